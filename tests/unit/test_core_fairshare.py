"""The allocation primitives (tokenpools.core.fairshare): weighted water-filling and largest-remainder rounding."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.fairshare import Claim, round_down_fair, water_fill

PROPERTY = settings(max_examples=200, deadline=None)
CLAIMS = st.dictionaries(
    st.sampled_from("abcdefgh"),
    # weights as priorities come (≥ 1e-6; a denormal weight's share underflows to 0, which is float, not policy)
    st.builds(Claim, weight=st.sampled_from([0.0, 1.0, 20.3, 93.8]) | st.floats(1e-6, 1000.0),
              cap=st.sampled_from([0.0, 1.0, 5.0]) | st.floats(0.0, 1000.0)),
    max_size=8,
)
AMOUNT = st.sampled_from([0.0, 8.0, 16.0]) | st.floats(0.0, 5000.0)


def test_water_fill_splits_by_weight() -> None:
    grants = water_fill(8.0, {"copilot": Claim(93.8, 100.0), "synth": Claim(20.3, 100.0)})
    assert grants["copilot"] == pytest.approx(8.0 * 93.8 / 114.1)
    assert grants["synth"] == pytest.approx(8.0 * 20.3 / 114.1)


def test_water_fill_redistributes_what_a_capped_party_cannot_take() -> None:
    grants = water_fill(8.0, {"copilot": Claim(93.8, 5.0), "synth": Claim(20.3, 5.0)})
    assert grants == {"copilot": 5.0, "synth": pytest.approx(3.0)}


def test_water_fill_gives_everyone_their_cap_when_there_is_enough() -> None:
    assert water_fill(100.0, {"a": Claim(1.0, 3.0), "b": Claim(5.0, 4.0)}) == {"a": 3.0, "b": 4.0}


def test_water_fill_ignores_zero_weight_zero_cap_and_negative_amounts() -> None:
    assert water_fill(10.0, {"a": Claim(0.0, 5.0), "b": Claim(1.0, 0.0), "c": Claim(1.0, 2.0)}) == \
        {"a": 0.0, "b": 0.0, "c": 2.0}
    assert water_fill(-5.0, {"a": Claim(1.0, 5.0)}) == {"a": 0.0}


@PROPERTY
@given(amount=AMOUNT, claims=CLAIMS)
def test_water_fill_conserves_and_respects_caps(amount: float, claims: dict[str, Claim]) -> None:
    """Σ grants = min(amount, Σ caps of eligible parties); 0 ≤ grant ≤ cap; ineligible parties get 0."""
    grants = water_fill(amount, claims)
    assert set(grants) == set(claims)
    eligible = {k: c for k, c in claims.items() if c.weight > 0 and c.cap > 0}
    for k, c in claims.items():
        assert 0.0 <= grants[k] <= c.cap + 1e-9 * max(1.0, c.cap)
        if k not in eligible:
            assert grants[k] == 0.0
    expected = min(amount, math.fsum(c.cap for c in eligible.values()))
    assert math.fsum(grants.values()) == pytest.approx(expected, rel=1e-9, abs=1e-9)


@PROPERTY
@given(amount=AMOUNT, claims=CLAIMS)
def test_water_fill_is_weighted_max_min_fair(amount: float, claims: dict[str, Claim]) -> None:
    """Any party below its cap has the highest grant/weight of all (it is at the water level); so a higher weight
    with at least the same cap never gets less."""
    grants = water_fill(amount, claims)
    eligible = {k: c for k, c in claims.items() if c.weight > 0 and c.cap > 0}
    level = {k: grants[k] / c.weight for k, c in eligible.items()}
    for k, c in eligible.items():
        if grants[k] < c.cap * (1 - 1e-9) - 1e-9:
            assert all(level[k] >= other * (1 - 1e-9) - 1e-12 for other in level.values()), (k, level)
    for a, ca in eligible.items():
        for b, cb in eligible.items():
            if ca.weight > cb.weight and ca.cap >= cb.cap:
                assert grants[a] >= grants[b] * (1 - 1e-9) - 1e-9


def test_round_down_fair_hands_spare_units_to_the_largest_remainders() -> None:
    values = {"a": 2.6, "b": 2.3, "c": 1.1}  # Σ = 6
    assert round_down_fair(values, {k: 10 for k in values}, 6, ["c", "b", "a"]) == {"a": 3, "b": 2, "c": 1}
    assert round_down_fair(values, {k: 10 for k in values}, 7, ["c", "b", "a"]) == {"a": 3, "b": 3, "c": 1}


def test_round_down_fair_breaks_ties_by_order_and_respects_caps() -> None:
    values = {"a": 1.5, "b": 1.5}
    assert round_down_fair(values, {"a": 5, "b": 5}, 3, ["b", "a"]) == {"a": 1, "b": 2}
    assert round_down_fair(values, {"a": 5, "b": 1}, 3, ["b", "a"]) == {"a": 2, "b": 1}


@PROPERTY
@given(data=st.data(), values=st.dictionaries(st.sampled_from("abcdef"), st.floats(0.0, 50.0), max_size=6))
def test_round_down_fair_is_a_rounding_of_the_values(data: st.DataObject, values: dict[str, float]) -> None:
    """Each result is ⌊v⌋ or ⌈v⌉ (within its cap), the sum never exceeds the total, and when the total is
    ⌊Σ v⌋ and caps do not bind every unit is handed out; a larger remainder is never passed over for a smaller."""
    order = data.draw(st.permutations(sorted(values)))
    total = int(math.fsum(values.values()) + 1e-6)
    result = round_down_fair(values, {k: 1000 for k in values}, total, order)
    assert sum(result.values()) == total
    for k, v in values.items():
        assert math.floor(v + 1e-9) <= result[k] <= max(math.floor(v + 1e-9), math.ceil(v - 1e-9))
    remainder = {k: v - math.floor(v + 1e-9) for k, v in values.items()}
    rounded_up = [k for k in values if result[k] > math.floor(values[k] + 1e-9)]
    passed_over = [k for k in values if result[k] == math.floor(values[k] + 1e-9) and remainder[k] > 1e-9]
    for up in rounded_up:
        for down in passed_over:
            assert remainder[up] >= remainder[down]
    caps = {k: data.draw(st.integers(0, 60), label=f"cap {k}") for k in values}
    capped = round_down_fair(values, caps, total, order)
    assert sum(capped.values()) <= total
    assert all(capped[k] <= caps[k] for k in values)
