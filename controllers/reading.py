"""One pool's backends from one Prometheus answer (pure): vLLM's own series when they are fresh, else the proxies'.

vLLM's series of a pool are classified by a closed rule (``classify``), first match wins:

| cause | state | when |
|---|---|---|
| ``NoTargets`` | stale | Prometheus has no target for the pool (``count(up)`` is empty or 0) |
| ``ScrapesOld`` | stale | the oldest target's newest scrape is older than ``stale_after_s`` (Prometheus stopped scraping) |
| ``ScrapeFailed`` | stale | a target's last scrape failed (``sum(up) < count(up)``): its ``vllm:*`` series are gone. On 2 busy cores a vLLM answers ``/metrics`` late (docs/vllm.md), so this is often a busy backend, not a dead one |
| ``SeriesMissing`` | stale | every target is up but ``vllm:num_requests_running`` is missing (``--disable-log-stats``, a selector that matches something else) |
| ``CountersStill`` | frozen | vLLM finished no request over the rate window plus twice ``stale_after_s``, while the proxies saw requests end well over the rate window that ended ``stale_after_s`` ago |
| ``SeriesCurrent`` | fresh | none of the above |

Why the frozen rule cannot fire on correct series: vLLM counts a request as finished before its last bytes leave
the API server, hence before the proxy counts its completion; a completion the proxies counted by
``t - stale_after_s`` was counted by vLLM before that, and vLLM's newest scrape is younger than ``stale_after_s``
(else the state is ``ScrapesOld``). vLLM's window starts ``stale_after_s`` before the proxies', which covers one
scrape interval (so that ``increase`` sees the rise between two of its samples) as long as ``stale_after_s`` is
longer than a scrape interval plus the delivery of a response. Requests that reach vLLM without a proxy only make
vLLM's count larger.

What each state publishes (``read_pool``):

- fresh: vLLM's values as they are (``source`` vllm); a field whose series is missing is None and named in
  ``stale``; a NaN quantile (nothing observed) is None but not stale.
- stale or frozen, the proxies' series current (an in-flight sample of theirs younger than ``stale_after_s``):
  ``source`` proxies. ``running`` + ``waiting`` = the requests the proxies hold in flight for the pool (each is
  running or queued at vLLM), split at the pool's slots (per-replica concurrency × ready replicas, the spec's
  replicas when those are unknown): the proxies cannot see vLLM's queue, but they never hold more than its slots
  unless it queues. Token rates are the tokens the proxies settled per second over the rate window (a request's
  tokens count when it ends). KV usage and latency quantiles are unknown.
- stale or frozen, no current proxies' series: ``source`` none, every load field unknown.
- ``replicas_ready`` (``Ready``, how it was read, first match wins):

  | ready | value | when |
  |---|---|---|
  | ``NotScraped`` | unknown | no target, or the scrapes are too old |
  | ``Counted`` | ``sum(up)`` | every target is up (fresh, series missing or frozen) |
  | ``Busy`` | unknown | a scrape failed while the proxies hold requests in flight for the pool or saw some end well over the rate window: a starved vLLM answers ``/metrics`` late and may finish nothing for longer than the window, yet it works |
  | ``Unseen`` | unknown | a scrape failed and the proxies' in flight is missing: nothing tells a busy backend from a dead one |
  | ``Down`` | ``sum(up)`` | a scrape failed while the proxies hold nothing in flight and saw nothing end well: an idle vLLM answers at once, so one that does not is down |

  Unknown is None (the agents then assume the spec's replicas). Zero ready replicas therefore always rest on the
  proxies' word that the pool is idle; a stale series never reads as zero load.

Unknown is None and named in ``stale``, never 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tokenpools.controllers.promql import (
    PROXY_FINISHED,
    PROXY_GENERATION_TOKENS_PER_S,
    PROXY_IN_FLIGHT,
    PROXY_PROMPT_TOKENS_PER_S,
    PROXY_SERVED,
    SAMPLE_FIELDS,
    SCRAPE_AGE,
    TARGETS,
    VLLM_FINISHED,
)
from tokenpools.core.spec import PoolSpec
from tokenpools.topics.records import BackendMetricsSample, MetricsSource, MetricsState

Values = Mapping[str, float | None]


class Cause(StrEnum):
    """Why vLLM's series of a pool are in their state; CamelCase, as the reason of the TokenPool's condition."""

    SERIES_CURRENT = "SeriesCurrent"
    NO_TARGETS = "NoTargets"
    SCRAPES_OLD = "ScrapesOld"
    SCRAPE_FAILED = "ScrapeFailed"
    SERIES_MISSING = "SeriesMissing"
    COUNTERS_STILL = "CountersStill"

    @property
    def state(self) -> MetricsState:
        if self is Cause.SERIES_CURRENT:
            return MetricsState.FRESH
        return MetricsState.FROZEN if self is Cause.COUNTERS_STILL else MetricsState.STALE


class Ready(StrEnum):
    """How a reading's ``replicas_ready`` was read (the table above); CamelCase, as ``Cause``."""

    COUNTED = "Counted"
    NOT_SCRAPED = "NotScraped"
    BUSY = "Busy"
    UNSEEN = "Unseen"
    DOWN = "Down"

    @property
    def known(self) -> bool:
        return self in (Ready.COUNTED, Ready.DOWN)


