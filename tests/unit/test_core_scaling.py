"""Autoscaling from the capacity model (tokenpools.core.scaling): demand, replica counts and the stabiliser (inv. 8)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.scaling import (
    ScalingConfig,
    Stabilizer,
    desired_replicas,
    pool_demand,
    protected_floor,
    replicas_for,
)
from tokenpools.core.spec import PoolSpec
from tokenpools_dev.builders import entitlement_spec, pool_spec

PROPERTY = settings(max_examples=100, deadline=None)
PER_REPLICA = Capacity(240.0, 16e9, 16.0)


def pool(min_replicas: int = 1, max_replicas: int = 10) -> PoolSpec:
    return pool_spec(per_replica=PER_REPLICA, min_replicas=min_replicas, max_replicas=max_replicas)


# ---- demand and replica counts -------------------------------------------------------------------------------

def test_pool_demand_counts_protected_baselines_elastic_max_and_spot_observed() -> None:
    specs = [entitlement_spec("g", ServiceClass.GUARANTEED, 6, 90.0), entitlement_spec("e", ServiceClass.ELASTIC, 5, 75.0),
             entitlement_spec("s", ServiceClass.SPOT), entitlement_spec("p", ServiceClass.PREEMPTIBLE)]
    observed = {
        "g": Capacity(0.0, 0.0, 1.0),  # an idle guaranteed still counts its whole baseline
        "e": Capacity(150.0, 0.0, 2.0),  # elastic: max(baseline, observed) per dimension
        "s": Capacity(10.0, 5.0, 3.0),
        "p": Capacity(1.0, 0.0, 1.0),
    }
    assert pool_demand(specs, observed, include_spot=True) == Capacity(90 + 150 + 10 + 1, 5.0, 6 + 5 + 3 + 1)
    assert pool_demand(specs, observed, include_spot=False) == Capacity(90 + 150, 0.0, 6 + 5)


def test_pool_demand_without_measurement_is_the_baselines() -> None:
    specs = [entitlement_spec("g", ServiceClass.GUARANTEED, 6), entitlement_spec("e", ServiceClass.ELASTIC, 5), entitlement_spec("s", ServiceClass.SPOT)]
    assert pool_demand(specs, {}, include_spot=True) == Capacity(0.0, 0.0, 11.0)


@pytest.mark.parametrize(
    ("amount", "utilization", "replicas"),
    [
        (Capacity(0.0, 0.0, 16.0), 1.0, 1),
        (Capacity(0.0, 0.0, 16.0), 0.9, 2),  # 16 / 14.4
        (Capacity(0.0, 0.0, 22.0), 0.9, 2),  # Exp 1's overload: 22 / 14.4 = 1.53
        (Capacity(480.0, 0.0, 1.0), 1.0, 2),  # throughput dominates
        (Capacity(0.0, 33e9, 1.0), 1.0, 3),  # KV dominates
        (Capacity(), 0.9, 0),
        (Capacity(240.0 * 3, 0.0, 0.0), 1.0, 3),  # exactly three replicas' worth: no rounding up
    ],
)
def test_replicas_for_is_the_ceiling_over_dimensions(amount: Capacity, utilization: float, replicas: int) -> None:
    assert replicas_for(amount, PER_REPLICA, utilization) == replicas


def test_replicas_for_skips_dimensions_a_replica_does_not_have() -> None:
    assert replicas_for(Capacity(0.0, 1e12, 3.0), Capacity(240.0, 0.0, 16.0)) == 1


def test_desired_replicas_is_clamped_to_the_pool_bounds() -> None:
    specs = [entitlement_spec("s", ServiceClass.SPOT)]
    huge = {"s": Capacity(0.0, 0.0, 1000.0)}
    assert desired_replicas(pool(1, 4), specs, huge, ScalingConfig()) == 4
    assert desired_replicas(pool(2, 4), specs, {}, ScalingConfig()) == 2


def test_desired_replicas_never_below_what_the_bound_baselines_need() -> None:
    specs = [entitlement_spec("e1", ServiceClass.ELASTIC, 16), entitlement_spec("e2", ServiceClass.ELASTIC, 16)]
    assert protected_floor(pool(), specs) == 2
    idle = {"e1": Capacity(), "e2": Capacity()}
    assert desired_replicas(pool(), specs, idle, ScalingConfig(target_utilization=1.0)) == 2


def test_unused_entitlement_capacity_is_lent_before_scaling_out() -> None:
    """Spot demand fits in what the elastic baseline leaves idle: no extra replica for it (demand is pool-wide)."""
    specs = [entitlement_spec("e", ServiceClass.ELASTIC, 8), entitlement_spec("s", ServiceClass.SPOT)]
    demand = {"e": Capacity(0.0, 0.0, 2.0), "s": Capacity(0.0, 0.0, 6.0)}
    assert desired_replicas(pool(), specs, demand, ScalingConfig(target_utilization=1.0)) == 1


@pytest.mark.parametrize("kwargs", [{"target_utilization": 0.0}, {"target_utilization": 1.5},
                                    {"scale_down_stabilization_s": -1.0}, {"cooldown_s": -1.0}])
def test_scaling_config_is_validated(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        ScalingConfig(**kwargs)


# ---- the stabiliser: worked sequences ------------------------------------------------------------------------

CFG = ScalingConfig(scale_down_stabilization_s=60.0, cooldown_s=15.0)


def run_steps(stabilizer: Stabilizer, steps: list[tuple[float, int, int]], config: ScalingConfig = CFG) -> list[int]:
    out = []
    for now_s, desired, floor in steps:
        stabilizer, replicas = stabilizer.step(now_s, desired, floor, config)
        out.append(replicas)
    return out


def test_scale_up_applies_at_once() -> None:
    assert run_steps(Stabilizer(2), [(0.0, 5, 1)]) == [5]


def test_scale_down_takes_the_highest_recommendation_of_the_window() -> None:
    steps = [(0.0, 5, 1), (20.0, 3, 1), (40.0, 2, 1), (60.0, 2, 1), (80.0, 2, 1), (100.0, 2, 1)]
    # 5 recommended at 0 s is in the window until 60 s; 3 (at 20 s) until 80 s
    assert run_steps(Stabilizer(2), steps) == [5, 5, 5, 3, 2, 2]


def test_a_fresh_stabilizer_waits_a_window_before_scaling_down() -> None:
    """A restarted scaler has no history: one low reading must not shrink the pool at once."""
    steps = [(0.0, 1, 1), (30.0, 1, 1), (59.0, 1, 1), (60.0, 1, 1)]
    assert run_steps(Stabilizer(4), steps) == [4, 4, 4, 1]


def test_a_floor_driven_size_is_stabilised_like_any_other() -> None:
    """4 replicas were needed for the protected floor until 10 s; the drop of the floor waits the window too."""
    steps = [(0.0, 1, 4), (10.0, 1, 4), (20.0, 1, 1), (69.0, 1, 1), (71.0, 1, 1)]
    assert run_steps(Stabilizer(4, recommendations=((0.0, 4),)), steps) == [4, 4, 4, 4, 1]


def test_cooldown_blocks_a_second_change() -> None:
    steps = [(0.0, 3, 1), (5.0, 6, 1), (14.9, 6, 1), (15.0, 6, 1)]
    assert run_steps(Stabilizer(1), steps) == [3, 3, 3, 6]


def test_the_protected_floor_is_not_held_back_by_the_cooldown() -> None:
    """Promised never exceeds provisioned: a newly Bound baseline gets its replicas without waiting."""
    steps = [(0.0, 3, 1), (5.0, 1, 5)]
    assert run_steps(Stabilizer(1), steps) == [3, 5]


# ---- invariant 8 ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scenario:
    min_replicas: int
    max_replicas: int
    initial: int
    config: ScalingConfig
    steps: list[tuple[float, int, int]]  # (now_s, desired, floor), desired and floor within [min, max]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    lo = draw(st.integers(0, 3))
    hi = draw(st.integers(max(1, lo), 8))
    config = ScalingConfig(scale_down_stabilization_s=draw(st.sampled_from([0.0, 10.0, 60.0])),
                           cooldown_s=draw(st.sampled_from([0.0, 5.0, 15.0])))
    now, steps = 0.0, []
    for _ in range(draw(st.integers(1, 30))):
        now += draw(st.sampled_from([0.0, 1.0, 5.0, 10.0, 30.0]) | st.floats(0.0, 40.0))
        floor = draw(st.integers(lo, hi))
        steps.append((now, draw(st.integers(floor, hi)), floor))  # desired_replicas is never below the floor
    return Scenario(lo, hi, draw(st.integers(lo, hi)), config, steps)


def trace(s: Scenario) -> list[int]:
    return run_steps(Stabilizer(s.initial), s.steps, s.config)


@PROPERTY
@given(s=scenarios())
def test_stabilizer_stays_within_bounds_and_never_below_the_floor(s: Scenario) -> None:
    """Invariant 8a — with recommendations and floors within [min, max] the size stays within [min, max], and
    after every step it is at least that step's protected floor (the floor beats the cooldown)."""
    for (_, _, floor), replicas in zip(s.steps, trace(s)):
        assert s.min_replicas <= replicas <= s.max_replicas
        assert replicas >= floor


