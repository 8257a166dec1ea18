"""Elastic shares (docs/semantics.md#elastic-shares): named invariants of the rule, on any pool, and the refusal it
names at the proxy.

- E1 guaranteed is never above (nor below) its baseline;
- E2 an elastic entitlement is above its baseline only when its priority is higher than that of every elastic
  entitlement it takes capacity from (one below min(want, baseline));
- E3 the published concurrency limits add up to at most the pool (beyond the protected baselines the pool lacks);
- E4 the re-split moves capacity between elastic entitlements only: what elastic holds together, and every other
  class's limit, are those of the tiers by class;
- E5 a higher priority never gets a smaller part of its baseline than a lower one, both wanting more;
- E6 ``yielding`` marks only elastic entitlements below their baseline with a higher priority above its own;
- E7 in a pool contended for slots, ``yielding`` never marks an entitlement that had its baseline for the asking:
  raise a marked entitlement's demand to its baseline and it still gets less, or at most one slot more than it
  has (its share then is still below the baseline, and whole-slot rounding hands it the slot). One whose limit is
  below its baseline because it asked for less is refused for its concurrency, not for priority.
"""

from __future__ import annotations

import math

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tokenpools.core.admission import AdmissionController, EntitlementLimits
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.limits import LimitConfig, compute_limits, elastic_shares, yielding
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.spec import EntitlementSpec
from tokenpools_dev.builders import entitlement_spec

PROPERTY = settings(max_examples=150, deadline=None)
DIMS = (0, 1, 2)


def run(case):  # noqa: ANN001, ANN201 - a conftest LimitsCase
    config = LimitConfig(lend_idle_protected=case.lend_idle_protected, burst_headroom=case.burst_headroom)
    return compute_limits(case.capacity, case.entitlements, case.priorities, case.demand, config)


def dim(c: Capacity, d: int) -> float:
    return c.as_tuple()[d]


def want(case, e: EntitlementSpec, d: int) -> float:  # noqa: ANN001
    ceiling = dim(e.ceiling(case.capacity), d)
    demand = case.demand.get(e.name)
    if demand is None:
        return min(ceiling, dim(e.baseline, d))
    asked = dim(demand, d) * (1 + case.burst_headroom)
    return min(ceiling, math.ceil(asked - 1e-9) if d == 2 else asked)


def tol(*scales: float) -> float:
    return 1e-9 * max((1.0, *scales)) + 1e-6


@PROPERTY
@given(data=st.data())
def test_e1_guaranteed_is_capped_at_its_baseline(core, data: st.DataObject) -> None:  # noqa: ANN001
    case = data.draw(core.limits_case())
    allocation = run(case)
    for e in case.entitlements:
        if e.service_class is ServiceClass.GUARANTEED:
            assert allocation.limits[e.name] == e.baseline


@PROPERTY
@given(data=st.data())
def test_e2_an_elastic_burst_is_won_against_everyone_it_takes_from(core, data: st.DataObject) -> None:  # noqa: ANN001
    """Checked on the float shares (tokens/s, KV) and on whole slots with one slot of rounding slack."""
    case = data.draw(core.limits_case())
    allocation = run(case)
    elastic = [e for e in case.entitlements if e.service_class is ServiceClass.ELASTIC]
    for d in DIMS:
        slack = 1.0 + 1e-6 if d == 2 else tol(dim(case.capacity, d))
        short = [e for e in elastic if dim(allocation.limits[e.name], d) < min(want(case, e, d), dim(e.baseline, d)) - slack]
        for e in elastic:
            if dim(allocation.limits[e.name], d) > dim(e.baseline, d) + slack:
                for other in short:
                    assert case.priorities[e.name] > case.priorities[other.name], (d, e.name, other.name)


@PROPERTY
@given(data=st.data())
def test_e3_published_concurrency_limits_never_exceed_the_pool(core, data: st.DataObject) -> None:  # noqa: ANN001
    """Σ limits ≤ the pool's slots, except as far as protected baselines (never shrunk) exceed the pool; with
    ``lend_idle_protected`` the idle part of a protected baseline is counted once (it is in the owner's limit and
    lent to another's)."""
    case = data.draw(core.limits_case())
    allocation = run(case)
    protected = sum(e.baseline.concurrency for e in case.entitlements if e.service_class.protected)
    total = sum(limit.concurrency for limit in allocation.limits.values())
    assert total - allocation.lent.concurrency <= max(case.capacity.concurrency, protected) + 1e-6


