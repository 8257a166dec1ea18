"""The admission queue (core.waiting): who waits, who is admitted first, and the invariants of its bookkeeping."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.admission import AdmissionController, Decision, Ticket
from tokenpools.core.classes import ServiceClass
from tokenpools.core.waiting import AdmissionQueue, QueueConfig, WaitOutcome, WaitRoom, Waiter

from admission_support import O, controller, limits, spec


def _queue(ctl: AdmissionController, *, room: int = 1024, per_entitlement: int = 64,
           timeout_ms: int = 500) -> AdmissionQueue:
    queue = AdmissionQueue(ctl, QueueConfig(max_waiters_per_entitlement=per_entitlement), WaitRoom(room))
    for name in ctl.entitlement_names():
        queue.set_spec(spec(name, queue_timeout_ms=timeout_ms))
    return queue


def _admitted(result: Decision | Waiter) -> Ticket:
    assert isinstance(result, Decision) and result.admitted, result
    assert result.ticket is not None
    return result.ticket


# ---- who waits -------------------------------------------------------------------------------------------------

def test_timeout_defaults_to_a_fraction_of_the_slo_capped_and_per_class() -> None:
    config = QueueConfig(slo_fraction=0.5, max_timeout_ms=2_000,
                         classes=frozenset({ServiceClass.GUARANTEED, ServiceClass.ELASTIC}))
    assert config.timeout_ms(spec("a")) == 500  # SLO 1000 ms
    assert config.timeout_ms(dataclasses.replace(spec("a"), slo_ms=60_000.0)) == 2_000
    assert config.timeout_ms(spec("s", ServiceClass.SPOT)) == 0
    assert config.timeout_ms(spec("s", ServiceClass.SPOT, queue_timeout_ms=300)) == 300  # its own wins
    assert config.timeout_ms(spec("a", queue_timeout_ms=0)) == 0


def test_a_refusal_for_a_slot_waits_and_is_admitted_on_release() -> None:
    ctl = controller((spec("a"), limits(concurrency=1)))
    queue = _queue(ctl)
    first = _admitted(queue.admit("a", "r1", 10, 10, 0.0))
    waiter = queue.admit("a", "r2", 10, 10, 0.1)
    assert isinstance(waiter, Waiter) and waiter.decision.outcome is O.REFUSED_CONCURRENCY
    assert queue.drain(0.2) == [] and len(queue) == 1
    ctl.release(first, 20, 0.3)
    assert queue.drain(0.3) == [waiter]
    assert waiter.outcome is WaitOutcome.ADMITTED and waiter.decision.admitted
    assert waiter.waited_s == pytest.approx(0.2) and waiter.decision.ticket.admitted_s == 0.3
    assert len(queue) == 0 and queue.room.used == 0


def test_no_wait_when_the_timeout_is_zero_or_the_refusal_cannot_pass() -> None:
    ctl = controller((spec("a"), limits(concurrency=1)), (spec("b"), limits()))
    queue = _queue(ctl, timeout_ms=0)
    _admitted(queue.admit("a", "r1", 10, 10, 0.0))
    assert queue.admit("a", "r2", 10, 10, 0.0).outcome is O.REFUSED_CONCURRENCY
    assert queue.admit("nobody", "r3", 10, 10, 0.0).outcome is O.REFUSED_UNKNOWN_KEY
    assert len(queue) == 0


def test_a_token_budget_that_refills_after_the_deadline_is_refused_at_once() -> None:
    ctl = controller((spec("a"), limits(tokens_per_s=100.0)), window_s=1.0)  # depth 100 tokens
    queue = _queue(ctl, timeout_ms=500)
    _admitted(queue.admit("a", "r1", 40, 40, 0.0))  # 20 left
    short = queue.admit("a", "r2", 30, 10, 0.0)  # needs 40: 200 ms of refill
    assert isinstance(short, Waiter) and queue.next_wake_s() == pytest.approx(0.2)
    assert queue.drain(0.199) == []
    assert queue.drain(0.2) == [short] and short.outcome is WaitOutcome.ADMITTED
    long = queue.admit("a", "r3", 50, 49, 0.2)  # needs 99 from 0: 990 ms > 500 ms
    assert isinstance(long, Decision) and long.outcome is O.REFUSED_TOKEN_BUDGET
    assert queue.outcomes[WaitOutcome.TOO_LONG] == 1


def test_a_slot_that_frees_after_the_deadline_is_refused_at_once_with_its_estimate() -> None:
    """A wait that would time out costs its client the whole timeout before its retry: when the estimate of the next
    release (k x S / n) is past the deadline, the client learns at once, with that estimate."""
    ctl = controller((spec("a"), limits(concurrency=2)))
    queue = _queue(ctl, timeout_ms=500)
    r1 = _admitted(queue.admit("a", "r1", 10, 10, 0.0))
    _admitted(queue.admit("a", "r2", 10, 10, 0.0))
    assert isinstance(queue.admit("a", "r3", 10, 10, 0.0), Waiter)  # no release yet: no estimate, it waits
    assert queue.drain(0.5)[0].outcome is WaitOutcome.TIMED_OUT
    ctl.release(r1, 20, 2.0)  # S = 2 s
    _admitted(queue.admit("a", "r4", 10, 10, 2.0))
    refused = queue.admit("a", "r5", 10, 10, 2.0)  # 1 release needed of 2 in flight: 1 x 2 s / 2 = 1000 ms > 500
    assert isinstance(refused, Decision) and refused.outcome is O.REFUSED_CONCURRENCY
    assert refused.retry_after_ms == 1000 == ctl.slot_estimate_ms("a", O.REFUSED_CONCURRENCY)
    assert queue.outcomes[WaitOutcome.TOO_LONG] == 1 and len(queue) == 0
    patient = _queue(ctl, timeout_ms=1000)  # the same estimate within a longer deadline: it waits
    assert isinstance(patient.admit("a", "r6", 10, 10, 2.0), Waiter)


@settings(max_examples=150, deadline=None)
@given(concurrency=st.integers(1, 6), services=st.lists(st.floats(0.05, 20.0), min_size=0, max_size=6),
       timeout_ms=st.integers(1, 5_000))
def test_a_slot_refusal_waits_exactly_when_its_estimate_is_within_its_deadline(
        concurrency: int, services: list[float], timeout_ms: int) -> None:
    """Invariant: a request refused for a slot waits iff its slot estimate is unknown (nothing learned) or at most its
    timeout; refused at once, it carries its check's own refusal (its retry-after-ms untouched)."""
    ctl = controller((spec("a"), limits(concurrency=concurrency)), pool_concurrency=64)
    queue = _queue(ctl, timeout_ms=timeout_ms)
    t = 0.0
    for i, service in enumerate(services):  # teach S through releases
        ticket = _admitted(queue.admit("a", f"s{i}", 10, 10, t))
        t += service
        ctl.release(ticket, 20, t)
    for i in range(concurrency):  # fill the limit
        _admitted(ctl.admit("a", f"f{i}", 10, 10, t))
    estimate = ctl.slot_estimate_ms("a", O.REFUSED_CONCURRENCY)
    plain = ctl.admit("a", "probe", 10, 10, t)
    result = queue.admit("a", "x", 10, 10, t)
    if estimate is None or estimate <= timeout_ms:
        assert isinstance(result, Waiter)
    else:
        assert isinstance(result, Decision) and result == plain
        assert result.retry_after_ms == min(estimate, 1000)  # the refusal's own, capped as HTTP's hint
        assert queue.outcomes[WaitOutcome.TOO_LONG] == 1


