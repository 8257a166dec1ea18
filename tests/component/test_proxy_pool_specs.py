"""``PoolRuntime.replace_specs``, pure (time as an argument): entitlements added, changed and removed at one proxy's
pool, under static limits and under a limit update; a removed entitlement's ticket still settles."""

from __future__ import annotations

import dataclasses

import pytest

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState, ServiceClass
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.admission.pools import LimitsSource, PoolRuntime, UpdateResult
from tokenpools_dev.proxy.doubles import limit_update

pytestmark = pytest.mark.component

POOL = PoolSpec("pool-a", "m", Capacity(10_000, 10_000_000, 8), kv_bytes_per_token=1000, default_max_tokens=32)
GOLD = EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(1000, 2_000_000, 2))
SPOT = EntitlementSpec("spot", "pool-a", ServiceClass.SPOT, 30000)


def runtime() -> PoolRuntime:
    return PoolRuntime(POOL, [GOLD], proxy_id="p1", ttl_s=30, retry_after_s=1, now_s=0.0, wall_s=1000.0)


def test_an_added_entitlement_is_admitted_at_once_on_static_limits() -> None:
    rt = runtime()
    assert rt.controller.admit("spot", "r0", 10, 10, 0.0).outcome is AdmissionOutcome.REFUSED_UNKNOWN_KEY
    assert rt.replace_specs(POOL, [GOLD, SPOT], 1.0, 1001.0) == []
    assert rt.controller.admit("spot", "r1", 10, 10, 1.0).admitted
    assert rt.in_force.source is LimitsSource.STATIC and rt.bound == [GOLD, SPOT]


def test_a_class_change_decides_from_the_next_decision_and_keeps_what_is_in_flight() -> None:
    rt = runtime()
    rt.replace_specs(POOL, [GOLD, SPOT], 0.0, 1000.0)
    ticket = rt.controller.admit("spot", "r1", 10, 10, 0.0).ticket
    assert ticket is not None
    before = rt.controller.limits_of("spot").priority
    elastic = dataclasses.replace(SPOT, service_class=ServiceClass.ELASTIC, baseline=Capacity(100, 100_000, 1))
    rt.replace_specs(POOL, [GOLD, elastic], 1.0, 1001.0)
    assert rt.controller.in_flight_of("spot") == 1  # kept
    assert rt.controller.limits_of("spot").priority != before  # static priorities follow the class at once
    assert rt.controller.limits_of("spot") == rt.static_limits()[0]["spot"]  # the elastic class's static limits
    second = rt.controller.admit("spot", "r2", 10, 10, 1.0)
    assert second.admitted and second.ticket is not None and second.ticket.priority != ticket.priority
    assert rt.controller.release(ticket, 15, 2.0) == ticket.reserved_tokens - 15  # settles as it was admitted
    assert rt.controller.in_flight_of("spot") == 1


def test_a_state_change_refuses_from_the_next_decision() -> None:
    rt = runtime()
    rt.replace_specs(POOL, [dataclasses.replace(GOLD, state=EntitlementState.EXPIRED)], 1.0, 1001.0)
    decision = rt.controller.admit("gold", "r1", 10, 10, 1.0)
    assert decision.outcome is AdmissionOutcome.REFUSED_NOT_BOUND and "Expired" in decision.reason
    assert rt.bound == []


def test_a_removed_entitlement_is_forgotten_and_its_ticket_still_settles() -> None:
    rt = runtime()
    ticket = rt.controller.admit("gold", "r1", 10, 10, 0.0).ticket
    assert ticket is not None and rt.controller.in_flight == 1
    removed = rt.replace_specs(POOL, [SPOT], 1.0, 1001.0)
    assert removed == ["gold"] and "gold" not in rt.entitlements
    # until forgotten (after its waiters were refused) it refuses as not Bound
    assert rt.controller.admit("gold", "r2", 10, 10, 1.0).outcome is AdmissionOutcome.REFUSED_NOT_BOUND
    rt.forget(removed)
    assert rt.controller.admit("gold", "r3", 10, 10, 1.0).outcome is AdmissionOutcome.REFUSED_UNKNOWN_KEY
    assert rt.controller.release(ticket, 15, 2.0) == ticket.reserved_tokens - 15
    assert rt.controller.in_flight == 0


def test_under_a_limit_update_the_update_keeps_its_limits_and_a_new_entitlement_gets_static_ones() -> None:
    rt = runtime()
    update = limit_update("pool-a", 1, 1_000_000, {"gold": (1, 500.0, 1e6, 7.0)}, 8)
    assert rt.apply_update(update, 0.0, 1_000_000) is UpdateResult.APPLIED
    rt.replace_specs(POOL, [GOLD, SPOT], 1.0, 1001.0)
    assert rt.controller.limits_of("gold").priority == 7.0  # the update's, until the next one
    assert rt.controller.limits_of("spot").concurrency > 0  # static, until an update names it
    assert rt.in_force.source is LimitsSource.UPDATE


def test_a_pool_spec_change_takes_effect_and_another_pool_is_refused() -> None:
    rt = runtime()
    rt.replace_specs(dataclasses.replace(POOL, default_max_tokens=8), [GOLD], 1.0, 1001.0)
    assert rt.controller.default_max_tokens == 8 and rt.pool.default_max_tokens == 8
    with pytest.raises(ValueError, match="cannot take the spec of pool other"):
        rt.replace_specs(dataclasses.replace(POOL, name="other"), [], 1.0, 1001.0)
