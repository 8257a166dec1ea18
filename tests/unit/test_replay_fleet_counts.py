"""The ``counts`` what-if: concurrency from the fleet-wide in-flight counts (share_p = L − (N − own_p))."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.admission import EntitlementLimits
from tokenpools.core.capacity import Capacity
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.replay.fleet.model import FleetConfig, run
from tokenpools.replay.fleet.policies import POLICIES, FleetView, Grants, Observation
from tokenpools.replay.fleet.trace import Entitlement, Request, Trace, TraceConfig, generate

COUNTS = POLICIES["counts"]


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(0, 40),
       st.lists(st.tuples(st.integers(0, 7), st.integers(0, 20)), max_size=12))
def test_each_proxy_may_hold_what_the_limit_leaves_after_the_others(proxies: int, limit: int,
                                                                    held: list[tuple[int, int]]) -> None:
    """Invariants: share_p = max(0, L − Σ_{q≠p} in_flight_q); so share_p + others_p ≥ L exactly when the fleet was
    below the limit, and a proxy that held the whole fleet's in-flight keeps share L."""
    names = tuple(f"p{i}" for i in range(proxies))
    fleet = FleetView(names, {"e": EntitlementLimits(limit, 100.0, 1e9, 1.0)}, Capacity(100.0, 1e9, 1000.0))
    in_flight: dict[str, int] = {}
    for proxy, n in held:
        if proxy < proxies and n:
            in_flight[names[proxy]] = in_flight.get(names[proxy], 0) + n
    grants = COUNTS.decide(fleet, Observation({}, {"e": in_flight} if in_flight else {}), COUNTS.initial(fleet))
    total = sum(in_flight.values())
    for proxy in names:
        slots, tokens_per_s, _ = grants.shares[proxy]["e"]
        assert slots == max(0, limit - (total - in_flight.get(proxy, 0)))
        assert tokens_per_s == 100.0  # not split: a what-if for concurrency alone
    assert grants.pool_slots == {p: 1000 for p in names}


def test_at_one_proxy_counts_decides_exactly_as_the_exact_enforcer() -> None:
    """One proxy: its share is L − 0 = L every tick, so nothing changes and every decision is the reference's."""
    trace = generate(TraceConfig(entitlements=20, duration_s=40.0, load=0.9, tokens_headroom=0.5), random.Random(2))
    counts = run(trace, FleetConfig(proxies=1, policy="counts"), random.Random(0))
    exact = run(trace, FleetConfig(proxies=1, policy="exact"), random.Random(0))
    assert counts.decisions == exact.decisions and counts.figures.refusals > 0


def test_a_second_proxy_admits_while_the_fleet_has_room_and_both_may_spend_the_same_slot() -> None:
    """Limit 2, round robin. At the first window's end p0 holds 1, so p0 may hold 2 and p1 may hold 1: p1 admits
    (today's split would give it nothing it has not shown demand for), and so does p0, spending the same free slot
    within the tick: fleet-wide in flight reaches 3, the overshoot this design trades for fewer refusals."""
    trace = Trace((Entitlement("e", 2, 1e6, 0.0),),
                  (Request(0.5, "e", "r0", 10, 10, 5, 30.0), Request(1.5, "e", "r1", 10, 10, 5, 30.0),
                   Request(1.6, "e", "r2", 10, 10, 5, 30.0), Request(2.5, "e", "r3", 10, 10, 5, 30.0)), 10.0, 10)
    config = FleetConfig(proxies=2, policy="counts", balancer="round_robin", tick_s=1.0, propagation_delay_s=0.1)
    result = run(trace, config, random.Random(0))
    admitted, refused = AdmissionOutcome.ADMITTED, AdmissionOutcome.REFUSED_CONCURRENCY
    assert result.decisions == (admitted, admitted, admitted, refused)  # r3 at p1: the others hold 2 = L
    assert result.figures.overshoot_max_slots == 1 and result.figures.false_refusals == 0
