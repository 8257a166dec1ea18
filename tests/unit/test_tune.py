"""``tokenpools tune`` on a small synthetic log (Exp 1 at half length, replayed once and written as a log).

Invariants pinned:
- determinism: the same seed and log give the same trials, the same best point and the same report.md bytes;
- each trial's replay speed is in trials.csv with the machine it was timed on; the report holds no timing;
- where trials run does not matter: serial and ``--workers 2`` give identical trial digests;
- the best point meets every constraint on the tuning part, and no feasible trial dominates it (property test
  of the choice rule on random points);
- every bad space file, a bad log path, and ``--resume`` on another log: one line naming the problem (file:line
  for a space file), exit 2, no traceback.
"""

from __future__ import annotations

import csv
import json
import math
import platform
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.cli import main
from tokenpools.replay import experiments, logio
from tokenpools.replay.replayer import replay
from tokenpools.replay.tune.choose import Point, best, dominates, front, on_front
from tokenpools.replay.tune.outcomes import outcomes
from tokenpools.config import load_config
from tokenpools.replay.log_replay import pool_of
from tokenpools.replay.tune.space import Direction, load_space, resolve

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "exp1.yaml"
SPACE = """\
parameters:
  policy.alpha_debt: {low: 0.5, high: 4.0}
  policy.gamma_debt: {low: 0.3, high: 0.95}
  policy.queue_slo_fraction: {low: 0.0, high: 1.0}
objectives:
  - {outcome: p99_client_ttft_s.guaranteed, direction: minimize}
  - {outcome: goodput_tokens_per_s.spot, direction: maximize}
constraints:
  - {outcome: refused.guaranteed-a, "<=": BOUND}
"""


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    scenario = experiments.build("exp1", ["load.compress=0.3"])
    root = tmp_path_factory.mktemp("tune") / "log"
    logio.write_log(replay(scenario, "token-pools"), root)
    return root


def _space(tmp_path: Path, text: str = SPACE, bound: str = "200", name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text.replace("BOUND", bound), encoding="utf-8")
    return path


