"""Stage 2 of a sharded pool (docs/scaling.md#the-two-stage-topology): the shards' window summaries → the pool's
state, and when the pool may tick a window.

The pool's decision state is the pool's own ``PoolState`` (the one an unsharded pool has): its backend metrics come
as today (key ``<pool>``, folded by ``streams.batch.fold``), its usage as summaries (``shard_windows``) that
``merge`` adds into the same windows, attempts and in-flight deltas the events would have made. Adding a shard's
bucket of an entitlement to an empty bucket gives that very bucket, and no other shard has that entitlement, so
the tick (``pool_state.tick``, unchanged) sees bit for bit the windows an unsharded pool would have.

Each shard's progress (the last window it summarised) is kept in the state's ``offsets`` under ``shard:<k>``
(so it is written and restored with the rest of the state): ``ready_through`` is the last window every shard is
through. ``horizon`` turns that into the close horizon ``pool_state.tick`` takes: a window closes once every shard
summarised it, or at its end + grace + ``shard_grace_ms`` with what came (a missing shard's entitlements are
unmeasured in it: they keep their last limits). A summary of a window the pool already ticked is late: its usage
and attempts are dropped (as a late event's are), its in-flight changes go into the level.

Two de-duplications. A summary's position (its topic/partition and offset, ``Position``) de-duplicates it like an
event: one at or before the last offset applied from its partition was applied already (at-least-once
re-delivery). And a shard summarises its windows in increasing order, once each, except that a worker taking a
shard over re-sends the shard's outbox (the last close's summaries, which the worker before may or may not have
sent, ``shard_windows.close``): so a summary of a window at or before the shard's progress was applied already —
also a late one, whose in-flight changes must not count twice — and is dropped (``RESENT``).

Pure: no Faust, no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields, replace
from enum import StrEnum

from tokenpools.core.windows import Bucket
from tokenpools.core.windows import empty as empty_window
from tokenpools.streams.table.pool_state import PoolState, Position
from tokenpools.topics.records import WindowSummary

PROGRESS = "shard:"  # offsets key prefix: a shard's last summarised window index
_BUCKET_FIELDS = tuple(f.name for f in fields(Bucket))


class Merged(StrEnum):
    APPLIED = "applied"
    LATE = "late"  # its window was ticked already: only its in-flight changes count
    DUPLICATE = "duplicate"  # its position was applied already (at-least-once re-delivery)
    RESENT = "resent"  # its (shard, window) was applied already: a shard's new worker re-sending its outbox
    IGNORED = "ignored"  # another pool's, or another window width's


def progress_key(shard: int) -> str:
    return f"{PROGRESS}{shard}"


def merge(state: PoolState, summary: WindowSummary, at: Position | None = None) -> tuple[PoolState, Merged]:
    """Add one shard's window summary into the pool's state (see the module docstring)."""
    if at is not None:
        last = state.offsets.get(at.source)
        if last is not None and at.offset <= last:
            return state, Merged.DUPLICATE
        state = replace(state, offsets={**state.offsets, at.source: at.offset})
    if summary.pool != state.pool or summary.width_ms != state.width_ms:
        return state, Merged.IGNORED
    index = summary.window_end_ms // state.width_ms - 1
    key = progress_key(summary.shard)
    progress = state.offsets.get(key)
    if progress is not None and index <= progress:  # a shard's windows come in order, but for re-sends
        return state, Merged.RESENT
    late = state.closed_through is not None and index <= state.closed_through
    windows = dict(state.windows)
    attempts = {i: dict(a) for i, a in state.attempts.items()}
    deltas = {i: dict(d) for i, d in state.in_flight_deltas.items()}
    level = {e: dict(p) for e, p in state.in_flight.items()}
    for part in summary.entitlements:
        if state.closed_through is not None:  # the events the shard got late: into the level, as the pool would
            for proxy, (floor, net) in part.late_in_flight.items():
                per_proxy = level.setdefault(part.name, {})
                per_proxy[proxy] = max(floor, per_proxy.get(proxy, 0) + net)
        else:  # a pool that ticked nothing yet counts them into their windows
            for i, late_deltas in part.late_windows.items():
                _add_to(deltas, i, part.name, late_deltas)
        if late:
            for proxy, n in part.in_flight_deltas.items():
                per_proxy = level.setdefault(part.name, {})
                per_proxy[proxy] = max(0, per_proxy.get(proxy, 0) + n)
            continue
        if part.bucket is not None:
            window = windows.get(part.name) or empty_window(state.width_ms)
            windows[part.name] = replace(window, buckets={**window.buckets, index: _added(window.buckets.get(index),
                                                                                           part.bucket)})
        if part.attempts:
            per_entitlement = dict(attempts.setdefault(index, {}).get(part.name, {}))
            for proxy, n in part.attempts.items():
                per_entitlement[proxy] = per_entitlement.get(proxy, 0) + n
            attempts[index][part.name] = per_entitlement
        if part.in_flight_deltas:
            _add_to(deltas, index, part.name, part.in_flight_deltas)
    offsets = {**state.offsets, key: index}
    level = {e: {p: n for p, n in c.items() if n} for e, c in level.items()}
    state = replace(state, windows=windows, attempts=attempts, in_flight={e: c for e, c in level.items() if c},
                    in_flight_deltas=deltas, offsets=offsets)
    return state, Merged.LATE if late else Merged.APPLIED


def _add_to(deltas: dict[int, dict[str, Mapping[str, int]]], index: int, name: str, more: Mapping[str, int]) -> None:
    per_entitlement = dict(deltas.setdefault(index, {}).get(name, {}))
    for proxy, n in more.items():
        per_entitlement[proxy] = per_entitlement.get(proxy, 0) + n
    deltas[index][name] = per_entitlement


def merge_all(state: PoolState, items: Iterable[tuple[WindowSummary, Position | None]]
              ) -> tuple[PoolState, list[Merged]]:
    outcomes = []
    for summary, at in items:
        state, outcome = merge(state, summary, at)
        outcomes.append(outcome)
    return state, outcomes


def _added(bucket: Bucket | None, sums: tuple[int | float, ...]) -> Bucket:
    if bucket is None:
        return Bucket(*sums)
    return Bucket(*(getattr(bucket, f) + s for f, s in zip(_BUCKET_FIELDS, sums, strict=True)))


def ready_through(offsets: Mapping[str, int], shards: int) -> int | None:
    """The last window every one of ``shards`` shards has summarised; None while one has summarised none."""
    through = [offsets.get(progress_key(k)) for k in range(shards)]
    return None if any(t is None for t in through) else min(through)  # type: ignore[type-var]


def heard(previous: Mapping[int, tuple[int | None, int]], offsets: Mapping[str, int], shards: int,
          now_ms: int) -> dict[int, tuple[int | None, int]]:
    """Per shard: (its progress, the wall-clock time it was last seen to change); a shard not seen before counts
    as heard now (a restarted worker gives every shard a full ``shard_grace_ms`` before ticking without it)."""
    out = {}
    for k in range(shards):
        progress = offsets.get(progress_key(k))
        seen = previous.get(k)
        out[k] = seen if seen is not None and seen[0] == progress else (progress, now_ms)
    return out


def horizon(state: PoolState, shards: int, horizon_ms: int, grace_ms: int, shard_grace_ms: int, now_ms: int,
            heard_from: Mapping[int, tuple[int | None, int]]) -> int:
    """The close horizon of the pool's decision: ``horizon_ms`` (the partition's), but no further than the last
    window every shard has summarised, leaving out the shards silent for ``shard_grace_ms`` of wall clock
    (``heard``: a shard that is down; its entitlements are unmeasured in the windows ticked without it). A shard
    that is slow (catching up, loaded) keeps making progress, so it is waited for: a restarted worker's backlog
    ticks exactly. A pool of one shard has no summaries to wait for: ``horizon_ms`` itself (today's single stage)."""
    if shards <= 1:
        return horizon_ms
    bound = horizon_ms
    for k in range(shards):
        progress, since_ms = heard_from.get(k, (None, now_ms))
        if now_ms - since_ms >= shard_grace_ms:
            continue  # silent: not waited for
        if progress is None:
            return 0  # a live shard that has summarised nothing yet: nothing closes
        bound = min(bound, (progress + 1) * state.width_ms + grace_ms)
    return bound
