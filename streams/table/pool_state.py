"""Per-pool aggregate state S and the two pure functions the agents run on it (docs/conventions.md#windows).

One idea: the per-pool state S of the agents' window algebra (the events folded in, the windows closed and ticked);
the de-duplication by offset and identity and the in-flight counts per proxy are parts of S that ``tick`` reads.

``new(pool, width_ms) -> S``, ``apply_event(S, record, params, at) -> (S, Outcome)`` and
``tick(S, view, horizon_ms, params, proxies) -> TickOutput`` are pure: no Faust, no clock, no I/O. The Faust
table stores S (``streams.state`` serialises it); the agent folds events into it, the timer ticks it.
``apply_event`` is the reference (one event through ``core.accumulator.add``); the agent runs ``streams.batch.fold``,
the same fold for a batch at a fraction of the cost, checked against this one by a property test.

S holds, per pool: the core's usage windows per entitlement (``core.windows``), attempts per (window,
entitlement, proxy) for the per-proxy split, the EWMA signals (b_e, d_e), the frozen ℓ̄*, recent backend-metrics
samples, the index of the last ticked window, and the last offset applied per source partition.

Event time and determinism:
- an event belongs to window ``t_ms // width_ms``; it is *late* when that window has been ticked, or when the
  record itself reached Kafka at or after the window's end + grace (its Kafka timestamp). The second rule makes
  lateness a property of the record, so a worker that catches up after a crash classifies it as the first one did;
- ``tick`` closes every window whose end + grace ≤ ``horizon_ms`` and runs ``core.tick.pool_tick`` (binding, ℓ̄*,
  ``control_tick``: the function the replayer runs too) once per closed window, oldest first, publishing a
  LimitUpdate whose ``version`` and ``t_ms`` are the window's end (ms): identical events give identical updates
  however the ticks were spread over time;
- a pool's first ticked window is its first window with content, never one chosen by the wall clock;
- re-delivered records (at-least-once after a crash) are recognised by their offset and skipped;
- re-sent records (the proxy's spool after an outage longer than its producer's timeout: the broker holds the event
  twice, at two offsets) are recognised by their identity and skipped the same way (``DUPLICATE``): decisions and
  completions carry ``proxy_start_ms`` and ``sequence`` (``core.resends``), and ``seen`` keeps, per *stream* (one
  proxy process's decisions, or its completions, of one entitlement: ``resend_stream``), the numbers seen. A
  stream is forgotten at the tick once its newest event is ``RESEND_MEMORY_MS`` older than the end of the newest
  closed window: a re-send later than that would be counted again. A record without an identity (written before
  the fields existed, or by the replay) is de-duplicated by its offset alone, as always.

Choices recorded here: the version is the window's end in ms (not its index) so it keeps increasing if
``tick_s`` is changed between runs; a catch-up over many windows computes every one of them but returns only
the newest ``max_updates_per_tick`` updates (the topic is compacted: older ones would be overwritten at once);
the scale intent is a level, so only the newest closed window's ScaleCommand is returned. With each update go
the entitlements' effective-limit records of the same window (``topics.effective``), and the entitlements that left
the pool's ticks (no longer in ``signals``, the tick's members) since the last call: their records get tombstones.

In flight per proxy: ``track_in_flight`` keeps, per entitlement and proxy, the requests admitted and not yet
completed, in event time like everything else here: an admission or completion adds ±1 to its window's deltas, and
closing a window folds them into the level as of the window's end (``in_flight``), so the hold-back of a window
depends only on the events, never on how far the worker had read when it ticked (a restored worker ticks the same).
A late event (its window already closed) goes straight into the level: a request that ended late has still ended.
``tick`` grants each proxy its share of an entitlement's (and the pool's) concurrency only as far as the other
proxies are not holding slots (``streams.hold_back``), so a moving split never puts more than the limit in flight.

Reserved per proxy: beside the counts, ``track_in_flight`` keeps the tokens those requests reserved (``reserved``:
an admission's ``cost_tokens`` in, a completion's ``reserved_tokens`` out, ``reservation_delta``), a plain sum over
every tracked event, not split by window: it is only read whole, to seed a restored worker's fleet counts
(``streams.counts.fleet_counts``), whose budget records carry the others' reservations in flight. A cell's sum lives
only while that proxy has requests of it in flight (``add_reserved``): a drained cell starts again from 0, so a
completion of a request admitted before the state began, or a proxy gone with its requests, leaves no residue.
"""

