"""The one clock (runtime.clock): the system clock's two readings and the fake that tests move by hand."""

from __future__ import annotations

import time

import pytest

from tokenpools.runtime.clock import Clock, FakeClock, SystemClock, wall_s


def test_the_system_clock_reads_monotonic_seconds_and_epoch_milliseconds() -> None:
    clock: Clock = SystemClock()
    before_ms, before_s = time.time_ns() // 1_000_000, time.monotonic()
    wall, now = clock.wall_ms(), clock.now_s()
    assert isinstance(wall, int) and before_ms <= wall <= time.time_ns() // 1_000_000
    assert before_s <= now <= time.monotonic()


def test_the_fake_clock_moves_only_when_told_and_both_readings_together() -> None:
    clock = FakeClock(wall_ms=1_700_000_000_000, now_s=50.0)
    assert (clock.wall_ms(), clock.now_s()) == (1_700_000_000_000, 50.0)
    assert (clock.wall_ms(), clock.now_s()) == (1_700_000_000_000, 50.0)
    clock.advance(1.5)
    assert (clock.wall_ms(), clock.now_s()) == (1_700_000_001_500, 51.5)
    clock.advance_to(1_700_000_002_000)
    assert (clock.wall_ms(), clock.now_s()) == (1_700_000_002_000, 52.0)
    clock.advance_to(1_600_000_000_000)  # in the past: stays
    assert (clock.wall_ms(), clock.now_s()) == (1_700_000_002_000, 52.0)
    assert wall_s(clock) == 1_700_000_002.0
    with pytest.raises(ValueError):
        clock.advance(-1)
