"""The figures (replay/plots.py), drawn from a small synthetic replay: no replay runs here.

Invariants: a band marks an outage or a tenant joining and says which; the rate panels' smoothing is a trailing mean
(a change never shows before it happens); Fig. 5 has the paper's four panels; legends sit outside the data; the SLO
lines are in the legend; log axes read as plain numbers; titles name the paper's figure numbers; a tenant has the
name report.md gives it (copilot, not elastic-copilot).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.replay import plots
from tokenpools.replay.experiments import build
from tokenpools.replay.policy import EntitlementTick
from tokenpools.replay.replayer import Completions, Decisions, ReplayResult, Samples
from tokenpools.replay.scenario import CapacityChange, Membership, Phase, Scenario

DURATION_S = 60.0
NAMES = ("elastic-copilot", "elastic-synth", "elastic-reports")
SHOWN = ("copilot", "synth", "reports")  # as report.md names them


@pytest.fixture(scope="module")
def scenario() -> Scenario:
    """Exp 2's pool and tenants on a 60-s schedule: an outage in [10, 30) s, reports joining at 40 s."""
    base = build("exp2")
    return dataclasses.replace(
        base, arrivals=(), closed=(), duration_s=DURATION_S,
        membership={"elastic-reports": Membership(40.0)},
        capacity_changes=(CapacityChange(10.0, 8), CapacityChange(30.0, 16)),
        phases=(Phase("normal", 0.0, 10.0), Phase("outage", 10.0, 30.0), Phase("recovered", 30.0, 40.0),
                Phase("+ reports", 40.0, DURATION_S)))


def _result(scenario: Scenario, policy: str = "token-pools") -> ReplayResult:
    dec, comp, samples, ticks = Decisions(), Completions(), Samples(), []
    for k in range(int(DURATION_S)):
        t = float(k)
        slots = 8 if 10 <= t < 30 else 16
        samples.pool.append((t, 6, k % 3, slots))
        for i, name in enumerate(NAMES):
            samples.by_entitlement.append((t, name, 2, 0, 1 + (k + i) % 4))
            outcome = AdmissionOutcome.ADMITTED if (k + i) % 3 else (
                AdmissionOutcome.REFUSED_LOW_PRIORITY, AdmissionOutcome.REFUSED_CONCURRENCY,
                AdmissionOutcome.REFUSED_KV)[i]
            dec.t_s.append(t + 0.1)
            dec.entitlement.append(name)
            dec.outcome.append(outcome.value)
            dec.queued_s.append(0.0)
            if outcome is AdmissionOutcome.ADMITTED:
                comp.entitlement.append(name)
                comp.first_attempt_s.append(t)
                comp.admitted_s.append(t + 0.1 * i)
                comp.t_s.append(t + 2.0)
                comp.completion_tokens.append(50 + 10 * i)
                comp.ttft_s.append(0.05 * (i + 1))
                comp.e2e_s.append(2.0 + i)
                comp.queue_s.append(0.0)
            if k % 5 == 0:
                ticks.append(EntitlementTick(t, name, priority=10.0 * (i + 1) + k, debt=0.01 * k * (i + 1),
                                             burst=0.0, limit_concurrency=5, limit_tokens_per_s=100.0,
                                             used_tokens_per_s=50.0, demand_tokens_per_s=60.0,
                                             used_concurrency=2.0))
    return ReplayResult(scenario, policy, dec, comp, samples, ticks, [], {}, {}, 0, 0, DURATION_S)


@pytest.fixture(scope="module")
def result(scenario: Scenario) -> ReplayResult:
    return _result(scenario)


