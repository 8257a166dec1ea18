"""Event-time usage windows per entitlement, as an explicit algebra (docs/conventions.md#windows).

``empty() -> S``, ``add(S, event) -> S`` and ``close(S, now_ms) -> (S, samples)`` are pure; the stream agents keep S
in a Faust table and the replayer keeps it in a dict, and both get identical samples from identical events.
For hot loops, ``Accumulator`` (and ``add_many`` on it) sums many events in place and builds the frozen state
once; it *is* the arithmetic of ``add`` (one ``add`` is one accumulator step), so there is a single copy of it.

Per window [start, start + width) and entitlement the state holds sums only, so adding events is commutative:
one step or many, in any order within the grace period, gives the same result.

- λ̂ (tokens/s): prompt + completion tokens of the requests *completed* in the window ÷ width;
- r̂ (concurrency) and χ̂ (KV bytes): time-weighted averages of in-flight requests and of their reserved KV,
  from +1 at admission and −1 at completion (each event adds ±(window end − t) to an integral; the level at the
  window start is carried from the previous window);
- demand: what was asked for, not what was served: tokens/s = (served + refused requests' cost) ÷ width;
  concurrency and KV = the average in flight scaled by attempts/admissions (at least one slot when anything was
  refused). Retries of a refused request count again: demand is an upper estimate, used to detect saturation.

Events older than the last closed window (past the grace) are *late*: ``add`` reports them instead of counting them.
Samples start at the window of the first event (or after ``start_index`` when one is given) and from then on
every window is emitted, empty or not; closing before the first event only moves the lateness boundary.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import StrEnum

from tokenpools.core.capacity import Capacity


class UsageKind(StrEnum):
    ADMITTED = "admitted"
    COMPLETED = "completed"
    REFUSED = "refused"


@dataclass(frozen=True, slots=True)
class UsageEvent:
    """What the windows need of a request event."""

    kind: UsageKind
    t_ms: int
    cost_tokens: int = 0  # ADMITTED/REFUSED: n_in + the output estimate (at most max_tokens)
    served_tokens: int = 0  # COMPLETED: actual prompt + completion tokens
    kv_bytes: int = 0  # ADMITTED/COMPLETED: the KV reservation taken / released


@dataclass(frozen=True, slots=True)
class Bucket:
    """Sums for one window."""

    in_flight_delta: int = 0
    kv_delta: int = 0
    in_flight_integral_ms: float = 0.0
    kv_integral_ms: float = 0.0
    served_tokens: int = 0
    completed: int = 0
    admitted: int = 0
    admitted_cost_tokens: int = 0
    refused: int = 0
    refused_cost_tokens: int = 0


_EMPTY = Bucket()  # a window nothing happened in (frozen: one for all)


@dataclass(frozen=True, slots=True)
class UsageSample:
    """The result of a closed window."""

    start_ms: int
    width_ms: int
    used: Capacity
    demand: Capacity
    admitted: int
    refused: int
    completed: int
    in_flight_at_end: int


@dataclass(frozen=True, slots=True)
class WindowState:
    """S: open buckets by window index, plus the level carried into the first open window."""

    width_ms: int
    closed_through: int = -1  # index of the last closed window; events at or before it are late
    in_flight_carry: int = 0
    kv_carry: int = 0
    buckets: dict[int, Bucket] = field(default_factory=dict)
    emitting: bool = False  # a sample has been emitted (or start_index given): every later window is emitted


def empty(width_ms: int, start_index: int = -1) -> WindowState:
    """A fresh state; with ``start_index`` >= 0 windows after it are emitted (empty ones too), else from the first
    event's window on."""
    if width_ms <= 0:
        raise ValueError(f"`width_ms` must be positive, got {width_ms}")
    return WindowState(width_ms=width_ms, closed_through=start_index, emitting=start_index >= 0)


def add(state: WindowState, event: UsageEvent) -> tuple[WindowState, bool]:
    """Count an event into its window. Returns (new state, accepted); a late event leaves the state unchanged."""
    acc = Accumulator(state)
    accepted = acc.add_values(event.kind, event.t_ms, event.cost_tokens, event.served_tokens, event.kv_bytes)
    return acc.state(), accepted


def add_many(state: WindowState, events: Iterable[UsageEvent]) -> tuple[WindowState, list[bool]]:
    """``add`` folded over ``events`` in one pass: the same state (bit for bit) and each event's ``accepted``."""
    acc = Accumulator(state)
    add_values = acc.add_values
    accepted = [add_values(e.kind, e.t_ms, e.cost_tokens, e.served_tokens, e.kv_bytes) for e in events]
    return acc.state(), accepted


# A bucket's sums as a mutable list, in ``Bucket``'s field order (``Bucket(*sums)`` rebuilds it).
_IN_FLIGHT, _KV, _IN_FLIGHT_INT, _KV_INT, _SERVED, _COMPLETED, _ADMITTED, _ADMITTED_COST, _REFUSED, _REFUSED_COST = (
    range(10)
)
_ADMITTED_KIND, _COMPLETED_KIND = UsageKind.ADMITTED, UsageKind.COMPLETED


def _sums(b: Bucket) -> list[int | float]:
    return [b.in_flight_delta, b.kv_delta, b.in_flight_integral_ms, b.kv_integral_ms, b.served_tokens, b.completed,
            b.admitted, b.admitted_cost_tokens, b.refused, b.refused_cost_tokens]


