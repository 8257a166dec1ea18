"""Per-request admission (DESIGN.md §2): the six ordered checks, Retry-After, contention, eviction, settle/refund.

The model-based test of the reserve-then-settle invariant (6) is in test_core_admission_model.py.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.admission import AdmissionController, Decision, EntitlementLimits, Ticket
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState, ServiceClass
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.spec import EntitlementSpec

O = AdmissionOutcome


def spec(name: str, service_class: ServiceClass = ServiceClass.ELASTIC, **kwargs) -> EntitlementSpec:
    baseline = Capacity(100.0, 1e9, 4.0) if service_class.has_baseline else Capacity()
    return EntitlementSpec(name=name, pool="pool", service_class=service_class, slo_ms=1000.0, baseline=baseline,
                           **kwargs)


def limits(concurrency: int = 4, tokens_per_s: float = 100.0, kv_bytes: float = 1e12,
           priority: float = 50.0) -> EntitlementLimits:
    return EntitlementLimits(concurrency, tokens_per_s, kv_bytes, priority)


def controller(*entries: tuple[EntitlementSpec, EntitlementLimits], pool_concurrency: int = 16,
               kv_bytes_per_token: int = 1, default_max_tokens: int = 256, window_s: float = 10.0,
               now_s: float = 0.0) -> AdmissionController:
    ctl = AdmissionController(pool_concurrency, kv_bytes_per_token, default_max_tokens, window_s)
    for s, lim in entries:
        ctl.upsert_entitlement(s, lim, now_s)
    return ctl


def admit(ctl: AdmissionController, name: str | None, rid: str = "r", prompt: int = 50, max_tokens: int | None = 50,
          now_s: float = 0.0) -> Decision:
    return ctl.admit(name, rid, prompt, max_tokens, now_s)


# ---- outcomes and HTTP status --------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("outcome", "status"),
    [
        (O.ADMITTED, 200),
        (O.REFUSED_UNKNOWN_KEY, 401),
        (O.REFUSED_NOT_BOUND, 403),
        (O.REFUSED_CONCURRENCY, 429),
        (O.REFUSED_TOKEN_BUDGET, 429),
        (O.REFUSED_KV, 429),
        (O.REFUSED_LOW_PRIORITY, 429),
    ],
)
def test_outcome_picks_the_http_status(outcome: AdmissionOutcome, status: int) -> None:
    assert outcome.http_status == status
    assert outcome.admitted is (outcome is O.ADMITTED)


def test_every_outcome_has_a_status() -> None:
    assert {o.http_status for o in AdmissionOutcome} <= {200, 401, 403, 429}


def test_refusal_reasons_are_the_designs_wire_names() -> None:
    """The value labels the metric and names the reason in the 429 body (DESIGN.md §2)."""
    assert [o.value for o in (O.REFUSED_CONCURRENCY, O.REFUSED_TOKEN_BUDGET, O.REFUSED_KV, O.REFUSED_LOW_PRIORITY)] \
        == ["concurrency", "token_budget", "kv_cache", "low_priority"]


# ---- check 1: key and state ----------------------------------------------------------------------------------

@pytest.mark.parametrize("key", [None, "nobody"])
def test_unknown_or_missing_key_is_401(key: str | None) -> None:
    ctl = controller((spec("a"), limits()))
    decision = admit(ctl, key)
    assert decision.outcome is O.REFUSED_UNKNOWN_KEY and decision.outcome.http_status == 401
    assert decision.ticket is None and ctl.in_flight == 0


@pytest.mark.parametrize("state", [EntitlementState.PENDING, EntitlementState.DEGRADED, EntitlementState.EXPIRED])
def test_entitlement_that_is_not_bound_is_403_naming_its_state(state: EntitlementState) -> None:
    ctl = controller((spec("a", state=state), limits()))
    decision = admit(ctl, "a")
    assert decision.outcome is O.REFUSED_NOT_BOUND and decision.outcome.http_status == 403
    assert state.value in decision.reason
    assert ctl.in_flight_of("a") == 0


def test_entitlement_past_its_expiry_is_refused_as_expired() -> None:
    ctl = controller((spec("a", expires_at_s=100.0), limits()))
    assert admit(ctl, "a", "r1", now_s=99.9).admitted
    late = admit(ctl, "a", "r2", now_s=100.0)
    assert late.outcome is O.REFUSED_NOT_BOUND and "Expired" in late.reason


# ---- the order of the checks ---------------------------------------------------------------------------------

CHECKS = ("not_bound", "concurrency", "token_budget", "kv", "low_priority")
OUTCOME_OF = {
    "not_bound": O.REFUSED_NOT_BOUND,
    "concurrency": O.REFUSED_CONCURRENCY,
    "token_budget": O.REFUSED_TOKEN_BUDGET,
    "kv": O.REFUSED_KV,
    "low_priority": O.REFUSED_LOW_PRIORITY,
}


def _scenario(failing: frozenset[str]) -> tuple[AdmissionController, Decision]:
    """Entitlement x fails exactly the checks in ``failing``; a request of 100 tokens (50 + 50) is tried.

    The pool holds one slot, taken by "hi" (priority 100), so the pool is contended for x.
    """
    x_limits = limits(
        concurrency=0 if "concurrency" in failing else 4,
        tokens_per_s=5.0 if "token_budget" in failing else 100.0,  # bucket depth 50 < 100 tokens
        kv_bytes=99.0 if "kv" in failing else 1e6,  # 100 tokens · 1 byte
        priority=10.0 if "low_priority" in failing else 200.0,
    )
    x_state = EntitlementState.PENDING if "not_bound" in failing else EntitlementState.BOUND
    ctl = controller((spec("hi", ServiceClass.GUARANTEED), limits(priority=100.0)), (spec("x", state=x_state), x_limits),
                     pool_concurrency=1)
    assert admit(ctl, "hi", "hi-1").admitted
    return ctl, admit(ctl, "x", "x-1", prompt=50, max_tokens=50)


@pytest.mark.parametrize(
    "failing",
    [frozenset(c) for n in range(len(CHECKS) + 1) for c in itertools.combinations(CHECKS, n)],
    ids=lambda f: "+".join(sorted(f)) or "none",
)
def test_first_failing_check_wins(failing: frozenset[str]) -> None:
    """Not Bound beats concurrency beats token budget beats KV beats low priority (all 32 combinations)."""
    ctl, decision = _scenario(failing)
    expected = next((OUTCOME_OF[c] for c in CHECKS if c in failing), O.ADMITTED)
    assert decision.outcome is expected, decision.reason
    if expected is not O.ADMITTED:
        assert decision.ticket is None
        assert ctl.in_flight_of("x") == 0 and ctl.kv_reserved_of("x") == 0 and ctl.in_flight == 1


def test_a_refusal_reserves_nothing() -> None:
    ctl = controller((spec("a"), limits(tokens_per_s=5.0)))
    before = ctl.bucket_tokens_of("a", 0.0)
    assert admit(ctl, "a", prompt=50, max_tokens=50).outcome is O.REFUSED_TOKEN_BUDGET
    assert ctl.bucket_tokens_of("a", 0.0) == before and ctl.in_flight == 0


# ---- check 2: default max_tokens ----------------------------------------------------------------------------

def test_default_max_tokens_is_applied_to_the_cost_and_returned() -> None:
    ctl = controller((spec("a"), limits()), kv_bytes_per_token=147_456, default_max_tokens=256)
    decision = admit(ctl, "a", prompt=64, max_tokens=None)
    assert decision.admitted and decision.max_tokens == 256
    assert decision.ticket is not None
    assert decision.ticket.reserved_tokens == 64 + 256
    assert decision.ticket.reserved_kv_bytes == (64 + 256) * 147_456
    assert ctl.bucket_tokens_of("a", 0.0) == 1000 - 320


def test_explicit_max_tokens_is_kept() -> None:
    ctl = controller((spec("a"), limits()), default_max_tokens=256)
    decision = admit(ctl, "a", prompt=64, max_tokens=16)
    assert decision.max_tokens == 16 and decision.ticket is not None and decision.ticket.reserved_tokens == 80


def test_default_max_tokens_counts_in_the_budget_check() -> None:
    """A 64-token prompt without max_tokens costs 64 + 256: it does not fit a 300-token bucket."""
    ctl = controller((spec("a"), limits(tokens_per_s=30.0)), default_max_tokens=256)  # depth 300
    assert admit(ctl, "a", prompt=64, max_tokens=None).outcome is O.REFUSED_TOKEN_BUDGET
    assert admit(ctl, "a", prompt=64, max_tokens=236).admitted  # exactly 300


def test_kv_check_uses_bytes_per_token() -> None:
    ctl = controller((spec("a"), limits(kv_bytes=100 * 147_456)), kv_bytes_per_token=147_456)
    assert admit(ctl, "a", "r1", prompt=50, max_tokens=50).admitted  # exactly the limit
    assert admit(ctl, "a", "r2", prompt=1, max_tokens=0).outcome is O.REFUSED_KV


@pytest.mark.parametrize(("prompt", "max_tokens"), [(-1, 10), (10, -20)])
def test_negative_token_counts_are_rejected(prompt: int, max_tokens: int) -> None:
    """A negative max_tokens must not mint tokens into the bucket (cost < 0 would pass every check)."""
    ctl = controller((spec("a"), limits()))
    with pytest.raises(ValueError, match="must be >= 0"):
        admit(ctl, "a", prompt=prompt, max_tokens=max_tokens)
    assert ctl.bucket_tokens_of("a", 0.0) == 1000 and ctl.in_flight == 0


# ---- check 3: concurrency ------------------------------------------------------------------------------------

def test_concurrency_limit_is_in_flight_strictly_below_limit() -> None:
    ctl = controller((spec("a"), limits(concurrency=2)))
    first, second = admit(ctl, "a", "r1"), admit(ctl, "a", "r2")
    assert first.admitted and second.admitted
    third = admit(ctl, "a", "r3")
    assert third.outcome is O.REFUSED_CONCURRENCY and third.retry_after_s >= 1
    assert second.ticket is not None
    ctl.release(second.ticket, 100, 0.0)
    assert admit(ctl, "a", "r4").admitted


# ---- check 4: token budget and Retry-After ------------------------------------------------------------------

def test_token_budget_retry_after_is_seconds_until_the_bucket_holds_the_cost() -> None:
    ctl = controller((spec("a"), limits(tokens_per_s=10.0)))  # depth 100
    assert admit(ctl, "a", "r1", prompt=60, max_tokens=10).admitted  # 30 left
    refused = admit(ctl, "a", "r2", prompt=40, max_tokens=25)  # needs 65: 35 short at 10/s → 4 s
    assert refused.outcome is O.REFUSED_TOKEN_BUDGET and refused.retry_after_s == 4
    assert admit(ctl, "a", "r3", prompt=40, max_tokens=25, now_s=3.0).outcome is O.REFUSED_TOKEN_BUDGET
    assert admit(ctl, "a", "r4", prompt=40, max_tokens=25, now_s=4.0).admitted


def test_token_budget_retry_after_is_at_least_one_second() -> None:
    ctl = controller((spec("a"), limits(tokens_per_s=1000.0)))  # depth 10,000
    assert admit(ctl, "a", "r1", prompt=5000, max_tokens=4990).admitted  # 10 left
    refused = admit(ctl, "a", "r2", prompt=10, max_tokens=1)  # 1 token short: 1 ms of refill
    assert refused.outcome is O.REFUSED_TOKEN_BUDGET and refused.retry_after_s == 1


def test_request_larger_than_the_bucket_retries_after_the_window() -> None:
    ctl = controller((spec("a"), limits(tokens_per_s=10.0)), window_s=10.0)  # depth 100, never holds 150
    refused = admit(ctl, "a", prompt=100, max_tokens=50)
    assert refused.outcome is O.REFUSED_TOKEN_BUDGET and refused.retry_after_s == 10
    assert "at most" in refused.reason


def test_zero_rate_retries_after_a_minute() -> None:
    ctl = controller((spec("a"), limits(tokens_per_s=0.0)))
    refused = admit(ctl, "a", prompt=1, max_tokens=1)
    assert refused.outcome is O.REFUSED_TOKEN_BUDGET and refused.retry_after_s == 60


@settings(max_examples=150, deadline=None)
@given(rate=st.integers(1, 500), drained=st.integers(0, 5000), cost=st.integers(1, 5000),
       elapsed=st.sampled_from([0.0, 0.125, 0.5, 1.0, 2.5]))
def test_token_budget_retry_after_is_the_exact_wait(rate: int, drained: int, cost: int, elapsed: float) -> None:
    """Refused for budget ⇒ the same request fits after Retry-After seconds and (if > 1) not a second earlier."""
    depth = rate * 10
    ctl = controller((spec("a"), limits(concurrency=100, tokens_per_s=float(rate))))
    drained = min(drained, depth)
    if drained:
        assert admit(ctl, "a", "drain", prompt=drained, max_tokens=0).admitted
    decision = admit(ctl, "a", "r", prompt=cost, max_tokens=0, now_s=elapsed)
    if decision.admitted or cost > depth:
        return
    assert decision.outcome is O.REFUSED_TOKEN_BUDGET and decision.retry_after_s >= 1
    wait = decision.retry_after_s
    probe = controller((spec("a"), limits(concurrency=100, tokens_per_s=float(rate))))
    if drained:
        probe.admit("a", "drain", drained, 0, 0.0)
    if wait > 1:
        assert probe.admit("a", "early", cost, 0, elapsed + wait - 1).outcome is O.REFUSED_TOKEN_BUDGET
    assert probe.admit("a", "on-time", cost, 0, elapsed + wait).admitted


@pytest.mark.parametrize("retry_after_s", [1, 3])
def test_other_refusals_retry_after_the_configured_seconds(retry_after_s: int) -> None:
    ctl = controller((spec("hi"), limits(priority=100.0)), (spec("a"), limits(concurrency=0)),
                     (spec("b"), limits(kv_bytes=0.0)), (spec("c"), limits(priority=1.0)), pool_concurrency=1)
    ctl.retry_after_s = retry_after_s
    assert admit(ctl, "hi", "hi").admitted
    for name, outcome in (("a", O.REFUSED_CONCURRENCY), ("b", O.REFUSED_KV), ("c", O.REFUSED_LOW_PRIORITY)):
        decision = admit(ctl, name)
        assert decision.outcome is outcome and decision.retry_after_s == retry_after_s


def test_retry_after_below_one_second_is_rejected_at_construction() -> None:
    with pytest.raises(ValueError, match="retry_after_s"):
        AdmissionController(16, 1, 256, 10.0, retry_after_s=0)


def test_bucket_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="token_bucket_window_s"):
        AdmissionController(16, 1, 256, 0.0)


# ---- check 6: contention -------------------------------------------------------------------------------------

def _contended_pool(floor: float, other: float) -> AdmissionController:
    """One slot, held by a request of priority ``floor``; entitlement "b" has priority ``other``."""
    ctl = controller((spec("a"), limits(priority=floor)), (spec("b"), limits(priority=other)), pool_concurrency=1)
    assert admit(ctl, "a", "a-1").admitted
    assert ctl.contended and ctl.min_in_flight_priority() == floor
    return ctl


def test_equal_priority_does_not_exceed_the_in_flight_minimum() -> None:
    decision = admit(_contended_pool(50.0, 50.0), "b")
    assert decision.outcome is O.REFUSED_LOW_PRIORITY and decision.retry_after_s >= 1


def test_priority_just_above_the_in_flight_minimum_is_admitted_into_a_full_pool() -> None:
    """No preemption: the higher priority goes through even though the pool is full (PAPER.md §2.3)."""
    ctl = _contended_pool(50.0, math.nextafter(50.0, math.inf))
    assert admit(ctl, "b").admitted
    assert ctl.in_flight == 2


def test_lower_priority_is_refused_under_contention() -> None:
    assert admit(_contended_pool(50.0, 20.3), "b").outcome is O.REFUSED_LOW_PRIORITY


def test_same_entitlement_cannot_beat_its_own_in_flight_minimum() -> None:
    """Why spot drains to near zero in Exp 1: while it holds the minimum, its own new requests are refused."""
    ctl = controller((spec("s", ServiceClass.SPOT), limits(priority=1.0)), pool_concurrency=1)
    assert admit(ctl, "s", "s-1").admitted
    assert admit(ctl, "s", "s-2").outcome is O.REFUSED_LOW_PRIORITY


def test_uncontended_pool_admits_low_priority() -> None:
    ctl = controller((spec("a"), limits(priority=900.0)), (spec("b"), limits(priority=0.1)), pool_concurrency=2)
    assert admit(ctl, "a", "a-1").admitted
    assert not ctl.contended
    assert admit(ctl, "b", "b-1").admitted  # the pool fills up to its concurrency
    assert ctl.contended
    assert admit(ctl, "b", "b-2").outcome is O.REFUSED_LOW_PRIORITY


def test_backend_waiting_queue_makes_the_pool_contended() -> None:
    ctl = controller((spec("a"), limits(priority=50.0)), (spec("b"), limits(priority=10.0)), pool_concurrency=16)
    assert admit(ctl, "a", "a-1").admitted
    ctl.set_pool(16, backend_waiting=3)
    assert ctl.contended
    assert admit(ctl, "b", "b-1").outcome is O.REFUSED_LOW_PRIORITY
    ctl.set_pool(16, backend_waiting=0)
    assert admit(ctl, "b", "b-2").admitted


def test_waiting_queue_with_nothing_in_flight_has_no_threshold() -> None:
    ctl = controller((spec("b"), limits(priority=0.1)), pool_concurrency=16)
    ctl.set_pool(16, backend_waiting=5)
    assert ctl.contended and ctl.min_in_flight_priority() is None
    assert admit(ctl, "b").admitted


def test_in_flight_requests_keep_the_priority_they_were_admitted_with() -> None:
    """Raising a's priority after admission does not raise the threshold its in-flight request sets."""
    ctl = _contended_pool(50.0, 60.0)
    ctl.set_limits("a", limits(priority=500.0), 1.0)
    assert ctl.min_in_flight_priority() == 50.0
    assert admit(ctl, "b", "b-1", now_s=1.0).admitted  # 60 > 50 (the snapshot), though 60 < 500 (the current)


