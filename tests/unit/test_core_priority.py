"""Eq. 1–3 and the capacity arithmetic against the paper's worked numbers (docs/paper.md#worked-numbers)."""

from __future__ import annotations

import doctest
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core import priority as priority_module
from tokenpools.core.capacity import Capacity, kv_bytes_per_token, max_concurrency_for_kv
from tokenpools.core.classes import DEFAULT_CLASS_WEIGHTS, ServiceClass
from tokenpools.core.priority import (
    PolicyConstants,
    burst_excess,
    decay_steps,
    mean_slo_ms,
    pool_mean_slo_ms,
    priority,
    service_gap,
    update_burst,
    update_debt,
)

PAPER = PolicyConstants()
EXP2_MEAN_SLO_MS = 15_250.0  # ℓ̄* the paper's numbers imply: mean(500, 30000), frozen when reports joins
EXP2_THREE_WAY_MEAN_MS = (500.0 + 30_000.0 + 5_000.0) / 3
PROPERTY = settings(max_examples=150, deadline=None)


def elastic(slo_ms: float, mean_ms: float = EXP2_MEAN_SLO_MS, burst: float = 0.0, debt: float = 0.0) -> float:
    return priority(ServiceClass.ELASTIC, slo_ms, mean_ms, burst, debt, PAPER)


# ---- Eq. 1: the worked numbers of Exp 2 ----------------------------------------------------------------------

def test_paper_constants_are_the_defaults() -> None:
    assert (PAPER.alpha_slo, PAPER.alpha_burst, PAPER.alpha_debt) == (2.0, 1.0, 4.0)
    assert PAPER.gamma_debt == 0.7
    assert PAPER.debt_factor_floor == 0.05


@pytest.mark.parametrize(
    ("service_class", "weight"),
    [
        (ServiceClass.DEDICATED, 1000.0),
        (ServiceClass.GUARANTEED, 1000.0),
        (ServiceClass.ELASTIC, 100.0),
        (ServiceClass.SPOT, 1.0),
        (ServiceClass.PREEMPTIBLE, 0.1),
    ],
)
def test_class_weights_are_the_papers_table_1(service_class: ServiceClass, weight: float) -> None:
    assert DEFAULT_CLASS_WEIGHTS[service_class] == weight
    assert PAPER.class_weights[service_class] == weight
    # with ℓ*_e = ℓ̄*, b = d = 0 the SLO factor is 1/(1 + α_slo) = 1/3 and the class weight shows through
    assert priority(service_class, 1000.0, 1000.0, 0.0, 0.0, PAPER) == pytest.approx(weight / 3.0, rel=1e-12)


def test_exp2_pool_average_slo_is_the_mean_of_the_two_founders() -> None:
    assert mean_slo_ms([500.0, 30_000.0]) == EXP2_MEAN_SLO_MS
    assert mean_slo_ms([500.0, 30_000.0, 5_000.0]) == pytest.approx(11_833.33, abs=0.01)


def test_frozen_pool_average_keeps_the_founders_mean_when_reports_joins() -> None:
    """What the paper's numbers imply: ℓ̄* stays 15,250 ms after reports (5 s) joins; unfrozen it becomes 11,833."""
    founders = pool_mean_slo_ms(None, [500.0, 30_000.0], frozen=True)
    assert founders == EXP2_MEAN_SLO_MS
    assert pool_mean_slo_ms(founders, [500.0, 30_000.0, 5_000.0], frozen=True) == EXP2_MEAN_SLO_MS
    assert pool_mean_slo_ms(founders, [500.0, 30_000.0, 5_000.0], frozen=False) == pytest.approx(EXP2_THREE_WAY_MEAN_MS)
    assert round(elastic(5_000.0, pool_mean_slo_ms(founders, [500.0, 30_000.0, 5_000.0], frozen=True)), 1) == 60.4


def test_mean_slo_of_an_empty_pool_is_an_error() -> None:
    with pytest.raises(ValueError, match="no Bound entitlement"):
        mean_slo_ms([])