class Accumulator:
    """A mutable front of one ``WindowState`` for hot loops: events are summed in place, and ``state()`` is the
    ``WindowState`` that folding ``add`` over the same events gives, bit for bit (the sums are the same
    operations in the same order; ``add`` itself is one step of this class). Only the frozen bucket and state
    objects are built less often: once per ``state()`` instead of once per event.

    Pure like the rest of this module: it holds no clock and does no I/O; the caller owns the object.
    """

    __slots__ = ("_state", "_width_ms", "_closed_through", "_open")

    def __init__(self, state: WindowState) -> None:
        self._state = state
        self._width_ms = state.width_ms
        self._closed_through = state.closed_through
        self._open: dict[int, list[int | float]] = {}  # window index -> sums not yet folded into ``_state``

    @property
    def changed(self) -> bool:
        """Events were accepted since the last ``state()``."""
        return bool(self._open)

    def add(self, event: UsageEvent) -> bool:
        """``add`` in place: count ``event`` into its window; False (and nothing counted) if it is late."""
        return self.add_values(event.kind, event.t_ms, event.cost_tokens, event.served_tokens, event.kv_bytes)

    def add_values(self, kind: UsageKind, t_ms: int, cost_tokens: int = 0, served_tokens: int = 0,
                   kv_bytes: int = 0) -> bool:
        """``add(UsageEvent(kind, t_ms, cost_tokens, served_tokens, kv_bytes))`` without building the event."""
        width = self._width_ms
        index = t_ms // width
        if index <= self._closed_through:
            return False
        s = self._open.get(index)
        if s is None:
            bucket = self._state.buckets.get(index)
            s = self._open[index] = _sums(bucket if bucket is not None else Bucket())
        remaining = (index + 1) * width - t_ms
        if kind is _ADMITTED_KIND:
            s[_IN_FLIGHT] += 1
            s[_KV] += kv_bytes
            s[_IN_FLIGHT_INT] += remaining
            s[_KV_INT] += remaining * kv_bytes
            s[_ADMITTED] += 1
            s[_ADMITTED_COST] += cost_tokens
        elif kind is _COMPLETED_KIND:
            s[_IN_FLIGHT] -= 1
            s[_KV] -= kv_bytes
            s[_IN_FLIGHT_INT] -= remaining
            s[_KV_INT] -= remaining * kv_bytes
            s[_SERVED] += served_tokens
            s[_COMPLETED] += 1
        else:
            s[_REFUSED] += 1
            s[_REFUSED_COST] += cost_tokens
        return True

    def state(self) -> WindowState:
        """The ``WindowState`` with every accepted event counted (the same object while nothing changed)."""
        if self._open:
            buckets = dict(self._state.buckets)
            for index, s in self._open.items():
                buckets[index] = Bucket(*s)
            self._state = replace(self._state, buckets=buckets)
            self._open = {}
        return self._state

    def close(self, now_ms: int, grace_ms: int) -> list[UsageSample]:
        """``close`` in place: close every window whose end + grace ≤ ``now_ms`` and return their samples."""
        self._state, samples = close(self.state(), now_ms, grace_ms)
        self._closed_through = self._state.closed_through
        return samples


def close(state: WindowState, now_ms: int, grace_ms: int) -> tuple[WindowState, list[UsageSample]]:
    """Close every window whose end + grace ≤ now_ms, oldest first, including empty ones after the first event."""
    last_closable = (now_ms - grace_ms) // state.width_ms - 1
    if last_closable <= state.closed_through:
        return state, []
    first = state.closed_through + 1
    if not state.emitting:  # nothing emitted yet: start at the first event's window, not at the lateness boundary
        if not state.buckets or min(state.buckets) > last_closable:
            return replace(state, closed_through=last_closable), []
        first = min(state.buckets)
    samples: list[UsageSample] = []
    in_flight, kv = state.in_flight_carry, state.kv_carry
    buckets = dict(state.buckets)
    for index in range(first, last_closable + 1):
        bucket = buckets.pop(index, _EMPTY)
        samples.append(_result(index, state.width_ms, in_flight, kv, bucket))
        in_flight += bucket.in_flight_delta
        kv += bucket.kv_delta
    return WindowState(state.width_ms, last_closable, in_flight, kv, buckets, emitting=True), samples


def _result(index: int, width_ms: int, in_flight: int, kv: int, b: Bucket) -> UsageSample:
    width_s = width_ms / 1000.0
    avg_in_flight = max(0.0, in_flight + b.in_flight_integral_ms / width_ms)
    avg_kv = max(0.0, kv + b.kv_integral_ms / width_ms)
    used = Capacity(b.served_tokens / width_s, avg_kv, avg_in_flight)
    attempts = b.admitted + b.refused
    scale = attempts / b.admitted if b.admitted else (1.0 if not b.refused else 0.0)
    demand_slots = avg_in_flight * scale if b.admitted else avg_in_flight
    if b.refused:
        demand_slots = max(demand_slots, avg_in_flight + 1.0)
    demand_kv = avg_kv * scale if b.admitted else avg_kv
    demand = Capacity((b.served_tokens + b.refused_cost_tokens) / width_s, demand_kv, demand_slots)
    return UsageSample(
        start_ms=index * width_ms,
        width_ms=width_ms,
        used=used,
        demand=demand,
        admitted=b.admitted,
        refused=b.refused,
        completed=b.completed,
        in_flight_at_end=in_flight + b.in_flight_delta,
    )
