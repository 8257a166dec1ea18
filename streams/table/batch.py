"""The agent's fast path for a batch of events: ``fold(S, items, params)`` == ``pool_state.apply_events``.

``pool_state.apply_event`` goes through ``core.accumulator.add`` once per event, which rebuilds a frozen bucket,
the window state and the pool state each time. Here every entitlement's window gets one
``core.accumulator.Accumulator`` for the batch (the core's own arithmetic, summing in place), and the frozen states are built once per batch.
The unit test ``test_streams_pool_state.py::test_the_batch_fold_equals_the_reference_fold`` checks the result,
event for event, against the reference fold.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from tokenpools.core import resends
from tokenpools.core.windows import UsageKind
from tokenpools.core.windows import empty as empty_window
from tokenpools.core.accumulator import Accumulator
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.streams.capacity import insert, point_of
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.table.pool_state import BUDGET_REFUSALS, Outcome, PoolState, Position, is_late, resend_stream, sight
from tokenpools.topics.records import BackendMetricsSample, Record, RequestCompleted, RequestDecided

_ADMITTED_KIND, _COMPLETED_KIND, _REFUSED_KIND = UsageKind.ADMITTED, UsageKind.COMPLETED, UsageKind.REFUSED
_ADMITTED_OUTCOME = AdmissionOutcome.ADMITTED


def _usage(record: Record) -> tuple[UsageKind, str, int, int, int, int, str | None] | None:
    """What ``pool_state._usage`` extracts, as a plain tuple: (kind, entitlement, t_ms, cost, served, kv, proxy)."""
    if type(record) is RequestDecided:
        if record.entitlement is None or record.outcome in BUDGET_REFUSALS:
            return None
        if record.outcome is _ADMITTED_OUTCOME:
            return (_ADMITTED_KIND, record.entitlement, record.t_ms, record.cost_tokens, 0, record.kv_bytes,
                    record.proxy_id)
        return _REFUSED_KIND, record.entitlement, record.t_ms, record.cost_tokens, 0, 0, record.proxy_id
    if type(record) is RequestCompleted:
        return (_COMPLETED_KIND, record.entitlement, record.t_ms, 0, record.prompt_tokens + record.completion_tokens,
                record.kv_bytes, None)
    return None


def fold(state: PoolState, items: Iterable[tuple[Record, Position | None]],
         params: StreamParams) -> tuple[PoolState, list[Outcome]]:
    width = state.width_ms
    offsets = dict(state.offsets)
    windows = dict(state.windows)
    metrics = state.metrics
    attempts = {i: {e: dict(p) for e, p in a.items()} for i, a in state.attempts.items()}
    seen: dict[str, resends.Seen] | None = None  # copied at the first record with an identity
    accumulators: dict[str, Accumulator] = {}
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
        if isinstance(record, (RequestDecided, RequestCompleted)) and record.sequence is not None:
            stream = resend_stream(record)
            if stream is not None:  # sighted before the late check, as in ``apply_event`` (see there)
                if seen is None:
                    seen = dict(state.seen)
                seen[stream], sighting = sight(seen.get(stream), record)
                if sighting is resends.Sighting.AGAIN:
                    append(Outcome.DUPLICATE)
                    continue
        usage = _usage(record)
        if usage is None:
            append(Outcome.IGNORED)
            continue
        kind, entitlement, t_ms, cost, served, kv, proxy_id = usage
        if is_late(state, t_ms, at.timestamp_ms if at else None, params.grace_ms):
            append(Outcome.LATE)
            continue
        acc = accumulators.get(entitlement)
        if acc is None:
            acc = accumulators[entitlement] = Accumulator(windows.get(entitlement) or empty_window(width))
        if not acc.add_values(kind, t_ms, cost, served, kv):
            append(Outcome.LATE)
            continue
        if proxy_id is not None:
            per_entitlement = attempts.setdefault(t_ms // width, {}).setdefault(entitlement, {})
            per_entitlement[proxy_id] = per_entitlement.get(proxy_id, 0) + 1
        append(Outcome.APPLIED)
    for entitlement, acc in accumulators.items():
        if acc.changed:  # (a window is only created by an event it accepts, as in ``apply_event``)
            windows[entitlement] = acc.state()
    return replace(state, offsets=offsets, windows=windows, metrics=metrics, attempts=attempts,
                   seen=state.seen if seen is None else seen), outcomes
