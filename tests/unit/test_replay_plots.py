"""Fig. 5's admissions-and-refusals panel (replay/plots.py ``priority_dynamics``): drawn from the replay's own refusals.

The panel counts what a proxy without a queue (the paper's) would have refused: a refusal at once at its decision,
a wait in the proxy's queue once, at its start, with the refusal it began with (``metrics.refusal_events``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenpools.replay import metrics, plots, results
from tokenpools.replay.experiments import build
from tokenpools.replay.replayer import ReplayResult, replay


@pytest.fixture(scope="module")
def closed_exp2() -> ReplayResult:
    return replay(build("exp2", ["load.mode=closed"]), "token-pools")


NAMES = ("elastic-copilot", "elastic-synth", "elastic-reports")  # their admissions are the panel's solid lines


def _grouped(counts: dict[str, int]) -> dict[str, int]:
    out = {"low_priority": 0, "concurrency": 0, "other": 0}
    for reason, n in counts.items():
        out[reason if reason in out else "other"] += n
    return out


def test_refusal_events_count_a_wait_once_at_its_start(closed_exp2: ReplayResult) -> None:
    events = metrics.refusal_events(closed_exp2)
    d = closed_exp2.decisions
    at_once = sum(1 for o, q in zip(d.outcome, d.queued_s) if o != "admitted" and q == 0)
    assert len(events) == at_once + len(closed_exp2.wait_starts)
    assert events == sorted(events)
    first = metrics.first_refusals(closed_exp2)
    summary = results.summarize("exp2", {"token-pools": closed_exp2})["token_pools"]
    assert summary["low_priority_refusals"] == {
        n.split("-", 1)[1]: first.get(n, {}).get("low_priority", 0) for n in ("elastic-copilot", "elastic-synth",
                                                                             "elastic-reports")}


def test_the_rates_add_up_to_the_first_refusals_by_reason(closed_exp2: ReplayResult) -> None:
    first = metrics.first_refusals(closed_exp2)
    for name in ("elastic-copilot", "elastic-synth", "elastic-reports"):
        rates = plots.refusal_rates(closed_exp2, name)
        drawn = {group: round(sum(ys) * plots.BIN_S) for group, (_, ys) in rates.items()}
        assert drawn == _grouped(first.get(name, {})), name
    synth = plots.refusal_rates(closed_exp2, "elastic-synth")["low_priority"]
    assert sum(synth[1]) > 0 and not any(plots.refusal_rates(closed_exp2, "elastic-copilot")["low_priority"][1])


def test_the_panel_draws_each_tenants_nonzero_groups_from_the_data(closed_exp2: ReplayResult, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    drawn = []
    saved = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: (drawn.append(fig), saved(fig, path))[1])
    path = plots.priority_dynamics(closed_exp2, tmp_path / "fig5.png", "exp2 closed loop")
    assert path.stat().st_size > 0
    panel = drawn[0].axes[2]  # (c) admissions and refusals by reason
    lines = {line.get_label(): list(line.get_ydata()) for line in panel.get_lines()}
    expected = {}
    for name in ("elastic-copilot", "elastic-synth", "elastic-reports"):
        for group, (_, ys) in plots.refusal_rates(closed_exp2, name).items():
            if any(ys):  # labelled with the tenant's name in report.md: synth, not elastic-synth
                expected[f"{name.removeprefix('elastic-')} {group}"] = plots.moving_mean(
                    ys, round(plots.SMOOTH_S / plots.BIN_S))
    shown = {n.removeprefix("elastic-") for n in NAMES}
    assert {label: ys for label, ys in lines.items() if label not in shown} == expected
    assert "synth low_priority" in lines and "copilot low_priority" not in lines