from __future__ import annotations

from collections import deque
from itertools import chain
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import NamedTuple

from tokenpools.core import accumulator, resends
from tokenpools.core.windows import UsageEvent, UsageKind, UsageSample, WindowState
from tokenpools.core.windows import close as close_windows
from tokenpools.core.windows import empty as empty_window
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.scaling import protected_floor
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.split import hold_back_shares, split_limits
from tokenpools.core.tick import Signals, pool_tick
from tokenpools.streams.capacity import MetricsPoint, capacity_at, insert, point_of, prune
from tokenpools.streams.table.params import StreamParams
from tokenpools.topics.effective import departed, effective_limits
from tokenpools.topics.limits import limit_update
from tokenpools.topics.records import (
    BackendMetricsSample,
    EffectiveLimit,
    LimitUpdate,
    ProxyHeartbeat,
    Record,
    RequestCompleted,
    RequestDecided,
    ScaleCommand,
    WindowSummary,
)


RESEND_MEMORY_MS = 3_600_000  # how long a stream's sequence numbers are kept after its newest event (1 h): a copy
# of a stream whose newest event is that much older than the newest closed window's end is counted again (the
# spool re-sends within its outage; an hour is many times the producer's request timeout)
RESEND_MAX_AHEAD_UNSTARTED = 64  # the numbers a stream not yet seen from 1 on keeps above its gap (see ``sight``)


class Outcome(StrEnum):
    APPLIED = "applied"
    LATE = "late"
    DUPLICATE = "duplicate"  # an offset at or before the last one applied from that partition, or a re-send (identity)
    IGNORED = "ignored"  # nothing to count: an unknown key (no entitlement) or another pool's record


class Position(NamedTuple):
    """Where a record came from: ``source`` is "topic/partition"; ``timestamp_ms`` is the Kafka record time.
    (A NamedTuple, not a frozen dataclass: one is built per record on the agent's hot path.)"""

    source: str
    offset: int
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class PoolView:
    """The pool as the specs describe it at a tick: its spec and all its entitlements, oldest first."""

    pool: PoolSpec
    entitlements: tuple[EntitlementSpec, ...]
    # (t_ms of a spec record, the entitlements after it), oldest first (``Catalogue.history_of``): a window closed
    # late is ticked with the membership at its end, as the replay does, not with the one known when it is ticked
    history: tuple[tuple[int, tuple[EntitlementSpec, ...]], ...] = ()

    def entitlements_at(self, t_ms: int) -> tuple[EntitlementSpec, ...]:
        """The entitlements of the newest record at or before ``t_ms``; today's without a history."""
        at = self.history[0][1] if self.history else self.entitlements
        for changed_ms, entitlements in self.history:
            if changed_ms > t_ms:
                break
            at = entitlements
        return at


@dataclass(frozen=True, slots=True)
class PoolState:
    pool: str
    width_ms: int
    closed_through: int | None = None  # index of the last ticked window
    windows: Mapping[str, WindowState] = field(default_factory=dict)
    attempts: Mapping[int, Mapping[str, Mapping[str, int]]] = field(default_factory=dict)  # window→ent→proxy
    signals: Mapping[str, Signals] = field(default_factory=dict)
    mean_slo_ms: float | None = None
    last_version: int | None = None
    metrics: tuple[MetricsPoint, ...] = ()
    offsets: Mapping[str, int] = field(default_factory=dict)
    in_flight: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # entitlement→proxy→level at closed_through's end
    in_flight_deltas: Mapping[int, Mapping[str, Mapping[str, int]]] = field(default_factory=dict)  # window→ent→proxy→±n
    granted: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # the last update's entitlement→proxy→slots
    pool_granted: Mapping[str, int] = field(default_factory=dict)  # the last update's proxy→pool slots
    # a sharded pool's shard only (``streams.shard_windows``): the floors of the in-flight changes that came late since
    # its last close (entitlement→proxy→floor), and its outbox, the summaries of its last close not known to be sent
    late_floor: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    outbox: tuple[WindowSummary, ...] = ()
    seen: Mapping[str, resends.Seen] = field(default_factory=dict)  # resend_stream → its sequence numbers seen
    # entitlement→proxy→tokens its requests in flight reserved (a signed sum of every tracked event; see the docstring)
    reserved: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TickOutput:
    state: PoolState
    updates: list[LimitUpdate]
    scale: ScaleCommand | None
    windows: int = 0  # how many windows this call closed
    skipped: int = 0  # updates computed but not returned (catch-up beyond max_updates_per_tick)
    effective: list[EffectiveLimit] = field(default_factory=list)  # per entitlement, of the windows of ``updates``
    departed: list[str] = field(default_factory=list)  # entitlements whose effective limits end (tombstones)


