"""Scripted event streams and the reference computation the stream tests and the benchmark compare against.

``reference_updates`` runs the core's pure functions directly (``core.windows``, ``core.binding``,
``core.tick.control_tick``, ``topics.limits.build_limit_update``) over a list of events, with none of the agents'
code (no ``streams.pool_state``): what the agents publish through Kafka must equal it.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tokenpools.core import accumulator, windows as W
from tokenpools.core.binding import bind_entitlements
from tokenpools.core.classes import EntitlementState
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.priority import pool_mean_slo_ms
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.tick import Signals, control_tick
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.counts.hold_back import grants_of, hold_back
from tokenpools.topics.limits import build_limit_update
from tokenpools.topics.records import (
    BackendMetricsSample,
    CompletionStatus,
    LimitUpdate,
    Record,
    RequestCompleted,
    RequestDecided,
)

POOL = "pool-a"
CONFIG_YAML = f"""\
apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {{name: {POOL}}}
spec:
  model: test/model
  backendRef: {{name: pool-a-vllm}}
  scaling: {{minReplicas: 1, maxReplicas: 4, replicas: 1}}
  perReplica: {{tokensPerSecond: 480, kvCacheGiB: 8, concurrency: 16}}
  kvBytesPerToken: 147456
  defaults: {{maxTokens: 64}}
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: copilot}}
spec:
  tenantId: tenant-a
  poolRef: {{name: {POOL}}}
  qos: {{serviceClass: elastic, sloTargetMs: 500}}
  resources: {{tokensPerSecond: 180, kvCacheGiB: 3, concurrency: 6}}
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: batch}}
spec:
  tenantId: tenant-b
  poolRef: {{name: {POOL}}}
  qos: {{serviceClass: spot, sloTargetMs: 30000}}
