"""Independent loops in one process, each restarted on its own (docs/conventions.md#errors).

- ``RetryableError``: the loop is restarted after ``Backoff.delay_s`` (at least the error's own ``delay_s``).
- ``PermanentError``: that loop stops and says why; the others keep running. The process ends when none is left.
- Anything else is a bug or an error no shell has classified yet: logged with its traceback, then treated as
  retryable, so one loop's surprise never takes the others down.

Warnings are throttled: one line per loop per ``interval_s`` with how many were suppressed since (``ThrottledLog``).
A loop that ran for longer than ``Backoff.max_s`` before failing starts again from the first delay. ``Backoff`` and
``ThrottledLog`` are the runtime's (``tokenpools.runtime.backoff``), shared with the other components' retry loops.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from tokenpools.errors import PermanentError, RetryableError
from tokenpools.runtime.backoff import Backoff, ThrottledLog
from tokenpools.runtime.clock import Clock, SystemClock

log = logging.getLogger("tokenpools.controllers")


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
                    clock: Clock | None = None) -> None:
    """Run ``run()`` until it returns, restarting it as its errors say (see the module docstring)."""
    clock = clock or SystemClock()
    attempt = 0
    while True:
        started = clock.now_s()
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
            if clock.now_s() - started > backoff.max_s:
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