@PROPERTY
@given(data=st.data())
def test_e4_the_resplit_moves_capacity_between_elastic_entitlements_only(core, data: st.DataObject) -> None:  # noqa: ANN001
    """Against the tiers without the re-split (every elastic priority made equal per unit of baseline, which is what
    the re-split would then reproduce only in total): what elastic holds together is the same in tokens/s and KV,
    and no other class's limit moves."""
    case = data.draw(core.limits_case())
    allocation = run(case)
    elastic = [e.name for e in case.entitlements if e.service_class is ServiceClass.ELASTIC]
    flat = dict(case.priorities)
    for name in elastic:
        flat[name] = 1.0
    config = LimitConfig(lend_idle_protected=case.lend_idle_protected, burst_headroom=case.burst_headroom)
    # with every elastic at the same priority the tiers give elastic the same total (the split inside differs)
    same_total = compute_limits(case.capacity, case.entitlements, flat, case.demand, config)
    for d in (0, 1):
        ours = sum(dim(allocation.limits[n], d) for n in elastic)
        theirs = sum(dim(same_total.limits[n], d) for n in elastic)
        if not any(e.service_class is not ServiceClass.ELASTIC and e.service_class.may_burst
                   for e in case.entitlements):  # (another burster's weighted share depends on elastic priorities)
            assert math.isclose(ours, theirs, rel_tol=1e-9, abs_tol=tol(dim(case.capacity, d))), d
    for e in case.entitlements:
        if not e.service_class.may_burst or e.service_class is ServiceClass.GUARANTEED:
            assert allocation.limits[e.name] == same_total.limits[e.name]


@PROPERTY
@given(total=st.floats(0.0, 100.0), data=st.data())
def test_e5_a_higher_priority_gets_no_smaller_part_of_its_baseline(total: float, data: st.DataObject) -> None:
    n = data.draw(st.integers(2, 6))
    priorities = data.draw(st.lists(st.floats(0.01, 1000.0), min_size=n, max_size=n))
    baselines = data.draw(st.lists(st.floats(0.5, 20.0), min_size=n, max_size=n))
    wants = data.draw(st.lists(st.floats(0.0, 40.0), min_size=n, max_size=n))
    shares = elastic_shares(total, priorities, baselines, wants)
    assert sum(shares) <= total + 1e-6
    assert sum(shares) >= min(total, sum(wants)) - 1e-6  # work-conserving among elastic
    for i in range(n):
        assert -1e-9 <= shares[i] <= wants[i] + 1e-9
        for j in range(n):
            if priorities[i] > priorities[j] and shares[i] < wants[i] - 1e-6 and shares[j] < wants[j] - 1e-6:
                assert shares[i] / baselines[i] >= shares[j] / baselines[j] - 1e-9


@PROPERTY
@given(data=st.data())
def test_e6_yielding_marks_only_entitlements_a_higher_priority_outbursts(core, data: st.DataObject) -> None:  # noqa: ANN001
    case = data.draw(core.limits_case())
    allocation = run(case)
    marked = yielding(case.entitlements, allocation.limits, case.priorities, allocation.contended)
    for e in case.entitlements:
        if e.name not in marked:
            continue
        assert e.service_class is ServiceClass.ELASTIC, e.name
        assert allocation.limits[e.name].concurrency < e.baseline.concurrency, e.name
        assert any(case.priorities[o.name] > case.priorities[e.name]
                   and allocation.limits[o.name].concurrency > o.baseline.concurrency for o in case.entitlements), e.name


