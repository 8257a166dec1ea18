"""The one clock of every component: logic takes time as an argument, this shell object is what supplies it.

``now_s`` is monotonic seconds (durations, rate limits, TTLs, throttling); ``wall_ms`` is epoch milliseconds (event
times on the wire, window horizons, timestamps in statuses). Components take a ``Clock``; tests pass a
``FakeClock`` that moves only when told.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float:
        """Monotonic seconds: only differences mean anything."""

    def wall_ms(self) -> int:
        """Milliseconds since the epoch."""


class SystemClock:
    __slots__ = ()

    def now_s(self) -> float:
        return time.monotonic()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000


class FakeClock:
    """A clock for tests: both readings move together and only when told (``advance``, ``advance_to``)."""

    __slots__ = ("_now_s", "_wall_ms")

    def __init__(self, wall_ms: int = 1_700_000_000_000, now_s: float = 1000.0) -> None:
        self._wall_ms = wall_ms
        self._now_s = now_s

    def now_s(self) -> float:
        return self._now_s

    def wall_ms(self) -> int:
        return self._wall_ms

    def advance(self, seconds: float) -> None:
        """Move both readings forward by ``seconds`` (>= 0)."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back, got advance({seconds})")
        self._now_s += seconds
        self._wall_ms += round(seconds * 1000)

    def advance_to(self, wall_ms: int) -> None:
        """Move forward until ``wall_ms`` reads ``wall_ms``; a time already passed leaves the clock where it is."""
        step_ms = max(0, wall_ms - self._wall_ms)
        self._now_s += step_ms / 1000
        self._wall_ms += step_ms


def wall_s(clock: Clock) -> float:
    """The wall clock in epoch seconds (the controllers' statuses, expiries and cooldowns are in seconds)."""
    return clock.wall_ms() / 1000
