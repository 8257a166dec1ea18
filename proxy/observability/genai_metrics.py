"""The proxy's request series under the OpenTelemetry GenAI semantic conventions' names (``proxy.metric_names``).

Gateways that follow the conventions (Envoy AI Gateway among them) export ``gen_ai.client.token.usage``,
``gen_ai.server.request.duration``, ``gen_ai.server.time_to_first_token`` and friends; dashboards and alerts written
for them work on this proxy's ``/metrics`` too when these series are on. The names and labels are what an
OpenTelemetry Prometheus exporter writes: dots become underscores, the unit ``s`` becomes a ``_seconds`` suffix and
``{token}`` none (``gen_ai_client_token_usage_bucket``, ``gen_ai_server_request_duration_seconds_bucket``), attribute
keys become labels the same way (``gen_ai_token_type``). Bucket boundaries are the conventions' recommended ones.

The proxy is the server its clients see and a client of the backend: ``gen_ai.server.request.duration`` runs from the
request's arrival to its end (the wait for admission included, as ``tokenpools_proxy_request_duration_seconds``),
``gen_ai.client.operation.duration`` from its admission to its end (the backend's call). Every label value comes
from a closed set: pools, entitlements and models from the config, operations and error types from enums.

As with the tokenpools series, the request path only bumps list cells (``observe``); the text is written at scrape.
"""

from __future__ import annotations

from collections import defaultdict
from enum import StrEnum

from tokenpools.proxy.observability.histogram import Histogram
from tokenpools.topics.records import CompletionStatus


class MetricNames(StrEnum):
    """Under which names the proxy exports its per-request series (``proxy.metric_names``)."""

    TOKENPOOLS = "tokenpools"  # tokenpools_proxy_tokens_total, _ttft_seconds, _request_duration_seconds
    GEN_AI = "gen_ai"  # the GenAI semantic conventions' histograms instead of those three
    BOTH = "both"


TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
DURATION_BUCKETS_S = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)

# The backends speak the OpenAI API (vLLM's server): the conventions' provider name says which API flavour it is.
PROVIDER = "openai"
# gen_ai.operation.name of an embedding (the request's kind gives it: admission.body.Kind.operation), which has no
# output tokens.
EMBEDDINGS = "embeddings"

_COMMON = ("gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "tokenpools_pool",
           "tokenpools_entitlement")


class _Durations:
    """The two durations of the requests of one series that ended one way (error type)."""

    __slots__ = ("server", "client")

    def __init__(self) -> None:
        self.server = Histogram(DURATION_BUCKETS_S)
        self.client = Histogram(DURATION_BUCKETS_S)

    def observe(self, server_s: float, client_s: float) -> None:
        self.server.observe(server_s)
        self.client.observe(client_s)


class _Series:
    """The histograms of one (pool, entitlement, operation, model): one lookup per request finds them all."""

    __slots__ = ("input", "output", "ttft", "tpot", "ok", "failed")

    def __init__(self) -> None:
        self.input = Histogram(TOKEN_BUCKETS)
        self.output = Histogram(TOKEN_BUCKETS)
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.tpot = Histogram(TPOT_BUCKETS_S)
        self.ok = _Durations()  # error_type ""
        self.failed: dict[str, _Durations] = {}  # error_type: the completion status's value


