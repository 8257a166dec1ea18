"""The ``counts`` design: fleet counts every ``counts_interval_s``, bounded growth, a token budget from the fleet
bucket, the pool treated alike, and the record a proxy reads (tokenpools/core/fleet.py, replay/fleet/policies.py, topics/counts.py)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.admission import AdmissionController, EntitlementLimits
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.spec import EntitlementSpec
from tokenpools.core.fleet import growth, growth_bound, slot_share, token_budget
from tokenpools.replay.fleet.model import FleetConfig, run
from tokenpools.replay.fleet.policies import POLICIES, Counts, FleetView
from tokenpools.replay.fleet.trace import Entitlement, Request, Trace, TraceConfig, generate
from tokenpools.topics.counts import CountsRecord, decode_counts, encode_counts

PROPERTY = settings(max_examples=200, deadline=None)
COUNTS = POLICIES["counts"]
FRACTIONS = st.sampled_from([1.0, 1.5, 2.0, 4.0, math.inf])


@PROPERTY
@given(st.integers(1, 300), st.integers(0, 300), st.integers(0, 300), st.integers(0, 300), st.booleans(),
       FRACTIONS)
def test_a_proxy_never_holds_more_than_its_own_plus_a_bounded_growth(proxies: int, limit: int, fleet: int, active: int,
                                                                    was_active: bool, fraction: float) -> None:
    """0 ≤ g ≤ H = (L − N)⁺; g ≥ 1 whenever there is headroom (a proxy can always take one free slot); the share
    is own + g while the fleet is within the limit, ⌊own · L / N⌋ ≤ own beyond it."""
    active = min(active, proxies)
    own = min(fleet, 7)
    headroom = max(0, limit - fleet)
    g = growth(limit - fleet, active, proxies, was_active, fraction)
    assert 0 <= g <= headroom and (g >= 1) == (headroom >= 1)
    share = slot_share(limit, fleet, own, active, proxies, was_active, fraction)
    assert share == (own + g if fleet <= limit else own * limit // fleet)
    if not math.isinf(fraction) and was_active and active:
        assert g <= max(1, math.ceil(fraction * headroom / active))


@PROPERTY
@given(st.integers(1, 300), st.integers(0, 300), st.integers(0, 300), FRACTIONS, st.data())
def test_the_whole_fleet_growing_at_once_stays_within_the_stated_bound(proxies: int, limit: int, fleet: int,
                                                                       fraction: float, data: st.DataObject) -> None:
    """Whichever A proxies were active, Σ_p g_p ≤ growth_bound(H, A, P, f); for a finite f it is at most
    f·H·(1 + (P − A)/(A + 1)) + P, and with every proxy active at most f·H + P."""
    active = data.draw(st.integers(0, proxies))
    headroom = limit - fleet
    total = sum(growth(headroom, active, proxies, i < active, fraction) for i in range(proxies))
    bound = growth_bound(headroom, active, proxies, fraction)
    assert total <= bound
    if headroom > 0 and not math.isinf(fraction):
        assert bound <= fraction * headroom * (1 + (proxies - active) / (active + 1)) + proxies
        if active == proxies:
            assert bound <= fraction * headroom + proxies


@PROPERTY
@given(st.floats(-5e4, 5e5, allow_nan=False), st.integers(1, 300), st.integers(0, 300), st.booleans(),
       st.sampled_from([1.0, 2.0, math.inf]), st.integers(0, 4096))
def test_a_token_budget_never_exceeds_the_fleet_bucket_and_always_fits_one_request_it_holds(
        bucket: float, proxies: int, active: int, was_active: bool, fraction: float, reservation: int) -> None:
    active = min(active, proxies)
    budget = token_budget(bucket, active, proxies, was_active, fraction, float(reservation))
    assert budget <= bucket
    assert budget >= min(bucket, reservation)


@PROPERTY
@given(st.floats(0, 20_000), st.lists(st.integers(1, 1500), max_size=40))
def test_a_proxy_never_spends_more_than_its_derived_budget(budget: float, costs: list[int]) -> None:
    """With its bucket set to the budget (``set_bucket_tokens``) and no time passing, what a proxy admits costs at
    most the budget, and it admits every request that still fits."""
    controller = AdmissionController(pool_concurrency=1000, kv_bytes_per_token=0, default_max_tokens=0,
                                     token_bucket_window_s=10.0)
    spec = EntitlementSpec(name="e", pool="pool", service_class=ServiceClass.GUARANTEED, slo_ms=1000.0,
                           baseline=Capacity(2000.0, 1e12, 1000.0))
    controller.upsert_entitlement(spec, EntitlementLimits(1000, 2000.0, 1e12, 1.0), 0.0)
    controller.set_bucket_tokens("e", budget, 1.0)
    spent = 0
    for i, cost in enumerate(costs):
        decision = controller.admit("e", f"r{i}", cost, 0, 1.0)
        assert decision.admitted == (spent + cost <= budget)
        spent += cost if decision.admitted else 0
    assert spent <= budget


@PROPERTY
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**16 - 1),
       st.lists(st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**16 - 1), st.integers(-2**31, 2**31 - 1)),
                max_size=50), st.text(max_size=20))
def test_the_counts_record_round_trips_in_ten_bytes_per_entitlement(pool_n: int, pool_a: int,
                                                                    rows: list[tuple[int, int, int]], pool: str) -> None:
    record = CountsRecord(pool, 1_700_000_000_000, 1_700_000_000_100, pool_n, pool_a, 200, tuple(r[0] for r in rows),
                          tuple(r[1] for r in rows), tuple(r[2] for r in rows))
    data = encode_counts(record)
    assert decode_counts(data) == record
    assert len(data) == 33 + len(pool.encode()) + 10 * len(rows)
    with pytest.raises(ValueError):
        decode_counts(data[:-1] if rows else data[:5])


@PROPERTY
@given(st.integers(0, 100), st.lists(st.integers(0, 40), min_size=1, max_size=30), FRACTIONS)
def test_a_fleet_over_its_limit_shrinks_to_it_and_one_proxy_holds_it_exactly(limit: int, owns: list[int],
                                                                            fraction: float) -> None:
    """N > L (a lowered limit, lost capacity): the proxies' shares sum to at most L, each at most its own in flight,
    so the excess drains as requests end; one proxy holding all N gets exactly L, as the exact enforcer."""
    fleet = sum(owns)
    if fleet <= limit:
        return
    shares = [slot_share(limit, fleet, own, len(owns), len(owns), own > 0, fraction) for own in owns]
    assert sum(shares) <= limit and all(0 <= s <= own for s, own in zip(shares, owns))
    assert slot_share(limit, fleet, fleet, 1, 1, True, fraction) == limit


def test_the_record_a_proxy_reads_grows_with_the_entitlements_not_the_proxies() -> None:
    """Same trace at P = 2 and P = 50: the same bytes per update; ∝ E."""
    trace = generate(TraceConfig(entitlements=30, duration_s=3.0), random.Random(4))
    sizes = {p: run(trace, FleetConfig(proxies=p, policy="counts"), random.Random(0)).figures.update_bytes_max
             for p in (2, 50)}
    assert sizes[2] == sizes[50] == 33 + len(b"pool") + 10 * 30


@pytest.mark.parametrize("policy", ["counts", "counts_greedy"])
@pytest.mark.parametrize("load", [0.6, 1.5])
def test_at_one_proxy_counts_decides_exactly_as_the_exact_enforcer(policy: str, load: float) -> None:
    """One proxy: g = H, so it may hold L; its budget is the fleet bucket, which is its own: every decision is the
    reference's (tokens bind too: the tokens/s limits are half what the slots consume)."""
    trace = generate(TraceConfig(entitlements=20, duration_s=40.0, load=load, tokens_headroom=0.5), random.Random(2))
    counts = run(trace, FleetConfig(proxies=1, policy=policy), random.Random(0))
    exact = run(trace, FleetConfig(proxies=1, policy="exact"), random.Random(0))
    assert counts.decisions == exact.decisions
    assert exact.figures.refused.get(AdmissionOutcome.REFUSED_TOKEN_BUDGET, 0) > 0
    assert exact.figures.refused.get(AdmissionOutcome.REFUSED_CONCURRENCY, 0) > 0


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.sampled_from(["random", "round_robin", "key_affinity"]), st.integers(1, 6),
       st.lists(st.tuples(st.integers(0, 2), st.integers(1, 60)), min_size=1, max_size=60), FRACTIONS)