_WHY = {
    Cause.SERIES_CURRENT: "vLLM's own series are current",
    Cause.NO_TARGETS: "Prometheus has no target for the pool's backends",
    Cause.SCRAPES_OLD: "a backend target of the pool was last scraped too long ago",
    Cause.SCRAPE_FAILED: "a scrape of the pool's backends failed (up == 0; a busy vLLM answers /metrics late)",
    Cause.SERIES_MISSING: "the pool's backends are scraped but export no vllm:num_requests_running",
    Cause.COUNTERS_STILL: "vLLM counted no finished request while the proxies counted some",
}
_UNKNOWN_READY = {
    Ready.NOT_SCRAPED: "no current scrape counts them",
    Ready.BUSY: "the proxies see the pool working",
    Ready.UNSEEN: "the proxies' view is missing too",
}
_FROM = {
    MetricsSource.VLLM: "load read from them",
    MetricsSource.PROXIES: "load read from the proxies' view (requests in flight, tokens settled)",
    MetricsSource.NONE: "the proxies' series are missing too: load unknown",
}


@dataclass(frozen=True, slots=True)
class PoolReading:
    """The controller's reading of one pool: why, from where, and the sample it publishes."""

    cause: Cause
    source: MetricsSource
    ready: Ready
    sample: BackendMetricsSample

    @property
    def state(self) -> MetricsState:
        return self.cause.state

    @property
    def key(self) -> tuple[Cause, MetricsSource, Ready]:
        """What a change of is news (logged once, written to status): not the numbers."""
        return self.cause, self.source, self.ready

    def describe(self) -> str:
        """One sentence without numbers (the status condition's message: it changes only when ``key`` does)."""
        text = f"{_WHY[self.cause]}: {_FROM[self.source]}"
        if not self.ready.known:
            text += f"; ready replicas unknown, {_UNKNOWN_READY[self.ready]} (the spec's replicas assumed)"
        return text


def classify(values: Values, present: frozenset[str], stale_after_s: float) -> Cause:
    """The first rule of the table above that matches."""
    targets = values.get(TARGETS)
    if targets is None or targets < 1:
        return Cause.NO_TARGETS
    age = values.get(SCRAPE_AGE)
    if age is None or age > stale_after_s:
        return Cause.SCRAPES_OLD
    ready = values.get("replicas_ready")
    if ready is None or ready < targets:
        return Cause.SCRAPE_FAILED
    if "running" not in present:
        return Cause.SERIES_MISSING
    finished, seen = values.get(VLLM_FINISHED), values.get(PROXY_FINISHED)
    if finished is not None and finished <= 0 and seen is not None and seen > 0:
        return Cause.COUNTERS_STILL
    return Cause.SERIES_CURRENT


def read_ready(cause: Cause, values: Values) -> tuple[Ready, int | None]:
    """How ``replicas_ready`` is read (the first row of the table above that matches) and its value."""
    ready = values.get("replicas_ready")
    if cause in (Cause.NO_TARGETS, Cause.SCRAPES_OLD) or ready is None:
        return Ready.NOT_SCRAPED, None
    counted = max(0, round(ready))
    if cause is not Cause.SCRAPE_FAILED:
        return Ready.COUNTED, counted
    in_flight, served = values.get(PROXY_IN_FLIGHT), values.get(PROXY_SERVED)
    if (in_flight is not None and in_flight > 0) or (served is not None and served > 0):
        return Ready.BUSY, None  # the failed scrapes are late answers of a working backend, not a dead one
    if in_flight is None:
        return Ready.UNSEEN, None
    return Ready.DOWN, counted


def _vllm_fields(values: Values, present: frozenset[str]) -> tuple[dict[str, Any], tuple[str, ...]]:
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
    return fields, tuple(name for name in SAMPLE_FIELDS if name not in present)


def _proxies_fields(pool: PoolSpec, values: Values, ready: int | None) -> dict[str, Any]:
    in_flight = max(0.0, values.get(PROXY_IN_FLIGHT) or 0.0)
    slots = pool.per_replica.concurrency * (pool.replicas if ready is None else ready)
    fields: dict[str, Any] = {"running": min(in_flight, slots), "waiting": max(0.0, in_flight - slots)}
    for field, name in (("prompt_tokens_per_s", PROXY_PROMPT_TOKENS_PER_S),
                        ("generation_tokens_per_s", PROXY_GENERATION_TOKENS_PER_S)):
        value = values.get(name)
        if value is not None:
            fields[field] = max(0.0, value)
    return fields


def read_pool(pool: PoolSpec, t_ms: int, values: Values, present: frozenset[str],
              stale_after_s: float) -> PoolReading:
    """The reading of ``pool`` at ``t_ms`` from the parsed answer to ``promql.pool_query`` (``parse_values``)."""
    cause = classify(values, present, stale_after_s)
    if cause is Cause.SERIES_CURRENT:
        fields, stale = _vllm_fields(values, present)
        return PoolReading(cause, MetricsSource.VLLM, Ready.COUNTED,
                           BackendMetricsSample(pool=pool.name, t_ms=t_ms, stale=stale, **fields))
    how, ready = read_ready(cause, values)
    source = MetricsSource.NONE if values.get(PROXY_IN_FLIGHT) is None else MetricsSource.PROXIES
    fields = _proxies_fields(pool, values, ready) if source is MetricsSource.PROXIES else {}
    if ready is not None:
        fields["replicas_ready"] = ready
    stale = tuple(name for name in SAMPLE_FIELDS if fields.get(name) is None)
    return PoolReading(cause, source, how, BackendMetricsSample(pool=pool.name, t_ms=t_ms, stale=stale,
                                                                metrics_state=cause.state, source=source, **fields))
