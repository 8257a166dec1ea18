"""Retry-After from the real state (docs/semantics.md#retry-after): every refusal for a limit carries
``retry_after_ms``, the estimate of when the same request's check would pass, and ``retry_after_s`` = its whole
seconds rounded up, at least 1.

The older whole-second tests stay in test_core_admission_checks.py.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.admission import AdmissionController, Decision

from admission_support import O, admit, controller, limits, spec


def _seconds_of(decision: Decision) -> None:
    assert decision.retry_after_s == max(1, math.ceil(decision.retry_after_ms / 1000))


# ---- token budget: exact --------------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(rate=st.floats(0.01, 5000.0), drained_part=st.floats(0.0, 1.0), cost=st.integers(1, 50_000),
       now_s=st.floats(0.0, 1e6), elapsed=st.floats(0.0, 30.0), window_s=st.sampled_from([0.5, 1.0, 2.0, 10.0]))
def test_token_budget_wait_is_the_exact_millisecond(rate: float, drained_part: float, cost: int, now_s: float,
                                                   elapsed: float, window_s: float) -> None:
    """Refused for budget with a cost that fits the depth ⇒ the same request, nothing else happening, is admitted at
    now + retry_after_ms and refused one millisecond earlier."""
    depth = rate * window_s
    drained = int(depth * drained_part)
    t = now_s + elapsed

    def refused_state() -> tuple[AdmissionController, Decision]:
        """The controller as the refusal leaves it (built afresh each time: a compiled controller has no deepcopy)."""
        ctl = controller((spec("a"), limits(concurrency=100, tokens_per_s=rate)), window_s=window_s, now_s=now_s)
        if drained:
            assert admit(ctl, "a", "drain", prompt=drained, max_tokens=0, now_s=now_s).admitted
        return ctl, admit(ctl, "a", "r", prompt=cost, max_tokens=0, now_s=t)

    _, decision = refused_state()
    if decision.admitted or cost > depth:
        return
    assert decision.outcome is O.REFUSED_TOKEN_BUDGET and decision.retry_after_ms >= 1
    _seconds_of(decision)
    ms = decision.retry_after_ms
    (early, _), (on_time, _) = refused_state(), refused_state()  # the state the refusal left, twice
    assert early.admit("a", "early", cost, 0, t + (ms - 1) / 1000).outcome is O.REFUSED_TOKEN_BUDGET
    assert on_time.admit("a", "on-time", cost, 0, t + ms / 1000).admitted


def test_token_budget_wait_is_sub_second() -> None:
    ctl = controller((spec("a"), limits(tokens_per_s=100.0)))  # depth 1000
    assert admit(ctl, "a", "r1", prompt=990, max_tokens=0).admitted  # 10 left
    refused = admit(ctl, "a", "r2", prompt=35, max_tokens=0)  # 25 short at 100/s: 250 ms
    assert (refused.outcome, refused.retry_after_ms, refused.retry_after_s) == (O.REFUSED_TOKEN_BUDGET, 250, 1)


def test_a_cost_above_the_depth_never_fits_and_says_so() -> None:
    ctl = controller((spec("a"), limits(tokens_per_s=10.0)), window_s=10.0)  # depth 100
    refused = admit(ctl, "a", prompt=100, max_tokens=50)
    assert "at most" in refused.reason
    assert (refused.retry_after_s, refused.retry_after_ms) == (10, 10_000)  # the window, as before


# ---- slots: concurrency, KV, low priority -------------------------------------------------------------------

def _learn(ctl: AdmissionController, name: str, service_s: float, now_s: float = 0.0) -> None:
    """One request of ``name`` held its slot for ``service_s``: the first release sets the EWMA."""
    ticket = admit(ctl, name, "learn", now_s=now_s).ticket
    assert ticket is not None
    ctl.release(ticket, 100, now_s + service_s)


def test_concurrency_wait_is_the_service_time_over_the_requests_in_flight() -> None:
    ctl = controller((spec("a"), limits(concurrency=4, tokens_per_s=1e6)))
    _learn(ctl, "a", 2.0)
    for i in range(4):
        assert admit(ctl, "a", f"r{i}", now_s=2.0).admitted
    refused = admit(ctl, "a", "r5", now_s=2.0)
    assert refused.outcome is O.REFUSED_CONCURRENCY
    assert (refused.retry_after_ms, refused.retry_after_s) == (500, 1)  # the next of 4 slots, each held ~2 s


def test_slot_wait_is_floored_and_ceiled() -> None:
    fast = controller((spec("a"), limits(concurrency=1, tokens_per_s=1e6)))
    _learn(fast, "a", 0.001)
    assert admit(fast, "a", "r1", now_s=1.0).admitted
    assert admit(fast, "a", "r2", now_s=1.0).retry_after_ms == fast.retry_floor_ms
    slow = controller((spec("a"), limits(concurrency=1, tokens_per_s=1e6)))
    slow.retry_after_s = 3
    _learn(slow, "a", 100.0)
    assert admit(slow, "a", "r1", now_s=100.0).admitted
    refused = admit(slow, "a", "r2", now_s=100.0)
    assert (refused.retry_after_ms, refused.retry_after_s) == (3000, 3)


def test_cold_start_waits_the_ceiling_and_an_entitlement_without_releases_borrows_the_pools() -> None:
    ctl = controller((spec("a"), limits(concurrency=1, tokens_per_s=1e6)), (spec("b"), limits(tokens_per_s=1e6)))
    assert admit(ctl, "a", "r1").admitted
    cold = admit(ctl, "a", "r2")
    assert (cold.outcome, cold.retry_after_ms) == (O.REFUSED_CONCURRENCY, 1000)
    _learn(ctl, "b", 0.4)  # the pool learns from b
    assert admit(ctl, "a", "r3", now_s=1.0).retry_after_ms == 400


def test_low_priority_waits_for_the_pool_slot() -> None:
    ctl = controller((spec("hi"), limits(priority=100.0, tokens_per_s=1e6)),
                     (spec("lo"), limits(priority=1.0, tokens_per_s=1e6)), pool_concurrency=2)
    _learn(ctl, "hi", 0.6)
    assert admit(ctl, "hi", "h1", now_s=1.0).admitted and admit(ctl, "hi", "h2", now_s=1.0).admitted
    refused = admit(ctl, "lo", "l1", now_s=1.0)
    assert (refused.outcome, refused.retry_after_ms) == (O.REFUSED_LOW_PRIORITY, 300)  # 0.6 s ÷ 2 in flight


def test_kv_refusal_waits_for_one_of_the_entitlements_releases() -> None:
    ctl = controller((spec("a"), limits(concurrency=8, tokens_per_s=1e6, kv_bytes=250.0)))
    _learn(ctl, "a", 1.2)
    assert admit(ctl, "a", "r1", now_s=2.0).admitted and admit(ctl, "a", "r2", now_s=2.0).admitted  # 200 bytes
    refused = admit(ctl, "a", "r3", now_s=2.0)
    assert (refused.outcome, refused.retry_after_ms) == (O.REFUSED_KV, 600)


@settings(max_examples=200, deadline=None)
@given(services=st.lists(st.floats(0.0, 120.0), min_size=0, max_size=12), concurrency=st.integers(0, 6),
       retry_after_s=st.integers(1, 5), floor_ms=st.integers(1, 1000), alpha=st.floats(0.01, 1.0))
def test_slot_wait_stays_within_its_bounds(services: list[float], concurrency: int, retry_after_s: int,
                                           floor_ms: int, alpha: float) -> None:
    """Whatever the service times learned, a concurrency refusal waits within [floor, retry_after_s × 1000] ms and
    its whole seconds are the ms rounded up."""
    ctl = AdmissionController(16, 1, 256, 10.0, retry_after_s=retry_after_s, retry_floor_ms=min(floor_ms, 1000),
                              service_ewma_alpha=alpha)
    ctl.upsert_entitlement(spec("a"), limits(concurrency=max(concurrency, 1), tokens_per_s=1e9), 0.0)
    t = 0.0
    for i, service_s in enumerate(services):
        ticket = ctl.admit("a", f"s{i}", 1, 1, t).ticket
        assert ticket is not None
        t += service_s
        ctl.release(ticket, 2, t)
    ctl.set_limits("a", limits(concurrency=concurrency, tokens_per_s=1e9), t)
    for i in range(concurrency):
        assert ctl.admit("a", f"r{i}", 1, 1, t).admitted
    refused = ctl.admit("a", "over", 1, 1, t)
    assert refused.outcome is O.REFUSED_CONCURRENCY
    assert min(floor_ms, 1000) <= refused.retry_after_ms <= retry_after_s * 1000
    _seconds_of(refused)


@settings(max_examples=200, deadline=None)
@given(services=st.lists(st.floats(0.001, 120.0), min_size=0, max_size=12), concurrency=st.integers(1, 6),
       retry_after_s=st.integers(1, 5))
def test_the_slot_estimate_is_the_refusals_wait_uncapped(services: list[float], concurrency: int,
                                                          retry_after_s: int) -> None:
    """The queue's estimate (``slot_estimate_ms``) is the refusal's k × S ÷ n without HTTP's ceiling: equal to its
    ``retry_after_ms`` below the ceiling, at least it above; None while no release has taught S."""
    ctl = AdmissionController(16, 1, 256, 10.0, retry_after_s=retry_after_s)
    ctl.upsert_entitlement(spec("a"), limits(concurrency=concurrency, tokens_per_s=1e9), 0.0)
    t = 0.0
    for i, service_s in enumerate(services):
        ticket = ctl.admit("a", f"s{i}", 1, 1, t).ticket
        assert ticket is not None
        t += service_s
        ctl.release(ticket, 2, t)
    for i in range(concurrency):
        assert ctl.admit("a", f"r{i}", 1, 1, t).admitted
    refused = ctl.admit("a", "over", 1, 1, t)
    estimate = ctl.slot_estimate_ms("a", refused.outcome)
    if not services:
        assert estimate is None
        return
    assert estimate is not None and estimate >= ctl.retry_floor_ms
    assert refused.retry_after_ms == min(estimate, retry_after_s * 1000)


def test_non_retryable_refusals_carry_no_wait() -> None:
    ctl = controller((spec("a"), limits()))
    decision = admit(ctl, "nobody")
    assert (decision.retry_after_s, decision.retry_after_ms) == (0, 0)


@pytest.mark.parametrize(("kwargs", "match"), [({"retry_floor_ms": 0}, "retry_floor_ms"),
                                                ({"retry_floor_ms": 1001}, "retry_floor_ms"),
                                                ({"service_ewma_alpha": 0.0}, "service_ewma_alpha")])
def test_bad_estimator_settings_are_rejected_at_construction(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AdmissionController(16, 1, 256, 10.0, **kwargs)