def test_new_requests_carry_the_current_priority() -> None:
    """Rising debt lets a newer request of the same entitlement beat its own older in-flight one (PAPER.md §2.3)."""
    ctl = controller((spec("synth"), limits(priority=20.3)), pool_concurrency=1)
    first = admit(ctl, "synth", "s-1")
    assert first.admitted and first.ticket is not None and first.ticket.priority == 20.3
    assert admit(ctl, "synth", "s-2").outcome is O.REFUSED_LOW_PRIORITY
    ctl.set_limits("synth", limits(priority=83.1), 5.0)
    second = admit(ctl, "synth", "s-3", now_s=5.0)
    assert second.admitted and second.ticket is not None and second.ticket.priority == 83.1
    assert ctl.min_in_flight_priority() == 20.3
    ctl.release(first.ticket, 100, 6.0)
    assert ctl.min_in_flight_priority() == 83.1


def test_threshold_follows_releases_with_duplicate_priorities() -> None:
    ctl = controller((spec("a"), limits(priority=10.0)), (spec("b"), limits(priority=30.0)), pool_concurrency=8)
    tickets = [admit(ctl, "a", f"a-{i}").ticket for i in range(2)] + [admit(ctl, "b", "b-0").ticket]
    assert all(t is not None for t in tickets)
    assert ctl.min_in_flight_priority() == 10.0
    ctl.release(tickets[0], 100, 0.0)  # type: ignore[arg-type]
    assert ctl.min_in_flight_priority() == 10.0  # the other a request is still in flight
    ctl.release(tickets[1], 100, 0.0)  # type: ignore[arg-type]
    assert ctl.min_in_flight_priority() == 30.0
    ctl.release(tickets[2], 100, 0.0)  # type: ignore[arg-type]
    assert ctl.min_in_flight_priority() is None


