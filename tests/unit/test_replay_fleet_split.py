"""The fleet model's ``shares`` policy is the agents' split: the same per-proxy shares, the same update bytes.

The model does not import the agents (components are independent); its wrapper calls the core functions the
agents call. Here, on generated windows, it is checked against what the agents do: ``streams.hold_back.hold_back``
applied to the ``LimitUpdate`` that ``topics.limits.build_limit_update`` makes from the same attempts, in-flight
levels and previous grants.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.admission import EntitlementLimits
from tokenpools.core.capacity import Capacity
from tokenpools.core.tick import Signals, TickResult
from tokenpools.replay.fleet.policies import FleetView, Grants, Observation, Split
from tokenpools.streams.counts.hold_back import grants_of, hold_back
from tokenpools.topics.codec import encode
from tokenpools.topics.limits import build_limit_update
from tokenpools.topics.records import LimitUpdate

PROPERTY = settings(max_examples=200, deadline=None)
T_MS = 1_700_000_001_000


@st.composite
def window(draw: st.DrawFn) -> tuple[FleetView, Observation, Grants, float]:
    """Fleet limits, one window's attempts and in-flight levels, previous grants, and the split's floor."""
    proxies = tuple(f"p{i}" for i in range(draw(st.integers(1, 6))))
    names = [f"e{i}" for i in range(draw(st.integers(1, 5)))]
    limits = {
        name: EntitlementLimits(draw(st.integers(0, 12)), draw(st.floats(0.0, 10_000.0)),
                                draw(st.floats(0.0, 1e12)), draw(st.floats(0.0, 5000.0)))
        for name in names
    }
    slots = sum(lim.concurrency for lim in limits.values())
    pool = Capacity(sum(lim.tokens_per_s for lim in limits.values()), sum(lim.kv_bytes for lim in limits.values()),
                    float(draw(st.integers(0, slots + 4))))
    counts = st.dictionaries(st.sampled_from(proxies), st.integers(0, 15), max_size=len(proxies))
    attempts = {name: draw(counts) for name in names}
    in_flight = {name: draw(counts) for name in names}
    previous = Grants(
        {p: {name: (draw(st.integers(0, 12)), 1.0, 1.0) for name in names} for p in proxies},
        {p: draw(st.integers(0, slots + 4)) for p in proxies},
    )
    fleet = FleetView(proxies, limits, pool, mean_slo_ms=draw(st.sampled_from([0.0, 500.0, 1234.5])))
    return fleet, Observation(attempts, in_flight), previous, draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))


def agents_update(fleet: FleetView, seen: Observation, previous: Grants, floor_fraction: float) -> LimitUpdate:
    """What the agents publish for this window (streams.pool_state._tick_window, with static limits)."""
    names = sorted(fleet.limits)
    tick = TickResult(
        signals={n: Signals() for n in names},
        priorities={n: fleet.limits[n].priority for n in names},
        limits={n: Capacity(fleet.limits[n].tokens_per_s, fleet.limits[n].kv_bytes,
                            float(fleet.limits[n].concurrency)) for n in names},
        contended=False, desired_replicas=1, lent=Capacity(),
    )
    demand = {p: {n: float(a) for n in names if (a := seen.attempts[n].get(p, 0)) > 0} for p in fleet.proxies}
    update = build_limit_update("pool", T_MS, T_MS, tick, fleet.pool, fleet.mean_slo_ms, demand, 0.0, floor_fraction)
    granted = {n: {p: previous.shares[p][n][0] for p in fleet.proxies} for n in names}
    return hold_back(update, seen.in_flight, granted, dict(previous.pool_slots))


@PROPERTY
@given(window())
def test_the_split_policy_grants_what_the_agents_hold_back_to(case: tuple[FleetView, Observation, Grants, float]) -> None:
    fleet, seen, previous, floor_fraction = case
    policy = Split(floor_fraction=floor_fraction)
    mine = policy.decide(fleet, seen, previous)
    update = agents_update(fleet, seen, previous, floor_fraction)
    granted, pool_granted = grants_of(update)
    assert {n: {p: mine.shares[p][n][0] for p in fleet.proxies} for n in fleet.limits} == granted
    assert dict(mine.pool_slots) == pool_granted
    assert {s.proxy_id: s.entitlements for s in update.proxies} == {p: dict(mine.shares[p]) for p in fleet.proxies}
    # the record a proxy reads under this design is the agents' record, byte for byte
    assert encode(policy.wire(fleet, mine, T_MS)) == encode(update)


def test_before_any_window_every_proxy_holds_an_equal_split() -> None:
    fleet = FleetView(("p0", "p1", "p2"), {"e": EntitlementLimits(7, 300.0, 3e9, 1.0)}, Capacity(300.0, 3e9, 7.0))
    grants = Split().initial(fleet)
    assert [grants.shares[p]["e"][0] for p in fleet.proxies] == [3, 2, 2]
    assert sum(grants.shares[p]["e"][1] for p in fleet.proxies) == pytest.approx(300.0)
    assert sum(grants.pool_slots.values()) == 7
