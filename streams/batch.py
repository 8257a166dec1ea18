"""The agent's fast path for a batch of events: ``fold(S, items, params)`` == ``pool_state.apply_events``.

``pool_state.apply_event`` goes through ``core.windows.add`` once per event, which rebuilds a frozen bucket, the
window state and the pool state each time (~50 µs an event in CPython). Here the same sums are accumulated in
mutable lists, in event order and with the same arithmetic (so the floats are bit-for-bit equal), and the frozen
states are built once per batch. The bucket arithmetic mirrors ``core.windows.add``; the unit test
``test_streams_pool_state.py::test_the_batch_fold_equals_the_reference_fold`` checks this, event for event, against
the core's own function, so a change in the core cannot silently diverge from it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields, replace

from tokenpools.core import windows as W
from tokenpools.streams.capacity import insert, point_of
from tokenpools.streams.params import StreamParams
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.streams.pool_state import Outcome, PoolState, Position, is_late
from tokenpools.topics.records import BackendMetricsSample, Record, RequestCompleted, RequestDecided

_NAMES = tuple(f.name for f in fields(W.Bucket))
(_IN_FLIGHT, _KV, _IN_FLIGHT_INT, _KV_INT, _SERVED, _COMPLETED, _ADMITTED, _ADMITTED_COST, _REFUSED,
 _REFUSED_COST) = (_NAMES.index(n) for n in (
    "in_flight_delta", "kv_delta", "in_flight_integral_ms", "kv_integral_ms", "served_tokens", "completed",
    "admitted", "admitted_cost_tokens", "refused", "refused_cost_tokens"))
_ADMITTED_KIND, _COMPLETED_KIND, _REFUSED_KIND = W.UsageKind.ADMITTED, W.UsageKind.COMPLETED, W.UsageKind.REFUSED
_EMPTY = tuple(getattr(W.Bucket(), n) for n in _NAMES)


_ADMITTED_OUTCOME = AdmissionOutcome.ADMITTED


def _usage(record: Record) -> tuple[W.UsageKind, str, int, int, int, int, str | None] | None:
    """What ``pool_state._usage`` extracts, as a plain tuple: (kind, entitlement, t_ms, cost, served, kv, proxy)."""
    if type(record) is RequestDecided:
        if record.entitlement is None:
            return None
        if record.outcome is _ADMITTED_OUTCOME:
            return (_ADMITTED_KIND, record.entitlement, record.t_ms, record.cost_tokens, 0, record.kv_bytes,
                    record.proxy_id)
        return _REFUSED_KIND, record.entitlement, record.t_ms, record.cost_tokens, 0, 0, record.proxy_id
    if type(record) is RequestCompleted:
        return (_COMPLETED_KIND, record.entitlement, record.t_ms, 0, record.prompt_tokens + record.completion_tokens,
                record.kv_bytes, None)
    return None


def _accumulate(sums: list, kind: W.UsageKind, t_ms: int, cost: int, served: int, kv: int, end_ms: int) -> None:
    remaining = end_ms - t_ms
    if kind is _ADMITTED_KIND:
        sums[_IN_FLIGHT] += 1
        sums[_KV] += kv
        sums[_IN_FLIGHT_INT] = sums[_IN_FLIGHT_INT] + remaining
        sums[_KV_INT] = sums[_KV_INT] + remaining * kv
        sums[_ADMITTED] += 1
        sums[_ADMITTED_COST] += cost
    elif kind is _COMPLETED_KIND:
        sums[_IN_FLIGHT] -= 1
        sums[_KV] -= kv
        sums[_IN_FLIGHT_INT] = sums[_IN_FLIGHT_INT] - remaining
        sums[_KV_INT] = sums[_KV_INT] - remaining * kv
        sums[_SERVED] += served
        sums[_COMPLETED] += 1
    else:
        sums[_REFUSED] += 1
        sums[_REFUSED_COST] += cost


def fold(state: PoolState, items: Iterable[tuple[Record, Position | None]],
         params: StreamParams) -> tuple[PoolState, list[Outcome]]:
    width = state.width_ms
    offsets = dict(state.offsets)
    windows = dict(state.windows)
    metrics = state.metrics
    attempts = {i: {e: dict(p) for e, p in a.items()} for i, a in state.attempts.items()}
    sums: dict[tuple[str, int], list] = {}
    outcomes: list[Outcome] = []
    append = outcomes.append
    for record, at in items:
        if at is not None:
            last = offsets.get(at.source)
            if last is not None and at.offset <= last:
                append(Outcome.DUPLICATE)
                continue
            offsets[at.source] = at.offset
        if getattr(record, "pool", None) != state.pool:
            append(Outcome.IGNORED)
            continue
        if isinstance(record, BackendMetricsSample):
            metrics = insert(metrics, point_of(record))
            append(Outcome.APPLIED)
            continue
        usage = _usage(record)
        if usage is None:
            append(Outcome.IGNORED)
            continue
        kind, entitlement, t_ms, cost, served, kv, proxy_id = usage
        index = t_ms // width
        window = windows.get(entitlement)
        if is_late(state, t_ms, at.timestamp_ms if at else None, params.grace_ms) or (
                window is not None and index <= window.closed_through):
            append(Outcome.LATE)
            continue
        if window is None:
            windows[entitlement] = W.empty(width)
            window = windows[entitlement]
        key = (entitlement, index)
        acc = sums.get(key)
        if acc is None:
            bucket = window.buckets.get(index)
            acc = sums[key] = [getattr(bucket, n) for n in _NAMES] if bucket else list(_EMPTY)
        _accumulate(acc, kind, t_ms, cost, served, kv, (index + 1) * width)
        if proxy_id is not None:
            per_entitlement = attempts.setdefault(index, {}).setdefault(entitlement, {})
            per_entitlement[proxy_id] = per_entitlement.get(proxy_id, 0) + 1
        append(Outcome.APPLIED)
    touched: dict[str, dict[int, W.Bucket]] = {}
    for (entitlement, index), acc in sums.items():
        touched.setdefault(entitlement, {})[index] = W.Bucket(*acc)
    for entitlement, buckets in touched.items():
        window = windows[entitlement]
        windows[entitlement] = replace(window, buckets={**window.buckets, **buckets})
    return replace(state, offsets=offsets, windows=windows, metrics=metrics, attempts=attempts), outcomes