# ---- eviction ------------------------------------------------------------------------------------------------

def _full_of_preemptible(n: int = 2) -> tuple[AdmissionController, list[Ticket]]:
    ctl = controller((spec("g", ServiceClass.GUARANTEED), limits(priority=333.0)),
                     (spec("e"), limits(priority=30.0)),
                     (spec("p", ServiceClass.PREEMPTIBLE), limits(concurrency=8, priority=0.03)),
                     pool_concurrency=n)
    tickets = []
    for i in range(n):
        decision = admit(ctl, "p", f"p-{i}", now_s=float(i))
        assert decision.admitted and decision.ticket is not None and decision.ticket.evictable
        tickets.append(decision.ticket)
    return ctl, tickets


def test_protected_request_into_a_full_pool_evicts_the_newest_preemptible() -> None:
    ctl, tickets = _full_of_preemptible()
    decision = admit(ctl, "g", "g-1", now_s=5.0)
    assert decision.admitted and decision.evict == (tickets[-1],)


def test_each_protected_admission_gets_its_own_victim() -> None:
    """Until the victim is released, a second protected request must not be handed the same one."""
    ctl, tickets = _full_of_preemptible()
    first = admit(ctl, "g", "g-1", now_s=5.0)
    second = admit(ctl, "g", "g-2", now_s=5.0)
    assert first.evict == (tickets[1],) and second.evict == (tickets[0],)
    assert admit(ctl, "g", "g-3", now_s=5.0).evict == ()  # nothing left to evict