@pytest.mark.parametrize(
    ("label", "slo_ms", "mean_ms", "debt", "expected"),
    [
        ("copilot, 500 ms", 500.0, EXP2_MEAN_SLO_MS, 0.0, 93.8),
        ("synth, 30 s", 30_000.0, EXP2_MEAN_SLO_MS, 0.0, 20.3),
        ("reports, 5 s, frozen ℓ̄*", 5_000.0, EXP2_MEAN_SLO_MS, 0.0, 60.4),
        ("reports, 5 s, three-way ℓ̄*", 5_000.0, EXP2_THREE_WAY_MEAN_MS, 0.0, 54.2),
        ("copilot at its peak debt 0.607", 500.0, EXP2_MEAN_SLO_MS, 0.607, 321.7),
    ],
)
def test_exp2_priorities(label: str, slo_ms: float, mean_ms: float, debt: float, expected: float) -> None:
    assert round(elastic(slo_ms, mean_ms, debt=debt), 1) == expected, label


def test_synth_peak_priority_is_its_base_times_one_plus_four_times_its_peak_debt() -> None:
    base = elastic(30_000.0)
    peak = elastic(30_000.0, debt=0.775)
    assert peak == pytest.approx(base * (1 + 4.0 * 0.775), rel=1e-12)
    # the paper rounds the base to 20.3 first: 20.3 · 4.1 = 83.2 (unrounded 20.27 · 4.1 = 83.1)
    assert peak == pytest.approx(20.3 * 4.1, abs=0.15)
    assert round(peak) == 83


def test_exp2_gap_narrows_from_4_6x_to_3_9x_at_peak_debt() -> None:
    assert round(elastic(500.0) / elastic(30_000.0), 1) == 4.6
    assert round(elastic(500.0, debt=0.607) / elastic(30_000.0, debt=0.775), 1) == 3.9


def test_newcomer_with_zero_debt_is_not_privileged() -> None:
    """Reports joins at d = 0 and ranks between copilot and synth by its SLO alone."""
    assert elastic(30_000.0) < elastic(5_000.0) < elastic(500.0)


def test_priority_docstring_example_runs() -> None:
    assert doctest.testmod(priority_module).failed == 0


# ---- the debt factor floor -----------------------------------------------------------------------------------

@pytest.mark.parametrize("debt", [-0.25, -0.2500001, -0.3, -0.5, -1.0])
def test_debt_factor_floor_keeps_priority_positive_where_the_raw_factor_is_not(debt: float) -> None:
    assert 1 + PAPER.alpha_debt * debt <= 0  # the unclamped Eq. 1 factor
    w = elastic(500.0, debt=debt)
    assert w > 0
    assert w == pytest.approx(elastic(500.0) * PAPER.debt_factor_floor, rel=1e-12)


def test_debt_factor_above_the_floor_is_unclamped() -> None:
    assert elastic(500.0, debt=-0.2) == pytest.approx(elastic(500.0) * (1 - 0.8), rel=1e-12)


@PROPERTY
@given(
    service_class=st.sampled_from(list(ServiceClass)),
    slo_ms=st.floats(1.0, 1e6),
    mean_ms=st.floats(1.0, 1e6),
    burst=st.floats(0.0, 100.0),
    debt=st.floats(-1.0, 1.0),
)
def test_priority_is_always_positive(service_class: ServiceClass, slo_ms: float, mean_ms: float, burst: float,
                                     debt: float) -> None:
    """w_e > 0 for every class, SLO, burst b_e ≥ 0 and debt d_e ∈ [−1, 1] (the ε floor)."""
    assert priority(service_class, slo_ms, mean_ms, burst, debt, PAPER) > 0


