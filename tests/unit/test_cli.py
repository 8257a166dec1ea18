"""The ``tokenpools`` command: lazy subcommand table, validate, demo, hash-key; as a process and in-process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tokenpools.cli import COMMANDS, Command, installed_commands, main
from tokenpools.config import hash_api_key

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TOKENPOOLS = Path(sys.executable).parent / "tokenpools"  # the console script of this venv
NOW = "2026-01-01T00:00:00Z"


def _run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    # a pipe with no COLUMNS, as a script's (a test run may export COLUMNS=80: tests/unit/test_tables.py checks
    # that width)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run([str(TOKENPOOLS), *args], cwd=ROOT, capture_output=True, text=True, input=stdin,
                          timeout=60, check=False, env=env)


# ---------------------------------------------------------------- as a process


def test_help_lists_every_command_and_marks_the_missing_ones() -> None:
    result = _run("--help")
    assert result.returncode == 0, result.stderr
    for command in installed_commands():  # the product's rows and those tokenpools-dev adds
        assert command.name in result.stdout
    for command in installed_commands():
        marked = f"{command.help} (not available yet)" in " ".join(result.stdout.split())
        assert marked == (not command.available()), command.name
    assert "(not available yet)" not in " ".join(result.stdout.split()).split("validate")[1].split("hash-key")[0]


def test_help_imports_nothing_heavy() -> None:
    code = textwrap.dedent("""
        import sys
        from tokenpools.cli import main
        assert main(["--help"]) == 0
        heavy = sorted(m for m in ("pydantic", "pydantic_settings", "yaml", "rich", "tokenpools.config", "aiohttp",
                                   "faust", "aiokafka", "polars", "kubernetes_asyncio", "openai",
                                   "tokenpools_dev.devstack.cli", "tokenpools_dev.loadgen.cli", "tokenpools_dev.live.cli")
                       if m in sys.modules)
        print("HEAVY", heavy, file=sys.stderr)
    """)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stderr


def test_validate_exp1_prints_the_tables() -> None:
    result = _run("validate", "examples/exp1.yaml", "--now", NOW)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "TokenPool qwen3-8b — nvidia/Qwen3-8B-NVFP4" in out
    assert "c = 147,456 B/token" in out
    for row in ("guaranteed-a", "spot-b", "guaranteed-c", "180 · 3.00 · 6", "120 · 2.00 · 4", "818.2", "Bound"):
        assert row in out, row
    assert "ℓ̄* = 10,800 ms" in out
    assert out.rstrip().endswith("examples/exp1.yaml: valid (1 pool, 3 entitlements)")
    assert result.stderr == ""


def test_validate_invalid_exits_2_with_every_problem_on_stderr() -> None:
    result = _run("validate", "examples/invalid.yaml")
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 27
    assert "examples/invalid.yaml:22: document 2 (TokenEntitlement spot-b): spec.qos.sloTargetMs: must be > 0, got -5" in lines
    assert ("examples/invalid.yaml:124: document 12 (TokenEntitlement spot-budgets-2): spec.budgets[1].rollover: a `never` "
            "budget has no next period to roll over into: remove rollover") in lines
    assert all(line.startswith("examples/invalid.yaml:") for line in lines)
    assert "valid" not in result.stdout


def test_python_dash_m_is_the_same_command() -> None:
    result = subprocess.run([sys.executable, "-m", "tokenpools", "validate", "-q", "examples/exp2.yaml"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "examples/exp2.yaml: valid (1 pool, 3 entitlements)"


def test_hash_key_reads_stdin() -> None:
    result = _run("hash-key", stdin="sk-exp1-guaranteed-a\n\nsk-exp1-spot-b\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [hash_api_key("sk-exp1-guaranteed-a"), hash_api_key("sk-exp1-spot-b")]
    assert _run("hash-key", stdin="").returncode == 2


# ---------------------------------------------------------------- in-process


def test_validate_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(EXAMPLES / "exp2.yaml"), "--now", NOW]) == 0
    out = capsys.readouterr().out
    assert "93.8" in out and "20.3" in out and "(60.4)" in out and "Pending" in out
    assert "ℓ̄* = 15,250 ms" in out


def test_validate_several_files_reports_each(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "-q", str(EXAMPLES / "exp1.yaml"), str(EXAMPLES / "invalid.yaml"),
                 str(EXAMPLES / "autoscale.yaml")]) == 2
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        f"{EXAMPLES / 'exp1.yaml'}: valid (1 pool, 3 entitlements)",
        f"{EXAMPLES / 'autoscale.yaml'}: valid (1 pool, 4 entitlements)",
    ]
    assert len(captured.err.splitlines()) == 27


def test_set_overrides_reach_validate_and_bad_ones_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(EXAMPLES / "exp2.yaml"), "--set", "policy.alpha_slo=0"]) == 0
    assert "100.0" in capsys.readouterr().out
    assert main(["validate", str(EXAMPLES / "exp2.yaml"), "--set", "policy.alpha_slo=-1", "--set", "streams.tik_s=1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "--set: policy.alpha_slo: must be >= 0, got -1",
        "--set: streams.tik_s: unknown setting 'tik_s' in streams; did you mean tick_s? (known: app_id, store_url, tick_s, "
        "grace_s, metrics_staleness_s, proxy_heartbeat_ttl_s, counts_interval_s, demand_window_s, session_timeout_s, "
        "standby_replicas)",
    ]


def test_a_config_error_names_the_command_as_every_error_line_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "nolog", "--config", str(EXAMPLES / "exp1.yaml"), "--set", "replay.backend=nosuch"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "tokenpools replay: --set: replay.backend: must be 'sim' or 'recorded', got 'nosuch'"]


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["no-such-command"]) == 2
    assert main(["validate"]) == 2  # FILE is required
    assert main(["validate", str(EXAMPLES / "exp1.yaml"), "--now", "yesterday"]) == 2
    assert "--now must be an RFC 3339 timestamp, got 'yesterday'" in capsys.readouterr().err
    assert main(["--help"]) == 0
    capsys.readouterr()
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == "tokenpools 0.1.0"


def test_demo_is_the_replay_of_both_experiments() -> None:
    """`make demo` runs this row; the replay tests check what it produces."""
    row = next(c for c in COMMANDS if c.name == "demo")
    assert row.run == "tokenpools.replay.demo:run" and row.available()


# ---------------------------------------------------------------- the command table


FAKE = '''
import sys
IMPORTED = True

def add_arguments(parser):
    parser.add_argument("--port", type=int, default=1)

def run(args):
    print(f"port={args.port} overrides={args.overrides}")
    return 3
'''


@pytest.fixture
def fake_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Command, ...]:
    (tmp_path / "tp_fake_command.py").write_text(FAKE)
    (tmp_path / "tp_fake_partial.py").write_text("def add_arguments(parser):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("tp_fake_command", "tp_fake_partial"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return (
        Command("fake", "tp_fake_command:run", "a fake command", arguments="tp_fake_command:add_arguments"),
        Command("partial", "tp_fake_partial:run", "module exists, run does not", arguments="tp_fake_partial:add_arguments"),
        Command("later", "tokenpools.not_written_yet.main:run", "a later command", arguments="tokenpools.not_written_yet.main:add_arguments"),
    )


def test_a_row_runs_its_function_with_its_own_arguments(fake_table: tuple[Command, ...], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fake", "--port", "7", "--set", "streams.tick_s=1"], commands=fake_table) == 3
    assert capsys.readouterr().out.strip() == "port=7 overrides=['streams.tick_s=1']"


def test_other_rows_are_not_imported(fake_table: tuple[Command, ...], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"], commands=fake_table) == 0
    assert main(["partial", "--help"], commands=fake_table) == 0
    assert "tp_fake_command" not in sys.modules


def test_missing_commands_say_so_and_exit_2(fake_table: tuple[Command, ...], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"], commands=fake_table) == 0
    listing = " ".join(capsys.readouterr().out.split())
    assert "a fake command" in listing and "a fake command (not available yet)" not in listing
    assert "module exists, run does not (not available yet)" in listing
    assert "a later command (not available yet)" in listing
    assert main(["later", "--anything", "goes"], commands=fake_table) == 2
    assert capsys.readouterr().err.strip() == "tokenpools later: not available yet (tokenpools.not_written_yet.main:run is not implemented)"
    assert main(["partial"], commands=fake_table) == 2
    assert "tokenpools partial: not available yet" in capsys.readouterr().err
    assert main(["later", "--help"], commands=fake_table) == 0
    assert "(not available yet)" in capsys.readouterr().out


def test_the_table_points_at_the_agreed_entry_points() -> None:
    rows = {c.name: (c.run, c.arguments) for c in COMMANDS}
    assert rows["proxy"][0] == "tokenpools.proxy.main:run"
    assert rows["agents"][0] == "tokenpools.streams.main:run"
    assert rows["controller"][0] == "tokenpools.controllers.main:run"
    assert (rows["record"][0], rows["replay"][0], rows["experiment"][0]) == (
        "tokenpools.replay.cli:record", "tokenpools.replay.cli:replay", "tokenpools.replay.cli:experiment")
    assert {"validate", "demo", "hash-key"} <= set(rows)
    assert all(c.available() for c in COMMANDS if c.name in ("validate", "demo", "hash-key"))
    assert not [c.name for c in COMMANDS if "tokenpools_dev" in f"{c.run} {c.arguments}"], "the product names no dev row"
    added = {c.name: (c.run, c.arguments) for c in installed_commands()[len(COMMANDS):]}  # by tokenpools-dev
    assert added == {
        "up": ("tokenpools_dev.devstack.cli:up", "tokenpools_dev.devstack.cli:add_up_arguments"),
        "down": ("tokenpools_dev.devstack.cli:down", "tokenpools_dev.devstack.cli:add_down_arguments"),
        "load": ("tokenpools_dev.loadgen.cli:load", "tokenpools_dev.loadgen.cli:add_load_arguments"),
    }


def test_an_exception_nothing_classifies_is_a_bug_not_a_finding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 1 is a finding (``usage --reconcile`` found a difference): a crash must not read as one to a script."""
    (tmp_path / "tp_fake_bug.py").write_text("def run(args):\n    raise RuntimeError('a bug')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tp_fake_bug", raising=False)
    table = (Command("bug", "tp_fake_bug:run", "raises"),)
    assert main(["bug"], commands=table) == 70
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: a bug" in err  # a bug keeps its traceback
    assert err.rstrip().splitlines()[-1] == "tokenpools bug: internal error (a bug; the traceback above says where), exit 70"
