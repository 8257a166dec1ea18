"""``AdmissionQueue.next_wake_s`` after a drain: it must never name a moment the drain has already passed.

Found by the replayer, which schedules a wake event at ``next_wake_s``: a line below the priority floor is only
checked for deadlines by ``drain``, so its head keeps an old token-budget refusal whose refill moment is already
past, and ``next_wake_s`` returns it. The proxy's timer, re-armed at that moment after every drain, fires at once,
again and again, while nothing changes (a busy loop until the next release); the replayer schedules its wake at the
next deadline or refill instead. Marked xfail (strict) until ``core.waiting`` is fixed: the fix turns it into a
failure that asks for the mark to go.
"""

from __future__ import annotations

import pytest

from tokenpools.core.waiting import AdmissionQueue, QueueConfig, WaitRoom, Waiter

from admission_support import O, controller, limits, spec


@pytest.mark.xfail(strict=True, reason="core.waiting: a line below the priority floor keeps a stale refill moment "
                                       "that next_wake_s reports after the drain has passed it")
def test_after_a_drain_the_next_wake_is_later_than_the_drain() -> None:
    ctl = controller((spec("hold"), limits(priority=95.0)), (spec("high"), limits(priority=90.0)),
                     (spec("low"), limits(tokens_per_s=100.0, priority=10.0)), pool_concurrency=2, window_s=1.0)
    queue = AdmissionQueue(ctl, QueueConfig(), WaitRoom())
    for name in ("hold", "high", "low"):
        queue.set_spec(spec(name, queue_timeout_ms=500))
    spent = queue.admit("low", "l0", 40, 40, 0.0)  # low's bucket: 100 - 80 = 20 tokens left
    assert not isinstance(spent, Waiter) and spent.ticket is not None
    ctl.release(spent.ticket, 80, 0.0)
    for rid in ("h0", "h1"):  # the pool is full of priority 95
        assert not isinstance(queue.admit("hold", rid, 10, 10, 0.0), Waiter)
    low = queue.admit("low", "l1", 20, 20, 0.01)  # needs 40: waits ~0.19 s for its bucket
    high = queue.admit("high", "x1", 10, 10, 0.02)  # 90 does not exceed the in-flight minimum 95
    assert isinstance(low, Waiter) and low.decision.outcome is O.REFUSED_TOKEN_BUDGET
    assert isinstance(high, Waiter) and high.decision.outcome is O.REFUSED_LOW_PRIORITY
    assert queue.next_wake_s() == pytest.approx(0.2)  # low's refill: right
    assert queue.drain(0.3) == []  # high is refused for low priority: low's line is below the floor, not tried
    wake = queue.next_wake_s()
    assert wake is not None and wake > 0.3  # fails: 0.2, the refill moment the drain at 0.3 has passed
