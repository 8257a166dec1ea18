"""PromQL for a pool's vLLM backends and its proxies, and Prometheus answers parsed into values (pure).

One instant query per pool asks for every value at once (``label_replace(..., "tp_field", "<name>", "", "")``
joined with ``or``), so all of them come from the same evaluation instant and one round trip. What the values
mean together (fresh, stale or frozen; vLLM's series or the proxies') is ``reading``'s decision.

vLLM's series (``selector``, default ``job="{pool}"``):

- Old and new vLLM names are both accepted: ``vllm:kv_cache_usage_perc`` (vLLM ≥ 0.10) or
  ``vllm:gpu_cache_usage_perc`` (older), ``vllm:inter_token_latency_seconds`` (≥ 0.11) or
  ``vllm:time_per_output_token_seconds`` (older). ``a or b`` is taken per backend instance (set operators match
  on the labels without the metric name), so the new name wins where a backend exposes both and a fleet that
  mixes versions is still counted whole.
- Rates and quantiles count only backends whose last scrape succeeded (``and on (job, instance) up == 1``): range
  functions do not see staleness markers, and a stopped backend must not report its last minute as current.
- A value whose series is missing is absent from the answer (``parse_values`` says which were present); a
  quantile over a window without observations is NaN: None, but present (nothing happened).
- ``replicas_ready`` is ``sum(up)`` and ``targets`` ``count(up)``; ``scrape_age_s`` is how old the *oldest*
  target's newest scrape is; ``vllm_finished`` counts the requests vLLM finished over the rate window plus twice
  the staleness limit (the frozen check, ``reading``).

The proxies' series (``proxy_selector``, default ``pool="{pool}"``: the proxies label their series with the pool):
what each holds in flight (``tokenpools_proxy_in_flight``) as last scraped within the staleness limit (a proxy
whose one scrape failed still counts; one gone for longer does not; for a proxy replaced within the limit, old
and new both count until then), the tokens they settled per second (``tokenpools_proxy_tokens_total`` by kind: not
exported under ``proxy.metric_names=gen_ai``), and the requests they saw end well
(``tokenpools_proxy_completions_total{status="ok"}``) over the rate window (the pool answers: long requests on a
slow backend end seconds apart) and over the rate window that ended one staleness limit ago (the frozen check).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from string import Template
from typing import Any

from tokenpools.config.settings import DEFAULT_METRICS_SELECTOR, DEFAULT_PROXY_METRICS_SELECTOR

FIELD_LABEL = "tp_field"

DEFAULT_SELECTOR = DEFAULT_METRICS_SELECTOR  # the settings' defaults, so the two never disagree
"""The label matchers that select a pool's backends; ``{pool}``, ``{model}`` and ``{namespace}`` are filled in.
deploy/prometheus/scrape-config.yaml sets ``job`` to the pool label of the backend pods, so this default fits."""
DEFAULT_PROXY_SELECTOR = DEFAULT_PROXY_METRICS_SELECTOR
"""The label matchers that select the proxies' series of a pool (they carry a ``pool`` label of their own)."""

# Names of the values that are not fields of the sample (``reading`` uses them to decide).
SCRAPE_AGE = "scrape_age_s"  # how old the oldest target's newest scrape is, seconds
TARGETS = "targets"  # how many targets Prometheus has for the pool
VLLM_FINISHED = "vllm_finished"  # requests vLLM finished over the long window
PROXY_IN_FLIGHT = "proxy_in_flight"  # requests the proxies hold in flight for the pool, as last scraped
PROXY_PROMPT_TOKENS_PER_S = "proxy_prompt_tokens_per_s"
PROXY_GENERATION_TOKENS_PER_S = "proxy_generation_tokens_per_s"
PROXY_SERVED = "proxy_served"  # requests the proxies saw end well over the rate window
PROXY_FINISHED = "proxy_finished"  # ... over the rate window that ended one staleness limit ago

# Templates: $SEL / $PSEL are the pool's backends' / proxies' label matchers, $WIN the rate window, $RECENT the
# staleness limit, $LONG the rate window plus twice that; $LIVE keeps only backends up now (range functions do
# not see staleness markers).
_LIVE = "and on (job, instance) (up{$SEL} == 1)"
_VLLM: dict[str, str] = {
    "replicas_ready": "sum(up{$SEL})",
    "running": "sum(vllm:num_requests_running{$SEL})",
    "waiting": "sum(vllm:num_requests_waiting{$SEL})",
    "kv_cache_usage": "avg(vllm:kv_cache_usage_perc{$SEL} or vllm:gpu_cache_usage_perc{$SEL})",
    "prompt_tokens_per_s": "sum(rate(vllm:prompt_tokens_total{$SEL}[$WIN]) $LIVE)",
    "generation_tokens_per_s": "sum(rate(vllm:generation_tokens_total{$SEL}[$WIN]) $LIVE)",
    "ttft_p99_s": "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket{$SEL}[$WIN]) $LIVE))",
    "inter_token_latency_p50_s": (
        "histogram_quantile(0.5, sum by (le) ((rate(vllm:inter_token_latency_seconds_bucket{$SEL}[$WIN])"
        " or rate(vllm:time_per_output_token_seconds_bucket{$SEL}[$WIN])) $LIVE))"
    ),
    "e2e_p99_s": "histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{$SEL}[$WIN]) $LIVE))",
}
_CHECKS: dict[str, str] = {
    SCRAPE_AGE: "time() - min(timestamp(up{$SEL}))",
    TARGETS: "count(up{$SEL})",
    VLLM_FINISHED: "sum(increase(vllm:request_success_total{$SEL}[$LONG]) $LIVE)",
    PROXY_IN_FLIGHT: "sum(last_over_time(tokenpools_proxy_in_flight{$PSEL}[$RECENT]))",
    PROXY_PROMPT_TOKENS_PER_S: 'sum(rate(tokenpools_proxy_tokens_total{$PSEL,kind="prompt"}[$WIN]))',
    PROXY_GENERATION_TOKENS_PER_S: 'sum(rate(tokenpools_proxy_tokens_total{$PSEL,kind="completion"}[$WIN]))',
    PROXY_SERVED: 'sum(increase(tokenpools_proxy_completions_total{$PSEL,status="ok"}[$WIN]))',
    PROXY_FINISHED: 'sum(increase(tokenpools_proxy_completions_total{$PSEL,status="ok"}[$WIN] offset $RECENT))',
}
_FIELDS = {**_VLLM, **_CHECKS}