"""
KV_PER_TOKEN = 147_456
Scripted = tuple[Record, int]  # a record and the Kafka timestamp (ms) to produce it with


@dataclass(frozen=True, slots=True)
class Load:
    entitlement: str
    per_window: int  # attempts per window
    refuse_every: int = 0  # every n-th attempt refused (0: none)
    proxies: tuple[str, ...] = ("proxy-1",)


def scripted_events(base_ms: int, width_ms: int, phases: Sequence[tuple[int, Sequence[Load]]], seed: int = 7,
                    pool: str = POOL, metrics_every: int = 1, replicas_ready: int = 1) -> list[Scripted]:
    """Requests (admitted or refused) and completions, window after window; each phase is (windows, loads).

    Events are spread over each window, completions 5–60 % of a window after admission (some fall in the next
    window), a backend-metrics sample every ``metrics_every`` windows. Kafka timestamps equal event times plus a
    few ms, as if produced live; sorted by that timestamp.
    """
    rng = random.Random(seed)
    out: list[Scripted] = []
    window = 0
    for count, loads in phases:
        for _ in range(count):
            start = base_ms + window * width_ms
            if metrics_every and window % metrics_every == 0:
                out.append((BackendMetricsSample(pool=pool, t_ms=start + 1, replicas_ready=replicas_ready,
                                                 running=4.0, waiting=0.0), start + 2))
            for load in loads:
                for i in range(load.per_window):
                    t = start + rng.randrange(width_ms)
                    proxy = load.proxies[i % len(load.proxies)]
                    prompt, max_tokens = rng.randrange(16, 96), 64
                    refused = load.refuse_every > 0 and i % load.refuse_every == load.refuse_every - 1
                    rid = f"{load.entitlement}-{window}-{i}"
                    cost = prompt + max_tokens
                    outcome = AdmissionOutcome.REFUSED_CONCURRENCY if refused else AdmissionOutcome.ADMITTED
                    out.append((RequestDecided(
                        request_id=rid, pool=pool, entitlement=load.entitlement, proxy_id=proxy, t_ms=t,
                        outcome=outcome, reason=outcome.value, prompt_tokens_est=prompt, max_tokens=max_tokens,
                        cost_tokens=cost, kv_bytes=0 if refused else cost * KV_PER_TOKEN, priority=1.0), t + 3))
                    if refused:
                        continue
                    done = t + rng.randrange(width_ms // 20, width_ms * 6 // 10)
                    out.append((RequestCompleted(
                        request_id=rid, pool=pool, entitlement=load.entitlement, proxy_id=proxy, t_ms=done,
                        admitted_t_ms=t, status=CompletionStatus.OK, prompt_tokens=prompt,
                        completion_tokens=rng.randrange(8, max_tokens), reserved_tokens=cost,
                        kv_bytes=cost * KV_PER_TOKEN, ttft_s=0.05, e2e_s=(done - t) / 1000), done + 3))
            window += 1
    out.sort(key=lambda item: item[1])
    return out


def two_class_phases(windows: int = 8) -> list[tuple[int, list[Load]]]:
    """copilot (elastic) steady; batch (spot) joins, overloads with refusals, then backs off."""
    quarter = max(1, windows // 4)
    return [
        (quarter, [Load("copilot", 6)]),
        (quarter, [Load("copilot", 6), Load("batch", 10, proxies=("proxy-1", "proxy-2"))]),
        (quarter, [Load("copilot", 8, refuse_every=4), Load("batch", 30, refuse_every=2, proxies=("proxy-1", "proxy-2"))]),
        (windows - 3 * quarter, [Load("copilot", 4)]),
    ]


def _usage(record: Record) -> tuple[str, W.UsageEvent, str | None] | None:
    if isinstance(record, RequestDecided) and record.entitlement is not None:
        if record.outcome is AdmissionOutcome.ADMITTED:
            return record.entitlement, W.UsageEvent(W.UsageKind.ADMITTED, record.t_ms, record.cost_tokens, 0,
                                                    record.kv_bytes), record.proxy_id
        return record.entitlement, W.UsageEvent(W.UsageKind.REFUSED, record.t_ms, record.cost_tokens), record.proxy_id
    if isinstance(record, RequestCompleted):
        return record.entitlement, W.UsageEvent(W.UsageKind.COMPLETED, record.t_ms, 0,
                                                record.prompt_tokens + record.completion_tokens,
                                                record.kv_bytes), None
    return None


def reference_updates(pool: PoolSpec, entitlements: Sequence[EntitlementSpec], records: Iterable[Record],
                      params: StreamParams, through_index: int) -> list[LimitUpdate]:
    """The limit updates of every window from the first event's through ``through_index`` (no late events)."""
    w = params.width_ms
    records = list(records)
    usage = [u for r in records if (u := _usage(r)) is not None]
    metrics = sorted((r for r in records if isinstance(r, BackendMetricsSample)), key=lambda r: r.t_ms)
    windows = {name: W.empty(w) for name, _, _ in usage}
    attempts: dict[int, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    for name, event, proxy in usage:
        windows[name], ok = accumulator.add(windows[name], event)
        assert ok
        if proxy is not None:
            attempts[event.t_ms // w][name][proxy] += 1
    origin = min([event.t_ms // w for _, event, _ in usage] + [m.t_ms // w for m in metrics])
    signals: dict[str, Signals] = {}
    mean: float | None = None
    updates = []
    in_flight: defaultdict[str, Counter[str]] = defaultdict(Counter)
    grants: tuple[dict[str, dict[str, int]], dict[str, int]] = ({}, {})
    for k in range(origin, through_index + 1):
        end = (k + 1) * w
        samples = {}
        for name in windows:
            windows[name], closed = W.close(windows[name], end + params.grace_ms, params.grace_ms)
            samples[name] = closed[-1] if closed else None
        binding = bind_entitlements(pool, list(entitlements), end / 1000)
        members = [e for e in entitlements if binding[e.name].state is EntitlementState.BOUND]
        mean = pool_mean_slo_ms(mean if params.mean_slo_frozen else None, [e.slo_ms for e in members],
                                params.mean_slo_frozen)
        seen = [m for m in metrics if m.t_ms <= end]
        fresh = seen and end - seen[-1].t_ms <= params.staleness_ms and seen[-1].replicas_ready is not None
        capacity = pool.capacity(seen[-1].replicas_ready if fresh else None)
        waiting = (seen[-1].waiting or 0.0) if seen and end - seen[-1].t_ms <= params.staleness_ms else 0.0
        result = control_tick(pool, members, signals, samples, capacity, mean, int(waiting), params.constants,
                              params.limit_config, params.scaling)
        signals = dict(result.signals)
        proxies = sorted({p for per in attempts.get(k, {}).values() for p in per})
        demand = {p: {e.name: float(n) for e in members if (n := attempts[k][e.name][p]) > 0} for p in proxies}
        shares = demand if params.proxy_shares else {}  # under counts: the fleet limits alone
        update = build_limit_update(pool.name, end, end, result, capacity, mean, shares, waiting)
        for record in records:  # in flight per proxy at the window's end: admitted minus completed before it
            if (end - w <= getattr(record, "t_ms", -1) < end and getattr(record, "entitlement", None) is not None
                    and (isinstance(record, RequestCompleted) or record.outcome is AdmissionOutcome.ADMITTED)):
                per_proxy = in_flight[record.entitlement]
                per_proxy[record.proxy_id] += -1 if isinstance(record, RequestCompleted) else 1
        in_flight = defaultdict(Counter, {e: Counter({p: n for p, n in c.items() if p in demand and n > 0})
                                          for e, c in in_flight.items()})  # a proxy no longer live is forgotten
        update = hold_back(update, {e: dict(c) for e, c in in_flight.items() if c}, *grants)
        grants = grants_of(update)
        updates.append(update)
    return updates


class Sent:
    """A ``Send`` that records (topic, key, value) instead of producing."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, bytes | None]] = []

    async def __call__(self, topic: str, key: bytes, value: bytes | None) -> None:
        self.records.append((topic, key, value))

    def of(self, topic: str) -> list[Record]:
        """The records sent to ``topic``, in order (tombstones left out)."""
        from tokenpools.topics.codec import decode_any

        return [decode_any(v) for t, _, v in self.records if t == topic and v is not None]

    def compacted(self, topic: str) -> dict[bytes, Record]:
        """What a reader of the compacted ``topic`` ends with: the newest record per key, tombstoned keys gone."""
        from tokenpools.topics.codec import decode_any

        table: dict[bytes, Record] = {}
        for t, key, value in self.records:
            if t == topic:
                if value is None:
                    table.pop(key, None)
                else:
                    table[key] = decode_any(value)
        return table


ScriptedBatch = tuple[list[Record], int]  # the records of one Kafka record (an event_batch, or one plain record)


def batched(events: Sequence[Scripted], max_events: int = 50, span_ms: int = 50) -> list[ScriptedBatch]:
    """Scripted events packed the way a proxy packs them (``proxy.events``): per (record type, pool), in order, at
    most ``max_events`` per batch and ``span_ms`` from a batch's first event to its last; each batch is stamped
    with its last event's timestamp (when it was sent) and the batches come in the order they were sent."""
    if max_events < 1 or span_ms < 0:
        raise ValueError(f"`max_events` must be >= 1 and `span_ms` >= 0, got {max_events}, {span_ms}")
    open_: dict[tuple[str, str], tuple[list[Record], int, int]] = {}
    out: list[ScriptedBatch] = []
    for record, ts in events:
        key = (record.record_type, record.pool)  # type: ignore[attr-defined]
        current = open_.get(key)
        if current is not None and (len(current[0]) >= max_events or ts - current[1] > span_ms):
            out.append((current[0], current[2]))
            current = None
        if current is None:
            open_[key] = ([record], ts, ts)
        else:
            current[0].append(record)
            open_[key] = (current[0], current[1], max(current[2], ts))
    out += [(records, last) for records, _, last in open_.values()]
    return sorted(out, key=lambda b: b[1])