def new(pool: str, width_ms: int) -> PoolState:
    if width_ms <= 0:
        raise ValueError(f"`width_ms` must be positive, got {width_ms}")
    return PoolState(pool=pool, width_ms=width_ms)


BUDGET_REFUSALS = frozenset({AdmissionOutcome.REFUSED_BUDGET, AdmissionOutcome.BUDGET_UNAVAILABLE})


def _usage(record: Record) -> tuple[UsageEvent, str, str | None] | None:
    if isinstance(record, RequestDecided):
        if record.entitlement is None or record.outcome in BUDGET_REFUSALS:
            return None  # a budget refusal is no demand the pool's limits could serve before the budget's reset (or,
            # budget_unavailable, before the agents' record of it arrives; its decision carries no cost either)
        if record.outcome is AdmissionOutcome.ADMITTED:
            event = UsageEvent(UsageKind.ADMITTED, record.t_ms, record.cost_tokens, 0, record.kv_bytes)
        else:
            event = UsageEvent(UsageKind.REFUSED, record.t_ms, record.cost_tokens)
        return event, record.entitlement, record.proxy_id
    if isinstance(record, RequestCompleted):
        served = record.prompt_tokens + record.completion_tokens
        return UsageEvent(UsageKind.COMPLETED, record.t_ms, 0, served, record.kv_bytes), record.entitlement, None
    return None


def resend_stream(record: RequestDecided | RequestCompleted) -> str | None:
    """The stream a decision or completion is numbered in, ``<entitlement>␟decided|completed␟<proxy_id>@<start>``
    (␟ is 0x1f; the proxy numbers the two kinds apart, per (pool, entitlement), and a state is one pool's); None:
    the record carries no identity."""
    if record.entitlement is None:
        return None
    process = resends.stream_key(record.proxy_id, record.proxy_start_ms, record.sequence)
    if process is None:
        return None
    kind = "decided" if type(record) is RequestDecided else "completed"
    return f"{record.entitlement}\x1f{kind}\x1f{process}"


def sight(seen: resends.Seen | None, record: RequestDecided | RequestCompleted) -> tuple[resends.Seen,
                                                                                     resends.Sighting]:
    """``core.resends.sight`` of an event with an identity, with a tighter bound on a stream never seen from its
    first number on (``through`` 0): a stream forgotten after ``RESEND_MEMORY_MS`` of quiet that resumes at number
    n has a gap 1..n-1 that never fills, so it would hold every new number (and a batch's journal entry rewrite
    them) until ``core.resends.MAX_AHEAD``; here it gives the gap up after ``RESEND_MAX_AHEAD_UNSTARTED`` numbers,
    still room for a new stream's first events arriving out of order (a spool re-append)."""
    bound = resends.MAX_AHEAD if seen is not None and seen.through > 0 else RESEND_MAX_AHEAD_UNSTARTED
    return resends.sight(seen, record.sequence or 0, record.t_ms, bound)


def forget_resends(seen: Mapping[str, resends.Seen], closed_through: int,
                   width_ms: int) -> Mapping[str, resends.Seen]:
    """``seen`` without the streams whose newest event is ``RESEND_MEMORY_MS`` or more before the end of window
    ``closed_through`` (the newest closed: the cut depends on the events, never on when the tick ran); ``seen``
    itself when none goes."""
    kept = resends.forget(seen, (closed_through + 1) * width_ms - RESEND_MEMORY_MS)
    return seen if len(kept) == len(seen) else kept