RENDERERS: dict[int, Any] = {}


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every figure a test draws, drawn once and kept for inspection (saved to its file as usual)."""
    figures: list[Any] = []
    saved = plots._save

    def keep(fig: Any, path: Path) -> Path:
        fig.canvas.draw()
        RENDERERS[id(fig)] = fig.canvas.get_renderer()  # closing the figure takes its canvas away
        figures.append(fig)
        return saved(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    return figures


def test_the_outage_and_a_tenant_joining_are_told_apart(result: ReplayResult) -> None:
    bands = plots.bands(result)
    assert [(b.start_s, b.end_s, b.kind) for b in bands] == [(10.0, 30.0, plots.BandKind.OUTAGE),
                                                            (40.0, DURATION_S, plots.BandKind.JOIN)]
    assert bands[0].label == "outage: 16 → 8 slots per replica"
    assert bands[1].label == "reports joins"  # as report.md names the tenant
    assert plots.BAND_COLORS[plots.BandKind.OUTAGE] != plots.BAND_COLORS[plots.BandKind.JOIN]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.floats(-1e6, 1e6), max_size=40), st.integers(1, 8))
def test_the_moving_mean_stays_within_its_window_and_never_looks_ahead(ys: list[float], n: int) -> None:
    out = plots.moving_mean(ys, n)
    assert len(out) == len(ys)
    for i, v in enumerate(out):
        window = ys[max(0, i - n + 1):i + 1]
        assert min(window) - 1e-6 <= v <= max(window) + 1e-6
    if ys:
        changed = [*ys[:-1], ys[-1] + 1.0]
        assert plots.moving_mean(changed, n)[:-1] == out[:-1]  # a later point never moves an earlier one


def test_a_constant_series_is_left_as_it_is() -> None:
    assert plots.moving_mean([3.0] * 7, 4) == [3.0] * 7
    assert plots.moving_mean([1.0, 5.0], 1) == [1.0, 5.0]


def _outside(fig: Any, legend: Any, ax: Any) -> bool:
    renderer = RENDERERS[id(fig)]
    return legend.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1


def test_fig5_has_the_papers_four_panels(result: ReplayResult, tmp_path: Path, drawn: list[Any]) -> None:
    path = plots.priority_dynamics(result, tmp_path / "fig5.png", "exp2 token pools (paper's Fig. 5)")
    assert path.stat().st_size > 0
    fig = drawn[0]
    panels = [ax for ax in fig.axes if ax.get_title(loc="left")]
    assert [ax.get_title(loc="left")[:3] for ax in panels] == ["(a)", "(b)", "(c)", "(d)"]
    assert len(plots.FIG5_PANELS) == 4 and len(fig.axes) == 5  # (b) has a second y axis: priority
    flight, debt, rates, delay = panels
    assert "capacity (slots)" in [line.get_label() for line in flight.get_lines()]
    priority = next(ax for ax in fig.axes if ax not in panels)
    assert priority.get_yscale() == "log"
    assert {line.get_label() for line in debt.get_lines()} >= set(SHOWN)
    labels = {line.get_label() for line in rates.get_lines()}
    assert {"copilot low_priority", "synth concurrency", "reports other"} <= labels
    assert "last 20 s" in rates.get_ylabel()
    assert "admission delay" in delay.get_ylabel()
    for ax in panels:
        legend = ax.get_legend()
        assert legend is not None and _outside(fig, legend, ax), ax.get_title(loc="left")
        texts = [t.get_text() for t in legend.get_texts()]
        assert "outage: 16 → 8 slots per replica" in texts and "reports joins" in texts
        assert not [t for t in texts if "elastic-" in t], texts
    assert not [t.get_text() for t in priority.get_yticklabels() if "^" in t.get_text() or "$" in t.get_text()]


def test_the_rates_panel_draws_the_smoothed_first_refusals(result: ReplayResult, tmp_path: Path,
                                                           drawn: list[Any]) -> None:
    plots.priority_dynamics(result, tmp_path / "fig5.png", "fig5")
    rates = drawn[0].axes[2]
    lines = {line.get_label(): list(line.get_ydata()) for line in rates.get_lines()}
    for name, shown in zip(NAMES, SHOWN):
        for group, (_, ys) in plots.refusal_rates(result, name).items():
            if any(ys):
                assert lines[f"{shown} {group}"] == plots.moving_mean(ys, 4)


def test_latency_puts_the_slo_lines_in_an_outside_legend_and_reads_plain_numbers(
        result: ReplayResult, tmp_path: Path, drawn: list[Any]) -> None:
    runs = {"token-pools": result, "none": _result(result.scenario, "none")}
    groups = {name: [name] for name in NAMES}
    plots.latency(runs, groups, tmp_path / "lat.png", "exp2", plots.group_slo_s(result, groups))
    fig = drawn[0]
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    slo = {e.name: e.slo_ms / 1000 for e in result.scenario.entitlements}
    assert [f"{n} TTFT SLO {slo[n]:g} s" for n in NAMES] == [t for t in texts if "SLO" in t]
    renderer = RENDERERS[id(fig)]
    assert fig.legends[0].get_window_extent(renderer).x0 >= max(ax.get_window_extent(renderer).x1 for ax in fig.axes)
    for ax in fig.axes:
        labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
        assert labels and not [s for s in labels if "^" in s or "$" in s], labels


def test_group_slo_only_where_the_group_shares_one(result: ReplayResult) -> None:
    slo = {e.name: e.slo_ms / 1000 for e in result.scenario.entitlements}
    mixed = {"all": list(NAMES), "copilot": ["elastic-copilot"]}
    assert plots.group_slo_s(result, mixed) == {"copilot": slo["elastic-copilot"]}


def test_every_figure_names_the_papers_figure_and_the_smoothing(result: ReplayResult, tmp_path: Path,
                                                                drawn: list[Any]) -> None:
    runs = {"token-pools": result, "none": _result(result.scenario, "none")}
    paths = plots.experiment_figures("exp2", runs, tmp_path, "open loop")
    assert [p.name for p in paths] == ["exp2_queue_depth.png", "exp2_slot_share.png", "exp2_latency.png",
                                       "exp2_throughput.png", "exp2_priority_dynamics.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    titles = [fig._suptitle.get_text() for fig in drawn]
    assert all("(paper's Fig. " in t for t in titles), titles
    throughput = drawn[3]
    assert "last 20 s" in throughput.axes[0].get_ylabel()
    for fig in drawn[:4]:  # the rows of panels: one legend for the row, beside it
        assert len(fig.legends) == 1
        texts = [t.get_text() for t in fig.legends[0].get_texts()]
        assert not [t for t in texts if "elastic-" in t], texts  # the report's names
    latency_texts = [t.get_text() for t in drawn[2].legends[0].get_texts()]
    assert "copilot, token pools" in latency_texts and "copilot TTFT SLO 0.5 s" in latency_texts
