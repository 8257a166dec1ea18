"""Prometheus metrics of one proxy, in a registry of its own (no global registry).

The request path only bumps plain ints and list cells (tens of ns); a custom collector turns them into metric
families at scrape time, and calls the gauge functions the proxy registers in ``gauges`` (what it reads straight
from the live objects: ``proxy.views.gauges``). Every label value comes
from a closed set: pools and entitlements from the config ("" for an unknown key), outcomes and statuses from their
enums.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from tokenpools.proxy.observability.genai_metrics import GenAiSeries, MetricNames
from tokenpools.proxy.observability.histogram import Histogram
from tokenpools.proxy.http.http_limits import ConnectionStats

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