@PROPERTY
@given(s=scenarios())
def test_scale_down_waits_the_stabilization_window(s: Scenario) -> None:
    """Invariant 8b — a scale-down at t to n happens only if neither this step nor any in (t − window, t) recommended
    more than n
    (a recommendation is max(desired, floor)), and within the first window after the first step the stabiliser
    does not go below its initial size."""
    window = s.config.scale_down_stabilization_s
    previous = s.initial
    t_first = s.steps[0][0]
    for i, ((now, desired, floor), replicas) in enumerate(zip(s.steps, trace(s))):
        if replicas < previous:
            recent = [max(d, f) for (t, d, f) in s.steps[:i] if t > now - window] + [max(desired, floor)]
            assert max(recent) <= replicas, (now, recent, replicas)
            if now - t_first < window:
                assert replicas >= s.initial
        previous = replicas


@PROPERTY
@given(s=scenarios())
def test_cooldown_is_honoured(s: Scenario) -> None:
    """Invariant 8c — two changes are at least the cooldown apart, unless the later one lifts the size to the
    protected floor."""
    last_change = None
    previous = s.initial
    for (now, _, floor), replicas in zip(s.steps, trace(s)):
        if replicas != previous:
            if last_change is not None and now - last_change < s.config.cooldown_s:
                assert previous < floor <= replicas, (now, last_change, previous, replicas, floor)
            last_change = now
        previous = replicas


@PROPERTY
@given(s=scenarios(), hold=st.integers(0, 8), floor_share=st.integers(0, 8))
def test_stabilizer_converges_to_a_steady_recommendation(s: Scenario, hold: int, floor_share: int) -> None:
    """Invariant 8d — liveness (a stabiliser that never moves would pass 8a–c): after any history, a steady
    recommendation held for longer than the window plus the cooldown is reached."""
    floor = s.min_replicas + floor_share % (s.max_replicas - s.min_replicas + 1)
    desired = floor + hold % (s.max_replicas - floor + 1)
    stabilizer = Stabilizer(s.initial)
    for now, d, f in s.steps:
        stabilizer, _ = stabilizer.step(now, d, f, s.config)
    now = s.steps[-1][0]
    replicas = stabilizer.current
    end = now + s.config.scale_down_stabilization_s + s.config.cooldown_s + 2.0
    while now < end:
        now += 1.0
        stabilizer, replicas = stabilizer.step(now, desired, floor, s.config)
    assert replicas == desired