def is_late(state: PoolState, t_ms: int, timestamp_ms: int | None, grace_ms: int) -> bool:
    index = t_ms // state.width_ms
    if state.closed_through is not None and index <= state.closed_through:
        return True
    return timestamp_ms is not None and timestamp_ms >= (index + 1) * state.width_ms + grace_ms


def apply_event(state: PoolState, record: Record, params: StreamParams,
                at: Position | None = None) -> tuple[PoolState, Outcome]:
    if at is not None:
        last = state.offsets.get(at.source)
        if last is not None and at.offset <= last:
            return state, Outcome.DUPLICATE
        state = replace(state, offsets={**state.offsets, at.source: at.offset})
    if getattr(record, "pool", None) != state.pool:
        return state, Outcome.IGNORED
    if isinstance(record, BackendMetricsSample):
        return replace(state, metrics=insert(state.metrics, point_of(record))), Outcome.APPLIED
    if isinstance(record, (RequestDecided, RequestCompleted)) and (stream := resend_stream(record)) is not None:
        # before the late check: a late event still moves the in-flight level, so a late re-send must be a
        # DUPLICATE, not LATE; and before ``_usage``, so every number is seen (a budget refusal's too: no gaps)
        seen, sighting = sight(state.seen.get(stream), record)
        state = replace(state, seen={**state.seen, stream: seen})
        if sighting is resends.Sighting.AGAIN:
            return state, Outcome.DUPLICATE
    usage = _usage(record)
    if usage is None:
        return state, Outcome.IGNORED
    event, entitlement, proxy_id = usage
    if is_late(state, event.t_ms, at.timestamp_ms if at else None, params.grace_ms):
        return state, Outcome.LATE
    index = event.t_ms // state.width_ms
    window, accepted = accumulator.add(state.windows.get(entitlement) or empty_window(state.width_ms), event)
    if not accepted:
        return state, Outcome.LATE
    state = replace(state, windows={**state.windows, entitlement: window})
    if proxy_id is not None:
        per_window = state.attempts.get(index, {})
        per_entitlement = per_window.get(entitlement, {})
        per_entitlement = {**per_entitlement, proxy_id: per_entitlement.get(proxy_id, 0) + 1}
        state = replace(state, attempts={**state.attempts, index: {**per_window, entitlement: per_entitlement}})
    return state, Outcome.APPLIED


def apply_events(state: PoolState, items: Iterable[tuple[Record, Position | None]],
                 params: StreamParams) -> tuple[PoolState, list[Outcome]]:
    """A fold of ``apply_event``: one call with many events equals many calls."""
    outcomes = []
    for record, at in items:
        state, outcome = apply_event(state, record, params, at)
        outcomes.append(outcome)
    return state, outcomes


def in_flight_changes(items: Iterable[tuple[Record, Position | None]], outcomes: Iterable[Outcome]
                      ) -> Iterator[tuple[RequestDecided | RequestCompleted, str, int]]:
    """The batch's admissions (+1) and completions (−1), with their entitlement: every one the fold counted, not a
    DUPLICATE (seen before) or IGNORED one."""
    for (record, _), outcome in zip(items, outcomes, strict=True):
        if outcome is Outcome.DUPLICATE or outcome is Outcome.IGNORED:
            continue
        if isinstance(record, RequestDecided):
            if record.outcome is AdmissionOutcome.ADMITTED and record.entitlement is not None:
                yield record, record.entitlement, 1
        elif isinstance(record, RequestCompleted):
            yield record, record.entitlement, -1


