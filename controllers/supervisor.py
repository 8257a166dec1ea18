"""Independent loops in one process, each restarted on its own (docs/conventions.md#errors).

- ``RetryableError``: the loop is restarted after ``Backoff.delay_s`` (at least the error's own ``delay_s``).
- ``PermanentError``: that loop stops and says why; the others keep running. The process ends when none is left.
- Anything else is a bug or an error no shell has classified yet: logged with its traceback, then treated as
  retryable, so one loop's surprise never takes the others down.

Warnings are throttled: one line per loop per ``interval_s`` with how many were suppressed since (``ThrottledLog``).
A loop that ran for longer than ``Backoff.max_s`` before failing starts again from the first delay.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from tokenpools.errors import PermanentError, RetryableError

log = logging.getLogger("tokenpools.controllers")


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


class ThrottledLog:
    """At most one line per key per ``interval_s``; the next line says how many were suppressed."""

    def __init__(self, logger: logging.Logger, interval_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._log, self._interval_s, self._clock = logger, interval_s, clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def log(self, level: int, key: str, message: str, *args: object, exc_info: BaseException | None = None) -> bool:
        now = self._clock()
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


class LoopState(enum.StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    BACKING_OFF = "backing_off"
    STOPPED = "stopped"  # returned normally (shutdown)
    FAILED = "failed"  # a PermanentError: not restarted


@dataclass(slots=True)
class LoopStatus:
    name: str
    state: LoopState = LoopState.STARTING
    restarts: int = 0
    last_error: str = ""
    errors: dict[str, int] = field(default_factory=dict)  # error class → count


LoopFactory = Callable[[], Awaitable[None]]


async def supervise(name: str, run: LoopFactory, status: LoopStatus, backoff: Backoff, throttled: ThrottledLog,
                    clock: Callable[[], float] = time.monotonic) -> None:
    """Run ``run()`` until it returns, restarting it as its errors say (see the module docstring)."""
    attempt = 0
    while True:
        started = clock()
        status.state = LoopState.RUNNING
        try:
            await run()
        except asyncio.CancelledError:
            status.state = LoopState.STOPPED
            raise
        except PermanentError as exc:
            status.state, status.last_error = LoopState.FAILED, str(exc)
            status.errors[type(exc).__name__] = status.errors.get(type(exc).__name__, 0) + 1
            log.error("%s loop stopped: %s (not retried; the other loops keep running)", name, exc)
            return
        except Exception as exc:  # noqa: BLE001 — classified right here
            if clock() - started > backoff.max_s:
                attempt = 0
            hint = exc.delay_s if isinstance(exc, RetryableError) else 0.0
            delay = backoff.delay_s(attempt, hint)
            status.state, status.last_error, status.restarts = LoopState.BACKING_OFF, str(exc) or repr(exc), status.restarts + 1
            status.errors[type(exc).__name__] = status.errors.get(type(exc).__name__, 0) + 1
            if isinstance(exc, RetryableError):
                throttled.log(logging.WARNING, name, "%s loop: %s; restarting in %.1f s", name, exc, delay)
            else:
                throttled.log(logging.ERROR, name, "%s loop: unexpected %s; restarting in %.1f s", name,
                              type(exc).__name__, delay, exc_info=exc)
            attempt += 1
            await asyncio.sleep(delay)
            continue
        status.state = LoopState.STOPPED
        return


async def run_loops(loops: Mapping[str, LoopFactory], backoff: Backoff | None = None, throttled: ThrottledLog | None = None,
                    statuses: dict[str, LoopStatus] | None = None) -> dict[str, LoopStatus]:
    """Supervise every loop concurrently until all have stopped (or this is cancelled); their final statuses."""
    backoff = backoff or Backoff()
    throttled = throttled or ThrottledLog(log)
    statuses = statuses if statuses is not None else {}
    for name in loops:
        statuses.setdefault(name, LoopStatus(name))
    tasks = [asyncio.create_task(supervise(n, f, statuses[n], backoff, throttled), name=f"loop-{n}") for n, f in loops.items()]
    try:
        await asyncio.gather(*tasks)
    except asyncio.CancelledError:
        # gather has cancelled every loop once; wait for their clean-up (closing clients) without cancelling it too
        await asyncio.wait(tasks)
        raise
    return statuses