def test_a_refusal_against_a_zero_limit_does_not_wait() -> None:
    """Only the agents raise a limit of 0, and they see demand in refusals: a waiter would hide it."""
    ctl = controller((spec("p", ServiceClass.PREEMPTIBLE), limits(concurrency=0)),
                     (spec("t", ServiceClass.SPOT), limits(tokens_per_s=0.0)))
    queue = _queue(ctl)
    assert queue.admit("p", "r1", 10, 10, 0.0).outcome is O.REFUSED_CONCURRENCY
    assert queue.admit("t", "r2", 10, 10, 0.0).outcome is O.REFUSED_TOKEN_BUDGET
    assert len(queue) == 0 and queue.outcomes[WaitOutcome.ZERO_LIMIT] == 2


def test_a_waiter_times_out_with_a_fresh_refusal_at_its_deadline() -> None:
    ctl = controller((spec("a"), limits(concurrency=1)))
    queue = _queue(ctl, timeout_ms=500)
    _admitted(queue.admit("a", "r1", 10, 10, 0.0))
    waiter = queue.admit("a", "r2", 10, 10, 0.1)
    assert isinstance(waiter, Waiter) and queue.next_wake_s() == pytest.approx(0.6)
    assert queue.drain(0.6) == [waiter]
    assert waiter.outcome is WaitOutcome.TIMED_OUT and waiter.decision.outcome is O.REFUSED_CONCURRENCY
    assert waiter.decision.retry_after_ms > 0 and queue.room.used == 0


# ---- order -----------------------------------------------------------------------------------------------------

