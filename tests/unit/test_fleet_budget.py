"""The overshoot of a budget a fleet of proxies enforces from the published ledger (``replay.fleet.budget``,
docs/budgets.md#the-overshoot-measured): the bound holds on every run, for N in {1, 2, 4, 8}."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.budgets import BudgetSpec, Period, Weights
from tokenpools.replay.fleet.budget import FLEET_SIZES, BudgetFleetConfig, figures, measure, run

BASE = BudgetFleetConfig(1, BudgetSpec("run", Period.NEVER, 200_000), rate_per_s=20.0, duration_s=60.0)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(proxies=st.sampled_from(FLEET_SIZES), seed=st.integers(0, 10_000),
       estimate=st.integers(0, 512), interval_s=st.sampled_from((0.1, 0.5, 1.0, 5.0)),
       kafka_lag_s=st.sampled_from((0.0, 0.05, 0.5)), watermark_lag_s=st.sampled_from((0.0, 0.1, 1.0)),
       service_high_s=st.sampled_from((0.5, 5.0, 20.0)), amount=st.sampled_from((20_000, 200_000)),
       completion_weight=st.sampled_from((1.0, 4.0)), publish_in_flight=st.booleans())
def test_the_overshoot_never_exceeds_the_bound(proxies: int, seed: int, estimate: int, interval_s: float,
                                                kafka_lag_s: float, watermark_lag_s: float, service_high_s: float,
                                                amount: int, completion_weight: float, publish_in_flight: bool) -> None:
    """At the end of the period the overshoot is at most what the last admitting proxy could not see — the other
    proxies' reservations not completed by its record's ``through`` — plus every request's use beyond its
    reservation; and so at most the reservations the fleet admitted in one staleness interval plus the longest
    request before the last admission, plus that use. With records that carry the proxies' reservations in flight,
    at most the other proxies' reservations admitted since that ``through``, plus that use."""
    budget = BudgetSpec("run", Period.NEVER, amount, weights=Weights(completion=completion_weight))
    config = replace(BASE, proxies=proxies, seed=seed, estimate_tokens=estimate, publish_interval_s=interval_s,
                     kafka_lag_s=kafka_lag_s, watermark_lag_s=watermark_lag_s, service_s=(0.1, service_high_s),
                     budget=budget, publish_in_flight=publish_in_flight)
    r = run(config)
    assert r.refused > 0  # the budget binds in every example (otherwise there is nothing to bound)
    slack = 1e-6 * r.allowance
    assert r.overshoot <= r.bound_exact + slack
    assert r.bound_exact <= r.bound_in_flight + slack
    if proxies == 1:
        assert r.overshoot <= r.beyond_reservation + slack  # one proxy: only requests beyond their reservation
    if publish_in_flight:
        assert r.overshoot <= r.bound_admitted_since + slack


@pytest.mark.parametrize("proxies", FLEET_SIZES)
def test_reserving_max_tokens_one_proxy_never_overspends_and_a_fleet_does_by_what_it_could_not_see(proxies: int) -> None:
    r = run(replace(BASE, proxies=proxies, estimate_tokens=BASE.max_tokens, publish_in_flight=False))
    assert r.beyond_reservation == 0 and r.refused > 0
    if proxies == 1:
        assert r.overshoot == 0 and r.spent <= r.allowance
    else:
        assert 0 < r.overshoot <= r.bound_exact


def test_the_interval_alone_does_not_bound_it_the_requests_in_flight_do() -> None:
    """The ledger counts completions only: a request another proxy has in flight is as invisible as one it admitted
    since the record. With requests of up to 20 s and a 1 s interval, the overshoot exceeds one interval's
    admissions; the bound with the longest request added holds."""
    r = run(replace(BASE, proxies=8, estimate_tokens=BASE.max_tokens, publish_in_flight=False))
    assert r.overshoot > r.bound_interval
    assert r.overshoot <= r.bound_in_flight


def test_records_carrying_the_reservations_in_flight_bound_it_by_what_the_others_admitted_since() -> None:
    """The rule of docs/budgets.md#the-others-reservations-in-flight: the same fleet (8 proxies reserving max_tokens,
    so no use goes beyond a reservation) overshoots by far less than with records of completions only, within the
    others' admissions since the record's ``through``, which does not bound it without the reservations."""
    today = run(replace(BASE, proxies=8, estimate_tokens=BASE.max_tokens, publish_in_flight=False))
    design = run(replace(BASE, proxies=8, estimate_tokens=BASE.max_tokens, publish_in_flight=True))
    assert today.overshoot > today.bound_admitted_since
    assert design.overshoot <= design.bound_admitted_since and design.overshoot < today.overshoot / 4


def test_runs_are_deterministic_and_the_table_has_a_row_per_fleet_size() -> None:
    assert run(replace(BASE, proxies=4, seed=3)) == run(replace(BASE, proxies=4, seed=3))
    lines = measure(BASE, seeds=2)
    assert len(lines) == 2 + len(FLEET_SIZES) and lines[2].startswith("| 1 | ")


def test_the_figures_are_the_tables_numbers_and_the_largest_over_the_seeds() -> None:
    rows = figures(BASE, sizes=(1, 4), seeds=2)
    assert [f.proxies for f in rows] == [1, 4]
    for f in rows:
        runs = [run(replace(BASE, proxies=f.proxies, seed=BASE.seed + s)) for s in range(2)]
        assert f.overshoot == max(r.overshoot for r in runs)
        assert f.allowance_ratio == max(r.overshoot / r.allowance for r in runs)
    table = measure(BASE, sizes=(1, 4), seeds=2)[2:]
    assert [line.split(" | ")[2] for line in table] == [f"{f.allowance_ratio:.4f}" for f in rows]


def test_the_run_must_lie_in_one_period() -> None:
    with pytest.raises(ValueError, match="one period"):
        replace(BASE, budget=BudgetSpec("d", Period.DAY, 1000), origin_ms=BASE.origin_ms - 10_000)