@PROPERTY
@given(
    slo_ms=st.floats(1.0, 1e5),
    mean_ms=st.floats(1.0, 1e5),
    burst=st.floats(0.0, 10.0),
    debt=st.floats(-1.0, 1.0),
    more=st.floats(0.0, 1.0),
)
def test_priority_rises_with_debt_and_falls_with_burst_and_slo(slo_ms: float, mean_ms: float, burst: float,
                                                               debt: float, more: float) -> None:
    """More debt never lowers w_e; more burst or a looser SLO never raises it."""
    w = elastic(slo_ms, mean_ms, burst, debt)
    assert elastic(slo_ms, mean_ms, burst, min(1.0, debt + more)) >= w
    assert elastic(slo_ms, mean_ms, burst + more, debt) <= w
    assert elastic(slo_ms * (1 + more), mean_ms, burst, debt) <= w


def test_negative_burst_is_treated_as_none() -> None:
    assert elastic(500.0, burst=-3.0) == elastic(500.0, burst=0.0)


def test_priority_needs_a_positive_mean_slo() -> None:
    with pytest.raises(ValueError, match="mean_slo_ms"):
        priority(ServiceClass.ELASTIC, 500.0, 0.0, 0.0, 0.0, PAPER)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha_slo": -1.0}, "alpha_slo"),
        ({"debt_factor_floor": 0.0}, "debt_factor_floor"),
        ({"debt_factor_floor": 1.5}, "debt_factor_floor"),
        ({"gamma_debt": 1.0}, "gamma_debt"),
        ({"gamma_burst": -0.1}, "gamma_burst"),
        ({"debt_credit": "false"}, "debt_credit"),
        ({"debt_credit": 1}, "debt_credit"),
        ({"class_weights": {ServiceClass.ELASTIC: 100.0}}, "lacks"),
        ({"class_weights": {**DEFAULT_CLASS_WEIGHTS, ServiceClass.SPOT: 0.0}}, "class_weights.spot"),
    ],
)
def test_policy_constants_are_validated(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PolicyConstants(**kwargs)


def test_policy_constants_hash_by_value() -> None:
    assert hash(PolicyConstants()) == hash(PolicyConstants())
    assert PolicyConstants() == PolicyConstants()
    assert PolicyConstants(alpha_debt=3.0) != PolicyConstants()


# ---- Eq. 2: service gap and debt -----------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("baseline", "measured", "demanded", "gap"),
    [
        (100.0, 0.0, 0.0, 0.0),  # idle tenant: not underserved
        (100.0, 0.0, 500.0, 1.0),  # wants more than its baseline, got nothing
        (100.0, 40.0, 100.0, 0.6),
        (100.0, 50.0, 50.0, 0.0),  # asked for half its baseline and got it: served in full
        (100.0, 30.0, 50.0, 0.2),  # target is min(λ_e, demand) = 50
        (100.0, 150.0, 200.0, -0.5),  # bursting above its baseline: credit
        (100.0, 900.0, 900.0, -1.0),  # clamped at −1
        (100.0, 20.0, 0.0, -0.2),  # no recorded demand, but it used capacity: over-use still counts
        (100.0, 0.0, -5.0, 0.0),  # negative demand is no demand
        (0.0, 50.0, 50.0, 0.0),  # no baseline, no gap (spot)
    ],
)
def test_service_gap(baseline: float, measured: float, demanded: float, gap: float) -> None:
    assert service_gap(baseline, measured, demanded) == pytest.approx(gap, abs=1e-12)


@PROPERTY
@given(baseline=st.floats(0.0, 1e6), measured=st.floats(0.0, 1e7), demanded=st.floats(-1e3, 1e7))
def test_service_gap_is_clamped_to_unit_interval(baseline: float, measured: float, demanded: float) -> None:
    """g_e ∈ [−1, 1], and an idle tenant (no demand) is never underserved (g_e ≤ 0)."""
    gap = service_gap(baseline, measured, demanded)
    assert -1.0 <= gap <= 1.0
    assert service_gap(baseline, measured, 0.0) <= 0.0