def test_a_freed_slot_goes_to_the_highest_priority_waiter_whatever_arrived_first() -> None:
    ctl = controller((spec("low"), limits(priority=10.0)), (spec("high"), limits(priority=90.0)),
                     (spec("hold"), limits(priority=95.0)), pool_concurrency=1)
    queue = _queue(ctl)
    held = _admitted(queue.admit("hold", "h", 10, 10, 0.0))
    low = queue.admit("low", "l", 10, 10, 0.1)
    high = queue.admit("high", "h2", 10, 10, 0.2)
    assert isinstance(low, Waiter) and isinstance(high, Waiter)
    assert low.decision.outcome is O.REFUSED_LOW_PRIORITY
    ctl.release(held, 20, 0.3)
    assert queue.drain(0.3) == [high]  # the pool is full again: low stays (its priority is below high's)
    assert low.outcome is None


def test_inside_an_entitlement_requests_never_overtake() -> None:
    ctl = controller((spec("a"), limits(concurrency=1)))
    queue = _queue(ctl)
    held = _admitted(queue.admit("a", "r0", 10, 10, 0.0))
    first = queue.admit("a", "r1", 10, 10, 0.1)
    second = queue.admit("a", "r2", 10, 10, 0.2)
    assert isinstance(first, Waiter) and isinstance(second, Waiter)
    ctl.release(held, 20, 0.3)
    assert queue.drain(0.3) == [first] and second.outcome is None


def test_a_limit_update_admits_every_waiter_that_now_fits_at_once() -> None:
    ctl = controller((spec("a"), limits(concurrency=1)))
    queue = _queue(ctl)
    _admitted(queue.admit("a", "r0", 10, 10, 0.0))
    waiters = [queue.admit("a", f"r{i}", 10, 10, 0.1) for i in (1, 2, 3)]
    ctl.set_limits("a", limits(concurrency=3), 0.2)
    assert queue.drain(0.2) == waiters[:2] and waiters[2].outcome is None


def test_a_line_refused_for_slots_kept_for_protected_limits_does_not_hold_back_the_protected_line() -> None:
    """A low-priority refusal holds for every lower line only when the pool is full. One for the slots kept for a
    protected limit (the pool over-committed by a removed entitlement's requests) says nothing about the protected
    line below: it is served at the same drain."""
    ctl = controller((spec("g", ServiceClass.GUARANTEED), limits(concurrency=1, priority=5.0)),
                     (spec("e"), limits(concurrency=2, priority=50.0)), (spec("x"), limits(concurrency=1, priority=50.0)),
                     pool_concurrency=3)
    queue = _queue(ctl)
    _admitted(queue.admit("x", "x1", 10, 10, 0.0))
    e1 = _admitted(queue.admit("e", "e1", 10, 10, 0.0))
    _admitted(queue.admit("e", "e2", 10, 10, 0.0))
    g = queue.admit("g", "g1", 10, 10, 0.1)  # a full pool and a lower priority than the floor
    e3 = queue.admit("e", "e3", 10, 10, 0.1)  # e at its limit
    assert isinstance(g, Waiter) and g.decision.outcome is O.REFUSED_LOW_PRIORITY and isinstance(e3, Waiter)
    ctl.remove_entitlement("x")  # x1 still runs: the pool is over-committed by one
    ctl.release(e1, 20, 0.2)
    assert queue.drain(0.2) == [g]  # e3 (higher, first) is refused for g's kept slot; g takes it
    assert g.outcome is WaitOutcome.ADMITTED and e3.outcome is None
    assert e3.decision.outcome is O.REFUSED_LOW_PRIORITY and "kept" in e3.decision.reason


def test_a_blocked_higher_line_does_not_hold_back_a_lower_line_that_fits() -> None:
    """``high`` waits for its own concurrency; a free pool slot still goes to ``low``'s waiter."""
    ctl = controller((spec("high"), limits(concurrency=1, priority=90.0)), (spec("low"), limits(concurrency=1, priority=10.0)),
                     pool_concurrency=4)
    queue = _queue(ctl)
    _admitted(queue.admit("high", "h1", 10, 10, 0.0))
    low_held = _admitted(queue.admit("low", "l1", 10, 10, 0.0))
    high = queue.admit("high", "h2", 10, 10, 0.1)
    low = queue.admit("low", "l2", 10, 10, 0.1)
    ctl.release(low_held, 20, 0.2)
    assert queue.drain(0.2) == [low] and isinstance(high, Waiter) and high.outcome is None


