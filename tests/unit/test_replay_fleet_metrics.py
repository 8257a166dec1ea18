"""The fleet meter's accounting on hand-made event sequences with known answers."""

from __future__ import annotations

import math

import pytest

from tokenpools.core.admission import EntitlementLimits
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.replay.fleet.metrics import FleetFigures, FleetMeter, refusal_ratio

ADMITTED = AdmissionOutcome.ADMITTED
CONCURRENCY = AdmissionOutcome.REFUSED_CONCURRENCY
BUDGET = AdmissionOutcome.REFUSED_TOKEN_BUDGET


def meter(slots: int = 1, tokens_per_s: float = 1e6, window_s: float = 10.0) -> FleetMeter:
    return FleetMeter({"e": EntitlementLimits(slots, tokens_per_s, 1e12, 1.0)}, window_s)


def test_overshoot_is_the_time_above_the_limit_over_the_time_the_limit_was_in_force() -> None:
    m = meter(slots=1)
    m.decided("e", ADMITTED, 10, 0.0)
    m.decided("e", ADMITTED, 10, 1.0)  # 2 in flight of 1: one slot over from t=1 …
    m.decided("e", ADMITTED, 10, 2.0)  # … two from t=2 …
    m.released("e", 0, 3.0)  # … one from t=3 …
    m.released("e", 0, 4.0)  # … none from t=4
    m.released("e", 0, 6.0)
    (e,) = m.finish(10.0, ticks=0).entitlements
    assert e.overshoot_max_slots == 2
    assert e.overshoot_slot_s == pytest.approx(1 * 1 + 2 * 1 + 1 * 1)
    assert e.limit_slot_s == pytest.approx(10.0)
    assert m.finish(10.0, ticks=0).overshoot_fraction == pytest.approx(0.4)


def test_requests_still_in_flight_at_the_end_count_until_the_end() -> None:
    m = meter(slots=1)
    m.decided("e", ADMITTED, 10, 0.0)
    m.decided("e", ADMITTED, 10, 2.0)
    figures = m.finish(5.0, ticks=0)
    assert figures.entitlements[0].overshoot_slot_s == pytest.approx(3.0)
    assert figures.overshoot_fraction == pytest.approx(3.0 / 5.0)


def test_a_refusal_is_false_only_below_the_fleet_limit() -> None:
    m = meter(slots=2)
    m.decided("e", ADMITTED, 10, 0.0)
    assert m.decided("e", CONCURRENCY, 10, 0.1)  # 1 of 2 in flight fleet-wide: one enforcer would admit
    m.decided("e", ADMITTED, 10, 0.2)
    assert not m.decided("e", CONCURRENCY, 10, 0.3)  # 2 of 2: any enforcer refuses
    m.released("e", 0, 0.4)
    assert m.decided("e", CONCURRENCY, 10, 0.5)
    figures = m.finish(1.0, ticks=0)
    assert (figures.attempts, figures.admitted, figures.refusals, figures.false_refusals) == (5, 2, 3, 2)
    assert figures.refused == {CONCURRENCY: 3}


def test_a_refusal_is_false_only_when_the_fleet_bucket_held_the_cost() -> None:
    """Depth 100 (10 tokens/s × 10 s), starting full; charged by admissions, refilled, refunded on release."""
    m = meter(slots=10, tokens_per_s=10.0, window_s=10.0)
    m.decided("e", ADMITTED, 80, 0.0)  # bucket 20
    assert not m.decided("e", BUDGET, 50, 0.0)  # 20 < 50: the fleet could not have admitted it either
    assert m.bucket_of("e", 2.0) == pytest.approx(40.0)
    assert not m.decided("e", BUDGET, 50, 2.0)
    assert m.decided("e", BUDGET, 50, 3.5)  # 55 ≥ 50
    m.released("e", 60, 4.0)  # 60 + 60 refunded, capped at the depth
    assert m.bucket_of("e", 4.0) == pytest.approx(100.0)
    m.decided("e", ADMITTED, 150, 4.0)  # admitted elsewhere beyond what the fleet held: the bucket goes below 0
    assert m.bucket_of("e", 4.0) == pytest.approx(-50.0)
    assert m.finish(5.0, ticks=0).false_refusals == 1


def test_update_bytes_are_averaged_per_tick_and_proxy() -> None:
    m = meter()
    for size in (100, 300, 200):
        m.update_read(size)
    figures = m.finish(3.0, ticks=3)
    assert (figures.ticks, figures.update_bytes_mean, figures.update_bytes_max) == (3, 200.0, 300)
    assert meter().finish(1.0, ticks=0).update_bytes_mean == 0.0


def test_the_refusal_ratio_compares_a_design_with_the_exact_enforcer() -> None:
    def figures(refusals: int) -> FleetFigures:
        m = meter(slots=0)
        for i in range(refusals):
            m.decided("e", CONCURRENCY, 1, float(i))
        return m.finish(100.0, ticks=0)

    assert refusal_ratio(figures(6), figures(4)) == pytest.approx(1.5)
    assert refusal_ratio(figures(0), figures(0)) == 1.0
    assert refusal_ratio(figures(1), figures(0)) == math.inf
