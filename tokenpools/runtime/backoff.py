"""How loops pace their retries and their warnings: ``Backoff`` (exponential, jitter, cap), ``Retries`` (the
attempt count of one loop) and ``ThrottledLog`` (one line per key per interval).

A loop that reconnects to a broker or an API server waits ``Backoff.delay_s(attempt)`` after each failure in a row
and starts over after a success, so an outage costs few reconnects and a blip costs one short wait; the warning it
logs each time goes through ``ThrottledLog``, so an outage of minutes is a few lines, each saying how many were
suppressed.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from tokenpools.runtime.clock import Clock, SystemClock


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter: ``initial_s · factor^attempt``, capped at ``max_s``, ±``jitter``."""

    initial_s: float = 0.5
    max_s: float = 30.0
    factor: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not (0 < self.initial_s <= self.max_s) or self.factor < 1 or not 0 <= self.jitter < 1:
            raise ValueError(f"invalid backoff {self}")

    def delay_s(self, attempt: int, at_least_s: float = 0.0, rng: random.Random | None = None) -> float:
        base = min(self.max_s, self.initial_s * self.factor ** max(0, attempt))
        spread = 1.0 + self.jitter * (2 * (rng or random).random() - 1) if self.jitter else 1.0
        return max(at_least_s, base * spread)


@dataclass(slots=True)
class Retries:
    """The failures in a row of one loop: each asks for a longer delay, a success starts over."""

    backoff: Backoff
    attempt: int = 0

    def failed(self, at_least_s: float = 0.0) -> float:
        """Count a failure; the seconds to wait before the next attempt."""
        delay = self.backoff.delay_s(self.attempt, at_least_s)
        self.attempt += 1
        return delay

    def succeeded(self) -> None:
        self.attempt = 0


class ThrottledLog:
    """At most one line per key per ``interval_s`` (of ``clock.now_s``); the next line says how many were
    suppressed. ``log`` returns whether the line was written, so a caller may log the rest at a lower level."""

    def __init__(self, logger: logging.Logger, interval_s: float = 30.0, clock: Clock | None = None) -> None:
        if interval_s < 0:
            raise ValueError(f"`interval_s` must be >= 0, got {interval_s}")
        self._log, self._interval_s, self._clock = logger, interval_s, clock or SystemClock()
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(self, level: int, key: str, message: str, *args: object, exc_info: BaseException | None = None) -> bool:
        now = self._clock.now_s()
        last = self._last.get(key)
        if last is not None and now - last < self._interval_s:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        self._last[key] = now
        skipped = self._suppressed.pop(key, 0)
        suffix = f" ({skipped} more like this in the last {self._interval_s:.0f} s)" if skipped else ""
        self._log.log(level, message + suffix, *args, exc_info=exc_info)
        return True

    def warning(self, key: str, message: str, *args: object) -> bool:
        return self.log(logging.WARNING, key, message, *args)

    def said(self, key: str) -> None:
        """Start ``key``'s interval now: a line written another way (one that must never be suppressed) just said
        what its next throttled line would repeat."""
        self._last[key] = self._clock.now_s()
        self._suppressed.pop(key, None)
