"""Two defects of the admission queue (core.waiting) found while building the proxy's shell around it.

Each test states the behaviour docs/queueing.md promises and fails on the queue as it is; they are strict xfails,
so the fix turns them into failures to remove the mark from. The proxy does not work around either.
"""

from __future__ import annotations

import pytest

from tokenpools.core.admission import Decision
from tokenpools.core.waiting import AdmissionQueue, QueueConfig, WaitRoom

from admission_support import O, controller, limits, spec


@pytest.mark.xfail(strict=True, reason="next_wake_s keeps the stale refill time of a token-budget head below the "
                                       "priority floor, which drain never re-checks: a shell timer re-armed at it "
                                       "fires at once, again and again, until the floor moves or a deadline passes")
def test_the_next_wake_is_always_after_a_drain_at_now() -> None:
    """``next_wake_s`` is when ``drain`` next has something to do: never a moment it has just drained at."""
    ctl = controller((spec("hold"), limits(priority=95.0)), (spec("high"), limits(priority=90.0)),
                     (spec("low"), limits(priority=10.0, tokens_per_s=100.0)), pool_concurrency=1, window_s=1.0)
    queue = AdmissionQueue(ctl, QueueConfig(), WaitRoom(16))
    for name in ("hold", "high", "low"):
        queue.set_spec(spec(name, queue_timeout_ms=5_000))
    ctl.set_bucket_tokens("low", 20.0, 0.0)
    assert queue.admit("hold", "h", 10, 10, 0.0).outcome is O.ADMITTED  # the pool's one slot, priority 95
    high = queue.admit("high", "x", 10, 10, 0.0)  # waits for a slot: the pool's floor
    low = queue.admit("low", "y", 50, 10, 0.0)  # waits for its bucket: 40 tokens short, 400 ms at 100/s
    assert high.decision.outcome is O.REFUSED_LOW_PRIORITY and low.decision.outcome is O.REFUSED_TOKEN_BUDGET
    assert queue.next_wake_s() == pytest.approx(0.4)
    for now_s in (0.4, 0.5, 1.0):
        assert queue.drain(now_s) == []  # below the floor: only deadlines are checked
        wake_s = queue.next_wake_s()
        assert wake_s is not None and wake_s > now_s, f"drained at {now_s}, next wake {wake_s}"


@pytest.mark.xfail(strict=True, reason="a cost above the bucket's depth is refused with the bucket's window as "
                                       "its retry_after_ms (a sign, not a refill time); a timeout at least that "
                                       "long makes it wait, and every later request of its tenant waits behind it")
def test_a_cost_above_the_bucket_depth_never_waits() -> None:
    """docs/queueing.md: a token-budget refusal that cannot refill before its deadline at the current rate does not
    wait. A cost above the bucket's depth never refills at the current rate."""
    ctl = controller((spec("a"), limits(tokens_per_s=100.0)), window_s=1.0)  # depth 100 tokens
    queue = AdmissionQueue(ctl, QueueConfig(), WaitRoom(16))
    queue.set_spec(spec("a", queue_timeout_ms=5_000))
    never = queue.admit("a", "big", 150, 10, 0.0)  # 160 tokens > 100
    assert isinstance(never, Decision) and never.outcome is O.REFUSED_TOKEN_BUDGET
    assert isinstance(queue.admit("a", "small", 10, 10, 0.0), Decision)  # and nobody waits behind it