def track_in_flight(state: PoolState, items: Iterable[tuple[Record, Position | None]],
                    outcomes: Iterable[Outcome]) -> PoolState:
    """Fold a batch's admissions and completions into the per-proxy in-flight deltas, after the batch was folded.

    ``outcomes`` are the fold's (``apply_events`` or ``streams.batch.fold``), one per item: every admission and
    completion of this pool counts except a DUPLICATE (seen before) or IGNORED one. One whose window is still open
    adds to that window's deltas; one whose window was closed (LATE) goes into the level at once, which never goes
    below 0 (a completion whose admission came before a restore).
    """
    deltas = {i: {e: dict(p) for e, p in d.items()} for i, d in state.in_flight_deltas.items()}
    level = {e: dict(p) for e, p in state.in_flight.items()}
    reserved = {e: dict(p) for e, p in state.reserved.items()}
    changed = False
    for record, entitlement, delta in in_flight_changes(items, outcomes):
        index = record.t_ms // state.width_ms
        if state.closed_through is not None and index <= state.closed_through:
            per_proxy = level.setdefault(entitlement, {})
            per_proxy[record.proxy_id] = max(0, per_proxy.get(record.proxy_id, 0) + delta)
        else:
            per_proxy = deltas.setdefault(index, {}).setdefault(entitlement, {})
            per_proxy[record.proxy_id] = per_proxy.get(record.proxy_id, 0) + delta
        add_reserved(reserved, record, entitlement, delta, cell_in_flight(level, deltas, state.closed_through,
                                                                           entitlement, record.proxy_id))
        changed = True
    if not changed:
        return state
    return replace(state, in_flight=nonzero(level), in_flight_deltas={i: d for i, d in deltas.items() if d},
                   reserved=reserved)


def reservation_delta(record: RequestDecided | RequestCompleted, delta: int) -> int:
    """The tokens an admission (``delta`` +1) reserves, or a completion (−1) gives back: its ``cost_tokens``, or
    minus the ``reserved_tokens`` it carries (``core.budget_reservations``)."""
    if delta > 0 and isinstance(record, RequestDecided):
        return record.cost_tokens
    if delta < 0 and isinstance(record, RequestCompleted):
        return -record.reserved_tokens
    raise ValueError(f"no reservation change for a {type(record).__name__} counted {delta:+d}")


def add_reserved(reserved: dict[str, dict[str, int]], record: RequestDecided | RequestCompleted, entitlement: str,
                 delta: int, in_flight_after: int) -> None:
    """An admission's or completion's reservation into the signed per-proxy sums, in place. ``in_flight_after``:
    the cell's requests in flight with this event counted (``cell_in_flight``). A cell that had none before the
    event starts again from 0 (a proxy that died took its requests, and their tokens, with it), and one left with
    none is dropped (a completion of a request admitted before the state began leaves no residue)."""
    proxy = record.proxy_id
    per_proxy = reserved.get(entitlement)
    if in_flight_after <= 0:
        if per_proxy is not None and per_proxy.pop(proxy, None) is not None and not per_proxy:
            del reserved[entitlement]
        return
    if per_proxy is None:
        per_proxy = reserved[entitlement] = {}
    before = per_proxy.get(proxy, 0) if in_flight_after - delta > 0 else 0
    if (tokens := before + reservation_delta(record, delta)) != 0:
        per_proxy[proxy] = tokens
    else:
        per_proxy.pop(proxy, None)
        if not per_proxy:
            del reserved[entitlement]


def cell_in_flight(level: Mapping[str, Mapping[str, int]], deltas: Mapping[int, Mapping[str, Mapping[str, int]]],
                   closed_through: int | None, entitlement: str, proxy: str) -> int:
    """One cell's requests in flight with every tracked change counted: its level and the deltas of the windows
    after ``closed_through`` (``in_flight_through`` for one cell, unclamped)."""
    closed = -1 if closed_through is None else closed_through
    n = level.get(entitlement, {}).get(proxy, 0)
    for i, per_window in deltas.items():
        if i > closed:
            n += per_window.get(entitlement, {}).get(proxy, 0)
    return n


