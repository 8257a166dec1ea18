"""``core.tick.pool_tick``: the pool's tick as the agents and the replayer both run it (membership, ℓ̄*, the backend's
waiting queue and whole slots around ``control_tick``)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState, ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.tick import Signals, control_tick, pool_tick, whole_slots
from tokenpools.core.windows import UsageSample
from tokenpools_dev.builders import entitlement_spec

NOW_S = 1_700_000_000.0
POOL = PoolSpec("pool", "Qwen/Qwen3-8B", Capacity(240.0, 16e9, 16.0), min_replicas=1, max_replicas=1)


def elastic(name: str, slo_ms: float, tokens_per_s: float = 75.0, slots: float = 5.0) -> EntitlementSpec:
    return entitlement_spec(name, ServiceClass.ELASTIC, slots, tokens_per_s, 1e9, slo_ms=slo_ms)


COPILOT, SYNTH, REPORTS = elastic("copilot", 500.0), elastic("synth", 30_000.0), elastic("reports", 5_000.0)
LATE = elastic("late", 1_000.0)  # a fourth 75 tokens/s baseline: 300 > the pool's 240 at max replicas
SPOT = EntitlementSpec("spot", "pool", ServiceClass.SPOT, 30_000.0)


def sample(used_tokens_per_s: float, demand_tokens_per_s: float, slots: float = 5.0) -> UsageSample:
    return UsageSample(start_ms=0, width_ms=5000, used=Capacity(used_tokens_per_s, 1e9, slots),
                       demand=Capacity(demand_tokens_per_s, 1e9, slots), admitted=1, refused=0, completed=1,
                       in_flight_at_end=0)


def run(entitlements: list[EntitlementSpec], previous_mean_slo_ms: float | None = None, frozen: bool = False,
        waiting: float = 0.0, now_s: float = NOW_S):  # noqa: ANN201
    return pool_tick(POOL, entitlements, now_s, previous={}, previous_mean_slo_ms=previous_mean_slo_ms,
                     mean_slo_frozen=frozen, samples={}, capacity=POOL.capacity(), backend_waiting=waiting)


# ---- membership ----------------------------------------------------------------------------------------------

def test_only_the_entitlements_bound_at_the_tick_take_part() -> None:
    """A baseline that does not fit (Degraded), one past its expiry and one held Pending in its spec get no limits,
    count towards no demand and leave ℓ̄* alone; the order of the others is kept."""
    expired = dataclasses.replace(elastic("expired", 100.0, tokens_per_s=1.0, slots=1.0), expires_at_s=NOW_S)
    pending = dataclasses.replace(elastic("pending", 100.0, tokens_per_s=1.0, slots=1.0),
                                  state=EntitlementState.PENDING)
    ticked = run([COPILOT, expired, SYNTH, REPORTS, LATE, pending, SPOT])
    assert [e.name for e in ticked.members] == ["copilot", "synth", "reports", "spot"]
    assert set(ticked.tick.limits) == set(ticked.concurrency) == {"copilot", "synth", "reports", "spot"}
    assert ticked.mean_slo_ms == pytest.approx((500.0 + 30_000.0 + 5_000.0 + 30_000.0) / 4)


def test_an_entitlement_binds_until_its_expiry() -> None:
    expiring = dataclasses.replace(COPILOT, expires_at_s=NOW_S + 1.0)
    assert [e.name for e in run([expiring], now_s=NOW_S).members] == ["copilot"]
    assert run([expiring], now_s=NOW_S + 1.0).members == []


# ---- ℓ̄* -------------------------------------------------------------------------------------------------------

def test_frozen_mean_slo_keeps_the_first_value_recompute_follows_the_members() -> None:
    """docs/paper.md#worked-numbers: 15,250 ms kept when reports joins; 11,833 ms recomputed."""
    first = run([COPILOT, SYNTH], frozen=True)
    assert first.mean_slo_ms == 15_250.0
    assert run([COPILOT, SYNTH, REPORTS], first.mean_slo_ms, frozen=True).mean_slo_ms == 15_250.0
    assert run([COPILOT, SYNTH, REPORTS], first.mean_slo_ms).mean_slo_ms == pytest.approx(35_500.0 / 3)


def test_no_member_keeps_the_previous_mean_slo() -> None:
    assert run([], None).mean_slo_ms is None
    held = EntitlementSpec("held", "pool", ServiceClass.SPOT, 9.0, state=EntitlementState.PENDING)
    ticked = run([held], 123.0)
    assert ticked.members == [] and ticked.mean_slo_ms == 123.0


# ---- rounding --------------------------------------------------------------------------------------------------

def test_a_fractional_backend_queue_is_a_queue() -> None:
    ticked = run([COPILOT], waiting=0.2)
    assert ticked.backend_waiting == 1 and ticked.tick.contended
    assert run([COPILOT], waiting=0.0).backend_waiting == 0


def test_whole_slots_rounds_down_with_a_tolerance_for_float_error() -> None:
    assert [whole_slots(c) for c in (0.0, 0.999, 1.0, 2.5, 2.9999999999, 3.0)] == [0, 0, 1, 2, 3, 3]


# ---- properties ----------------------------------------------------------------------------------------------

SAMPLES = st.none() | st.builds(sample, used_tokens_per_s=st.floats(0.0, 1000.0),
                                demand_tokens_per_s=st.floats(0.0, 1000.0), slots=st.floats(0.0, 20.0))
ENTITLEMENTS = st.lists(st.sampled_from([COPILOT, SYNTH, REPORTS, LATE, SPOT]), unique=True)


@settings(max_examples=80, deadline=None)
@given(entitlements=ENTITLEMENTS, samples=st.tuples(*[SAMPLES] * 5), debt=st.floats(-1.0, 1.0),
       previous_mean=st.none() | st.floats(100.0, 50_000.0), frozen=st.booleans(), waiting=st.floats(0.0, 50.0))
def test_the_glue_decides_membership_and_rounding_never_the_policy(
        entitlements: list[EntitlementSpec], samples: tuple[UsageSample | None, ...], debt: float,
        previous_mean: float | None, frozen: bool, waiting: float) -> None:
    """Invariant: ``pool_tick`` is ``control_tick`` on the members with its ℓ̄* and the queue rounded up, nothing
    else; every member's slots are whole, equal its limit's concurrency, and fit the pool."""
    by_name = dict(zip(("copilot", "synth", "reports", "late", "spot"), samples))
    previous = {e.name: Signals(debt=debt) for e in entitlements}
    ticked = pool_tick(POOL, entitlements, NOW_S, previous=previous, previous_mean_slo_ms=previous_mean,
                       mean_slo_frozen=frozen, samples=by_name, capacity=POOL.capacity(), backend_waiting=waiting)
    direct = control_tick(POOL, ticked.members, previous, by_name, POOL.capacity(), ticked.mean_slo_ms or 1.0,
                          ticked.backend_waiting)
    assert ticked.tick == direct
    assert ticked.backend_waiting >= waiting > ticked.backend_waiting - 1
    assert ticked.concurrency == {n: int(limit.concurrency) for n, limit in direct.limits.items()}
    assert all(float(n) == direct.limits[name].concurrency for name, n in ticked.concurrency.items())
    assert sum(ticked.concurrency.values()) <= POOL.capacity().concurrency
