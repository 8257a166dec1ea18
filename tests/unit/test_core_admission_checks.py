"""Per-request admission (docs/semantics.md#admission): outcomes, the six ordered checks, max_tokens, Retry-After.

Contention and eviction are in test_core_admission_contention.py, settle/refund in test_core_admission_settle.py,
the model-based test of the reserve-then-settle invariant (6) in test_core_admission_model.py.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.admission import AdmissionController, Decision, Ticket, _decision, _ticket
from tokenpools.core.classes import EntitlementState, ServiceClass
from tokenpools.core.outcomes import AdmissionOutcome

from admission_support import O, admit, controller, limits, spec


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
        (O.REFUSED_BUDGET, 429),
        (O.BUDGET_UNAVAILABLE, 503),
    ],
)
def test_outcome_picks_the_http_status(outcome: AdmissionOutcome, status: int) -> None:
    assert outcome.http_status == status
    assert outcome.admitted is (outcome is O.ADMITTED)


def test_every_outcome_has_a_status() -> None:
    assert {o.http_status for o in AdmissionOutcome} <= {200, 401, 403, 429, 503}


def test_refusal_reasons_are_the_designs_wire_names() -> None:
    """The value labels the metric and names the reason in the 429 body (docs/semantics.md#admission)."""
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


# ---- how the hot path builds its records -----------------------------------------------------------------------

def test_the_hot_path_builds_decisions_and_tickets_field_for_field() -> None:
    """``_decision`` and ``_ticket`` build the NamedTuples positionally (``tuple.__new__``, no Python-level
    ``__new__``): a field added to either record must be added there too, or these differ."""
    ticket = Ticket("r1", "a", 10, 20, 1.5, 2.0, True, 7)
    assert _ticket("r1", "a", 10, 20, 1.5, 2.0, True, 7) == ticket
    assert _decision(O.REFUSED_TOKEN_BUDGET, "why", 2, 1500) == Decision(O.REFUSED_TOKEN_BUDGET, "why", 2,
                                                                          retry_after_ms=1500)
    assert _decision(O.ADMITTED, "admitted", 0, 0, ticket, 7, (ticket,)) == Decision(O.ADMITTED, "admitted", 0,
                                                                                      ticket, 7, (ticket,))
    assert type(_decision(O.ADMITTED, "admitted", 0, 0)) is Decision and type(_ticket("r", "a", 1, 1, 0.0, 0.0,
                                                                                        False, 1)) is Ticket