def test_e7_a_limit_below_the_baseline_by_its_own_small_demand_does_not_yield() -> None:
    """Exp 2 after reports joins (open loop, 215 s): reports' debt lifts it above copilot and it bursts to 11 slots;
    copilot asked for 4 and got 4. Had copilot asked for its 5, it would have had them (its weight reaches ~7.6 at
    the level the re-split filled to), so a fifth request is refused for concurrency, not for priority. Synth,
    squeezed to 1 while asking for 19, yields."""
    ents = [elastic("copilot", 5, 150.0), elastic("synth", 5, 150.0), elastic("reports", 5, 150.0)]
    priorities = {"copilot": 83.6, "synth": 16.0, "reports": 120.6}
    limits = {"copilot": Capacity(0, 0, 4), "synth": Capacity(0, 0, 1), "reports": Capacity(0, 0, 11)}
    assert yielding(ents, limits, priorities, True) == {"synth"}
    assert yielding(ents, limits, priorities, False) == frozenset()  # with capacity to spare nobody is squeezed
    demand = {"copilot": Capacity(0, 0, 4), "synth": Capacity(0, 0, 19), "reports": Capacity(0, 0, 11)}
    asked_more = compute_limits(Capacity(0, 0, 16), ents, priorities, demand | {"copilot": Capacity(0, 0, 5)})
    assert asked_more.limits["copilot"].concurrency >= 5  # it had its baseline for the asking


def test_e7_nobody_yields_while_spot_holds_a_slot() -> None:
    """Found by the property below: the only burster above its baseline is capped by its ceiling, so the level
    read from the limits is too low, and an elastic entitlement that asked for nothing looked squeezed. Spot held
    two slots, which it gets only once every elastic want is met."""
    ents = [EntitlementSpec(name="gold", pool="pool", service_class=ServiceClass.GUARANTEED, slo_ms=200.0,
                            baseline=Capacity(0, 0, 1)),
            EntitlementSpec(name="idle", pool="pool", service_class=ServiceClass.ELASTIC, slo_ms=200.0,
                            baseline=Capacity(0, 0, 1)),
            EntitlementSpec(name="capped", pool="pool", service_class=ServiceClass.ELASTIC, slo_ms=200.0,
                            baseline=Capacity(0, 0, 1), burst_ceiling=Capacity(0, 0, 3)),
            EntitlementSpec(name="spot", pool="pool", service_class=ServiceClass.SPOT, slo_ms=200.0,
                            baseline=Capacity(0, 0, 0))]
    priorities = {"gold": 1.0, "idle": 1.0, "capped": 4.0, "spot": 1.0}
    demand = {"gold": None, "idle": Capacity(0, 0, 0), "capped": Capacity(0, 0, 2.625), "spot": Capacity(0, 0, 2.625)}
    allocation = compute_limits(Capacity(0, 0, 6), ents, priorities, demand)
    assert allocation.contended
    assert {n: c.concurrency for n, c in allocation.limits.items()} == {"gold": 1, "idle": 0, "capped": 3, "spot": 2}
    assert yielding(ents, allocation.limits, priorities, allocation.contended) == frozenset()


@PROPERTY
@given(data=st.data())
def test_e7_yielding_never_marks_an_entitlement_that_had_its_baseline_for_the_asking(core, data: st.DataObject) -> None:  # noqa: ANN001
    """In a pool contended for slots (the unprotected entitlements ask for more than the protected baselines
    leave). Contended in tokens or KV only, with slots to spare, the idle slots go to whoever may burst by
    priority and the published limits cannot tell that from a squeeze: a refusal at the limit may then be named
    low_priority where concurrency was meant (the decision, a refusal, is the same; docs/semantics.md#elastic-shares)."""
    case = data.draw(core.limits_case())
    allocation = run(case)
    unprotected = sum(want(case, e, 2) for e in case.entitlements if not e.service_class.protected)
    protected = sum(e.baseline.concurrency for e in case.entitlements if e.service_class.protected)
    assume(unprotected > case.capacity.concurrency - protected)
    marked = yielding(case.entitlements, allocation.limits, case.priorities, allocation.contended)
    for e in case.entitlements:
        if e.name not in marked:
            continue
        asking = dict(case.demand)
        d = asking.get(e.name) or Capacity()
        asking[e.name] = Capacity(d.tokens_per_s, d.kv_bytes, max(d.concurrency, e.baseline.concurrency))
        config = LimitConfig(lend_idle_protected=case.lend_idle_protected, burst_headroom=case.burst_headroom)
        again = compute_limits(case.capacity, case.entitlements, case.priorities, asking, config)
        got, had = again.limits[e.name].concurrency, allocation.limits[e.name].concurrency
        assert got < e.baseline.concurrency or got - had <= 1, e.name  # (one slot: a share below it, rounded up)