def test_lines_and_the_proxy_room_are_bounded() -> None:
    ctl = controller((spec("a"), limits(concurrency=1)), (spec("b"), limits(concurrency=1)))
    queue = _queue(ctl, room=3, per_entitlement=2)
    for name in ("a", "b"):
        _admitted(queue.admit(name, f"{name}0", 10, 10, 0.0))
    assert all(isinstance(queue.admit("a", f"a{i}", 10, 10, 0.0), Waiter) for i in (1, 2))
    full = queue.admit("a", "a3", 10, 10, 0.0)
    assert isinstance(full, Decision) and full.outcome is O.REFUSED_CONCURRENCY and "2 earlier" in full.reason
    assert isinstance(queue.admit("b", "b1", 10, 10, 0.0), Waiter)
    assert isinstance(queue.admit("b", "b2", 10, 10, 0.0), Decision)  # the proxy's room is full
    assert queue.outcomes[WaitOutcome.QUEUE_FULL] == 2 and queue.room.used == 3


def test_withdrawn_waiters_leave_their_line_and_free_their_room() -> None:
    ctl = controller((spec("a"), limits(concurrency=1)))
    queue = _queue(ctl)
    held = _admitted(queue.admit("a", "r0", 10, 10, 0.0))
    gone = queue.admit("a", "r1", 10, 10, 0.1)
    stays = queue.admit("a", "r2", 10, 10, 0.1)
    assert isinstance(gone, Waiter) and isinstance(stays, Waiter)
    assert queue.withdraw(gone, 0.2) and not queue.withdraw(gone, 0.2)
    assert gone.outcome is WaitOutcome.WITHDRAWN and queue.room.used == 1
    ctl.release(held, 20, 0.3)
    assert queue.drain(0.3) == [stays]


def test_a_protected_waiter_evicts_a_preemptible_request_when_it_is_admitted_into_a_full_pool() -> None:
    ctl = controller((spec("g", ServiceClass.GUARANTEED), limits(tokens_per_s=100.0, priority=900.0)),
                     (spec("p", ServiceClass.PREEMPTIBLE), limits(priority=0.1)), pool_concurrency=2, window_s=1.0)
    queue = _queue(ctl)
    ctl.release(_admitted(queue.admit("g", "g0", 40, 40, 0.0)), 80, 0.05)  # its bucket: 20 of 100 left
    waiter = queue.admit("g", "g1", 20, 20, 0.05)  # needs 40: waits for the refill
    assert isinstance(waiter, Waiter) and waiter.decision.outcome is O.REFUSED_TOKEN_BUDGET
    _admitted(queue.admit("p", "p0", 10, 10, 0.06))
    newest = _admitted(queue.admit("p", "p1", 10, 10, 0.07))  # the pool is full of preemptible work
    wake = queue.next_wake_s()
    assert wake is not None and queue.drain(wake) == [waiter]
    assert waiter.decision.admitted and waiter.decision.evict == (newest,)


# ---- invariants over random traffic ----------------------------------------------------------------------------

_NAMES = ("gold", "silver", "bronze")
_PRIORITY = {"gold": 90.0, "silver": 50.0, "bronze": 10.0}

_arrive = st.tuples(st.just("arrive"), st.sampled_from(_NAMES), st.integers(1, 60))
_op = st.one_of(
    _arrive, _arrive, _arrive,  # arrivals outnumber the rest, so lines form
    st.tuples(st.just("release"), st.integers(0, 50), st.integers(0, 120)),
    st.tuples(st.just("wait"), st.integers(1, 200), st.just(0)),
    st.tuples(st.just("limits"), st.sampled_from(_NAMES), st.integers(0, 4)),
)


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(_op, min_size=20, max_size=80), pool=st.integers(1, 4), per_entitlement=st.integers(1, 6),
       room=st.integers(0, 12))