def test_a_released_preemptible_is_no_longer_a_victim() -> None:
    ctl, tickets = _full_of_preemptible()
    ctl.release(tickets[1], 10, 1.0)
    assert admit(ctl, "e", "e-1", now_s=1.0).admitted  # fills the freed slot (uncontended: 1 < 2)
    assert admit(ctl, "g", "g-1", now_s=2.0).evict == (tickets[0],)


def test_elastic_request_into_a_full_pool_evicts_nothing() -> None:
    ctl, _ = _full_of_preemptible()
    decision = admit(ctl, "e", "e-1", now_s=5.0)
    assert decision.admitted and decision.evict == ()


def test_protected_request_into_a_pool_with_room_evicts_nothing() -> None:
    ctl, _ = _full_of_preemptible(2)
    ctl.set_pool(3, backend_waiting=1)  # contended by the queue, but a slot is free
    decision = admit(ctl, "g", "g-1", now_s=5.0)
    assert decision.admitted and decision.evict == ()


def test_non_preemptible_tickets_are_not_evictable() -> None:
    ctl = controller((spec("s", ServiceClass.SPOT), limits(priority=1.0)),
                     (spec("g", ServiceClass.GUARANTEED), limits(priority=333.0)), pool_concurrency=1)
    spot = admit(ctl, "s", "s-1")
    assert spot.ticket is not None and not spot.ticket.evictable
    assert admit(ctl, "g", "g-1").evict == ()


