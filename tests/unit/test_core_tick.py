"""One control tick (tokenpools.core.tick): conditioning (Eq. 2–3), priorities (Eq. 1), limits and replicas."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.priority import PolicyConstants
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.tick import Signals, condition, control_tick, static_limits, static_priorities
from tokenpools.core.windows import UsageSample
from tokenpools_dev.builders import entitlement_spec

PAPER = PolicyConstants()
TICK_S = 5.0
MEAN_SLO_MS = 15_250.0
POOL = PoolSpec("pool", "Qwen/Qwen3-8B", Capacity(240.0, 16e9, 16.0), min_replicas=1, max_replicas=1)


def elastic(name: str, slo_ms: float, tokens_per_s: float = 75.0, slots: float = 5.0) -> EntitlementSpec:
    return entitlement_spec(name, ServiceClass.ELASTIC, slots, tokens_per_s, 1e9, slo_ms=slo_ms)


COPILOT, SYNTH, REPORTS = elastic("copilot", 500.0), elastic("synth", 30_000.0), elastic("reports", 5_000.0)
SPOT = EntitlementSpec("spot", "pool", ServiceClass.SPOT, 30_000.0)


def sample(used_tokens_per_s: float, demand_tokens_per_s: float, slots: float = 5.0, kv: float = 1e9) -> UsageSample:
    return UsageSample(start_ms=0, width_ms=5000, used=Capacity(used_tokens_per_s, kv, slots),
                       demand=Capacity(demand_tokens_per_s, kv, slots), admitted=1, refused=0, completed=1,
                       in_flight_at_end=0)


# ---- conditioning --------------------------------------------------------------------------------------------

def test_no_sample_keeps_the_previous_signals() -> None:
    previous = Signals(burst=0.4, debt=0.3)
    assert condition(COPILOT, previous, None, PAPER) == previous


def test_debt_follows_eq_2_from_the_throughput_gap() -> None:
    """Underserved in throughput while holding its slots (copilot in the outage): g = (75 − 30)/75 = 0.6."""
    signals = condition(COPILOT, Signals(), sample(30.0, 150.0), PAPER)
    assert signals.debt == pytest.approx(0.3 * 0.6)


def test_burst_follows_eq_3_over_the_three_dimensions() -> None:
    used = sample(150.0, 150.0, slots=7.5, kv=1.5e9)  # 2× tokens, 1.5× KV, 1.5× slots
    signals = condition(COPILOT, Signals(burst=1.0), used, PAPER)
    assert signals.burst == pytest.approx(0.7 * 1.0 + 0.3 * (1.0 + 0.5 + 0.5))


def test_spot_keeps_zero_debt() -> None:
    assert condition(SPOT, Signals(debt=0.5), sample(0.0, 1000.0), PAPER).debt == 0.0


def test_idle_tenant_does_not_accrue_debt() -> None:
    assert condition(COPILOT, Signals(), sample(0.0, 0.0, slots=0.0, kv=0.0), PAPER) == Signals(0.0, 0.0)


def test_debt_peaks_while_underserved_and_decays_within_about_fifty_seconds() -> None:
    """Exp 2: synth starved (g = 1) through the outage, then served exactly what it asks for (g = 0)."""
    signals = Signals()
    for _ in range(18):  # 90 s of outage
        signals = condition(SYNTH, signals, sample(0.0, 150.0), PAPER)
    assert signals.debt == pytest.approx(1.0, abs=1e-2)  # saturates towards g
    signals = Signals(debt=0.775)  # the paper's peak
    ticks_below = {}
    for tick in range(1, 20):
        signals = condition(SYNTH, signals, sample(75.0, 75.0), PAPER)
        for threshold in (0.05, 0.02):
            if signals.debt < threshold and threshold not in ticks_below:
                ticks_below[threshold] = tick
    assert ticks_below == {0.05: 8, 0.02: 11}
    assert ticks_below[0.05] * TICK_S == 40.0 and ticks_below[0.02] * TICK_S == 55.0  # "≈ 50 s"


# ---- the tick ------------------------------------------------------------------------------------------------

def test_exp2_priorities_at_zero_debt_with_frozen_mean_slo() -> None:
    result = control_tick(POOL, [COPILOT, SYNTH, REPORTS], {}, {}, POOL.capacity(), MEAN_SLO_MS)
    assert {n: round(w, 1) for n, w in result.priorities.items()} == {"copilot": 93.8, "synth": 20.3, "reports": 60.4}
    assert result.signals == {n: Signals() for n in ("copilot", "synth", "reports")}


def test_tick_priority_uses_the_new_debt() -> None:
    samples = {"synth": sample(0.0, 150.0)}
    result = control_tick(POOL, [COPILOT, SYNTH], {"synth": Signals(debt=0.7)}, samples, POOL.capacity(), MEAN_SLO_MS)
    debt = 0.7 * 0.7 + 0.3 * 1.0
    assert result.signals["synth"].debt == pytest.approx(debt)
    assert result.priorities["synth"] == pytest.approx(100 / (1 + 2 * 30_000 / MEAN_SLO_MS) * (1 + 4 * debt))


def test_outage_tick_is_contended_and_splits_by_priority() -> None:
    samples = {"copilot": sample(40.0, 120.0, slots=7.0), "synth": sample(40.0, 120.0, slots=7.0)}
    half = Capacity(120.0, 8e9, 8.0)
    result = control_tick(POOL, [COPILOT, SYNTH], {}, samples, half, MEAN_SLO_MS)
    assert result.contended
    # elastic shares (issue 30): at zero debt copilot's priority wins 7 of the 8 slots it asks for, synth keeps 1
    assert result.limits["copilot"].concurrency == 7.0 and result.limits["synth"].concurrency == 1.0
    assert result.limits["copilot"].tokens_per_s > result.limits["synth"].tokens_per_s


def test_limits_follow_demand_not_usage() -> None:
    """An entitlement refused all tick long used nothing but demanded plenty: it still gets limits to grow into."""
    samples = {"copilot": sample(0.0, 200.0, slots=0.0)}
    result = control_tick(POOL, [COPILOT], {}, samples, POOL.capacity(), MEAN_SLO_MS)
    assert result.limits["copilot"].tokens_per_s >= 200.0


def test_desired_replicas_are_reported() -> None:
    pool = PoolSpec("pool", "m", Capacity(240.0, 16e9, 16.0), min_replicas=1, max_replicas=4)
    samples = {"spot": sample(0.0, 0.0, slots=40.0)}
    result = control_tick(pool, [SPOT], {}, samples, pool.capacity(), MEAN_SLO_MS)
    assert result.desired_replicas == 3  # 40 slots / (16 × 0.9)


def test_static_priorities_and_limits_are_the_baselines_never_unlimited() -> None:
    specs = [EntitlementSpec("g", "pool", ServiceClass.GUARANTEED, 500.0, Capacity(60.0, 4e9, 6.0)), COPILOT, SPOT]
    priorities = static_priorities(specs, MEAN_SLO_MS, PAPER)
    assert priorities["g"] == pytest.approx(1000 / (1 + 2 * 500 / MEAN_SLO_MS))
    limits = static_limits(POOL, specs, MEAN_SLO_MS, PAPER)
    assert limits["g"] == Capacity(60.0, 4e9, 6.0)
    assert limits["copilot"].concurrency >= 5.0
    total = Capacity.total(list(limits.values()))
    assert total.fits_in(POOL.capacity())
    assert limits["spot"].concurrency == 16.0 - limits["g"].concurrency - limits["copilot"].concurrency


# ---- properties ----------------------------------------------------------------------------------------------

SAMPLES = st.none() | st.builds(
    sample,
    used_tokens_per_s=st.floats(0.0, 1000.0),
    demand_tokens_per_s=st.floats(0.0, 1000.0),
    slots=st.floats(0.0, 20.0),
    kv=st.floats(0.0, 1e10),
)


@settings(max_examples=60, deadline=None)
@given(ticks=st.lists(st.tuples(SAMPLES, SAMPLES, SAMPLES), min_size=1, max_size=15))
def test_signals_stay_bounded_and_priorities_positive(ticks: list) -> None:  # noqa: ANN001
    """Over any sequence of ticks: d_e ∈ [−1, 1], spot debt 0, b_e ≥ 0, every priority > 0 and every limit within
    the pool for the non-protected."""
    specs = [COPILOT, SYNTH, SPOT]
    signals: dict[str, Signals] = {}
    for tick in ticks:
        samples = dict(zip(("copilot", "synth", "spot"), tick))
        result = control_tick(POOL, specs, signals, samples, POOL.capacity(), MEAN_SLO_MS)
        signals = result.signals
        assert signals["spot"].debt == 0.0
        for s in signals.values():
            assert -1.0 <= s.debt <= 1.0 and s.burst >= 0.0
        assert all(w > 0 for w in result.priorities.values())
        assert all(limit.fits_in(POOL.capacity()) for limit in result.limits.values())
