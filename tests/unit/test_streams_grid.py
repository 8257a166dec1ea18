"""The agents' periodic publishers (the counts, the ledgers and tenant alerts) share one loop, ``_on_grid``: on the
wall-clock grid, each step in turn while the agents are ready, a failed step logged and the rest going on."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

import pytest

from tokenpools.runtime.clock import FakeClock
from tokenpools.streams.app import _on_grid

INTERVAL_MS = 1000


class Clocked(SimpleNamespace):
    """The agents as ``_on_grid`` sees them: a wall clock 1 ms before each grid step (so each sleep is 2 ms)."""

    def __init__(self) -> None:
        super().__init__(clock=FakeClock(wall_ms=10 * INTERVAL_MS - 1), ready_answers=[])

    def ready(self) -> bool:
        return self.ready_answers.pop(0) if self.ready_answers else True


async def _rounds(agents: Clocked, steps: list, calls: list, rounds: int) -> None:
    """Run ``_on_grid`` until ``rounds`` rounds have started (each round's first step records one)."""
    task = asyncio.create_task(_on_grid(agents, INTERVAL_MS, steps))
    while calls.count("round") < rounds:
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_each_step_runs_in_turn_and_a_failure_does_not_stop_the_rest(caplog: pytest.LogCaptureFixture
                                                                            ) -> None:
    agents, calls = Clocked(), []

    async def first() -> None:
        calls.append("round")

    async def failing() -> None:
        calls.append("failing")
        raise RuntimeError("broker gone")

    async def last() -> None:
        calls.append("last")

    with caplog.at_level(logging.ERROR, logger="tokenpools.streams.app"):
        await _rounds(agents, [("first", first), ("sends", failing), ("last", last)], calls, 3)
    assert calls[:6] == ["round", "failing", "last", "round", "failing", "last"]
    assert [r.getMessage() for r in caplog.records][:2] == ["sends failed", "sends failed"]


async def test_a_worker_not_ready_skips_the_rest_of_the_round() -> None:
    agents, calls = Clocked(), []
    agents.ready_answers = [False, True, False, True, True]  # round 1: nothing; round 2: first only; round 3: both

    async def first() -> None:
        calls.append("round")

    async def second() -> None:
        calls.append("second")

    await _rounds(agents, [("first", first), ("second", second)], calls, 3)
    assert calls[:3] == ["round", "round", "second"]