# ---- the paper's Exp 2 outage ---------------------------------------------------------------------------------

def elastic(name: str, slots: float, tokens_per_s: float) -> EntitlementSpec:
    return entitlement_spec(name, ServiceClass.ELASTIC, slots, tokens_per_s)


EXP2 = [elastic("copilot", 5, 150.0), elastic("synth", 5, 150.0)]
OUTAGE = Capacity(240.0, 0.0, 8.0)


def test_exp2_outage_the_higher_priority_bursts_above_its_baseline() -> None:
    """8 slots for two 5-slot baselines, both asking 7: priorities 93.8 / 20.3 split them about 6.6 / 1.4."""
    demand = {"copilot": Capacity(200.0, 0, 7), "synth": Capacity(200.0, 0, 7)}
    allocation = compute_limits(OUTAGE, EXP2, {"copilot": 93.8, "synth": 20.3}, demand)
    assert {n: int(c.concurrency) for n, c in allocation.limits.items()} == {"copilot": 7, "synth": 1}
    assert allocation.limits["copilot"].tokens_per_s > 150.0  # its bucket refills faster too
    assert yielding(EXP2, allocation.limits, {"copilot": 93.8, "synth": 20.3}, allocation.contended) == {"synth"}


def test_exp2_outage_debt_raises_the_squeezed_share() -> None:
    """Synth's debt 0.5 triples its priority (Eq. 1): its share grows, copilot still ahead."""
    demand = {"copilot": Capacity(200.0, 0, 7), "synth": Capacity(200.0, 0, 7)}
    allocation = compute_limits(OUTAGE, EXP2, {"copilot": 93.8, "synth": 60.8}, demand)
    slots = {n: int(c.concurrency) for n, c in allocation.limits.items()}
    assert slots == {"copilot": 5, "synth": 3}
    assert yielding(EXP2, allocation.limits, {"copilot": 93.8, "synth": 60.8}, allocation.contended) == frozenset()


def test_equal_priorities_split_by_baseline() -> None:
    assert elastic_shares(9.0, [10.0, 10.0], [2.0, 4.0], [9.0, 9.0]) == [3.0, 6.0]


def test_a_yielded_limit_refuses_for_low_priority_and_estimates_its_own_release() -> None:
    controller = AdmissionController(pool_concurrency=8, kv_bytes_per_token=1, default_max_tokens=10,
                                     token_bucket_window_s=10.0)
    controller.upsert_entitlement(EXP2[1], EntitlementLimits(1, 1e6, 1e9, 20.3, yields=True), 0.0)
    controller.upsert_entitlement(EXP2[0], EntitlementLimits(7, 1e6, 1e9, 93.8), 0.0)
    first = controller.admit("synth", "s1", 10, 10, 0.0)
    assert first.admitted
    controller.release(first.ticket, 20, 2.0)  # teaches the service time: 2 s
    assert controller.admit("synth", "s2", 10, 10, 2.0).admitted
    refused = controller.admit("synth", "s3", 10, 10, 2.5)
    assert refused.outcome is AdmissionOutcome.REFUSED_LOW_PRIORITY
    assert "higher priorities" in refused.reason
    assert refused.retry_after_ms == 1000  # its own next release: 1 × 2 s ÷ 1 in flight, at the 1-s ceiling
    assert controller.slot_estimate_ms("synth", refused.outcome) == 2000  # (the queue's estimate, not capped)
    for i in range(7):
        assert controller.admit("copilot", f"c{i}", 10, 10, 2.5).admitted  # the winner is never refused for priority
    assert controller.admit("copilot", "c7", 10, 10, 2.5).outcome is AdmissionOutcome.REFUSED_CONCURRENCY
