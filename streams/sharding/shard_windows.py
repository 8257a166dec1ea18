"""Stage 1 of a sharded pool (docs/scaling.md#the-two-stage-topology): a shard's events → window summaries.

A shard's state is a ``PoolState`` named by its key (``<pool>#<k>``, ``topics.shards``), folded by the same fold
as a pool's (``streams.batch.fold``, here under the pool's name, since the records carry it) with the same
lateness, offsets and windows: every event of an entitlement is in one shard, so the shard's buckets of that
entitlement are bit for bit the ones an unsharded pool's state would hold. What differs is the close: instead of a
control tick, ``close`` hands each closed window over as one ``WindowSummary`` (every closed window, empty ones too:
a summary also says "this shard is through that window") and drops it from the shard's state.

In flight: every admission (+1) and completion (−1) goes into its window's per-proxy deltas, as in
``pool_state.track_in_flight``. One whose window the shard had closed already (late) cannot change a summary sent,
so the next summary carries it apart, in the two forms the pool's decision may need, since whether the pool itself
counts it into its level or its window depends on whether the pool has ticked any window yet (it has, unless it
has had no content at all): per (entitlement, proxy) the (floor, net) of the level change — the shard keeps
``floor`` in the state's ``late_floor`` map, the running level of those events alone since its last close, never
below 0, and ``net`` is their sum in the closed windows' deltas — and per window the deltas themselves. A level L
becomes max(floor, L + net): exactly what adding the events one by one, never below 0, gives (the composition of
x ↦ max(0, x + d) is x ↦ max(a, x + b)). The first close carries the same way the changes of the windows before
the first one it closes (see ``close``).

The shard also keeps its own level (``in_flight``, at its last closed window's end), composed as the pool's is: a
closed window's deltas go into it at the close, a late event at once, never below 0. The hold-back is the
decision's and never reads it; it is what a worker that takes the shard over seeds its fleet counts from
(``pool_state.in_flight_through``: the level and the open windows' deltas), so its N_e are the old worker's.

Takeover: a close keeps the summaries it made in the shard's state (``outbox``, written with the rest of the close),
and a worker that holds a shard's state whose outbox it has not sent sends it first (``streams.processor``); the
pool's decision drops a summary of a window the shard has summarised already (``summaries.merge``), so a re-send
changes nothing and a summary lost between the write and the send is not lost.

Re-sends: the fold recognises a re-sent decision or completion by its identity (``pool_state.resend_stream``) as a
pool's does (every event of an entitlement is in one shard, so are its streams), and a close forgets old streams
by the pool's rule (``pool_state.forget_resends``).

Pure: no Faust, no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields, replace

from tokenpools.core.windows import Bucket
from tokenpools.streams.table.batch import fold
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.table.pool_state import (
    Outcome,
    PoolState,
    Position,
    add_reserved,
    cell_in_flight,
    forget_resends,
    in_flight_changes,
    in_flight_through,
    nonzero,
    origin,
)
from tokenpools.topics.records import EntitlementWindow, Record, WindowSummary
from tokenpools.topics.shards import parse_key

_BUCKET_FIELDS = tuple(f.name for f in fields(Bucket))


def fold_shard(state: PoolState, pool: str, items: list[tuple[Record, Position | None]],
               params: StreamParams) -> tuple[PoolState, list[Outcome]]:
    """``batch.fold`` and the in-flight tracking for a shard's state (named ``<pool>#<k>``) and ``pool``'s records."""
    folded, outcomes = fold(replace(state, pool=pool), items, params)
    return track_in_flight(replace(folded, pool=state.pool), items, outcomes), outcomes


def track_in_flight(state: PoolState, items: Iterable[tuple[Record, Position | None]],
                    outcomes: Iterable[Outcome]) -> PoolState:
    """Admissions (+1) and completions (−1) into their window's deltas; a late one (its window closed by the shard)
    also moves the shard's level (``in_flight``) and the floor of the late changes (``late_floor``), both never below
    0 (see the module docstring). DUPLICATE and IGNORED ones count nothing."""
    deltas = {i: {e: dict(p) for e, p in d.items()} for i, d in state.in_flight_deltas.items()}
    level = {e: dict(p) for e, p in state.in_flight.items()}
    floors = {e: dict(p) for e, p in state.late_floor.items()}
    reserved = {e: dict(p) for e, p in state.reserved.items()}
    changed = False
    for record, entitlement, delta in in_flight_changes(items, outcomes):
        index = record.t_ms // state.width_ms
        per_proxy = deltas.setdefault(index, {}).setdefault(entitlement, {})
        per_proxy[record.proxy_id] = per_proxy.get(record.proxy_id, 0) + delta
        if state.closed_through is not None and index <= state.closed_through:
            for into in (level, floors):
                at = into.setdefault(entitlement, {})
                at[record.proxy_id] = max(0, at.get(record.proxy_id, 0) + delta)
        add_reserved(reserved, record, entitlement, delta, cell_in_flight(level, deltas, state.closed_through,
                                                                           entitlement, record.proxy_id))
        changed = True
    if not changed:
        return state
    return replace(state, in_flight=nonzero(level), late_floor=nonzero(floors),
                   in_flight_deltas={i: d for i, d in deltas.items() if d}, reserved=reserved)


def close(state: PoolState, horizon_ms: int, params: StreamParams, shards: int,
          unsent: tuple[WindowSummary, ...] = ()) -> tuple[PoolState, list[WindowSummary]]:
    """Close every window of the shard whose end + grace ≤ ``horizon_ms``, oldest first: one summary each (empty
    ones too), and the state without them. ``shards``: the pool's count now (recorded).

    The outbox: the state keeps the summaries it returns (``outbox``, in the very value that is written, so a worker
    that dies before sending them leaves them to the next one, which sends them first), after ``unsent`` (the
    outbox as it was, when the caller has not sent it yet: it stays until sent). A close that closes nothing keeps
    the outbox as it is. The closed windows' in-flight deltas go into the shard's level (``in_flight``) as the
    pool's tick puts them into the pool's: a window at a time, never below 0.

    The first close starts at the shard's first window with content; a shard with none yet in a closable window
    (the worker keeps a state for every shard it owns, so that the pool's decision hears from each) says it is
    through the last closable window with one empty summary of it: an event of an earlier window coming after it is late by its
    Kafka timestamp anyway (it reached Kafka after the horizon, so after its window's end + grace).

    The in-flight changes of windows before the first closed one (events late by their Kafka timestamp: no usage,
    no attempts, so no content) go with the first summary as late ones, never dropped: the pool counts every
    admission and completion, and a pool that has ticked nothing (it waits for every shard's first summary) puts
    them into their own windows, as its single stage would have. Their floor is 0: the shard has ticked nothing
    either, so the level is the sum, never below 0."""
    key = parse_key(state.pool)
    if key.shard is None:
        raise ValueError(f"{state.pool!r} is not a shard's key (<pool>#<k>)")
    width = state.width_ms
    last = (horizon_ms - params.grace_ms) // width - 1
    if state.closed_through is None:  # the first close: from the first content, or just "through ``last``"
        content = origin(state)
        first = last if content is None else min(content, last)
    else:
        first = state.closed_through + 1
    if last < first:
        return state, []
    closed = state.closed_through
    # late: the windows closed already; on the first close, the windows before ``first`` (their events were all late
    # by Kafka timestamp, so they made no content, only in-flight changes, which the pool counts nonetheless)
    before = first if closed is None else closed + 1
    late_windows = {i: d for i, d in state.in_flight_deltas.items() if i < before}
    summaries = [_summary(state, key.pool, key.shard, shards, first, late_windows)]
    summaries += [_summary(state, key.pool, key.shard, shards, index, {}) for index in range(first + 1, last + 1)]
    # the closed windows' deltas into the level, a window at a time (those before ``first`` with it, as the pool's
    # first tick takes them); the late windows' changes of a later close are in the level already
    steps: dict[int, dict[int, dict[str, dict[str, int]]]] = {}
    for i, d in state.in_flight_deltas.items():
        if i <= last and (closed is None or i >= before):
            steps.setdefault(max(i, first), {})[i] = d  # type: ignore[assignment]
    level = state.in_flight
    for step in sorted(steps):
        level = in_flight_through(replace(state, in_flight=level, in_flight_deltas=steps[step]))
    windows = {}
    for name, window in state.windows.items():
        kept = {i: b for i, b in window.buckets.items() if i > last}
        if kept:
            windows[name] = replace(window, buckets=kept, closed_through=max(window.closed_through, last))
    state = replace(state, closed_through=last, windows=windows, in_flight=level, late_floor={}, metrics=(),
                    attempts={i: a for i, a in state.attempts.items() if i > last},
                    in_flight_deltas={i: d for i, d in state.in_flight_deltas.items() if i > last},
                    outbox=(*unsent, *summaries), seen=forget_resends(state.seen, last, width))
    return state, summaries


def _summary(state: PoolState, pool: str, shard: int, shards: int, index: int,
             late_windows: dict[int, dict[str, dict[str, int]]]) -> WindowSummary:
    """Window ``index``'s summary; the first of a close also carries the late events (``late_windows``)."""
    attempts = state.attempts.get(index, {})
    deltas = state.in_flight_deltas.get(index, {})
    floors = state.late_floor if late_windows else {}
    names = {n for n, w in state.windows.items() if index in w.buckets} | set(attempts) | set(deltas) | set(floors)
    names |= {n for d in late_windows.values() for n in d}
    parts = []
    for name in sorted(names):
        window = state.windows.get(name)
        bucket = window.buckets.get(index) if window is not None else None
        late = {i: dict(sorted(d[name].items())) for i, d in sorted(late_windows.items()) if name in d}
        net: dict[str, int] = {}
        for per_proxy in late.values():
            for proxy, n in per_proxy.items():
                net[proxy] = net.get(proxy, 0) + n
        floor = floors.get(name, {})
        parts.append(EntitlementWindow(
            name=name, bucket=None if bucket is None else tuple(getattr(bucket, f) for f in _BUCKET_FIELDS),
            attempts=dict(sorted(attempts.get(name, {}).items())),
            in_flight_deltas=dict(sorted(deltas.get(name, {}).items())),
            late_in_flight={p: (floor.get(p, 0), net.get(p, 0)) for p in sorted(set(net) | set(floor))},
            late_windows=late))
    return WindowSummary(pool=pool, shard=shard, shards=shards, width_ms=state.width_ms,
                         window_end_ms=(index + 1) * state.width_ms, entitlements=tuple(parts))