# ---- settle / refund -----------------------------------------------------------------------------------------

def _one_entitlement(rate: float = 100.0) -> AdmissionController:
    return controller((spec("a"), limits(concurrency=8, tokens_per_s=rate)))  # depth 10 × rate


def test_settle_refunds_the_unused_reservation() -> None:
    ctl = _one_entitlement()
    ticket = admit(ctl, "a", prompt=100, max_tokens=200).ticket
    assert ticket is not None and ctl.bucket_tokens_of("a", 0.0) == 700
    assert ctl.release(ticket, 100 + 50, 0.0) == 150  # actual prompt 100 + completion 50
    assert ctl.bucket_tokens_of("a", 0.0) == 850
    assert ctl.in_flight_of("a") == 0 and ctl.kv_reserved_of("a") == 0 and ctl.in_flight == 0


def test_abort_settles_with_partial_usage() -> None:
    ctl = _one_entitlement()
    ticket = admit(ctl, "a", prompt=100, max_tokens=200).ticket
    assert ticket is not None
    assert ctl.release(ticket, 120, 0.0) == 180  # aborted after 20 completion tokens
    assert ctl.bucket_tokens_of("a", 0.0) == 880


def test_using_more_than_reserved_charges_the_extra() -> None:
    ctl = _one_entitlement()
    ticket = admit(ctl, "a", prompt=100, max_tokens=200).ticket
    assert ticket is not None
    assert ctl.release(ticket, 400, 0.0) == -100  # the prompt estimate was 100 tokens low
    assert ctl.bucket_tokens_of("a", 0.0) == 600


