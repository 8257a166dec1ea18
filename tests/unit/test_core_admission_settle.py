"""Settle and refund: what a finished, aborted or over-using request leaves in the bucket; limit changes; releases."""

from __future__ import annotations

import pytest

from tokenpools.core.admission import AdmissionController
from tokenpools.core.classes import EntitlementState

from admission_support import O, admit, controller, limits, spec


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


def test_set_bucket_tokens_sets_the_level_then_refills_from_there() -> None:
    """A proxy told its budget by the fleet: the level is set at now (clamped to the depth), refills from then on,
    and a request must still fit entirely; nothing else in the ledger changes."""
    ctl = _one_entitlement()  # depth 1,000, 100 tokens/s
    ticket = admit(ctl, "a", prompt=100, max_tokens=200).ticket
    assert ticket is not None
    ctl.set_bucket_tokens("a", 250.0, 1.0)
    assert ctl.bucket_tokens_of("a", 1.0) == 250.0
    assert ctl.bucket_tokens_of("a", 1.5) == 300.0
    assert not admit(ctl, "a", rid="r2", prompt=100, max_tokens=250, now_s=1.5).admitted
    ctl.set_bucket_tokens("a", 5_000.0, 2.0)
    assert ctl.bucket_tokens_of("a", 2.0) == 1_000.0  # never above the depth
    ctl.set_bucket_tokens("a", -40.0, 3.0)
    assert ctl.bucket_tokens_of("a", 3.0) == -40.0  # an overdrawn fleet bucket is passed on as it is
    assert ctl.in_flight_of("a") == 1 and ctl.limits_of("a").tokens_per_s == 100.0
