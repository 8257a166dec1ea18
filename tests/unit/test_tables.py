"""Every terminal table at 80 columns (``tokenpools.tables``): no line wider than the terminal and no number cut."""

from __future__ import annotations

import io
import random
import re
from pathlib import Path

import polars as pl
import pytest
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from tokenpools.cli import main
from tokenpools.config import load_config, load_settings
from tokenpools.config.render import entitlement_table, pool_table
from tokenpools.config.summary import summarize
from tokenpools.replay.cli_progress import headline_table, metric_label
from tokenpools.replay.fleet import compare
from tokenpools.replay.fleet.table import terminal_table as fleet_table
from tokenpools.replay.fleet.trace import TraceConfig
from tokenpools.replay.results import MODE_KEYS, PAPER
from tokenpools.replay.sweep import terminal_table as sweep_table
from tokenpools.tables import PIPE_WIDTH, Column, console_width, fit, share

EXAMPLES = sorted(p for p in (Path(__file__).parents[2] / "examples").glob("*.yaml") 
            if p.name in ("autoscale.yaml", "exp1.yaml", "exp2.yaml"))  # the configs (not the tune search space)
CUT_NUMBER = re.compile(r"\d…|…\d")


def rendered(table: Table, width: int = 80) -> list[str]:
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(table)
    out = console.file.getvalue()  # type: ignore[attr-defined]
    return out.splitlines()


def assert_readable(lines: list[str], width: int = 80) -> None:
    assert lines
    for line in lines:
        assert cell_len(line) <= width, line
        assert not CUT_NUMBER.search(line), line
        assert "…" not in line, line


def assert_whole(lines: list[str], cells: list[str]) -> None:
    """Each cell shows on one line: nothing of it was cut or wrapped away."""
    text = "\n".join(lines)
    for cell in cells:
        assert cell in text, cell


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_validate_tables_fit_80_columns(path: Path) -> None:
    config = load_config(str(path))
    settings = load_settings(config.settings_values, [])
    for s in summarize(config, settings.policy, 1.8e9):
        lines = rendered(pool_table(s, 80)) + rendered(entitlement_table(s, settings.policy, 80))
        assert_readable(lines)
        assert_whole(lines, [f"{e.spec.slo_ms:,.0f}" for e in s.rows] + [e.spec.name for e in s.rows])


def _results() -> dict[str, object]:
    """Every PAPER metric under both load models, with numbers as wide as a run gives."""
    results: dict[str, object] = {}
    for mode in MODE_KEYS.values():
        node = results.setdefault(mode, {})
        for key in PAPER:
            parts = key.split(".")
            target = node
            for part in parts[:-1]:
                target = target.setdefault(part, {})  # type: ignore[union-attr]
            target[parts[-1]] = 123456.789  # type: ignore[index]
    return results


def test_demo_headline_fits_80_columns_and_tells_rows_apart() -> None:
    lines = rendered(headline_table(_results(), 80))
    assert_readable(lines)
    assert "123456.789" in "\n".join(lines)
    labels = [metric_label(*key.split(".token_pools.")) for key in PAPER if ".token_pools." in key]
    assert len(set(labels)) == len(labels)  # no two rows under one name
    assert metric_label("exp2", "low_priority_refusals.synth") == "Exp 2 low-priority refusals, synth"


def test_fleet_table_fits_80_columns() -> None:
    trace_config = TraceConfig(entitlements=10, duration_s=5.0)
    trace = compare.trace_for(trace_config, 1)
    exact = compare.exact(trace, 1)
    designs = ["shares", "counts", "counts_greedy", compare.variant_name(3.0)]
    configs = compare.grid([4], ["key_affinity"], designs, 1.0, 0.1)
    rows = list(compare.design_runs(trace, configs, 1, exact, compare.policies_with([3.0])))
    lines = rendered(fleet_table(exact, rows, 80))
    assert_readable(lines)
    assert_whole(lines, [f"{r.ratio:.2f}" for r in rows] + designs)
    assert "left out" in "\n".join(lines)
    assert "left out" not in "\n".join(rendered(fleet_table(exact, rows, PIPE_WIDTH), PIPE_WIDTH))


def test_sweep_table_fits_80_columns() -> None:
    df = pl.DataFrame({"streams.tick_s": ["1", "2"], "match_rate": [0.8431, 0.7652], "max_waiting": [2, 20000],
                       **{f"{e}.{k}": [1234567.5, None] for e in ("guaranteed-a", "elastic-copilot", "spot-b")
                          for k in ("refused", "p99_ttft_s")}})
    lines = rendered(sweep_table(df, ["streams.tick_s"], 80))
    assert_readable(lines)
    assert_whole(lines, ["0.843", "20000"])
    assert "left out at 80 columns" in "\n".join(lines)


def test_a_number_is_never_cut_even_when_nothing_else_fits() -> None:
    columns = [Column("name", keep=1), Column("a long header", number=True, keep=2)]
    lines = rendered(fit(columns, [["x" * 30, "1,234,567,890.123"]], 20), 20)
    assert_readable(lines, 20)
    assert_whole(lines, ["1,234,567,890.123"])
    assert "left out at 20 columns: name" in " ".join(line.strip() for line in lines)


def test_a_table_of_no_rows_is_its_headers() -> None:
    """A pool without entitlements (a calibration's block validated alone): the entitlements table has no rows."""
    columns = [Column("name", keep=1), Column("slots", number=True, keep=2)]
    lines = rendered(fit(columns, [], 80), 80)
    assert_readable(lines, 80)
    assert "name" in lines[0] or any("name" in line for line in lines)


def test_validate_of_a_pool_without_entitlements_succeeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pool.yaml"
    path.write_text("""apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {name: p}
spec:
  model: m
  backendRef: {name: b}
  kvBytesPerToken: 512
  perReplica: {tokensPerSecond: 100, kvCacheGiB: 1, concurrency: 4}
""")
    assert main(["validate", str(path)]) == 0
    assert f"{path}: valid (1 pool, 0 entitlements)" in capsys.readouterr().out


def test_share_gives_the_room_by_keep_and_never_below_the_narrowest() -> None:
    assert share(10, [2, 2], [8, 8], [1, 2]) == [2, 8]
    assert share(10, [2, 2], [3, 20], [1, 1]) == [3, 7]  # equals: the one nearest whole first
    assert share(3, [2, 2], [8, 8], [1, 2]) == [2, 2]  # the narrowest win over the room


def test_console_width_honours_columns_in_a_pipe() -> None:
    assert console_width(False, 80, {"COLUMNS": "80"}) == 80
    assert console_width(False, 80, {}) == PIPE_WIDTH
    assert console_width(True, 100, {}) == 100
    assert console_width(True, 100, {"COLUMNS": "junk"}) == 100


def test_validate_in_a_pipe_follows_columns(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["validate", str(EXAMPLES[0])]) == 0
    assert_readable(capsys.readouterr().out.splitlines())
