"""``tokenpools fleet``: the fleet model on the product CLI, in-process, on a small trace; its figures are the model's."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tokenpools.cli import COMMANDS, main
from tokenpools.replay.fleet import compare
from tokenpools.replay.fleet.metrics import refusal_ratio
from tokenpools.replay.fleet.model import FleetConfig, run
from tokenpools.replay.fleet.table import HEADERS, table
from tokenpools.replay.fleet.trace import TraceConfig, generate

SMALL = ["--proxies", "4", "--entitlements", "10", "--duration-s", "5"]
FIELDS = {"attempts", "admitted", "refused", "refusals", "refused_fraction", "false_refusals", "overshoot_max_slots",
          "overshoot_fraction", "update_bytes_mean", "update_bytes_max"}


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["fleet", *SMALL, "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_row_points_at_the_fleet_module() -> None:
    row = next(c for c in COMMANDS if c.name == "fleet")
    assert (row.run, row.arguments) == ("tokenpools.replay.fleet.cli:fleet",
                                        "tokenpools.replay.fleet.cli:add_fleet_arguments")
    assert row.available()


def test_json_has_the_exact_row_and_each_design_row(capsys: pytest.CaptureFixture[str]) -> None:
    document = _json(capsys, "--lb", "key_affinity", "--design", "shares,counts", "--design", "counts_greedy",
                     "--growth-fraction", "3")
    assert document["trace"] == {"entitlements": 10, "duration_s": 5.0, "load": 0.6, "seed": 1,
                                 "requests": document["trace"]["requests"]}  # type: ignore[index]
    exact = document["exact"]
    assert isinstance(exact, dict) and FIELDS <= set(exact) and exact["false_refusals"] == 0
    runs = document["runs"]
    assert isinstance(runs, list)
    assert [r["design"] for r in runs] == ["shares", "counts", "counts_greedy", "counts_f3"]
    for r in runs:
        assert FIELDS | {"proxies", "balancer", "design", "refusal_ratio", "tick_s", "counts_interval_s"} <= set(r)
        assert (r["proxies"], r["balancer"], r["tick_s"], r["counts_interval_s"]) == (4, "key_affinity", 1.0, 0.1)
        assert r["attempts"] == exact["attempts"]  # the same trace for every design


def test_the_figures_are_those_of_the_model(capsys: pytest.CaptureFixture[str]) -> None:
    document = _json(capsys, "--design", "split",  # the former name of shares, still accepted
                     "--design", "counts", "--seed", "3", "--tick-s", "0.5",
                     "--counts-interval-s", "0.2", "--load", "0.9")
    trace = generate(TraceConfig(entitlements=10, duration_s=5.0, load=0.9), random.Random(3))
    exact = run(trace, FleetConfig(proxies=1, policy="exact"), random.Random(3)).figures
    assert document["exact"] == exact.summary()
    assert document["trace"]["requests"] == len(trace.requests)  # type: ignore[index]
    runs = document["runs"]
    assert isinstance(runs, list) and len(runs) == 2
    for design, row in zip(("shares", "counts"), runs):
        config = FleetConfig(proxies=4, policy=design, balancer="random", tick_s=0.5, counts_interval_s=0.2)
        figures = run(trace, config, random.Random(3)).figures
        assert {k: row[k] for k in figures.summary()} == figures.summary()
        assert row["refusal_ratio"] == refusal_ratio(figures, exact)
    assert runs[0]["refusals"] > 0  # split refuses on this trace: the comparison is not vacuous


def test_the_table_has_the_exact_row_first(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)  # a pipe: every column
    assert main(["fleet", *SMALL, "--design", "shares", "--lb", "round_robin"]) == 0
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["P", "balancer", "design"])
    header, rule, first, second = lines[start:start + 4]
    assert header.split() == " ".join(HEADERS).split()
    assert set(rule) == {"─"}
    assert first.split()[:3] == ["-", "-", "exact"] and first.split()[4] == "1.00"
    assert second.split()[:3] == ["4", "round_robin", "shares"]
    assert [line for line in lines[start + 4:] if line] == []


def test_out_writes_the_json_document(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["fleet", *SMALL, "--out", str(tmp_path / "fleet")]) == 0
    captured = capsys.readouterr()
    written = json.loads((tmp_path / "fleet" / "results.json").read_text())
    assert [r["design"] for r in written["runs"]] == ["counts"]  # the default design
    assert "exact" in captured.out and f"wrote {tmp_path / 'fleet' / 'results.json'}" in captured.err
    assert main(["fleet", *SMALL, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == written


@pytest.mark.parametrize(("args", "option", "says"), [
    (["--lb", "nearest"], "--lb", "invalid choice: 'nearest'"),
    (["--proxies", "0"], "--proxies", "must be >= 1, got 0"),
    (["--proxies", "two"], "--proxies", "expected a whole number, got 'two'"),
    (["--design", "exact"], "--design", "unknown design exact"),
    (["--design", "shares,nope"], "--design", "unknown design nope"),
    (["--entitlements", "0"], "--entitlements", "must be >= 1"),
    (["--duration-s", "0"], "--duration-s", "must be > 0"),
    (["--load", "-0.5"], "--load", "must be > 0"),
    (["--tick-s", "nan"], "--tick-s", "must be > 0"),
    (["--counts-interval-s", "0"], "--counts-interval-s", "must be > 0"),
    (["--growth-fraction", "0.5"], "--growth-fraction", "must be >= 1"),
    (["--seed", "-1"], "--seed", "must be >= 0"),
])
def test_bad_options_exit_2_naming_the_option(capsys: pytest.CaptureFixture[str], args: list[str], option: str,
                                              says: str) -> None:
    assert main(["fleet", *args]) == 2
    err = capsys.readouterr().err
    assert f"argument {option}: " in err and says in err


@pytest.mark.parametrize(("args", "says"), [
    (["--set", "nosuch.group=1"], "tokenpools fleet: error: --set: fleet reads no settings"),
    (["--set", "policy.fleet_enforcement=shares"], "tokenpools fleet: error: --set: fleet reads no settings"),
    (["--out", "{file}/out"], "tokenpools fleet: {file}/out: Not a directory"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_run(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                          args: list[str], says: str) -> None:
    file = tmp_path / "a-file"
    file.write_text("")
    assert main(["fleet", *SMALL, *(a.format(file=file) for a in args)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing ran
    lines = captured.err.strip().splitlines()
    assert lines[-1].startswith(says.format(file=file)) and "Traceback" not in captured.err
    assert len([line for line in lines if line.startswith("tokenpools fleet")]) == 1


def test_the_table_takes_extra_columns_one_cell_per_line() -> None:
    trace = compare.trace_for(TraceConfig(entitlements=4, duration_s=2.0), 1)
    exact = compare.exact(trace, 1)
    rows = list(compare.design_runs(trace, compare.grid([2], ["random"], ["shares", "counts"]), 1, exact))
    lines = table(exact, rows, [("run s", ["0.1", "0.2", "0.3"])])
    assert lines[0].endswith("run s") and [line.split()[-1] for line in lines[2:]] == ["0.1", "0.2", "0.3"]
    with pytest.raises(ValueError, match="run s"):
        table(exact, rows, [("run s", ["0.1"])])