def test_queue_invariants_over_random_traffic(ops, pool, per_entitlement, room) -> None:
    """Named invariants, checked after every step:
    - bounded: ``room.used`` == waiters in line ≤ the room, and no line is longer than its cap;
    - a fixpoint: a second ``drain`` at the same instant admits nobody (no waiter left that fits);
    - deadlines: with ``drain`` run at every ``next_wake_s``, nobody waits past its deadline;
    - first come, first served inside an entitlement: its waiters are admitted in arrival order;
    - resolved once: a waiter's outcome never changes after it is set.
    """
    ctl = controller(*((spec(n), limits(concurrency=2, tokens_per_s=200.0, priority=_PRIORITY[n])) for n in _NAMES),
                     pool_concurrency=pool, window_s=1.0)
    queue = _queue(ctl, room=room, per_entitlement=per_entitlement, timeout_ms=1000)
    now, n = 0.0, 0
    tickets: list[Ticket] = []
    waiters: list[Waiter] = []
    admitted_order: dict[str, list[int]] = {name: [] for name in _NAMES}

    def absorb(resolved: list[Waiter]) -> None:
        for w in resolved:
            assert w.resolved_s <= w.deadline_s + 1e-9, "waited past its deadline"
            if w.outcome is WaitOutcome.ADMITTED:
                tickets.append(w.decision.ticket)
                admitted_order[w.entitlement].append(w.seq)

    def advance(to: float) -> None:
        nonlocal now
        while (wake := queue.next_wake_s()) is not None and wake <= to:
            assert wake > now, "the next wake names a moment already drained"
            now = max(now, wake)
            absorb(queue.drain(now))
        now = to

    for kind, a, b in ops:
        if kind == "arrive":
            n += 1
            result = queue.admit(a, f"r{n}", b, b, now)
            if isinstance(result, Waiter):
                waiters.append(result)
            elif result.admitted:
                tickets.append(result.ticket)
        elif kind == "limits":  # a limit update: the entitlement's concurrency changes
            ctl.set_limits(a, limits(concurrency=b, tokens_per_s=200.0, priority=_PRIORITY[a]), now)
            absorb(queue.drain(now))
        elif kind == "release" and tickets:
            ctl.release(tickets.pop(a % len(tickets)), b, now)
            absorb(queue.drain(now))
        else:
            advance(now + a / 1000)
        outcomes = [w.outcome for w in waiters]
        assert queue.drain(now) == []
        assert [w.outcome for w in waiters] == outcomes
        assert queue.room.used == len(queue) == sum(w.outcome is None for w in waiters) <= room
        assert all(queue.waiting_of(name) <= per_entitlement for name in _NAMES)
    advance(now + 1.0)
    assert len(queue) == 0 and queue.room.used == 0
    for name, seqs in admitted_order.items():
        assert seqs == sorted(seqs), name


# ---- found by the proxy's and the replayer's shells ---------------------------------------------------------------

def test_a_cost_above_the_bucket_depth_never_waits() -> None:
    """It can never refill at the current rate: it would wait its whole timeout and hold its tenant's line."""
    ctl = controller((spec("a"), limits(tokens_per_s=100.0)), window_s=1.0)  # depth 100 tokens
    queue = AdmissionQueue(ctl, QueueConfig(), WaitRoom(16))
    queue.set_spec(spec("a", queue_timeout_ms=5_000))
    never = queue.admit("a", "big", 150, 10, 0.0)  # 160 tokens > 100
    assert isinstance(never, Decision) and never.outcome is O.REFUSED_TOKEN_BUDGET
    assert isinstance(queue.admit("a", "small", 10, 10, 0.0), Decision)  # and nobody waits behind it
    assert queue.outcomes[WaitOutcome.TOO_LONG] == 1


def test_after_a_drain_the_next_wake_is_later_than_the_drain() -> None:
    """A line below the priority floor keeps its head's old token-budget refusal (drain does not try it): its
    refill moment must not be named as the next wake, or a timer re-armed at it fires again and again."""
    ctl = controller((spec("hold"), limits(priority=95.0)), (spec("high"), limits(priority=90.0)),
                     (spec("low"), limits(tokens_per_s=100.0, priority=10.0)), pool_concurrency=1, window_s=1.0)
    queue = AdmissionQueue(ctl, QueueConfig(), WaitRoom(16))
    for name in ("hold", "high", "low"):
        queue.set_spec(spec(name, queue_timeout_ms=5_000))
    ctl.set_bucket_tokens("low", 20.0, 0.0)
    assert queue.admit("hold", "h", 10, 10, 0.0).outcome is O.ADMITTED  # the pool's one slot, priority 95
    high = queue.admit("high", "x", 10, 10, 0.0)  # waits for a slot: the pool's floor
    low = queue.admit("low", "y", 50, 10, 0.0)  # waits for its bucket: 40 tokens short, 400 ms at 100/s
    assert isinstance(high, Waiter) and high.decision.outcome is O.REFUSED_LOW_PRIORITY
    assert isinstance(low, Waiter) and low.decision.outcome is O.REFUSED_TOKEN_BUDGET
    assert queue.next_wake_s() == pytest.approx(0.4)  # nothing drained yet: its refill counts
    for now_s in (0.4, 0.5, 1.0):
        assert queue.drain(now_s) == []  # below the floor: only deadlines are checked
        wake_s = queue.next_wake_s()
        assert wake_s is not None and wake_s > now_s, f"drained at {now_s}, next wake {wake_s}"