def test_over_use_can_take_the_bucket_below_zero_and_delays_the_next_request() -> None:
    ctl = _one_entitlement(rate=10.0)  # depth 100
    ticket = admit(ctl, "a", prompt=50, max_tokens=50).ticket
    assert ticket is not None
    ctl.release(ticket, 150, 0.0)
    assert ctl.bucket_tokens_of("a", 0.0) == -50
    refused = admit(ctl, "a", "r2", prompt=5, max_tokens=5)
    assert refused.outcome is O.REFUSED_TOKEN_BUDGET and refused.retry_after_s == 6  # 60 short at 10/s


def test_refund_never_overfills_the_bucket() -> None:
    ctl = _one_entitlement()
    ticket = admit(ctl, "a", prompt=100, max_tokens=200).ticket
    assert ticket is not None
    assert ctl.bucket_tokens_of("a", 10.0) == 1000  # refilled while the request ran
    assert ctl.release(ticket, 0, 10.0) == 300
    assert ctl.bucket_tokens_of("a", 10.0) == 1000  # not 1300


def test_bucket_refills_at_the_limit_rate_up_to_its_depth() -> None:
    ctl = _one_entitlement(rate=100.0)
    assert admit(ctl, "a", prompt=900, max_tokens=100).admitted
    assert ctl.bucket_tokens_of("a", 0.0) == 0
    assert ctl.bucket_tokens_of("a", 2.5) == 250
    assert ctl.bucket_tokens_of("a", 60.0) == 1000