def _tune(log: Path, space: Path, out: Path, *extra: str, capsys: pytest.CaptureFixture[str]) -> dict:
    code = main(["tune", str(log), "--config", str(CONFIG), "--space", str(space), "--out", str(out),
                 "--trials", "10", "--batch", "4", "--workers", "1", "--no-progress", "--json", *extra])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_same_seed_same_trials_best_point_and_report(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    space = _space(tmp_path)
    first = _tune(log, space, tmp_path / "a", capsys=capsys)
    again = _tune(log, space, tmp_path / "b", capsys=capsys)
    assert first["digests"] == again["digests"] and len(set(first["digests"])) > 1
    assert first["best"] == again["best"] is not None
    assert (tmp_path / "a" / "report.md").read_bytes() == (tmp_path / "b" / "report.md").read_bytes()
    # each trial's replay speed names the machine it was timed on (trials.csv); the report holds no timing
    rows = _trials(tmp_path / "a")
    assert all(float(r["realtime_multiple"]) > 0 and float(r["cpu_us_per_request"]) > 0 for r in rows)
    assert {r["machine"] for r in rows} == set(first["speed"]["machines"]) == {first["speed"]["current_machine"]}
    assert platform.node() in rows[0]["machine"] and "CPUs" in rows[0]["machine"]
    assert "## Replay speed" in (tmp_path / "a" / "report.md").read_text() and platform.node() not in (
        tmp_path / "a" / "report.md").read_text()
    other = _tune(log, space, tmp_path / "c", "--seed", "1", capsys=capsys)
    assert other["digests"] != first["digests"]


def test_workers_give_the_serial_trials(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    space = _space(tmp_path)
    serial = _tune(log, space, tmp_path / "serial", capsys=capsys)
    pooled = _tune(log, space, tmp_path / "pooled", "--workers", "2", capsys=capsys)
    assert pooled["digests"] == serial["digests"]
    assert pooled["best"] == serial["best"]


def test_the_best_point_meets_every_constraint_and_best_yaml_validates(
        log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = _tune(log, _space(tmp_path), tmp_path / "out", capsys=capsys)
    assert summary["best"] is not None
    assert summary["best"]["outcomes"]["refused.guaranteed-a"] <= 200
    assert set(summary["held_out"]) == {"current", "chosen"}
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Held-out check" in report and "on the front" in report
    assert main(["validate", "-q", str(tmp_path / "out" / "best.yaml")]) == 0
    capsys.readouterr()


def test_no_feasible_point_no_best_yaml_and_the_report_names_the_nearest(
        log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = _tune(log, _space(tmp_path, bound="-1"), tmp_path / "out", capsys=capsys)
    assert summary["best"] is None and summary["feasible"] == 0
    assert not (tmp_path / "out" / "best.yaml").exists()
    report = (tmp_path / "out" / "report.md").read_text()
    assert "on the front" not in report and "none can be compared with today's settings" in report
    nearest = min(float(row["refused.guaranteed-a"]) for row in _trials(tmp_path / "out"))
    assert f"| refused.guaranteed-a <= -1 | " in report and f"| {nearest:g} | no |" in report


def test_a_today_bound_is_todays_outcome_and_the_best_point_meets_it(
        log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    summary = _tune(log, _space(tmp_path, bound="today"), tmp_path / "out", capsys=capsys)
    today = summary["current"]["outcomes"]["refused.guaranteed-a"]
    feasible = [r for r in _trials(tmp_path / "out") if r["feasible"] == "True"]
    assert feasible and all(float(r["refused.guaranteed-a"]) <= today for r in feasible)
    assert all(float(r["refused.guaranteed-a"]) > today
               for r in _trials(tmp_path / "out") if r["feasible"] == "False" and r["state"] == "COMPLETE")
    assert summary["best"]["outcomes"]["refused.guaranteed-a"] <= today
    assert f"refused.guaranteed-a <= today ({today:g})" in (tmp_path / "out" / "report.md").read_text()


def test_the_example_space_file_loads_against_the_example_configuration() -> None:
    config = load_config(CONFIG)
    _, ents = pool_of(config)
    space = load_space(ROOT / "examples" / "tune-exp1.yaml", [e.name for e in ents], config.settings_values)
    assert [c.label() for c in space.constraints] == ["given_up.guaranteed <= today (nan)"]
    today = {"given_up.guaranteed": 18.0}
    assert [c.label() for c in resolve(space, today).constraints] == ["given_up.guaranteed <= today (18)"]


def _trials(out: Path) -> list[dict[str, str]]:
    with (out / "trials.csv").open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


BAD = {
    "unknown key": ("  policy.alpha_debt: {low: 0.5, high: 4.0}", "  policy.alpha_debt: {low: 0.5, hihg: 4.0}",
                    2, "unknown field"),
    "empty range": ("  policy.gamma_debt: {low: 0.3, high: 0.95}", "  policy.gamma_debt: {low: 0.9, high: 0.3}",
                    3, "empty range"),
    "bound out of range": ("  policy.gamma_debt: {low: 0.3, high: 0.95}", "  policy.gamma_debt: {low: 0.3, high: 1.0}",
                           3, "outside policy.gamma_debt's allowed range [0, 1)"),
    "unknown outcome": ("p99_client_ttft_s.guaranteed,", "p99_client_ttft_s.gold,", 6, "unknown outcome"),
    "unknown parameter": ("policy.queue_slo_fraction:", "policy.queue_slo_fractoin:", 4, "unknown parameter"),
    "a word for a bound": ("BOUND", "yesterday", 9, "a number or 'today'"),
    "bad yaml": ("  - {outcome: goodput_tokens_per_s.spot, direction: maximize}",
                 "  - {outcome: goodput_tokens_per_s.spot, direction: maximize", 8, "invalid YAML"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_space_file_is_one_line_with_its_line(case: str, log: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    old, new, line, words = BAD[case]
    assert old in SPACE
    space = _space(tmp_path, SPACE.replace(old, new))
    code = main(["tune", str(log), "--config", str(CONFIG), "--space", str(space), "--out", str(tmp_path / "o"),
                 "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith(f"tokenpools tune: {space}:{line}: ") and words in err[0], err[0]
    assert not (tmp_path / "o").exists()  # nothing ran


def test_a_bad_log_path_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tune", str(tmp_path / "nolog"), "--config", str(CONFIG), "--space", str(_space(tmp_path)),
                 "--out", str(tmp_path / "o"), "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"tokenpools tune: {tmp_path / 'nolog'}: no such log "
                                                     "directory")


def test_resume_continues_and_refuses_another_log(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    space = _space(tmp_path)
    out = tmp_path / "out"
    first = _tune(log, space, out, capsys=capsys)
    more = _tune(log, space, out, "--resume", "--trials", "14", capsys=capsys)
    assert more["digests"][:10] == first["digests"] and len(more["digests"]) == 14
    other = tmp_path / "other"
    logio.write_log(replay(experiments.build("exp1", ["load.compress=0.25"]), "token-pools"), other)
    code = main(["tune", str(other), "--config", str(CONFIG), "--space", str(space), "--out", str(out),
                 "--workers", "1", "--no-progress", "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "another log_digest" in err[0], err
    code = main(["tune", str(log), "--config", str(CONFIG), "--space", str(space), "--out", str(out),
                 "--workers", "1", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--resume" in err[0]


def test_client_ttft_is_never_below_ttft_and_counts_add_up(log: Path) -> None:
    result = replay(experiments.build("exp1", ["load.compress=0.3"]), "token-pools")
    values = outcomes(result)
    for group in ("pool", "guaranteed", "spot", "guaranteed-a"):
        assert values[f"p99_client_ttft_s.{group}"] >= values[f"p99_ttft_s.{group}"]
        assert values[f"goodput_tokens_per_s.{group}"] <= values[f"throughput_tokens_per_s.{group}"]
    decided = len(result.decisions.t_s)
    assert values["admitted.pool"] + values["refused.pool"] == decided
    assert values["admitted.guaranteed"] == values["admitted.guaranteed-a"] + values["admitted.guaranteed-c"]
    assert math.isnan(values["p99_ttft_s.dedicated"])  # no dedicated entitlement: no samples


points = st.lists(st.builds(Point, st.integers(0, 40), st.tuples(st.floats(0, 10), st.floats(0, 10)), st.booleans()),
                  max_size=30, unique_by=lambda p: p.number)
directions = st.lists(st.sampled_from(list(Direction)), min_size=2, max_size=2)


@given(points, directions)
@settings(max_examples=200, deadline=None)
def test_the_best_point_is_feasible_and_undominated(ps: list[Point], ds: list[Direction]) -> None:
    chosen = best(ps, ds)
    if not any(p.feasible for p in ps):
        assert chosen is None
        return
    assert chosen is not None and chosen.feasible
    assert not any(dominates(q, chosen, ds) for q in ps if q.feasible)
    assert chosen in front(ps, ds) and on_front(chosen, ps, ds)


def test_batch_k_plus_1_is_asked_once_batch_k_minus_1_is_told_and_results_are_told_in_order() -> None:
    """The pipeline's rule (search.run): two batches in flight, asks and tells in an order no executor changes."""
    import optuna

    from tokenpools.replay.tune import search
    from tokenpools.replay.tune.trials import TrialResult

    space_file = Path(__file__).resolve().parents[2] / "examples" / "tune-exp1.yaml"
    config = load_config(Path(__file__).resolve().parents[2] / "examples" / "exp1.yaml")
    _, ents = pool_of(config)
    space = resolve(load_space(space_file, [e.name for e in ents], config.settings_values), {
        o: 1.0 for o in ("given_up.guaranteed",)})
    events: list[tuple[str, int]] = []

    class Recorded:
        def __init__(self, jobs: list[tuple[int, tuple[str, ...]]]) -> None:
            self.jobs = jobs
            events.append(("submit", jobs[0][0]))

        def result(self) -> list[TrialResult]:
            return [TrialResult(n, {o.outcome: float(n) for o in (*space.objectives, *space.constraints)}, str(n),
                                1, 1.0, 1.0, 1.0) for n, _ in self.jobs]

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=[d.value for d in search.direction_list(space)],
                                sampler=optuna.samplers.RandomSampler(seed=1))
    search.run(study, space, 10, 3, lambda jobs: Recorded(list(jobs)),
               lambda trial, result: events.append(("tell", trial.number)))
    # batches of 3: [0-2] [3-5] [6-8] [9]; the third is submitted after the first is told, before the second is
    assert [e for e in events if e[0] == "submit"] == [("submit", 0), ("submit", 3), ("submit", 6), ("submit", 9)]
    assert events[:2] == [("submit", 0), ("submit", 3)]
    assert events.index(("submit", 6)) == events.index(("tell", 2)) + 1
    assert events.index(("submit", 9)) == events.index(("tell", 5)) + 1
    assert [n for kind, n in events if kind == "tell"] == list(range(10))


def test_the_best_point_prints_as_a_reader_takes_it_in() -> None:
    """4 significant digits on the terminal, not a dict's repr with 0.12990000000000013 (best.yaml keeps all)."""
    from rich.console import Console

    from tokenpools.replay.tune.cli import _print

    console = Console(record=True, width=80)
    _print(console, {"trials": 4, "feasible": 4, "current": {"on_front": True}, "files": ["out/best.yaml"],
                     "speed": {"trials_timed": 0},
                     "best": {"trial": 0, "params": {"policy.alpha_debt": 2.4208472637456366},
                              "outcomes": {"p99_client_ttft_s.guaranteed": 0.12990000000000013,
                                           "given_up.guaranteed": 0.0}}})
    text = console.export_text()
    assert "policy.alpha_debt 2.421" in text and "p99_client_ttft_s.guaranteed 0.1299" in text
    assert "0.1299000" not in text and "{" not in text
