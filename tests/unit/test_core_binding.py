"""Capacity admission (tokenpools.core.binding): Bound / Degraded / Expired / Pending, and invariant 9."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.binding import bind_entitlements
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState, ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools_dev.builders import entitlement_spec, pool_spec

PROPERTY = settings(max_examples=100, deadline=None)
B, D, X, P = EntitlementState.BOUND, EntitlementState.DEGRADED, EntitlementState.EXPIRED, EntitlementState.PENDING
PER_REPLICA = Capacity(240.0, 16.0 * 2**30, 16.0)


def pool(max_replicas: int = 1) -> PoolSpec:
    return pool_spec(per_replica=PER_REPLICA, max_replicas=max_replicas)


def states(result: dict) -> dict[str, EntitlementState]:
    return {name: b.state for name, b in result.items()}


def test_exp2_three_five_slot_elastic_baselines_fit_sixteen_slots() -> None:
    specs = [entitlement_spec(n, ServiceClass.ELASTIC, 5, 75.0) for n in ("copilot", "synth", "reports")]
    assert states(bind_entitlements(pool(), specs, 0.0)) == {"copilot": B, "synth": B, "reports": B}


def test_baseline_that_does_not_fit_is_degraded_with_the_numbers() -> None:
    specs = [entitlement_spec("a", ServiceClass.GUARANTEED, 6), entitlement_spec("c", ServiceClass.GUARANTEED, 6),
             entitlement_spec("late", ServiceClass.ELASTIC, 5)]
    result = bind_entitlements(pool(), specs, 0.0)
    assert states(result) == {"a": B, "c": B, "late": D}
    assert "17 sequences" in result["late"].reason and "16 sequences" in result["late"].reason


def test_a_later_smaller_grant_still_binds_after_a_degraded_one() -> None:
    specs = [entitlement_spec("a", ServiceClass.GUARANTEED, 10), entitlement_spec("big", ServiceClass.DEDICATED, 8),
             entitlement_spec("small", ServiceClass.ELASTIC, 6)]
    assert states(bind_entitlements(pool(), specs, 0.0)) == {"a": B, "big": D, "small": B}


def test_more_replicas_make_room() -> None:
    specs = [entitlement_spec("a", ServiceClass.GUARANTEED, 10), entitlement_spec("b", ServiceClass.GUARANTEED, 10)]
    assert states(bind_entitlements(pool(max_replicas=2), specs, 0.0)) == {"a": B, "b": B}


def test_spot_and_preemptible_reserve_nothing_and_always_bind() -> None:
    specs = [entitlement_spec("g", ServiceClass.GUARANTEED, 16), entitlement_spec("s", ServiceClass.SPOT), entitlement_spec("p", ServiceClass.PREEMPTIBLE)]
    assert states(bind_entitlements(pool(), specs, 0.0)) == {"g": B, "s": B, "p": B}


def test_expired_entitlement_is_expired_and_holds_nothing() -> None:
    specs = [entitlement_spec("old", ServiceClass.GUARANTEED, 16, expires_at_s=100.0), entitlement_spec("new", ServiceClass.GUARANTEED, 16)]
    assert states(bind_entitlements(pool(), specs, 99.0)) == {"old": B, "new": D}
    result = bind_entitlements(pool(), specs, 100.0)
    assert states(result) == {"old": X, "new": B}
    assert "100" in result["old"].reason


def test_a_state_forced_in_the_spec_is_kept_and_reserves_nothing() -> None:
    held = EntitlementSpec("held", "pool", ServiceClass.GUARANTEED, 1000.0, Capacity(0.0, 0.0, 16.0), state=P)
    specs = [held, entitlement_spec("next", ServiceClass.GUARANTEED, 16)]
    result = bind_entitlements(pool(), specs, 0.0)
    assert states(result) == {"held": P, "next": B}
    assert "Pending" in result["held"].reason


def test_missing_pool_leaves_everything_pending() -> None:
    specs = [entitlement_spec("a", ServiceClass.ELASTIC, 1)]
    assert states(bind_entitlements(None, specs, 0.0)) == {"a": P}


# ---- invariant 9 ---------------------------------------------------------------------------------------------

@st.composite
def binding_cases(draw: st.DrawFn) -> tuple[PoolSpec, list[EntitlementSpec], float]:
    p = pool(draw(st.integers(1, 3)))
    specs = []
    for i in range(draw(st.integers(0, 10))):
        service_class = draw(st.sampled_from(list(ServiceClass)))
        baseline = Capacity()
        if service_class.has_baseline:
            baseline = Capacity(draw(st.sampled_from([0.0, 60.0, 240.0]) | st.floats(0.0, 500.0)),
                                draw(st.sampled_from([0.0, 2.0**33]) | st.floats(0.0, 2.0**35)),
                                float(draw(st.integers(1, 20))))
        expires = draw(st.none() | st.sampled_from([10.0, 50.0]))
        state = draw(st.sampled_from([B, B, B, P, D]))  # a state other than Bound is forced by the spec
        specs.append(EntitlementSpec(f"e{i}", "pool", service_class, 1000.0, baseline, expires_at_s=expires,
                                     state=state))
    return p, specs, draw(st.sampled_from([0.0, 10.0, 30.0, 60.0]))


@PROPERTY
@given(case=binding_cases())
def test_bound_baselines_fit_the_pool_at_max_replicas(case: tuple[PoolSpec, list[EntitlementSpec], float]) -> None:
    """Invariant 9a — Σ baselines of the Bound entitlements ≤ the pool's capacity at max replicas, in every
    dimension; each entitlement gets exactly one state; expiry wins over everything, then a state forced in the
    spec; spot and preemptible otherwise always bind."""
    p, specs, now = case
    result = bind_entitlements(p, specs, now)
    assert list(result) == [e.name for e in specs]
    bound = Capacity.total([e.baseline for e in specs if result[e.name].state is B])
    assert bound.fits_in(p.max_capacity)
    for e in specs:
        state = result[e.name].state
        assert (state is X) == e.is_expired(now)
        if not e.is_expired(now) and e.state is not B:
            assert state is e.state
        elif not e.service_class.has_baseline and not e.is_expired(now):
            assert state is B


@PROPERTY
@given(case=binding_cases(), extra=st.integers(0, 10))
def test_binding_respects_order(case: tuple[PoolSpec, list[EntitlementSpec], float], extra: int) -> None:
    """Invariant 9b — order respected (first come, first bound): an entitlement's state depends only on those
    before it (appending newcomers never changes an earlier state), and one is Degraded only if its baseline does
    not fit on top of the earlier Bound ones."""
    p, specs, now = case
    result = bind_entitlements(p, specs, now)
    cut = extra % (len(specs) + 1)
    prefix = bind_entitlements(p, specs[:cut], now)
    assert {n: b.state for n, b in prefix.items()} == {e.name: result[e.name].state for e in specs[:cut]}
    held = Capacity()
    for e in specs:
        state = result[e.name].state
        if state is B:
            held = held + e.baseline
        elif state is D and e.state is B:
            assert not (held + e.baseline).fits_in(p.max_capacity)