def in_flight_through(state: PoolState, index: int | None = None) -> dict[str, dict[str, int]]:
    """The per-proxy in-flight level at the end of window ``index`` (None: with every tracked event counted): the
    level and the deltas of the windows after ``closed_through`` (a shard keeps its closed windows' late deltas for
    its next summary, ``streams.shard_windows``; they are in its level already).

    Only the entitlements with deltas to add are copied; the others' levels are the state's own (never changed in
    place), kept as they are when already clean (every level > 0)."""
    touched: dict[str, dict[str, int]] = {}
    closed = -1 if state.closed_through is None else state.closed_through
    for i, per_window in state.in_flight_deltas.items():
        if i > closed and (index is None or i <= index):
            for entitlement, per_proxy in per_window.items():
                into = touched.get(entitlement)
                if into is None:
                    into = touched[entitlement] = dict(state.in_flight.get(entitlement, {}))
                for proxy, n in per_proxy.items():
                    into[proxy] = into.get(proxy, 0) + n
    out: dict[str, dict[str, int]] = {}
    for entitlement, counts in [*state.in_flight.items(), *((e, c) for e, c in touched.items()
                                                             if e not in state.in_flight)]:
        counts = touched.get(entitlement, counts)
        if counts and min(counts.values()) > 0:  # clean: the state's own, or this call's copy
            out[entitlement] = counts  # type: ignore[assignment]
        elif kept := {p: n for p, n in counts.items() if n > 0}:
            out[entitlement] = kept
    return out


