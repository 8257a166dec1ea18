"""Event-time usage windows per entitlement, as an explicit algebra (docs/conventions.md#windows).

``empty() -> S``, ``add(S, event) -> S`` and ``close(S, now_ms) -> (S, samples)`` are pure; the stream agents keep S
in a Faust table and the replayer keeps it in a dict, and both get identical samples from identical events. This
module holds the state, its types and ``close``; ``add`` (and ``add_many``, and ``Accumulator``, which sums many
events in place for hot loops: one ``add`` is one accumulator step, a single copy of the arithmetic) is in
``core.accumulator``, which the optional build compiles (``tokenpools.accel``) while these dataclasses stay plain.

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