def test_with_fresh_counts_and_no_concurrency_the_fleet_never_exceeds_its_limit(
        proxies: int, balancer: str, limit: int, arrivals: list[tuple[int, int]], fraction: float) -> None:
    """Counts in force at once (no delay), and counts between any two events that could change a decision: each
    arrival comes 0.25 s after the previous one and every completion at least 0.15 s before the next arrival, none
    on the 0.1-s counts grid. Then each proxy admits only into the headroom the fleet had, so N_e ≤ L_e always, and
    no request is refused while the fleet had room (tokens do not bind here)."""
    entitlements = tuple(Entitlement(f"e{i}", limit * (i + 1), 1e9, 0.0) for i in range(3))
    requests, t_s = [], 0.0
    for k, (which, service_tenths) in enumerate(arrivals):
        t_s += 0.25  # arrivals at 0.25·j + 0.01: never on the grid, two counts instants apart
        service_s = (1 + service_tenths // 10) * 0.25 - 0.15  # ends 0.15 s before some arrival slot
        requests.append(Request(round(t_s + 0.01, 2), f"e{which}", f"r{k}", 10, 10, 5, round(service_s, 2)))
    trace = Trace(entitlements, tuple(requests), t_s + 1.0, 10)
    policies = {**POLICIES, "x": Counts(name="x", growth_fraction=fraction)}
    config = FleetConfig(proxies=proxies, policy="x", balancer=balancer, counts_interval_s=0.1,
                         propagation_delay_s=0.0)
    figures = run(trace, config, random.Random(3), policies).figures
    assert figures.overshoot_max_slots == 0 and figures.false_refusals == 0


def test_two_proxies_may_spend_the_same_free_slot_between_counts_within_the_growth_bound() -> None:
    """Limit 2, round robin, counts every 0.1 s in force 0.1 s later. At 0.5 s the counts say N = 1 (r0 at p0),
    H = 1: each proxy may grow by 1. r1 (p1) and r2 (p0) both arrive before the next counts are in force and both
    take the one free slot: fleet in flight 3, overshoot 1 = Σ g − H, within the stated bound; r3 (p1), once the
    counts say N = 3, is refused."""
    trace = Trace((Entitlement("e", 2, 1e6, 0.0),),
                  (Request(0.05, "e", "r0", 10, 10, 5, 30.0), Request(0.52, "e", "r1", 10, 10, 5, 30.0),
                   Request(0.53, "e", "r2", 10, 10, 5, 30.0), Request(0.9, "e", "r3", 10, 10, 5, 30.0)), 10.0, 10)
    config = FleetConfig(proxies=2, policy="counts", balancer="round_robin", counts_interval_s=0.1,
                         propagation_delay_s=0.1)
    result = run(trace, config, random.Random(0))
    admitted, refused = AdmissionOutcome.ADMITTED, AdmissionOutcome.REFUSED_CONCURRENCY
    assert result.decisions == (admitted, admitted, admitted, refused)
    assert result.figures.overshoot_max_slots == 1 == growth_bound(1, 1, 2, 2.0) - 1
    assert result.figures.false_refusals == 0


def test_a_run_is_deterministic() -> None:
    trace = generate(TraceConfig(entitlements=15, duration_s=10.0, load=1.2), random.Random(5))
    config = FleetConfig(proxies=7, policy="counts", balancer="random")
    first, second = (run(trace, config, random.Random(9)) for _ in range(2))
    assert first.decisions == second.decisions and first.figures == second.figures


def test_the_pool_share_is_own_plus_the_pools_growth() -> None:
    fleet = FleetView(("p0", "p1", "p2"), {"e": EntitlementLimits(4, 100.0, 1e9, 1.0)}, Capacity(100.0, 1e9, 10.0))
    record = COUNTS.publish(fleet, {"e": 3}, {"e": 2}, {"e": 900.7}, 6, 2, 100)  # type: ignore[attr-defined]
    assert record.bucket_tokens == (901,) and record.in_flight == (3,)
    assert COUNTS.pool_share(fleet, record, 2, True) == 2 + 4  # H = 10 − 6, ⌈2·4 / 2⌉  # type: ignore[attr-defined]
    assert COUNTS.pool_share(fleet, record, 0, False) == 0 + 3  # ⌈2·4 / (2 + 1)⌉  # type: ignore[attr-defined]


def test_growth_fraction_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="growth_fraction"):
        Counts(growth_fraction=0.5)