class GenAiSeries:
    """What the GenAI families are built from, bumped once per completed request."""

    def __init__(self) -> None:
        self.series: defaultdict[tuple[str, str, str, str], _Series] = defaultdict(_Series)

    def completed(self, pool: str, entitlement: str, operation: str, model: str, *, status: CompletionStatus,
                  prompt: int, completion: int, server_s: float, client_s: float, ttft_s: float | None) -> None:
        """One admitted request ended. ``prompt``/``completion``: the tokens it was charged (the backend's usage, or
        the proxy's estimate without it: what ``tokenpools_proxy_tokens_total`` counts); ``operation``: its
        ``gen_ai.operation.name``; ``server_s``: arrival to end; ``client_s``: admission to end; ``ttft_s``: arrival
        to the first content chunk (streams)."""
        series = self.series[(pool, entitlement, operation, model)]
        if status is CompletionStatus.OK:
            series.ok.observe(server_s, client_s)
            if ttft_s is not None:  # the conventions' time metrics are of successful responses
                series.ttft.observe(ttft_s)
                if completion > 1:
                    series.tpot.observe(max(0.0, server_s - ttft_s) / (completion - 1))
        else:
            failed = series.failed.get(status.value) or series.failed.setdefault(status.value, _Durations())
            failed.observe(server_s, client_s)
        if prompt or completion:  # none: the backend did no work, no tokens to report
            series.input.observe(prompt)
            if operation != EMBEDDINGS:  # an embedding has no output tokens
                series.output.observe(completion)

    def render(self) -> str:
        """The five families in Prometheus text format (0.0.4), written directly: each series' label string is built
        once, not once per bucket line as prometheus_client's exposition does (about ten times the CPU here, on the
        event loop, for these many-bucket, long-labelled histograms)."""
        tokens: list[str] = []
        server: list[str] = []
        client: list[str] = []
        ttft: list[str] = []
        tpot: list[str] = []
        for (pool, entitlement, operation, model), series in sorted(self.series.items()):
            base = _labels(_COMMON, (operation, PROVIDER, model, pool, entitlement))
            for hist, token_type in ((series.input, "input"), (series.output, "output")):
                if hist.n:
                    _histogram(tokens, TOKENS, f'{base},gen_ai_token_type="{token_type}"', hist)
            if series.ttft.n:
                _histogram(ttft, TTFT, base, series.ttft)
            if series.tpot.n:
                _histogram(tpot, TPOT, base, series.tpot)
            ended = ([("", series.ok)] if series.ok.server.n else []) + sorted(series.failed.items())
            for error, durations in ended:
                labels = f'{base},error_type="{_escape(error)}"'
                _histogram(server, SERVER_DURATION, labels, durations.server)
                _histogram(client, CLIENT_DURATION, labels, durations.client)
        return "".join(f"# HELP {name} {doc}\n# TYPE {name} histogram\n" + "".join(lines)
                       for (name, doc), lines in ((TOKENS, tokens), (SERVER_DURATION, server),
                                                  (CLIENT_DURATION, client), (TTFT, ttft), (TPOT, tpot)))


TOKENS = ("gen_ai_client_token_usage", "Number of input and output tokens used (gen_ai.client.token.usage)")
SERVER_DURATION = ("gen_ai_server_request_duration_seconds", "Time from the request's arrival to its end, the wait "
                   "for admission included (gen_ai.server.request.duration)")
CLIENT_DURATION = ("gen_ai_client_operation_duration_seconds", "Time from the request's admission to its end: the "
                   "backend's call (gen_ai.client.operation.duration)")
TTFT = ("gen_ai_server_time_to_first_token_seconds", "Time to generate the first token for successful responses, "
        "from the request's arrival (gen_ai.server.time_to_first_token)")
TPOT = ("gen_ai_server_time_per_output_token_seconds", "Time per output token after the first, for successful "
        "streams (gen_ai.server.time_per_output_token)")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    return ",".join(f'{name}="{_escape(value)}"' for name, value in zip(names, values))


def _histogram(out: list[str], family: tuple[str, str], labels: str, hist: Histogram) -> None:
    """One series' lines: its cumulative buckets, then its count and sum."""
    name = family[0]
    running = 0
    for bound, count in zip(hist.bounds, hist.counts):
        running += count
        out.append(f'{name}_bucket{{{labels},le="{bound!r}"}} {running}\n')
    out.append(f'{name}_bucket{{{labels},le="+Inf"}} {hist.n}\n{name}_count{{{labels}}} {hist.n}\n'
               f"{name}_sum{{{labels}}} {hist.total!r}\n")