def test_lowering_limits_clamps_the_bucket_to_the_new_depth() -> None:
    ctl = _one_entitlement(rate=100.0)
    ctl.set_limits("a", limits(concurrency=8, tokens_per_s=30.0), 0.0)
    assert ctl.bucket_tokens_of("a", 0.0) == 300


def test_raising_limits_does_not_top_up_the_bucket() -> None:
    ctl = _one_entitlement(rate=10.0)
    assert admit(ctl, "a", prompt=60, max_tokens=0).admitted  # 40 left of 100
    ctl.set_limits("a", limits(concurrency=8, tokens_per_s=100.0), 0.0)
    assert ctl.bucket_tokens_of("a", 0.0) == 40
    assert ctl.bucket_tokens_of("a", 1.0) == 140  # the new rate from the change on


def test_limit_change_refills_at_the_old_rate_up_to_the_change() -> None:
    ctl = _one_entitlement(rate=100.0)
    assert admit(ctl, "a", prompt=1000, max_tokens=0).admitted
    ctl.set_limits("a", limits(concurrency=8, tokens_per_s=10.0), 2.0)  # 2 s at 100/s = 200, new depth 100
    assert ctl.bucket_tokens_of("a", 2.0) == 100
    ctl2 = _one_entitlement(rate=100.0)
    assert admit(ctl2, "a", prompt=1000, max_tokens=0).admitted
    ctl2.set_limits("a", limits(concurrency=8, tokens_per_s=50.0), 2.0)  # 200 < new depth 500: kept
    assert ctl2.bucket_tokens_of("a", 3.0) == 250