@PROPERTY
@given(baseline=st.floats(0.0, 1e6), measured=st.floats(0.0, 1e7), demanded=st.floats(-1e3, 1e7))
def test_service_gap_without_credit_is_the_under_service_part(baseline: float, measured: float,
                                                               demanded: float) -> None:
    """policy.debt_credit=false (the default): g_e is Eq. 2's gap with its negative part (service above the
    target, credit) dropped, so debt measures under-service only and never goes below 0."""
    with_credit = service_gap(baseline, measured, demanded, credit=True)
    assert service_gap(baseline, measured, demanded, credit=False) == max(0.0, with_credit)


def test_debt_without_credit_stays_at_zero_for_a_tenant_served_above_its_baseline() -> None:
    """Exp 2 before the outage: copilot bursts to 10 of 16 slots on a 5-slot, 150-tokens/s baseline. With credit its
    debt falls towards −1 and Eq. 1's factor max(ε, 1 + 4·d_e) towards ε; without, it stays 0."""
    debts = {True: 0.0, False: 0.0}
    for credit in debts:
        for _ in range(6):  # 30 s of ticks
            debts[credit] = update_debt(debts[credit], service_gap(150.0, 300.0, 300.0, credit), PAPER.gamma_debt)
    assert debts[False] == 0.0 and debts[True] < -0.8


@PROPERTY
@given(start=st.floats(-1.0, 1.0), gaps=st.lists(st.floats(-1.0, 1.0), max_size=30),
       gamma=st.floats(0.0, 0.99))
def test_debt_stays_within_unit_interval(start: float, gaps: list[float], gamma: float) -> None:
    """d_e ∈ [−1, 1] after any sequence of gaps in [−1, 1] (so the ε floor only guards d_e < −0.25)."""
    debt = start
    for gap in gaps:
        debt = update_debt(debt, gap, gamma)
        assert -1.0 - 1e-12 <= debt <= 1.0 + 1e-12


def test_debt_update_is_eq_2() -> None:
    assert update_debt(0.5, 1.0, 0.7) == pytest.approx(0.7 * 0.5 + 0.3 * 1.0)
    assert update_debt(0.0, 1.0, 0.7) == pytest.approx(0.3)  # first tick of an outage


def _zero_gap_steps_below(start: float, threshold: float, gamma: float) -> int:
    debt, steps = start, 0
    while abs(debt) >= threshold:
        debt = update_debt(debt, 0.0, gamma)
        steps += 1
    return steps


def test_synth_debt_decays_below_five_hundredths_in_eight_ticks() -> None:
    assert _zero_gap_steps_below(0.775, 0.05, 0.7) == 8
    assert decay_steps(0.775, 0.05, 0.7) == 8


def test_synth_debt_decays_below_two_hundredths_in_about_ten_ticks_or_fifty_seconds() -> None:
    continuous = math.log(0.02 / 0.775) / math.log(0.7)
    assert continuous == pytest.approx(10.3, abs=0.05)  # docs/paper.md#worked-numbers: ≈ 10.3 EWMA steps
    assert continuous * 5.0 == pytest.approx(50.0, abs=2.0)  # at a 5 s tick: "near zero within ≈ 50 s"
    # in whole ticks the crossing happens on the 11th (0.775 · 0.7¹⁰ = 0.0219 is still above 0.02)
    assert 0.775 * 0.7**10 > 0.02 > 0.775 * 0.7**11
    assert _zero_gap_steps_below(0.775, 0.02, 0.7) == 11
    assert decay_steps(0.775, 0.02, 0.7) == 11


@PROPERTY
@given(start=st.floats(-1.0, 1.0), threshold=st.floats(1e-4, 1.0), gamma=st.floats(0.05, 0.95))
def test_decay_steps_matches_stepping_the_ewma(start: float, threshold: float, gamma: float) -> None:
    """decay_steps is the number of zero-gap Eq. 2 steps until |d_e| is below the threshold."""
    assert decay_steps(start, threshold, gamma) == _zero_gap_steps_below(start, threshold, gamma)


# ---- Eq. 3: burst --------------------------------------------------------------------------------------------

