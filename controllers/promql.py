"""PromQL for a pool's vLLM backends, and Prometheus answers turned into a ``BackendMetricsSample`` (pure).

One instant query per pool asks for every field at once (``label_replace(..., "tp_field", "<field>", "", "")``
joined with ``or``), so all fields of a sample come from the same evaluation instant and one round trip.

- Old and new vLLM names are both accepted: ``vllm:kv_cache_usage_perc`` (vLLM ≥ 0.10) or
  ``vllm:gpu_cache_usage_perc`` (older), ``vllm:inter_token_latency_seconds`` (≥ 0.11) or
  ``vllm:time_per_output_token_seconds`` (older). ``a or b`` is taken per backend instance (set operators match
  on the labels without the metric name), so the new name wins where a backend exposes both and a fleet that
  mixes versions is still counted whole.
- Rates and quantiles count only backends whose last scrape succeeded (``and on (job, instance) up == 1``): range
  functions do not see staleness markers, and a stopped backend must not report its last minute as current.
- A field whose series is missing (the backend is down — Prometheus marks its series stale at the first failed
  scrape — or never exposed it) is ``None`` and named in ``stale``; it is never reported as 0.
- A quantile over a window without observations is NaN in PromQL: ``None`` (unknown), but not stale — the series
  is there, nothing happened.
- ``replicas_ready`` is ``sum(up)``: 0 when every target fails its scrape, stale only when Prometheus has no
  target for the pool at all. If the pool's newest scrape is older than the staleness limit (Prometheus stopped
  scraping), every field is stale.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenpools.config.settings import DEFAULT_METRICS_SELECTOR
from tokenpools.topics.records import BackendMetricsSample

FIELD_LABEL = "tp_field"
SCRAPE_AGE = "scrape_age_s"  # not a record field: how old the pool's newest scrape is, seconds

DEFAULT_SELECTOR = DEFAULT_METRICS_SELECTOR  # the settings' default, so the two never disagree
"""The label matchers that select a pool's backends; ``{pool}``, ``{model}`` and ``{namespace}`` are filled in.
deploy/prometheus/scrape-config.yaml sets ``job`` to the pool label of the backend pods, so this default fits."""

# Templates: SEL is the pool's label matchers, WIN the rate window, LIVE keeps only backends up now (range
# functions do not see staleness markers).
_LIVE = "and on (job, instance) (up{SEL} == 1)"
_FIELDS: dict[str, str] = {
    "replicas_ready": "sum(up{SEL})",
    "running": "sum(vllm:num_requests_running{SEL})",
    "waiting": "sum(vllm:num_requests_waiting{SEL})",
    "kv_cache_usage": "avg(vllm:kv_cache_usage_perc{SEL} or vllm:gpu_cache_usage_perc{SEL})",
    "prompt_tokens_per_s": "sum(rate(vllm:prompt_tokens_total{SEL}[WIN]) LIVE)",
    "generation_tokens_per_s": "sum(rate(vllm:generation_tokens_total{SEL}[WIN]) LIVE)",
    "ttft_p99_s": "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{SEL}[WIN]) LIVE))",
    "inter_token_latency_p50_s": (
        "histogram_quantile(0.5, sum by (le) ((rate(vllm:inter_token_latency_seconds_bucket{SEL}[WIN])"
        " or rate(vllm:time_per_output_token_seconds_bucket{SEL}[WIN])) LIVE))"
    ),
    "e2e_p99_s": "histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{SEL}[WIN]) LIVE))",
    SCRAPE_AGE: "time() - max(timestamp(up{SEL}))",
}


def _render(template: str, selector: str, window: str) -> str:
    return template.replace("LIVE", _LIVE).replace("WIN", window).replace("SEL", selector)  # the selector last


SAMPLE_FIELDS: tuple[str, ...] = tuple(f for f in _FIELDS if f != SCRAPE_AGE)

_MATCHERS = re.compile(r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*(,\s*[a-zA-Z_][a-zA-Z0-9_]*'
                       r'\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*)*,?\s*')


@dataclass(frozen=True, slots=True)
class QueryConfig:
    """How the backends of a pool are selected and how far back rates and quantiles look."""

    selector: str = DEFAULT_SELECTOR
    rate_window_s: float = 30.0  # ≥ 4 scrape intervals, so rate() always has two samples
    staleness_s: float = 15.0  # a newest scrape older than this makes the whole sample stale

    def __post_init__(self) -> None:
        if self.rate_window_s <= 0 or self.staleness_s <= 0:
            raise ValueError(f"`rate_window_s` and `staleness_s` must be > 0, got {self.rate_window_s}, {self.staleness_s}")
        try:
            sample = self.selector.format(pool="p", model="m", namespace="n")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"`selector` may use only {{pool}}, {{model}}, {{namespace}}: {exc}") from None
        if not _MATCHERS.fullmatch(sample):
            raise ValueError(f'`selector` must be PromQL label matchers such as job="{{pool}}", got {self.selector!r}')


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def selector_for(config: QueryConfig, pool: str, model: str = "", namespace: str = "") -> str:
    return config.selector.format(pool=_quote(pool), model=_quote(model), namespace=_quote(namespace))


def _window(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def pool_query(config: QueryConfig, pool: str, model: str = "", namespace: str = "") -> str:
    """The one instant query that answers every field for ``pool``."""
    s, w = selector_for(config, pool, model, namespace), _window(config.rate_window_s)
    parts = [f'label_replace({_render(q, s, w)}, "{FIELD_LABEL}", "{name}", "", "")' for name, q in _FIELDS.items()]
    return " or ".join(parts)


def field_query(config: QueryConfig, field: str, pool: str, model: str = "", namespace: str = "") -> str:
    """One field's query alone (for people debugging a dashboard; the loop uses ``pool_query``)."""
    return _render(_FIELDS[field], selector_for(config, pool, model, namespace), _window(config.rate_window_s))