def nonzero(counts: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    kept = {e: {p: n for p, n in c.items() if n} for e, c in counts.items()}
    return {e: c for e, c in kept.items() if c}


def origin(state: PoolState) -> int | None:
    """The first window with content (usage, attempts or a metrics sample), or None."""
    indices = [i for w in state.windows.values() for i in w.buckets]
    indices += list(state.attempts)
    indices += [p.t_ms // state.width_ms for p in state.metrics]
    return min(indices) if indices else None


def tick(state: PoolState, view: PoolView | None, horizon_ms: int, params: StreamParams,
         proxies: Mapping[str, ProxyHeartbeat] | None = None) -> TickOutput:
    """Close every window whose end + grace ≤ ``horizon_ms``; one control tick per closed window, in order."""
    last = (horizon_ms - params.grace_ms) // state.width_ms - 1
    first = origin(state) if state.closed_through is None else state.closed_through + 1
    if first is None or last < first:
        return TickOutput(state, [], None)
    updates: deque[LimitUpdate] = deque(maxlen=params.max_updates_per_tick)
    effective: deque[list[EffectiveLimit]] = deque(maxlen=params.max_updates_per_tick)
    scale = None
    before = set(state.signals)  # the entitlements the last tick published
    for index in range(first, last + 1):
        state, update, command, records = _tick_window(state, view, index, params, proxies or {})
        if update is not None:
            updates.append(update)
            effective.append(records)
            scale = command
    closed = last - first + 1
    computed = closed if view is not None else 0
    published = [r for window in effective for r in window]
    seen = forget_resends(state.seen, last, state.width_ms)
    if seen is not state.seen:
        state = replace(state, seen=seen)
    gone = departed(before, (r.entitlement for r in published), state.signals)
    return TickOutput(state, list(updates), scale, closed, max(0, computed - len(updates)), published, gone)


def _tick_window(state: PoolState, view: PoolView | None, index: int, params: StreamParams,
                 proxies: Mapping[str, ProxyHeartbeat]
                 ) -> tuple[PoolState, LimitUpdate | None, ScaleCommand | None, list[EffectiveLimit]]:
    end_ms = (index + 1) * state.width_ms
    windows: dict[str, WindowState] = {}
    samples: dict[str, UsageSample | None] = {}
    for name, window in state.windows.items():
        window, closed = close_windows(window, end_ms + params.grace_ms, params.grace_ms)
        windows[name] = window
        samples[name] = closed[-1] if closed else None
    attempts = {i: a for i, a in state.attempts.items() if i > index}
    in_window = state.attempts.get(index, {})
    metrics = prune(state.metrics, end_ms)
    if view is None:  # the pool is not (yet) in the specs: keep counting, decide nothing
        return replace(state, closed_through=index, windows=_keep(windows, set()), attempts=attempts,
                       metrics=metrics, in_flight=in_flight_through(state, index),
                       in_flight_deltas={i: d for i, d in state.in_flight_deltas.items() if i > index}), None, None, []
    pool = view.pool
    cap = capacity_at(pool, state.metrics, end_ms, params.staleness_ms)
    waiting = cap.backend_waiting or 0.0
    ticked = pool_tick(pool, view.entitlements_at(end_ms), end_ms / 1000.0, previous=state.signals,
                       previous_mean_slo_ms=state.mean_slo_ms, mean_slo_frozen=params.mean_slo_frozen, samples=samples,
                       capacity=cap.capacity, backend_waiting=waiting, constants=params.constants,
                       limit_config=params.limit_config, scaling=params.scaling)
    members, mean_slo, result = ticked.members, ticked.mean_slo_ms, ticked.tick
    live = _live_proxies(pool.name, in_window, proxies, end_ms, params.heartbeat_ttl_ms)
    in_flight = in_flight_through(state, index)
    split = None
    if params.proxy_shares and live:  # under counts the proxies divide the limits themselves
        demand, totals = _attempts(members, in_window, live)
        split = split_limits(result.limits, cap.capacity, live, demand, totals)
        split = hold_back_shares(split, result.limits, int(cap.capacity.concurrency), in_flight, state.granted,
                                 state.pool_granted)
    update = limit_update(pool.name, end_ms, end_ms, result, cap.capacity, mean_slo or 0.0, split, waiting)
    granted, pool_granted = split.grants() if split is not None else ({}, {})
    records = effective_limits(update, members, samples, state.width_ms)
    command = ScaleCommand(
        pool=pool.name, version=end_ms, t_ms=end_ms, desired_replicas=result.desired_replicas,
        current_replicas=cap.replicas, floor_replicas=protected_floor(pool, members),
        reason="capacity from backend metrics" if cap.fresh else "backend metrics stale: spec replicas assumed")
    names = {e.name for e in members}
    state = replace(state, closed_through=index, windows=_keep(windows, names), attempts=attempts,
                    signals={e.name: result.signals[e.name] for e in members}, mean_slo_ms=mean_slo,
                    last_version=end_ms, metrics=metrics, in_flight=_of_live(in_flight, set(live)),
                    in_flight_deltas={i: d for i, d in state.in_flight_deltas.items() if i > index},
                    granted=granted, pool_granted=pool_granted)
    return state, update, command, records


def _of_live(in_flight: Mapping[str, Mapping[str, int]], live: set[str]) -> Mapping[str, Mapping[str, int]]:
    """Forget the in-flight counts of proxies no longer live: their requests went with them."""
    if live.issuperset(chain.from_iterable(in_flight.values())):
        return in_flight
    kept = {e: {p: n for p, n in c.items() if p in live} for e, c in in_flight.items()}
    return {e: c for e, c in kept.items() if c}


def _keep(windows: dict[str, WindowState], members: set[str]) -> dict[str, WindowState]:
    """Drop the windows of non-members that hold nothing (no open bucket, nothing in flight)."""
    return {n: w for n, w in windows.items() if n in members or w.buckets or w.in_flight_carry or w.kv_carry}


def _live_proxies(pool: str, in_window: Mapping[str, Mapping[str, int]], proxies: Mapping[str, ProxyHeartbeat],
                  end_ms: int, ttl_ms: int) -> list[str]:
    """Live proxies, by id: seen in the window, or a heartbeat for this pool within the TTL."""
    live = {p for per_proxy in in_window.values() for p in per_proxy}
    live |= {p.proxy_id for p in proxies.values()
             if pool in p.pools and p.started_ms <= end_ms and end_ms - p.t_ms <= ttl_ms}
    return sorted(live)


def _attempts(members: list[EntitlementSpec], in_window: Mapping[str, Mapping[str, int]],
              live: list[str]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """The window's attempts as the split's demand: entitlement → proxy → attempts (members, where there were
    any) and proxy → its attempts over the members (summed in the members' order; 0 for a live proxy that saw
    none)."""
    demand: dict[str, dict[str, float]] = {}
    totals: dict[str, float] = dict.fromkeys(live, 0)
    for e in members:
        per_proxy = in_window.get(e.name)
        if per_proxy:
            counts = {p: float(n) for p, n in per_proxy.items() if n > 0}
            if counts:
                demand[e.name] = counts
                for p, n in counts.items():
                    totals[p] = totals[p] + n
    return demand, totals