SAMPLE_FIELDS: tuple[str, ...] = tuple(_VLLM)
"""The record's fields, in the record's order."""

_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*'
_MATCHERS = re.compile(rf"{_MATCHER}(,{_MATCHER})*,?\s*")


def _check_selector(name: str, selector: str) -> None:
    try:
        sample = selector.format(pool="p", model="m", namespace="n")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"`{name}` may use only {{pool}}, {{model}}, {{namespace}}: {exc}") from None
    if not _MATCHERS.fullmatch(sample):
        raise ValueError(f'`{name}` must be PromQL label matchers such as job="{{pool}}", got {selector!r}')


@dataclass(frozen=True, slots=True)
class QueryConfig:
    """How the backends and the proxies of a pool are selected, how far back rates and quantiles look, and how old
    a scrape may be before vLLM's series count as stale."""

    selector: str = DEFAULT_SELECTOR
    rate_window_s: float = 30.0  # ≥ 4 scrape intervals, so rate() always has two samples
    stale_after_s: float = 15.0  # an oldest scrape older than this makes vLLM's series stale; > 1 scrape interval
    proxy_selector: str = DEFAULT_PROXY_SELECTOR

    def __post_init__(self) -> None:
        if self.rate_window_s <= 0 or self.stale_after_s <= 0:
            raise ValueError(
                f"`rate_window_s` and `stale_after_s` must be > 0, got {self.rate_window_s}, {self.stale_after_s}")
        _check_selector("selector", self.selector)
        _check_selector("proxy_selector", self.proxy_selector)


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _fill(selector: str, pool: str, model: str, namespace: str) -> str:
    filled = selector.format(pool=_quote(pool), model=_quote(model), namespace=_quote(namespace)).strip()
    return filled[:-1].rstrip() if filled.endswith(",") else filled  # more matchers may follow it


def selector_for(config: QueryConfig, pool: str, model: str = "", namespace: str = "") -> str:
    return _fill(config.selector, pool, model, namespace)


def _window(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _render(template: str, config: QueryConfig, pool: str, model: str, namespace: str) -> str:
    selector = selector_for(config, pool, model, namespace)
    return Template(template.replace("$LIVE", _LIVE)).substitute(
        SEL=selector, PSEL=_fill(config.proxy_selector, pool, model, namespace),
        WIN=_window(config.rate_window_s), RECENT=_window(config.stale_after_s),
        LONG=_window(config.rate_window_s + 2 * config.stale_after_s))


def pool_query(config: QueryConfig, pool: str, model: str = "", namespace: str = "") -> str:
    """The one instant query that answers every value for ``pool``."""
    parts = [f'label_replace({_render(q, config, pool, model, namespace)}, "{FIELD_LABEL}", "{name}", "", "")'
             for name, q in _FIELDS.items()]
    return " or ".join(parts)


def field_query(config: QueryConfig, field: str, pool: str, model: str = "", namespace: str = "") -> str:
    """One value's query alone (for people debugging a dashboard; the loop uses ``pool_query``)."""
    return _render(_FIELDS[field], config, pool, model, namespace)


def _number(raw: Any) -> float | None:
    """A Prometheus sample value ("12", "NaN", "+Inf") as a finite float, else None."""
    try:
        value = float(raw[1] if isinstance(raw, Sequence) and not isinstance(raw, str) else raw)
    except (TypeError, ValueError, IndexError):
        return None
    return value if math.isfinite(value) else None


def parse_values(result: Sequence[Mapping[str, Any]]) -> tuple[dict[str, float | None], frozenset[str]]:
    """``custom_query`` output → (name → finite value or None, the names that had a series at all)."""
    values: dict[str, float | None] = {}
    for item in result:
        metric = item.get("metric") or {}
        name = metric.get(FIELD_LABEL) if isinstance(metric, Mapping) else None
        if isinstance(name, str) and name in _FIELDS and name not in values:
            values[name] = _number(item.get("value"))
    return values, frozenset(values)