def _number(raw: Any) -> float | None:
    """A Prometheus sample value ("12", "NaN", "+Inf") as a finite float, else None."""
    try:
        value = float(raw[1] if isinstance(raw, Sequence) and not isinstance(raw, str) else raw)
    except (TypeError, ValueError, IndexError):
        return None
    return value if math.isfinite(value) else None


def parse_values(result: Sequence[Mapping[str, Any]]) -> tuple[dict[str, float | None], frozenset[str]]:
    """``custom_query`` output → (field → finite value or None, the fields that had a series at all)."""
    values: dict[str, float | None] = {}
    for item in result:
        metric = item.get("metric") or {}
        name = metric.get(FIELD_LABEL) if isinstance(metric, Mapping) else None
        if isinstance(name, str) and name in _FIELDS and name not in values:
            values[name] = _number(item.get("value"))
    return values, frozenset(values)


def to_sample(pool: str, t_ms: int, result: Sequence[Mapping[str, Any]], staleness_s: float) -> BackendMetricsSample:
    """The record for one pool at ``t_ms`` from the answer to ``pool_query``."""
    values, present = parse_values(result)
    age = values.get(SCRAPE_AGE)
    if age is not None and age > staleness_s:  # Prometheus stopped scraping the pool: nothing it says is current
        return BackendMetricsSample(pool=pool, t_ms=t_ms, stale=SAMPLE_FIELDS)
    fields: dict[str, Any] = {}
    for name in SAMPLE_FIELDS:
        value = values.get(name)
        if value is None:
            continue
        if name == "replicas_ready":
            fields[name] = max(0, round(value))
        elif name == "kv_cache_usage":
            fields[name] = min(1.0, max(0.0, value))
        else:
            fields[name] = max(0.0, value)
    stale = tuple(name for name in SAMPLE_FIELDS if name not in present)
    return BackendMetricsSample(pool=pool, t_ms=t_ms, stale=stale, **fields)
