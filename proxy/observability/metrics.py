"""Prometheus metrics of one proxy, in a registry of its own (no global registry).

The request path only bumps plain ints and list cells (tens of ns); a custom collector turns them into metric
families at scrape time, and reads gauges (in flight, buckets, limits in force and their age, queue and spool
depth, waiters and queue outcomes: ``register_gauges``) straight from the live objects. Every label value comes
from a closed set: pools and entitlements from the config ("" for an unknown key), outcomes and statuses from their
enums.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from tokenpools.core.waiting import WaitOutcome
from tokenpools.proxy.admission.budgets import BudgetBook
from tokenpools.proxy.outbox.events import EventPipeline
from tokenpools.proxy.observability.genai_metrics import GenAiSeries, MetricNames
from tokenpools.proxy.observability.histogram import Histogram
from tokenpools.proxy.http.http_limits import ConnectionStats
from tokenpools.proxy.admission.pools import LimitsSource, PoolRuntime
from tokenpools.runtime.clock import Clock

PREFIX = "tokenpools_proxy_"

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
COUNTS_AGE_BUCKETS_S = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
DECISION_BUCKETS_S = (5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 5e-3)
WAIT_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class ProxyMetrics:
    """``names``: whether the per-request series (tokens, time to first token, request duration) are exported under
    the tokenpools names, the OpenTelemetry GenAI conventions' (``genai_metrics.py``), or both; the series with no
    GenAI equivalent (admission, queue, limits, events) keep their tokenpools names in every case."""

    def __init__(self, names: MetricNames = MetricNames.TOKENPOOLS) -> None:
        self.names = names
        self.gen_ai = None if names is MetricNames.TOKENPOOLS else GenAiSeries()  # None: not measured at all
        self.decisions: defaultdict[tuple[str, str, str], int] = defaultdict(int)  # pool, entitlement, outcome
        self.completions: defaultdict[tuple[str, str, str], int] = defaultdict(int)  # pool, entitlement, status
        self.tokens: defaultdict[tuple[str, str, str], int] = defaultdict(int)  # pool, entitlement, kind
        self.evictions: defaultdict[tuple[str, str], int] = defaultdict(int)
        self.would_refuse: defaultdict[tuple[str, str, str], int] = defaultdict(int)  # pool, entitlement, reason
        self.backend_refusals: defaultdict[tuple[str, str], int] = defaultdict(int)  # pool, http status
        self.backend_errors: defaultdict[tuple[str, str], int] = defaultdict(int)  # pool, kind
        self.bad_requests: defaultdict[str, int] = defaultdict(int)  # code
        self.limit_updates: defaultdict[tuple[str, str], int] = defaultdict(int)  # pool, result
        self.limit_fallbacks: defaultdict[str, int] = defaultdict(int)
        self.counts_records: defaultdict[tuple[str, str], int] = defaultdict(int)  # pool, result
        self.counts_fallbacks: defaultdict[str, int] = defaultdict(int)
        self.counts_age: defaultdict[tuple[str], Histogram] = defaultdict(lambda: Histogram(COUNTS_AGE_BUCKETS_S))
        self.limit_records_invalid = 0
        self.budget_records: defaultdict[tuple[str, str], int] = defaultdict(int)  # pool, result (budgets topic)
        self.spec_version = 0  # the version of the specs in force (live_specs)
        self.spec_refused: defaultdict[str, int] = defaultdict(int)  # source (topic, file) → refused changes
        self.specs_not_loaded = 0  # unknown keys answered 503 before the specs topic was read to its end
        self.connections = ConnectionStats()  # the HTTP server's: open now, closed by reason
        self.ttft: defaultdict[tuple[str, str], Histogram] = defaultdict(lambda: Histogram(LATENCY_BUCKETS_S))
        self.latency: defaultdict[tuple[str, str], Histogram] = defaultdict(lambda: Histogram(LATENCY_BUCKETS_S))
        self.decision_time = Histogram(DECISION_BUCKETS_S)
        self.wait_time: defaultdict[tuple[str, str], Histogram] = defaultdict(lambda: Histogram(WAIT_BUCKETS_S))
        self.gauges: list[Callable[[], Iterator[Metric]]] = []
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))  # type: ignore[arg-type]

    def render(self) -> bytes:
        text = generate_latest(self.registry)
        return text if self.gen_ai is None else text + self.gen_ai.render().encode()


def counter(name: str, doc: str, labels: tuple[str, ...], values: dict[tuple[str, ...], int]) -> Metric:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(key, value)
    return family


def histogram(name: str, doc: str, labels: tuple[str, ...], values: dict[tuple[str, ...], Histogram]) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for key, hist in sorted(values.items()):
        family.add_metric(list(key), hist.buckets(), hist.total)
    return family


class _Collector:
    def __init__(self, metrics: ProxyMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._m
        p = PREFIX
        yield counter(p + "decisions", "Admission decisions by outcome", ("pool", "entitlement", "outcome"),
                       m.decisions)
        yield counter(p + "completions", "Admitted requests that ended, by status", ("pool", "entitlement", "status"),
                       m.completions)
        if m.names is not MetricNames.GEN_AI:
            yield counter(p + "tokens", "Actual tokens of completed requests (backend usage)",
                          ("pool", "entitlement", "kind"), m.tokens)
        yield counter(p + "evictions", "Preemptible requests aborted for protected work", ("pool", "entitlement"),
                       m.evictions)
        yield counter(p + "would_refuse", "Admissions in shadow (docs/shadow.md) by the refusal enforce would have "
                       "given", ("pool", "entitlement", "reason"), m.would_refuse)
        yield counter(p + "backend_refusals", "The backend's own 429/503, passed through (not ours)",
                       ("pool", "code"), m.backend_refusals)
        yield counter(p + "backend_errors", "Backend failures (connect, timeout, 5xx, broken stream)",
                       ("pool", "kind"), m.backend_errors)
        yield counter(p + "bad_requests", "Requests answered 4xx before admission, by code", ("code",),
                       {(k,): v for k, v in m.bad_requests.items()})
        yield counter(p + "limit_updates", "Limit updates received, by what was done with them", ("pool", "result"),
                       m.limit_updates)
        yield counter(p + "limit_fallbacks", "Falls back to static limits after the TTL", ("pool",),
                       {(k,): v for k, v in m.limit_fallbacks.items()})
        yield counter(p + "counts_records", "Fleet counts records of this proxy's pools, by what was done with them",
                       ("pool", "result"), m.counts_records)
        yield counter(p + "counts_fallbacks", "Fleet counts stopped coming: the limit update's shares took over",
                       ("pool",), {(k,): v for k, v in m.counts_fallbacks.items()})
        yield counter(p + "budget_records", "Budget accounts received from the budgets topic, by what was done with "
                      "them", ("pool", "result"), m.budget_records)
        yield counter(p + "limit_records_invalid", "Undecodable records on the limits topic", (),
                       {(): m.limit_records_invalid})
        yield gauge(p + "spec_version", "Version of the pools, entitlements and keys in force (specs topic records "
                    "or --config edits applied since start)", (), {(): m.spec_version})
        yield counter(p + "spec_refused", "Spec changes refused (the last good specs kept), by source: topic, file",
                      ("source",), {(k,): v for k, v in m.spec_refused.items()})
        yield counter(p + "specs_not_loaded", "Requests of an unknown key answered 503 because the specs topic was "
                      "not read to its end yet (not ready)", (), {(): m.specs_not_loaded})
        yield counter(p + "connections_closed", "Client connections closed, by why: the client, idle keep-alive, a "
                      "deadline (header, body, write), a cap (connections, requests), bad or oversize input, "
                      "shutdown, error", ("reason",), {(r.value,): n for r, n in m.connections.closed.items()})
        yield gauge(p + "connections_open", "Client connections open now (those refused over max_connections "
                    "included, for the moment they linger)", (), {(): m.connections.open})
        yield histogram(p + "counts_age_seconds", "How old fleet counts are when they arrive (wall clock − their "
                         "instant): the delay the counts design's overshoot bound depends on", ("pool",), m.counts_age)
        if m.names is not MetricNames.GEN_AI:
            yield histogram(p + "ttft_seconds", "Time to the first content chunk (streams)", ("pool", "entitlement"),
                            m.ttft)
            yield histogram(p + "request_duration_seconds", "End-to-end latency of admitted requests",
                            ("pool", "entitlement"), m.latency)
        yield histogram(p + "wait_seconds", "How long requests waited for admission, by how the wait ended",
                         ("pool", "outcome"), m.wait_time)
        family = HistogramMetricFamily(p + "decision_seconds", "Time to take an admission decision", labels=())
        family.add_metric([], m.decision_time.buckets(), m.decision_time.total)
        yield family
        for gauges in m.gauges:
            yield from gauges()


def gauge(name: str, doc: str, labels: tuple[str, ...], values: dict[tuple[str, ...], float]) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(key, value)
    return family


def register_gauges(metrics: ProxyMetrics, pools: dict[str, PoolRuntime], events: EventPipeline,
                    clock: Clock, budgets: BudgetBook | None = None) -> None:
    """Fills ``metrics.gauges``: what the collector reads from the live pools, the budget accounts and the event
    pipeline at scrape time."""
    p = PREFIX

    def pool_gauges() -> Iterator[Metric]:
        now = clock.now_s()
        in_flight: dict[tuple[str, ...], float] = {}
        bucket: dict[tuple[str, ...], float] = {}
        limit: dict[tuple[str, ...], float] = {}
        debt: dict[tuple[str, ...], float] = {}
        for name, rt in pools.items():
            c = rt.controller
            for ent in c.entitlement_names():
                in_flight[(name, ent)] = c.in_flight_of(ent)
                bucket[(name, ent)] = c.bucket_tokens_of(ent, now)
                lim = c.limits_of(ent)
                limit[(name, ent, "concurrency")] = lim.concurrency
                limit[(name, ent, "tokens_per_s")] = lim.tokens_per_s
                limit[(name, ent, "kv_bytes")] = lim.kv_bytes
                limit[(name, ent, "priority")] = lim.priority
                # under static limits the last update's debt is no longer news: none exported
                if rt.in_force.source is LimitsSource.UPDATE and ent in rt.signals:
                    debt[(name, ent)] = rt.signals[ent][0]
        yield gauge(p + "in_flight", "Admitted requests in progress", ("pool", "entitlement"), in_flight)
        yield gauge(p + "bucket_tokens", "Tokens in the entitlement's bucket now", ("pool", "entitlement"), bucket)
        yield gauge(p + "limit", "Limits in force at this proxy", ("pool", "entitlement", "dimension"), limit)
        yield gauge(p + "entitlement_debt", "The agents' service debt of the entitlement in the limit update in force "
                    "(> 0: it got less than its baseline; none while static limits are in force)",
                    ("pool", "entitlement"), debt)
        yield gauge(p + "pool_concurrency", "This proxy's share of the pool's concurrency", ("pool",),
                    {(n,): rt.controller.pool_concurrency for n, rt in pools.items()})
        yield gauge(p + "limits_version", "Version of the last limit update applied (-1: none yet)", ("pool",),
                    {(n,): -1 if rt.in_force.version is None else rt.in_force.version for n, rt in pools.items()})
        yield gauge(p + "limits_age_seconds", "Time since the limits in force were put in force", ("pool",),
                    {(n,): rt.limits_age_s(now) for n, rt in pools.items()})
        yield gauge(p + "limits_static", "1 when static (fail-static) limits are in force", ("pool",),
                    {(n,): float(rt.in_force.source is LimitsSource.STATIC) for n, rt in pools.items()})
        yield gauge(p + "waiters", "Requests waiting for admission", ("pool",),
                    {(n,): len(rt.queue) for n, rt in pools.items()})
        yield counter(p + "queue_outcomes", "How requests that could wait fared: admitted, timed_out, queue_full, "
                      "too_long, withdrawn", ("pool", "outcome"),
                      {(n, o.value): rt.queue.outcomes[o] for n, rt in pools.items() for o in WaitOutcome})

    def budget_gauges() -> Iterator[Metric]:
        if budgets is None:
            return
        now_ms = clock.wall_ms()
        remaining = {(name, ent, spec.name): budgets.state(ent, spec, now_ms, e.tenant).remaining_units
                     for name, rt in pools.items() for ent, e in rt.entitlements.items() for spec in e.budgets}
        yield gauge(p + "budget_remaining_units", "Units a budget has left this period as this proxy sees it (the "
                    "agents' account less its own unpublished spending and reservations; negative: overshot)",
                    ("pool", "entitlement", "budget"), remaining)
        waited = {}
        for name, rt in pools.items():
            for ent, e in rt.entitlements.items():
                for spec in e.budgets:
                    since = budgets.unacknowledged_since(ent, spec.name)
                    waited[(name, ent, spec.name)] = 0.0 if since is None else max(0, now_ms - since) / 1000
        yield gauge(p + "budget_unacknowledged_seconds", "How long this proxy's oldest spending of a budget has waited "
                    "for the agents' record of it (0: none waits); past budgets.stale_after_s the view is stale "
                    "(docs/budgets.md#stale-views)", ("pool", "entitlement", "budget"), waited)

    def event_gauges() -> Iterator[Metric]:
        yield counter(p + "events", "Events by stage: queued, sent, spooled, drained, respooled, dropped",
                      ("stage",), {(k,): v for k, v in events.counts.as_dict().items()})
        yield gauge(p + "event_queue_depth", "Events in memory waiting for the producer", (),
                    {(): events.queue_depth})
        yield gauge(p + "event_in_flight", "Events handed to the producer, not yet acknowledged", (),
                    {(): events.in_flight})
        yield gauge(p + "event_spool_depth", "Events in the spool waiting to be drained", (),
                    {(): events.spool.pending})
        yield gauge(p + "event_spool_corrupt", "Spool lines skipped for a bad checksum", (),
                    {(): events.spool.corrupt})
        yield gauge(p + "events_degraded", "1 while events go to the spool instead of straight to Kafka (broker unreachable, or the spool still draining)", (),
                    {(): float(events.degraded)})

    metrics.gauges[:] = [pool_gauges, budget_gauges, event_gauges]
