"""Adding events to the usage windows of ``core.windows``: ``add`` (the algebra's step), ``add_many`` and
``Accumulator``, the in-place form of both for hot loops.

The arithmetic is written once, in ``Accumulator.add_values``: one ``add`` is one accumulator step. It is a module of
its own so that the optional build compiles it (``tokenpools.accel``): the agents fold every request and completion
event through it and the replayer about two per request, while ``core.windows``' frozen dataclasses stay plain
Python (the agents restore them from their state). The sums are kept as a list of Python numbers (``Any``), so
compiled they are added by the same number protocol as in pure Python: the same ints and floats, bit for bit.
Event values are ints (``UsageEvent``'s fields), as the records and the replayer give them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Final

from tokenpools.core.windows import Bucket, UsageEvent, UsageKind, UsageSample, WindowState, close


def add(state: WindowState, event: UsageEvent) -> tuple[WindowState, bool]:
    """Count an event into its window. Returns (new state, accepted); a late event leaves the state unchanged."""
    acc = Accumulator(state)
    accepted = acc.add_values(event.kind, event.t_ms, event.cost_tokens, event.served_tokens, event.kv_bytes)
    return acc.state(), accepted


def add_many(state: WindowState, events: Iterable[UsageEvent]) -> tuple[WindowState, list[bool]]:
    """``add`` folded over ``events`` in one pass: the same state (bit for bit) and each event's ``accepted``."""
    acc = Accumulator(state)
    accepted = [acc.add_values(e.kind, e.t_ms, e.cost_tokens, e.served_tokens, e.kv_bytes) for e in events]
    return acc.state(), accepted


# A bucket's sums as a mutable list, in ``Bucket``'s field order (``Bucket(*sums)`` rebuilds it).
_IN_FLIGHT: Final = 0
_KV: Final = 1
_IN_FLIGHT_INT: Final = 2
_KV_INT: Final = 3
_SERVED: Final = 4
_COMPLETED: Final = 5
_ADMITTED: Final = 6
_ADMITTED_COST: Final = 7
_REFUSED: Final = 8
_REFUSED_COST: Final = 9
_ADMITTED_KIND: Final = UsageKind.ADMITTED
_COMPLETED_KIND: Final = UsageKind.COMPLETED


def _sums(b: Bucket) -> list[Any]:
    return [b.in_flight_delta, b.kv_delta, b.in_flight_integral_ms, b.kv_integral_ms, b.served_tokens, b.completed,
            b.admitted, b.admitted_cost_tokens, b.refused, b.refused_cost_tokens]


class Accumulator:
    """A mutable front of one ``WindowState`` for hot loops: events are summed in place, and ``state()`` is the
    ``WindowState`` that folding ``add`` over the same events gives, bit for bit (the sums are the same
    operations in the same order; ``add`` itself is one step of this class). Only the frozen bucket and state
    objects are built less often: once per ``state()`` instead of once per event.

    Pure like ``core.windows``: it holds no clock and does no I/O; the caller owns the object.
    """

    __slots__ = ("_state", "_width_ms", "_closed_through", "_open")

    def __init__(self, state: WindowState) -> None:
        self._state = state
        self._width_ms: int = state.width_ms
        self._closed_through: int = state.closed_through
        self._open: dict[int, list[Any]] = {}  # window index -> sums not yet folded into ``_state``

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