def test_upsert_keeps_in_flight_state_and_applies_new_limits() -> None:
    ctl = _one_entitlement()
    ticket = admit(ctl, "a", prompt=100, max_tokens=100).ticket
    assert ticket is not None
    ctl.upsert_entitlement(spec("a", state=EntitlementState.DEGRADED), limits(concurrency=1, tokens_per_s=5.0), 1.0)
    assert ctl.in_flight_of("a") == 1 and ctl.kv_reserved_of("a") == 200
    assert ctl.bucket_tokens_of("a", 1.0) == 50  # clamped to the new depth
    assert admit(ctl, "a", "r2", now_s=1.0).outcome is O.REFUSED_NOT_BOUND
    assert ctl.limits_of("a").concurrency == 1 and ctl.entitlement_names() == ["a"]


def test_release_after_the_entitlement_was_removed_frees_the_pool_slot() -> None:
    ctl = controller((spec("a"), limits(priority=10.0)), pool_concurrency=1)
    ticket = admit(ctl, "a").ticket
    assert ticket is not None
    ctl.remove_entitlement("a")
    assert ctl.release(ticket, 30, 1.0) == 70
    assert ctl.in_flight == 0 and ctl.min_in_flight_priority() is None


def test_release_of_an_entitlement_removed_and_added_again_leaves_the_new_ledger_alone() -> None:
    ctl = controller((spec("a"), limits()))
    old = admit(ctl, "a", "r1").ticket
    assert old is not None
    ctl.remove_entitlement("a")
    ctl.upsert_entitlement(spec("a"), limits(), 1.0)
    ctl.release(old, 100, 1.0)
    assert ctl.in_flight_of("a") == 0 and ctl.kv_reserved_of("a") == 0 and ctl.in_flight == 0


def test_releasing_a_ticket_twice_changes_nothing_the_second_time() -> None:
    """An evicted request may be released by the evictor and again by its own stream's cleanup."""
    ctl = controller((spec("a"), limits(priority=10.0)), (spec("b"), limits(priority=10.0)), pool_concurrency=2)
    ta, tb = admit(ctl, "a", "ra").ticket, admit(ctl, "b", "rb").ticket
    assert ta is not None and tb is not None
    assert ctl.release(ta, 30, 0.0) == 70
    bucket = ctl.bucket_tokens_of("a", 0.0)
    assert ctl.release(ta, 0, 0.0) == 0
    assert ctl.bucket_tokens_of("a", 0.0) == bucket
    assert ctl.in_flight == 1 and ctl.in_flight_of("a") == 0
    assert ctl.min_in_flight_priority() == 10.0  # b's request still sets the threshold


def test_a_request_id_already_in_flight_is_rejected() -> None:
    ctl = controller((spec("a"), limits()))
    assert admit(ctl, "a", "same").admitted
    with pytest.raises(ValueError, match="already in flight"):
        admit(ctl, "a", "same")
    assert ctl.in_flight == 1
