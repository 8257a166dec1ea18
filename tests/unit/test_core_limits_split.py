"""A moving per-proxy split never puts more than the limit in flight (tokenpools.core.limits.hold_back_growth).

Named invariant 6 — *Σ over proxies of granted concurrency ≤ limit whenever the in-flight reports are current*,
in the form that matters: a proxy enforces its grant on new admissions only, so what the proxies can have in flight
together is Σ_p max(grant_p, in_flight_p); it never exceeds the limit (unless it already did before the split).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.capacity import Capacity
from tokenpools.core.limits import hold_back_growth, split_across_proxies

PROPERTY = settings(max_examples=300, deadline=None)
PROXIES = ["p0", "p1", "p2", "p3"]


def test_the_growing_replica_waits_for_the_shrinking_one_to_release() -> None:
    """3/3 → 5/1 with both holding 3: p1 shrinks to 1 at once, p0 grows only into what p1 released."""
    assert hold_back_growth(6, {"p0": 5, "p1": 1}, {"p0": 3, "p1": 3}) == {"p0": 3, "p1": 1}
    assert hold_back_growth(6, {"p0": 5, "p1": 1}, {"p0": 3, "p1": 2}) == {"p0": 4, "p1": 1}
    assert hold_back_growth(6, {"p0": 5, "p1": 1}, {"p0": 3, "p1": 1}) == {"p0": 5, "p1": 1}


def test_nothing_held_beyond_the_targets_grants_the_targets() -> None:
    assert hold_back_growth(6, {"p0": 5, "p1": 1}, {}) == {"p0": 5, "p1": 1}
    assert hold_back_growth(6, {"p0": 3, "p1": 3}, {"p0": 3, "p1": 3}) == {"p0": 3, "p1": 3}


def test_a_proxy_gone_from_the_split_still_holds_its_requests() -> None:
    assert hold_back_growth(6, {"p0": 6}, {"p0": 2, "old": 3}) == {"p0": 3}


def test_an_overshoot_already_in_flight_lets_nobody_admit() -> None:
    """p1 holds 5 of a 4-slot limit: p0 gets nothing, p1 its target of 2, which is below what it holds."""
    assert hold_back_growth(4, {"p0": 2, "p1": 2}, {"p0": 1, "p1": 5}) == {"p0": 0, "p1": 2}


def test_negative_input_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match="limit_slots"):
        hold_back_growth(-1, {"p0": 1}, {})
    with pytest.raises(ValueError, match="in_flight"):
        hold_back_growth(2, {"p0": 1}, {"p0": -1})
    with pytest.raises(ValueError, match="targets"):
        hold_back_growth(2, {"p0": -1}, {})


@st.composite
def split_case(draw: st.DrawFn) -> tuple[int, dict[str, int], dict[str, int]]:
    """A limit, a new split of it (whole slots, as split_across_proxies gives) and any in-flight counts."""
    n = draw(st.integers(1, len(PROXIES)))
    names = PROXIES[:n]
    limit = draw(st.integers(0, 24))
    demand = {p: draw(st.floats(0.0, 100.0), label=f"demand {p}") for p in names}
    split = split_across_proxies(Capacity(1.0, 1.0, float(limit)), demand, draw(st.sampled_from([0.0, 0.1, 1.0])))
    targets = {p: int(c.concurrency) for p, c in split.items()}
    holders = draw(st.sampled_from([names, [*names, "gone"]]))
    in_flight = {p: draw(st.integers(0, limit + 2), label=f"in flight {p}") for p in holders}
    return limit, targets, in_flight


@PROPERTY
@given(split_case())
def test_what_can_be_in_flight_never_exceeds_the_limit(case: tuple[int, dict[str, int], dict[str, int]]) -> None:
    """Invariant 6: grant ≤ target; Σ_p max(grant_p, in_flight_p) ≤ max(limit, Σ in_flight) for current reports."""
    limit, targets, in_flight = case
    grants = hold_back_growth(limit, targets, in_flight)
    assert grants.keys() == targets.keys()
    assert all(0 <= grants[p] <= targets[p] for p in targets)
    assert sum(grants.values()) <= limit
    reachable = sum(max(grants.get(p, 0), in_flight.get(p, 0)) for p in {*targets, *in_flight})
    assert reachable <= max(limit, sum(in_flight.values()))
    if all(in_flight.get(p, 0) <= targets.get(p, 0) for p in in_flight):  # nothing left over from an old split
        assert grants == targets


def fleet_peak(ticks: int, seed: int, hold_back: bool) -> int:
    """Two proxies under ≈ 2 × limit of demand whose split moves every tick; requests outlive a tick.

    Each step, every proxy admits up to its grant and some requests end; every third step the agents re-split the
    limit by the proxies' latest demand, with the in-flight counts of this very moment (current reports). Returns
    the most in flight across both proxies.
    """
    rng = random.Random(seed)
    limit, proxies = 6, ["p0", "p1"]
    in_flight = {p: 0 for p in proxies}
    grants = {p: limit // 2 for p in proxies}
    peak = 0
    for step in range(ticks * 3):
        if step % 3 == 0:
            demand = {p: rng.choice([0.5, 1.0, 4.0, 9.0]) for p in proxies}
            split = split_across_proxies(Capacity(1.0, 1.0, float(limit)), demand, 0.1)
            targets = {p: int(c.concurrency) for p, c in split.items()}
            grants = hold_back_growth(limit, targets, in_flight) if hold_back else targets
        for p in proxies:
            in_flight[p] -= sum(rng.random() < 0.25 for _ in range(in_flight[p]))  # lasts ~4 steps
            in_flight[p] = max(in_flight[p], grants[p])  # demand is high: it fills its grant
        peak = max(peak, sum(in_flight.values()))
    return peak


@pytest.mark.parametrize("seed", range(5))
def test_two_proxies_whose_split_keeps_moving_stay_within_the_limit(seed: int) -> None:
    """The same run granted the raw split overshoots (limit + Δshare); held back it never does."""
    assert fleet_peak(200, seed, hold_back=False) > 6
    assert fleet_peak(200, seed, hold_back=True) <= 6
