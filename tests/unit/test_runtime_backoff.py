"""Retry pacing of every component's loops (runtime.backoff): exponential backoff, a loop's failures in a row, and
throttled warnings."""

from __future__ import annotations

import logging
import random

import pytest

from tokenpools.runtime.backoff import Backoff, Retries, ThrottledLog
from tokenpools.runtime.clock import FakeClock


def test_backoff_grows_caps_and_honours_the_error_hint() -> None:
    b = Backoff(initial_s=0.5, max_s=4.0, factor=2.0, jitter=0.0)
    assert [b.delay_s(i) for i in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert b.delay_s(0, at_least_s=3.0) == 3.0
    jittered = Backoff(initial_s=1.0, max_s=1.0, jitter=0.2)
    rng = random.Random(1)
    assert all(0.8 <= jittered.delay_s(0, rng=rng) <= 1.2 for _ in range(100))
    with pytest.raises(ValueError):
        Backoff(initial_s=0)


@pytest.mark.parametrize("bad", [dict(initial_s=2.0, max_s=1.0), dict(factor=0.5), dict(jitter=1.0),
                                 dict(jitter=-0.1)])
def test_backoff_refuses_what_would_not_back_off(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**bad)


def test_retries_grow_with_failures_in_a_row_and_start_over_after_a_success() -> None:
    retries = Retries(Backoff(initial_s=0.5, max_s=4.0, jitter=0.0))
    assert [retries.failed() for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    retries.succeeded()
    assert retries.failed() == 0.5
    assert retries.failed(at_least_s=3.0) == 3.0  # the error's own hint wins when it is longer
    assert retries.attempt == 2


def test_throttled_log_says_how_many_it_suppressed(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    t = ThrottledLog(logging.getLogger("t"), interval_s=10, clock=clock)
    with caplog.at_level(logging.WARNING, "t"):
        assert t.warning("k", "a") and not t.warning("k", "a") and not t.warning("k", "a")
        assert t.warning("other", "b")
        clock.advance(11)
        assert t.warning("k", "a")
    assert [r.getMessage() for r in caplog.records] == ["a", "b", "a (2 more like this in the last 10 s)"]


def test_a_line_said_another_way_starts_the_interval(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    t = ThrottledLog(logging.getLogger("t"), interval_s=10, clock=clock)
    with caplog.at_level(logging.WARNING, "t"):
        t.said("k")
        assert not t.warning("k", "a")
        clock.advance(11)
        assert t.warning("k", "a")
    assert [r.getMessage() for r in caplog.records] == ["a (1 more like this in the last 10 s)"]


def test_throttled_log_formats_arguments_and_keeps_the_level(caplog: pytest.LogCaptureFixture) -> None:
    t = ThrottledLog(logging.getLogger("t"), interval_s=10, clock=FakeClock())
    with caplog.at_level(logging.DEBUG, "t"):
        assert t.log(logging.ERROR, "k", "%s[%d]", "topic", 3)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.ERROR, "topic[3]")]