def test_burst_excess_sums_the_three_dimensions() -> None:
    baseline = Capacity(100.0, 1e9, 5.0)
    assert burst_excess(Capacity(200.0, 1.5e9, 15.0), baseline) == pytest.approx(1.0 + 0.5 + 2.0)


@pytest.mark.parametrize(
    ("actual", "expected"),
    [
        (Capacity(50.0, 0.5e9, 2.0), 0.0),  # under the baseline everywhere: no burst, no negative burst
        (Capacity(300.0, 0.0, 0.0), 2.0),  # throughput burst only
        (Capacity(0.0, 4e9, 0.0), 3.0),  # KV (prompt-length) burst only
        (Capacity(0.0, 0.0, 6.0), 0.2),  # concurrency burst only
        (Capacity(100.0, 1e9, 5.0), 0.0),  # exactly at the baseline
    ],
)
def test_burst_excess_per_dimension(actual: Capacity, expected: float) -> None:
    assert burst_excess(actual, Capacity(100.0, 1e9, 5.0)) == pytest.approx(expected)


def test_burst_excess_skips_dimensions_without_a_baseline() -> None:
    assert burst_excess(Capacity(500.0, 1e9, 9.0), Capacity()) == 0.0
    assert burst_excess(Capacity(500.0, 1e9, 9.0), Capacity(100.0, 0.0, 0.0)) == pytest.approx(4.0)


def test_burst_update_is_an_ewma() -> None:
    assert update_burst(1.0, 3.5, 0.7) == pytest.approx(0.7 + 0.3 * 3.5)
    b = 0.0
    for _ in range(200):
        b = update_burst(b, 2.0, 0.7)
    assert b == pytest.approx(2.0)  # a steady burst converges to δ_e


# ---- capacity arithmetic (docs/paper.md#capacity-arithmetic) -------------------------------------------------

def test_kv_bytes_per_token_for_qwen3_8b() -> None:
    assert kv_bytes_per_token(36, 8, 128, 2) == 147_456  # bf16: 144 KiB per token
    assert kv_bytes_per_token(36, 8, 128, 1) == 73_728  # fp8
    # the sample entitlement's 2 GiB holds about 14.6k bf16 context tokens
    assert 2 * 2**30 / 147_456 == pytest.approx(14_563, abs=1)


@pytest.mark.parametrize("bad", [{"layers": 0}, {"kv_heads": -1}, {"head_dim": 0}, {"bytes_per_element": 0}])
def test_kv_bytes_per_token_rejects_non_positive_sizes(bad: dict) -> None:
    args = {"layers": 36, "kv_heads": 8, "head_dim": 128, "bytes_per_element": 2} | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        kv_bytes_per_token(**args)


def test_max_concurrency_for_kv_is_floor_of_budget_over_sequence_size() -> None:
    c = 147_456
    assert max_concurrency_for_kv(16 * 2**30, 4096, c) == 28  # 16 GiB / (4096 · 144 KiB) = 28.4
    assert max_concurrency_for_kv(4096 * c * 3 - 1, 4096, c) == 2
    with pytest.raises(ValueError):
        max_concurrency_for_kv(1e9, 0, c)


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_capacity_rejects_negative_or_non_finite_amounts(bad: float) -> None:
    with pytest.raises(ValueError, match="concurrency"):
        Capacity(1.0, 1.0, bad)


def test_capacity_arithmetic() -> None:
    a, b = Capacity(1.0, 2.0, 3.0), Capacity(10.0, 20.0, 30.0)
    assert a + b == Capacity(11.0, 22.0, 33.0)
    assert a.scaled(2) == Capacity(2.0, 4.0, 6.0)
    assert Capacity.total([a, b, a]) == Capacity(12.0, 24.0, 36.0)
    assert a.fits_in(b) and not b.fits_in(a)
    assert not Capacity(1.0, 2.0, 31.0).fits_in(b)  # one dimension over is enough to not fit
    assert Capacity.from_tuple(a.as_tuple()) == a
