"""The per-tick limit policy (tokenpools.core.limits): worked scenarios and the named invariants 1–5.

Dimensions are checked one by one: 0 = tokens/s, 1 = KV bytes, 2 = concurrency (whole slots after rounding).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.limits import Allocation, LimitConfig, compute_limits, split_across_proxies
from tokenpools.core.spec import EntitlementSpec
from tokenpools_dev.builders import entitlement_spec

PROPERTY = settings(max_examples=100, deadline=None)
DIMS = (0, 1, 2)


def slots_of(allocation: Allocation) -> dict[str, int]:
    return {name: int(c.concurrency) for name, c in allocation.limits.items()}


def run(case) -> Allocation:  # noqa: ANN001 - a conftest LimitsCase
    config = LimitConfig(lend_idle_protected=case.lend_idle_protected, burst_headroom=case.burst_headroom)
    return compute_limits(case.capacity, case.entitlements, case.priorities, case.demand, config)


def dim(c: Capacity, d: int) -> float:
    return c.as_tuple()[d]


def tol(*scales: float) -> float:
    return 1e-9 * max((1.0, *scales)) + 1e-6


def idle_protected(case, e: EntitlementSpec, d: int) -> float:  # noqa: ANN001
    """The part of a protected baseline its owner does not currently demand (what the policy may lend)."""
    demand = case.demand.get(e.name)
    if not case.lend_idle_protected or demand is None:
        return 0.0
    return max(0.0, dim(e.baseline, d) - dim(demand, d))


def want(case, e: EntitlementSpec, d: int) -> float:  # noqa: ANN001
    """What the policy tries to give: demand × (1 + headroom), in whole slots for concurrency (the baseline when
    demand is unknown), at most the ceiling."""
    ceiling = dim(e.ceiling(case.capacity), d)
    demand = case.demand.get(e.name)
    if demand is None:
        return min(ceiling, dim(e.baseline, d))
    asked = dim(demand, d) * (1 + case.burst_headroom)
    return min(ceiling, math.ceil(asked - 1e-9) if d == 2 else asked)  # a sequence needs a whole slot


# ---- worked scenarios (docs/paper.md#worked-numbers) ----------------------------------------------------------

EXP1 = [
    entitlement_spec("guaranteed-a", ServiceClass.GUARANTEED, 6),
    entitlement_spec("spot-b", ServiceClass.SPOT),
    entitlement_spec("guaranteed-c", ServiceClass.GUARANTEED, 6),
]
EXP1_PRIORITIES = {"guaranteed-a": 333.3, "spot-b": 0.33, "guaranteed-c": 333.3}
SIXTEEN_SLOTS = Capacity(240.0, 0.0, 16.0)


def test_exp1_overload_spot_gets_what_the_guaranteed_baselines_leave() -> None:
    demand = {"guaranteed-a": Capacity(0, 0, 6), "spot-b": Capacity(0, 0, 10), "guaranteed-c": Capacity(0, 0, 6)}
    allocation = compute_limits(SIXTEEN_SLOTS, EXP1, EXP1_PRIORITIES, demand)
    assert slots_of(allocation) == {"guaranteed-a": 6, "spot-b": 4, "guaranteed-c": 6}
    assert allocation.contended  # 22 slots demanded of 16


def test_exp1_idle_guaranteed_baseline_is_lent_to_spot_without_shrinking_it() -> None:
    demand = {"guaranteed-a": Capacity(0, 0, 6), "spot-b": Capacity(0, 0, 10), "guaranteed-c": Capacity()}
    allocation = compute_limits(SIXTEEN_SLOTS, EXP1, EXP1_PRIORITIES, demand, LimitConfig(lend_idle_protected=True))
    assert slots_of(allocation) == {"guaranteed-a": 6, "spot-b": 10, "guaranteed-c": 6}
    assert allocation.lent.concurrency == 6
    assert not allocation.contended


def test_exp1_without_lending_the_idle_baseline_stays_reserved_and_that_is_the_default() -> None:
    demand = {"guaranteed-a": Capacity(0, 0, 6), "spot-b": Capacity(0, 0, 10), "guaranteed-c": Capacity()}
    allocation = compute_limits(SIXTEEN_SLOTS, EXP1, EXP1_PRIORITIES, demand, LimitConfig(lend_idle_protected=False))
    assert slots_of(allocation)["spot-b"] == 4 and allocation.lent.concurrency == 0
    assert compute_limits(SIXTEEN_SLOTS, EXP1, EXP1_PRIORITIES, demand) == allocation


EXP2 = [entitlement_spec("copilot", ServiceClass.ELASTIC, 5), entitlement_spec("synth", ServiceClass.ELASTIC, 5)]
EXP2_PRIORITIES = {"copilot": 93.8, "synth": 20.3}
EXP2_DEMAND = {"copilot": Capacity(0, 0, 7), "synth": Capacity(0, 0, 7)}


def test_exp2_outage_copilot_bursts_above_its_baseline_synth_is_squeezed() -> None:
    """8 slots for two 5-slot elastic baselines, both asking 7, at zero debt: elastic shares split them by
    priority × baseline (docs/semantics.md#elastic-shares), 8 × 93.8/114.1 = 6.58 and 1.42, so copilot bursts to 7
    and synth keeps 1. (Before issue 30 the split stopped copilot at its baseline: 5 and 3.) Synth's debt is what
    brings it back to 2-3 in the replay (test_core_elastic_shares: debt raises the squeezed share)."""
    allocation = compute_limits(Capacity(0, 0, 8), EXP2, EXP2_PRIORITIES, EXP2_DEMAND)
    assert slots_of(allocation) == {"copilot": 7, "synth": 1}
    assert allocation.contended


def test_exp2_full_capacity_lets_both_burst_and_hands_out_every_slot() -> None:
    allocation = compute_limits(Capacity(0, 0, 16), EXP2, EXP2_PRIORITIES, EXP2_DEMAND)
    slots = slots_of(allocation)
    assert slots["copilot"] >= slots["synth"] >= 7  # both get their 7 (+25 % headroom), the rest by weight
    assert sum(slots.values()) == 16
    assert not allocation.contended


def test_outage_below_the_protected_baselines_does_not_lend_capacity_the_pool_lacks() -> None:
    """8 slots left, a 10-slot guaranteed baseline idle: spot may use the 8 slots, not 10."""
    specs = [entitlement_spec("g", ServiceClass.GUARANTEED, 10), entitlement_spec("s", ServiceClass.SPOT)]
    demand = {"g": Capacity(), "s": Capacity(0, 0, 20)}
    allocation = compute_limits(Capacity(0, 0, 8), specs, {"g": 333.3, "s": 0.33}, demand, LimitConfig(lend_idle_protected=True))
    assert slots_of(allocation) == {"g": 10, "s": 8}


def test_guaranteed_is_capped_at_its_baseline_and_spot_takes_the_surplus() -> None:
    specs = [entitlement_spec("g", ServiceClass.GUARANTEED, 4, 100.0), entitlement_spec("s", ServiceClass.SPOT)]
    demand = {"g": Capacity(500.0, 0, 12), "s": Capacity(10.0, 0, 1)}
    allocation = compute_limits(Capacity(1000.0, 0, 16), specs, {"g": 333.3, "s": 0.33}, demand)
    assert allocation.limits["g"] == Capacity(100.0, 0.0, 4.0)
    assert allocation.limits["s"] == Capacity(900.0, 0.0, 12.0)  # work-conserving: the whole surplus


def test_burst_ceiling_caps_an_elastic_entitlement() -> None:
    specs = [entitlement_spec("e", ServiceClass.ELASTIC, 2, burst_ceiling=Capacity(0, 0, 3))]
    allocation = compute_limits(Capacity(0, 0, 16), specs, {"e": 50.0}, {"e": Capacity(0, 0, 10)})
    assert slots_of(allocation) == {"e": 3}


def test_unknown_demand_is_assumed_to_be_the_baseline() -> None:
    specs = [entitlement_spec("e1", ServiceClass.ELASTIC, 4), entitlement_spec("e2", ServiceClass.ELASTIC, 4)]
    allocation = compute_limits(Capacity(0, 0, 8), specs, {"e1": 50.0, "e2": 40.0}, {})
    assert slots_of(allocation) == {"e1": 4, "e2": 4}
    assert not allocation.contended


def test_preemptible_is_served_after_spot() -> None:
    specs = [entitlement_spec("s", ServiceClass.SPOT), entitlement_spec("p", ServiceClass.PREEMPTIBLE)]
    demand = {"s": Capacity(0, 0, 4), "p": Capacity(0, 0, 4)}
    allocation = compute_limits(Capacity(0, 0, 5), specs, {"s": 0.33, "p": 0.033}, demand, LimitConfig(burst_headroom=0))
    assert slots_of(allocation) == {"s": 4, "p": 1}


def test_backend_waiting_queue_marks_the_pool_contended() -> None:
    allocation = compute_limits(Capacity(0, 0, 16), EXP2, EXP2_PRIORITIES, {}, backend_waiting=1)
    assert allocation.contended


def test_limit_config_rejects_negative_headroom() -> None:
    with pytest.raises(ValueError, match="burst_headroom"):
        LimitConfig(burst_headroom=-0.1)


# ---- invariant 1: limits never exceed pool capacity ----------------------------------------------------------

@PROPERTY
@given(data=st.data())
def test_limits_never_exceed_pool_capacity(core, data: st.DataObject) -> None:  # noqa: ANN001
    """Invariant 1 — in every dimension: each non-protected limit ≤ capacity (a protected limit ≤ max(capacity, its
    baseline): baselines are never shrunk, invariant 2); and what is handed out beyond the protected tenants' own
    current use fits the pool: Σ non-protected limits + Σ protected (limit − idle part of the baseline)
    ≤ max(capacity, Σ protected in-use baselines). This implies the weaker statement
    Σ non-protected limits + Σ protected min(baseline, demand) ≤ max(capacity, Σ protected baselines).
    """
    case = data.draw(core.limits_case())
    allocation = run(case)
    protected = [e for e in case.entitlements if e.service_class.protected]
    others = [e for e in case.entitlements if not e.service_class.protected]
    for d in DIMS:
        cap = dim(case.capacity, d)
        baselines = sum(dim(e.baseline, d) for e in protected)
        slack = tol(cap, baselines)
        for e in others:
            assert dim(allocation.limits[e.name], d) <= cap + slack, (e.name, d)
        for e in protected:
            assert dim(allocation.limits[e.name], d) <= max(cap, dim(e.baseline, d)) + slack, (e.name, d)
        handed_out = sum(dim(allocation.limits[e.name], d) for e in others) + sum(
            dim(allocation.limits[e.name], d) - idle_protected(case, e, d) for e in protected)
        in_use = sum(dim(e.baseline, d) - idle_protected(case, e, d) for e in protected)
        assert handed_out <= max(cap, in_use) + slack, d

        def used_baseline(e: EntitlementSpec) -> float:
            demand = case.demand.get(e.name)
            return dim(e.baseline, d) if demand is None else min(dim(e.baseline, d), dim(demand, d))

        weak = sum(dim(allocation.limits[e.name], d) for e in others) + sum(used_baseline(e) for e in protected)
        assert weak <= max(cap, baselines) + slack, d


# ---- invariant 2: protected baselines are never shrunk -------------------------------------------------------

@PROPERTY
@given(data=st.data())
def test_protected_baselines_are_never_shrunk(core, data: st.DataObject) -> None:  # noqa: ANN001
    """Invariant 2 — a dedicated or guaranteed limit is ≥ its baseline in every dimension, whatever the capacity,
    demand and priorities (guaranteed: exactly its baseline)."""
    case = data.draw(core.limits_case())
    allocation = run(case)
    for e in case.entitlements:
        if not e.service_class.protected:
            continue
        limit = allocation.limits[e.name]
        for d in DIMS:
            assert dim(limit, d) >= dim(e.baseline, d), (e.name, d)
        if e.service_class is ServiceClass.GUARANTEED:
            assert limit == e.baseline


# ---- invariant 3: work-conserving ----------------------------------------------------------------------------

@PROPERTY
@given(data=st.data())
def test_work_conserving(core, data: st.DataObject) -> None:  # noqa: ANN001
    """Invariant 3 — no capacity is left idle while someone is refused.

    The shareable capacity of a dimension is what the protected baselines leave plus the idle part of those
    baselines the policy lends: max(0, capacity − Σ protected in-use baselines). If any entitlement's limit is below
    its want (min(ceiling, demand × (1 + headroom)), or its baseline when demand is unknown), the shareable capacity is
    all handed out: Σ non-protected limits + Σ protected (limit − baseline) = shareable. For whole slots, "below its
    want" means fewer than ⌊want⌋ slots, and "all handed out" means ⌊shareable⌋ slots.
    """
    case = data.draw(core.limits_case())
    allocation = run(case)
    protected = [e for e in case.entitlements if e.service_class.protected]
    for d in DIMS:
        cap = dim(case.capacity, d)
        in_use = sum(dim(e.baseline, d) - idle_protected(case, e, d) for e in protected)
        shareable = max(0.0, cap - in_use)
        handed = sum(dim(allocation.limits[e.name], d) - (dim(e.baseline, d) if e.service_class.protected else 0.0)
                     for e in case.entitlements)
        slack = tol(cap, in_use)
        short = [
            e.name for e in case.entitlements
            if (dim(allocation.limits[e.name], d) < math.floor(want(case, e, d) + 1e-9) if d == 2
                else dim(allocation.limits[e.name], d) < want(case, e, d) - slack)
        ]
        if short:
            floor = math.floor(shareable + 1e-6) if d == 2 else shareable - slack
            assert handed >= floor, (d, short, handed, shareable)
        # and nothing beyond the shareable capacity is handed out (the other half of invariant 1)
        assert handed <= shareable + slack, (d, handed, shareable)


# ---- invariant 4: higher priority never gets the smaller limit ----------------------------------------------

@PROPERTY
@given(data=st.data())
def test_higher_priority_never_gets_a_smaller_limit(core, data: st.DataObject) -> None:  # noqa: ANN001
    """Invariant 4 — two entitlements of the same class, baseline and ceiling, both with unmet demand
    (limit < demand, beyond float noise) in a dimension: the one with the higher priority does not get the smaller
    limit there (for slots too, because a concurrency want is whole slots)."""
    case = data.draw(core.limits_case(max_entitlements=5))
    twin_class = data.draw(st.sampled_from(list(ServiceClass)), label="twin class")
    twin = data.draw(core.entitlement("twin", case.capacity, twin_class), label="twin")
    hi = EntitlementSpec("twin-hi", "pool", twin.service_class, twin.slo_ms, twin.baseline,
                         burst_ceiling=twin.burst_ceiling)
    lo = EntitlementSpec("twin-lo", "pool", twin.service_class, twin.slo_ms, twin.baseline,
                         burst_ceiling=twin.burst_ceiling)
    p_lo = data.draw(core.priority(), label="p_lo")
    p_hi = data.draw(st.floats(p_lo, 5000.0).filter(lambda p: p > p_lo), label="p_hi")
    top = case.capacity.scaled(1.5)
    demand = dict(case.demand)
    demand["twin-hi"] = data.draw(core.demand(top.tokens_per_s, top.kv_bytes, top.concurrency), label="demand hi")
    demand["twin-lo"] = data.draw(core.demand(top.tokens_per_s, top.kv_bytes, top.concurrency), label="demand lo")
    entitlements = [*case.entitlements, hi, lo]
    entitlements = data.draw(st.permutations(entitlements), label="order")
    priorities = {**case.priorities, "twin-hi": p_hi, "twin-lo": p_lo}
    config = LimitConfig(lend_idle_protected=case.lend_idle_protected, burst_headroom=case.burst_headroom)
    allocation = compute_limits(case.capacity, entitlements, priorities, demand, config)
    for d in DIMS:
        l_hi, l_lo = dim(allocation.limits["twin-hi"], d), dim(allocation.limits["twin-lo"], d)
        slack = tol(dim(case.capacity, d))
        if l_hi < dim(demand["twin-hi"], d) - slack and l_lo < dim(demand["twin-lo"], d) - slack:
            assert l_hi >= l_lo - slack, (d, l_hi, l_lo)


def test_higher_priority_wanting_part_of_a_slot_is_not_rounded_below_a_lower_one() -> None:
    """One free slot; the higher priority averages 0.25 in flight, the lower wants 2. A fractional want (0.25 vs
    0.75 of the slot) would round the slot to the lower priority and leave the higher one unable to admit anything."""
    twins = [entitlement_spec("hi", ServiceClass.ELASTIC, 1), entitlement_spec("lo", ServiceClass.ELASTIC, 1)]
    demand = {"hi": Capacity(0, 0, 0.25), "lo": Capacity(0, 0, 2.0)}
    allocation = compute_limits(Capacity(0, 0, 1), twins, {"hi": 1.0, "lo": 0.5}, demand, LimitConfig(burst_headroom=0))
    assert slots_of(allocation) == {"hi": 1, "lo": 0}


# ---- determinism ---------------------------------------------------------------------------------------------

@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_limits_do_not_depend_on_the_order_entitlements_are_listed(core, data: st.DataObject) -> None:  # noqa: ANN001
    """Replays must give identical limits: the policy orders by (priority, name) itself."""
    case = data.draw(core.limits_case())
    shuffled = data.draw(st.permutations(case.entitlements))
    config = LimitConfig(lend_idle_protected=case.lend_idle_protected, burst_headroom=case.burst_headroom)
    again = compute_limits(case.capacity, shuffled, case.priorities, case.demand, config)
    assert again == run(case)


# ---- invariant 5: per-proxy shares ---------------------------------------------------------------------------

def test_split_follows_demand_shares_above_a_floor() -> None:
    shares = split_across_proxies(Capacity(100.0, 1000.0, 10.0), {"p1": 60.0, "p2": 40.0}, floor_fraction=0.1)
    assert shares["p1"].tokens_per_s == pytest.approx(59.0)  # 0.1/2 + 0.9 · 0.6
    assert shares["p2"].kv_bytes == pytest.approx(410.0)
    assert (shares["p1"].concurrency, shares["p2"].concurrency) == (6.0, 4.0)


def test_split_with_no_demand_known_is_equal() -> None:
    shares = split_across_proxies(Capacity(90.0, 0.0, 9.0), {"a": 0.0, "b": 0.0, "c": 0.0})
    assert [s.tokens_per_s for s in shares.values()] == pytest.approx([30.0, 30.0, 30.0])
    assert [s.concurrency for s in shares.values()] == [3.0, 3.0, 3.0]


def test_split_across_no_proxy_is_empty() -> None:
    assert split_across_proxies(Capacity(1.0, 1.0, 1.0), {}) == {}


def test_split_rejects_a_floor_fraction_outside_unit_interval() -> None:
    with pytest.raises(ValueError, match="floor_fraction"):
        split_across_proxies(Capacity(1.0, 1.0, 1.0), {"a": 1.0}, floor_fraction=1.5)


def test_split_with_fewer_slots_than_proxies_gives_them_to_the_busiest() -> None:
    shares = split_across_proxies(Capacity(10.0, 0.0, 2.0), {"a": 1.0, "b": 0.0, "c": 5.0}, floor_fraction=0.0)
    assert {p: s.concurrency for p, s in shares.items()} == {"a": 1.0, "b": 0.0, "c": 1.0}


def test_split_hands_out_every_slot_even_to_proxies_without_demand() -> None:
    """2 slots, 3 proxies, all demand at one and no floor: the second slot must still go somewhere."""
    shares = split_across_proxies(Capacity(10.0, 0.0, 2.0), {"a": 0.0, "b": 0.0, "c": 1.0}, floor_fraction=0.0)
    assert {p: s.concurrency for p, s in shares.items()} == {"a": 1.0, "b": 0.0, "c": 1.0}


@PROPERTY
@given(
    data=st.data(),
    proxies=st.integers(1, 8),
    floor_fraction=st.sampled_from([0.0, 0.1, 0.5, 1.0]) | st.floats(0.0, 1.0),
)
def test_proxy_shares_add_up_to_the_entitlement_limit(core, data: st.DataObject, proxies: int,  # noqa: ANN001
                                                      floor_fraction: float) -> None:
    """Invariant 5 — split_across_proxies: the per-proxy shares add up to the entitlement's limit in every dimension
    (whole slots exactly), never negative; when the limit has at least one slot per live proxy, each gets ≥ 1."""
    limit = data.draw(core.capacity(max_slots=40))
    names = [f"proxy-{i}" for i in range(proxies)]
    shares_in = {n: data.draw(st.sampled_from([0.0, 1.0]) | st.floats(-1.0, 1e4), label=n) for n in names}
    shares = split_across_proxies(limit, shares_in, floor_fraction)
    assert sorted(shares) == sorted(names)
    total = Capacity.total(list(shares.values()))
    assert total.tokens_per_s == pytest.approx(limit.tokens_per_s, rel=1e-9, abs=1e-6)
    assert total.kv_bytes == pytest.approx(limit.kv_bytes, rel=1e-9, abs=1e-6)
    assert total.concurrency == limit.concurrency
    for share in shares.values():
        assert share.concurrency == int(share.concurrency)
        if limit.concurrency >= proxies:
            assert share.concurrency >= 1
