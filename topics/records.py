"""Record schemas. Each is frozen, rejects unknown fields, and carries ``record_type`` and ``schema_version``.

Times are event times in integer milliseconds since the Unix epoch (``*_ms``) or durations in seconds (``*_s``).
A new incompatible shape means a new ``schema_version``; consumers reject versions they do not know (and
dead-letter them) rather than guess.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from tokenpools.core.budgets import BudgetScope, Period
from tokenpools.core.classes import ServiceClass
from tokenpools.core.outcomes import AdmissionOutcome

SCHEMA_VERSION = 1


class Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    schema_version: Literal[1] = 1


class RetryLink(StrEnum):
    """How the proxy knew that an attempt retries an earlier one (docs/tuning.md#retries)."""

    SDK_RETRY_COUNT = "sdk_retry_count"  # the OpenAI SDKs' x-stainless-retry-count header
    IDEMPOTENCY_KEY = "idempotency_key"  # an Idempotency-Key header seen on an earlier attempt
    CLIENT_REQUEST_ID = "client_request_id"  # the client's own request id (X-Client-Request-Id) seen before
    HEURISTIC = "heuristic"  # same key and body digest as a refusal within the retry window


class RequestDecided(Record):
    """One admission decision at a proxy (admitted or refused). Topic: requests, key: pool."""

    record_type: Literal["request_decided"] = "request_decided"
    request_id: str = Field(min_length=1)
    pool: str
    entitlement: str | None = Field(description="None when the API key was unknown")
    proxy_id: str
    t_ms: NonNegativeInt = Field(description="decision time, ms since epoch: the final decision's, after any wait")
    outcome: AdmissionOutcome
    reason: str
    retry_after_s: NonNegativeInt = 0
    retry_after_ms: NonNegativeInt = Field(0, description="the refusal's estimated wait in ms, sent as retry-after-ms; "
                                           "retry_after_s is it in whole seconds rounded up; 0: none (admitted, or "
                                           "a record written before the field existed)")
    queued_ms: NonNegativeInt = Field(0, description="how long the request waited at the proxy for this decision, ms "
                                      "(docs/queueing.md); t_ms is when the wait ended; 0: it did not wait (or a "
                                      "record written before the field existed)")
    waits: bool = Field(False, description="true: this refusal did not end the request, which waits at the proxy for "
                        "its check (docs/queueing.md), and its final decision follows under the same request_id. It "
                        "is demand like any refusal: the agents count it when the wait starts, not when it ends")
    prompt_tokens_est: NonNegativeInt = Field(description="n_in estimated at admission")
    max_tokens: NonNegativeInt = Field(description="max_tokens after the pool default was applied")
    cost_tokens: NonNegativeInt = Field(description="n_in + the output estimate (at most max_tokens; docs/reservations.md), the tokens reserved when admitted")
    kv_bytes: NonNegativeInt = Field(description="KV bytes reserved when admitted: (n_in + max_tokens) × c")
    priority: NonNegativeFloat = Field(description="w_e the request carries (admitted with)")
    stream: bool = False
    would_refuse: AdmissionOutcome | None = Field(
        None, exclude_if=lambda v: v is None,
        description="an admission of an entitlement in shadow (docs/shadow.md): the refusal enforce would have "
                    "given; outcome is admitted and the request was served, so it is counted as admitted. Absent "
                    "(not null) otherwise: a record without it is the same bytes a consumer older than the field reads")
    attempt: NonNegativeInt | None = Field(
        None, exclude_if=lambda v: v is None,
        description="which attempt of one client request this is, 0 for the first (docs/tuning.md#retries); absent "
                    "when the proxy could not tell (the client marked nothing and no earlier refusal matched)")
    first_request_id: str | None = Field(
        None, exclude_if=lambda v: v is None,
        description="the request_id of the request's first attempt, on a retry (attempt >= 1); absent otherwise")
    retry_link: RetryLink | None = Field(
        None, exclude_if=lambda v: v is None,
        description="how the attempt was linked to its first one: sdk_retry_count, idempotency_key, "
                    "client_request_id or heuristic; absent when attempt is")
    proxy_start_ms: NonNegativeInt | None = Field(
        None, exclude_if=lambda v: v is None,
        description="when the proxy process that sent it started, ms since epoch; with proxy_id, the stream of "
                    "sequence. Absent in a record written before the field existed, or built outside a proxy (the "
                    "replay): no identity, counted by position")
    sequence: PositiveInt | None = Field(
        None, exclude_if=lambda v: v is None,
        description="the n-th decision of this (pool, entitlement) at that proxy process, from 1 (a counter apart "
                    "from the completions'): the event's identity across re-sends, so a decision the broker holds "
                    "twice counts once in the agents' pool state (tokenpools.core.resends); absent for a decision "
                    "without an entitlement")
    limits_version: NonNegativeInt | None = Field(
        None, exclude_if=lambda v: v is None,
        description="the version of the pool's limit update in force at the proxy when it decided (t_ms), so a "
                    "replay puts each update in force when this proxy did (docs/tuning.md#limit-updates); absent "
                    "while the pool runs on static limits (none applied yet, or fallen back), for a decision without "
                    "a pool, and in a record written before the field existed")


class CompletionStatus(StrEnum):
    OK = "ok"
    CLIENT_ABORT = "client_abort"
    EVICTED = "evicted"
    BACKEND_ERROR = "backend_error"
    BACKEND_REFUSED = "backend_refused"  # the backend's own 429/503, passed through; never counted as ours
    TIMEOUT = "timeout"


class RequestCompleted(Record):
    """The end of an admitted request, with the backend's actual usage. Topic: completions, key: pool."""

    record_type: Literal["request_completed"] = "request_completed"
    request_id: str = Field(min_length=1)
    pool: str
    entitlement: str
    proxy_id: str
    t_ms: NonNegativeInt = Field(description="completion time, ms since epoch")
    admitted_t_ms: NonNegativeInt
    status: CompletionStatus
    prompt_tokens: NonNegativeInt = Field(description="actual, from the backend's usage (estimate if it gave none)")
    completion_tokens: NonNegativeInt
    cached_prompt_tokens: NonNegativeInt = Field(
        0, exclude_if=lambda v: v == 0,
        description="the part of prompt_tokens the backend served from its prefix cache (usage."
                    "prompt_tokens_details.cached_tokens); absent when 0, so older consumers read the same bytes")
    reserved_tokens: NonNegativeInt
    kv_bytes: NonNegativeInt = Field(description="the KV reservation this completion releases")
    ttft_s: NonNegativeFloat | None = Field(description="time to the first content chunk; None if none came")
    e2e_s: NonNegativeFloat
    backend: str = ""
    http_status: int = 200
    proxy_start_ms: NonNegativeInt | None = Field(
        None, exclude_if=lambda v: v is None,
        description="when the proxy process that sent it started, ms since epoch; with proxy_id, the stream of "
                    "sequence. Absent in a record written before the field existed (no identity: counted by position)")
    sequence: PositiveInt | None = Field(
        None, exclude_if=lambda v: v is None,
        description="the n-th completion of this (pool, entitlement) at that proxy process, from 1: the event's "
                    "identity across re-sends, so a completion the broker holds twice counts once "
                    "(tokenpools.core.resends)")


class MetricsState(StrEnum):
    """How current vLLM's own series of a pool were when the controller read them."""

    FRESH = "fresh"  # every target scraped within the limit, up, its load series there: used as they are
    STALE = "stale"  # no target, a failed scrape (up == 0), scrapes older than the limit, or no load series
    FROZEN = "frozen"  # up and current, yet vLLM counted no finished request while the proxies counted some


class MetricsSource(StrEnum):
    """Where a backend-metrics sample's load fields came from."""

    VLLM = "vllm"  # vLLM's own series (the state is fresh)
    PROXIES = "proxies"  # the proxies' series of the pool: in flight, settled tokens (vLLM's were not fresh)
    NONE = "none"  # neither: every load field unknown


class BackendMetricsSample(Record):
    """A pool's backends as Prometheus saw them. Fields that are None are unknown (stale or missing), never 0.

    ``metrics_state`` and ``source`` say whether vLLM's series were used or the proxies' view stood in for them;
    both are absent on the wire when vLLM's series were fresh (the bytes a consumer older than the fields reads).

    Topic: backend-metrics, key: pool.
    """

    record_type: Literal["backend_metrics"] = "backend_metrics"
    pool: str
    t_ms: NonNegativeInt
    replicas_ready: NonNegativeInt | None = None
    running: NonNegativeFloat | None = None
    waiting: NonNegativeFloat | None = None
    kv_cache_usage: float | None = Field(default=None, ge=0, le=1, description="fraction of KV cache in use")
    prompt_tokens_per_s: NonNegativeFloat | None = None
    generation_tokens_per_s: NonNegativeFloat | None = None
    ttft_p99_s: NonNegativeFloat | None = None
    inter_token_latency_p50_s: NonNegativeFloat | None = None
    e2e_p99_s: NonNegativeFloat | None = None
    stale: tuple[str, ...] = Field(default=(), description="names of the fields whose series were missing")
    metrics_state: MetricsState = Field(
        MetricsState.FRESH, exclude_if=lambda v: v is MetricsState.FRESH,
        description="how current vLLM's series were: fresh, stale (no target, up == 0, old scrapes, no load series) "
                    "or frozen (vLLM counted no finished request while the proxies did); absent when fresh")
    source: MetricsSource = Field(
        MetricsSource.VLLM, exclude_if=lambda v: v is MetricsSource.VLLM,
        description="where running, waiting and the token rates came from: vllm, proxies (running + waiting = the "
                    "requests the proxies hold in flight for the pool, token rates = what they settled) or none "
                    "(unknown); absent when vllm")


class SpecRecord(Record):
    """A TokenPool or TokenEntitlement as the controller sees it. Topic: specs (compacted), key: "<kind>/<name>".

    ``spec`` is the document's spec in its YAML/CRD camelCase form; ``deleted`` marks a removal (and a tombstone
    follows on the compacted topic).
    """

    record_type: Literal["spec"] = "spec"
    kind: Literal["TokenPool", "TokenEntitlement"]
    name: str = Field(min_length=1)
    pool: str = Field(description="the pool itself, or the entitlement's poolRef")
    generation: NonNegativeInt = 0
    spec: dict[str, object]
    state: Literal["Pending", "Bound", "Degraded", "Expired"] | None = None
    reason: str = ""
    deleted: bool = False
    t_ms: NonNegativeInt


class _Part(BaseModel):
    """A nested part of a record (no type or version of its own)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class EntitlementLimit(_Part):
    """An entitlement's effective limits and signals in one limit update."""

    name: str
    priority: NonNegativeFloat
    debt: float = Field(ge=-1, le=1)
    burst: NonNegativeFloat
    tokens_per_s: NonNegativeFloat
    kv_bytes: NonNegativeFloat
    concurrency: NonNegativeInt


class ProxyShare(_Part):
    """One proxy replica's share of every entitlement's limits (they add up to the entitlement's limits)."""

    proxy_id: str
    pool_concurrency: NonNegativeInt
    entitlements: dict[str, tuple[NonNegativeInt, NonNegativeFloat, NonNegativeFloat]] = Field(
        description="entitlement → (concurrency, tokens_per_s, kv_bytes)"
    )


class LimitUpdate(Record):
    """The limits the proxies enforce, one per pool per tick. Topic: limits (compacted), key: pool.

    ``version`` increases strictly per pool; a proxy applies an update only if it is newer than the one in force.
    A pool's update larger than a record should be is sent as ``pages`` records of one version (keys ``pool``,
    ``pool#1``, ...), each with a slice of the entitlements in name order (``topics.limits.paginate``); a proxy
    applies the version once it holds every page.
    """

    record_type: Literal["limit_update"] = "limit_update"
    pool: str
    version: NonNegativeInt
    t_ms: NonNegativeInt = Field(description="tick time")
    contended: bool
    backend_waiting: NonNegativeFloat = 0
    mean_slo_ms: NonNegativeFloat
    capacity_tokens_per_s: NonNegativeFloat
    capacity_kv_bytes: NonNegativeFloat
    capacity_concurrency: NonNegativeInt
    entitlements: tuple[EntitlementLimit, ...]
    proxies: tuple[ProxyShare, ...] = ()
    page: NonNegativeInt = Field(0, description="this record's page of the version (0 first)")
    pages: PositiveInt = Field(1, description="how many records carry this version")


class Amount(_Part):
    """An amount in the three dimensions every limit and baseline has."""

    concurrency: NonNegativeInt = Field(description="requests in flight at once")
    tokens_per_s: NonNegativeFloat = Field(description="prompt + completion tokens per second")
    kv_bytes: NonNegativeFloat = Field(description="KV-cache bytes reserved at once")


class WindowUsage(_Part):
    """What the agents measured of one entitlement in one window, over every proxy replica of the pool."""

    in_flight_at_end: NonNegativeInt = Field(description="requests admitted and not yet completed at the window's end")
    mean_in_flight: NonNegativeFloat = Field(description="requests in flight, averaged over the window")
    tokens_per_s: NonNegativeFloat = Field(description="tokens served (completed requests' actual usage) per second")
    kv_bytes: NonNegativeFloat = Field(description="KV bytes reserved, averaged over the window")
    demand_tokens_per_s: NonNegativeFloat = Field(description="tokens served plus the cost of the refused requests, "
                                                  "per second")
    admitted: NonNegativeInt
    refused: NonNegativeInt
    completed: NonNegativeInt


class EffectiveLimit(Record):
    """One entitlement's fleet-wide effective limits after one tick, for subscribers outside tokenpools.

    Topic: effective-limits (compacted), key: "<pool>/<entitlement>". One record per entitlement of the pool per
    tick, from the tick that also produced the pool's LimitUpdate (same ``version``). The limits are the whole
    fleet's (what every proxy replica together enforces), not a replica's share. A tombstone (null value) follows
    when the entitlement leaves the pool's ticks (deleted, expired, no longer bound).
    """

    record_type: Literal["effective_limit"] = "effective_limit"
    pool: str = Field(min_length=1)
    entitlement: str = Field(min_length=1)
    version: NonNegativeInt = Field(description="the limits' version: the window's end in ms, increasing per pool; "
                                    "equal to the version of the pool's LimitUpdate of the same tick")
    window_start_ms: NonNegativeInt = Field(description="start of the window the limits were computed from")
    window_end_ms: NonNegativeInt = Field(description="its end (exclusive), ms since epoch")
    service_class: ServiceClass
    priority: NonNegativeFloat = Field(description="w_e, the priority the entitlement's requests are admitted with")
    debt: float = Field(ge=-1, le=1, description="d_e, the service debt: > 0 when it got less than its baseline "
                        "while it wanted it")
    burst: NonNegativeFloat = Field(description="b_e, the smoothed excess of its usage over its baseline")
    contended: bool = Field(description="whether the pool's demand exceeded its capacity in this tick")
    limit: Amount = Field(description="the fleet-wide effective limits in force from this version on")
    baseline: Amount = Field(description="the entitlement's baselines, from its spec")
    measured: WindowUsage | None = Field(description="what was measured in the window; None before the "
                                         "entitlement's first measured window")


class ScaleCommand(Record):
    """The replicas a pool should have, from the same capacity model. Topic: scale, key: pool."""

    record_type: Literal["scale_command"] = "scale_command"
    pool: str
    version: NonNegativeInt
    t_ms: NonNegativeInt
    desired_replicas: NonNegativeInt
    current_replicas: NonNegativeInt
    floor_replicas: NonNegativeInt = Field(description="what Bound baselines need: never scale below")
    reason: str = ""


class ProxyHeartbeat(Record):
    """A proxy replica says it is alive and which pools it serves. Topic: heartbeats, key: proxy_id."""

    record_type: Literal["proxy_heartbeat"] = "proxy_heartbeat"
    proxy_id: str = Field(min_length=1)
    t_ms: NonNegativeInt
    pools: tuple[str, ...]
    started_ms: NonNegativeInt


class EntitlementWindow(_Part):
    """One entitlement's part of a ``WindowSummary``: the window's sums as the stage-1 fold kept them."""

    name: str = Field(min_length=1)
    bucket: tuple[int, int, float, float, int, int, int, int, int, int] | None = Field(
        description="the window's sums in core.windows.Bucket's field order (in-flight and KV deltas and integrals, "
        "served tokens, completed, admitted and their cost, refused and their cost); None: no usage event fell in it")
    attempts: dict[str, NonNegativeInt] = Field(default_factory=dict, description="proxy → admissions and refusals "
                                                 "it made in the window (the per-proxy split's demand)")
    in_flight_deltas: dict[str, int] = Field(default_factory=dict, description="proxy → admitted − completed in the "
                                             "window, by event time")
    late_in_flight: dict[str, tuple[NonNegativeInt, int]] = Field(
        default_factory=dict, description="proxy → (floor, net) of the admissions (+1) and completions (−1) that "
        "came after the shard had closed their window, since its last summary: a level L becomes max(floor, L + net), "
        "which is what adding them one by one, never below 0, gives")
    late_windows: dict[int, dict[str, int]] = Field(
        default_factory=dict, description="the same events per window index → proxy → net: for a pool that has "
        "ticked no window yet (it counts them into their windows' deltas instead)")


class WindowSummary(Record):
    """What one shard of a sharded pool measured in one window, for the pool's decision (stage 2).

    Topic: usage-windows (internal to the agents), key: pool. One per shard per closed window, empty ones too
    (they say the shard is through the window). The entitlements are the shard's, sorted by name.
    """

    record_type: Literal["window_summary"] = "window_summary"
    pool: str = Field(min_length=1)
    shard: NonNegativeInt
    shards: PositiveInt = Field(description="the pool's shards when the shard closed the window")
    width_ms: PositiveInt
    window_end_ms: NonNegativeInt = Field(description="the window's end (exclusive), ms since epoch")
    entitlements: tuple[EntitlementWindow, ...] = ()


class _Tokens(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_tokens: NonNegativeInt = 0
    cached_prompt_tokens: NonNegativeInt = Field(0, description="part of prompt_tokens")
    completion_tokens: NonNegativeInt = 0
    requests: NonNegativeInt = 0


class BudgetStatus(Record):
    """One budget's account in its current period, as the agents' ledger holds it (docs/budgets.md): exact to the
    token for every completion event folded so far. Proxies enforce from it plus their own spending since
    ``version``.

    Topic: budgets (compacted), key: ``<pool>/<entitlement>/<budget>/entitlement``, or
    ``<pool>/<entitlement>/<budget>/tenant/<tenant>`` (``topics.budget_keys``; before, ``<pool>/<entitlement>/<budget>``,
    still read). For a tenant-scoped budget the record is one entitlement's part of the tenant's spending (``scope``
    tenant); the tenant's total is the sum of its parts.
    """

    record_type: Literal["budget_status"] = "budget_status"
    pool: str = Field(min_length=1)
    entitlement: str = Field(min_length=1)
    tenant: str
    budget: str = Field(min_length=1)
    scope: BudgetScope
    period: Period
    time_zone: str
    period_start_ms: NonNegativeInt
    period_end_ms: NonNegativeInt = Field(description="exclusive: the reset")
    allowance: NonNegativeFloat = Field(description="units this period: the amount plus what rolled over")
    spent: _Tokens
    spent_units: NonNegativeFloat = Field(description="spent priced at the budget's weights")
    version: PositiveInt = Field(description="grows with every update of this key")
    t_ms: NonNegativeInt = Field(description="when the ledger last changed (the newest completion's event time)")
    through_ms: NonNegativeInt = Field(description="every completion of the entitlement with an event time before "
                                       "this is counted (the pool's watermark when published); a proxy drops its own "
                                       "spending before it and keeps the rest (docs/budgets.md#enforcement)")
    reserved_tokens: dict[str, NonNegativeInt] = Field(
        default_factory=dict, exclude_if=lambda v: not v,
        description="proxy → the tokens (cost_tokens) reserved by its requests of the entitlement admitted before "
                    "through_ms and not completed before it; a proxy adds the other proxies' to its own spending "
                    "(docs/budgets.md#the-others-reservations-in-flight). Absent (not empty) when none is in flight, "
                    "so such a record is the same bytes a consumer older than the field reads")


class UsageRecord(Record):
    """One entitlement's usage on one model in one UTC day: the chargeback ledger (docs/budgets.md#usage).

    Topic: usage (compacted), key: ``<tenant>/<entitlement>/<model>/<day>``. Cumulative: the newest record of a key
    is the day's total so far; totals reconcile exactly with the completion events."""

    record_type: Literal["usage"] = "usage"
    tenant: str
    entitlement: str = Field(min_length=1)
    pool: str = Field(min_length=1)
    model: str
    day: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$", description="UTC date, YYYY-MM-DD")
    labels: dict[str, str] = Field(default_factory=dict, description="billing labels from the entitlement's metadata")
    usage: _Tokens
    version: PositiveInt
    t_ms: NonNegativeInt


class BudgetAlert(Record):
    """A budget's spending reached one of its alert thresholds, once per period and threshold.

    Topic: budget-alerts (compacted), key: ``<pool>/<entitlement>/<budget>/<period_start_ms>/<threshold>``, or for a
    tenant budget ``tenant/<tenant>/<budget>/<period_start_ms>/<threshold>`` (its pool and entitlement then name the
    part whose spending crossed it; ``spent_units`` is the tenant's sum)."""

    record_type: Literal["budget_alert"] = "budget_alert"
    pool: str = Field(min_length=1)
    entitlement: str = Field(min_length=1)
    tenant: str
    budget: str = Field(min_length=1)
    scope: BudgetScope
    period_start_ms: NonNegativeInt
    period_end_ms: NonNegativeInt
    threshold: PositiveFloat = Field(description="fraction of the allowance, e.g. 0.8")
    allowance: NonNegativeFloat
    spent_units: NonNegativeFloat
    t_ms: NonNegativeInt = Field(description="event time of the completion that crossed it")


class DeadLetterReason(StrEnum):
    MALFORMED = "malformed"
    UNKNOWN_VERSION = "unknown_version"
    UNKNOWN_TYPE = "unknown_type"
    INVALID = "invalid"
    LATE = "late"


class DeadLetter(Record):
    """A record a consumer could not use, with where it came from. Topic: dead-letters, key: source topic."""

    record_type: Literal["dead_letter"] = "dead_letter"
    source_topic: str
    partition: NonNegativeInt
    offset: NonNegativeInt
    element: NonNegativeInt | None = Field(default=None, description="the element's index when the record was an "
                                           "event_batch and only that element is bad; None: the whole record")
    key: str | None = None
    reason: DeadLetterReason
    detail: str
    payload: str = Field(description="the original value (or the bad element's JSON) as text, lossy for binary, "
                         "truncated to 64 KiB")
    consumer: str = ""
    t_ms: NonNegativeInt


RECORD_TYPES: dict[str, type[Record]] = {
    cls.model_fields["record_type"].default: cls
    for cls in (
        RequestDecided,
        RequestCompleted,
        BackendMetricsSample,
        SpecRecord,
        LimitUpdate,
        EffectiveLimit,
        ScaleCommand,
        ProxyHeartbeat,
        DeadLetter,
        WindowSummary,
        BudgetStatus,
        UsageRecord,
        BudgetAlert,
    )
}
