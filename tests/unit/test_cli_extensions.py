"""Commands and experiment modes found through entry points: the real tokenpools-dev ones, a fake distribution's,
and none at all (the product alone offers only its own rows and ``--mode sim``)."""

from __future__ import annotations

import argparse
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from tokenpools.cli import COMMANDS, main
from tokenpools.commands import COMMANDS_GROUP, EXPERIMENT_MODES_GROUP, Command, Skipped, discover, judge
from tokenpools.replay.cli import SIM, add_experiment_arguments, experiment_modes

BUILTIN = {c.name for c in COMMANDS}

FAKE_MODULE = '''
from tokenpools.commands import Command

HELLO = Command("hello", "tp_fake_ext:hello", "say hello", arguments="tp_fake_ext:add_hello_arguments")
SHADOW = Command("validate", "tp_fake_ext:hello", "a second validate")
OTHER = Command("other", "tp_fake_ext:hello", "a row under another entry-point name")
NOT_A_ROW = "tp_fake_ext:hello"
ECHO = Command("echo", "tp_fake_ext:echo", "print the experiment's name", arguments="tp_fake_ext:add_echo_arguments")
SIM = Command("sim", "tp_fake_ext:echo", "a second sim")

def add_hello_arguments(parser):
    parser.add_argument("--who", default="world")

def hello(args):
    print(f"hello {args.who}")
    return 5

def add_echo_arguments(parser):
    parser.add_argument("--loud", action="store_true")

def echo(args):
    print(args.name.upper() if args.loud else args.name)
    return 7
'''

FAKE_ENTRY_POINTS = f"""
[{COMMANDS_GROUP}]
hello = tp_fake_ext:HELLO
validate = tp_fake_ext:SHADOW
mismatch = tp_fake_ext:OTHER
string = tp_fake_ext:NOT_A_ROW
broken = tp_no_such_module:ROW

[{EXPERIMENT_MODES_GROUP}]
echo = tp_fake_ext:ECHO
sim = tp_fake_ext:SIM
"""


@pytest.fixture
def fake_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed distribution ``tp-fake-ext`` (its dist-info on sys.path), as pip would leave it."""
    (tmp_path / "tp_fake_ext.py").write_text(FAKE_MODULE)
    info = tmp_path / "tp_fake_ext-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tp-fake-ext\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(FAKE_ENTRY_POINTS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "tp_fake_ext", raising=False)
    return tmp_path


# ---------------------------------------------------------------- the installed tokenpools-dev


def test_tokenpools_dev_adds_up_down_load_and_the_live_mode() -> None:
    commands = discover(COMMANDS_GROUP, taken=BUILTIN)
    assert commands.problems == ()
    assert sorted(c.name for c in commands.commands) == ["down", "load", "up"]
    assert all(c.available() and c.run.startswith("tokenpools_dev.") for c in commands.commands)
    modes = experiment_modes()
    assert [m.name for m in modes] == ["sim", "live"]
    assert modes[1].run == "tokenpools_dev.live.cli:experiment_live" and modes[1].available()


def test_the_experiment_parser_offers_live_and_its_options_when_tokenpools_dev_is_installed() -> None:
    parser = argparse.ArgumentParser()
    add_experiment_arguments(parser)
    args = parser.parse_args(["exp1", "--mode", "live", "--time-scale", "0.2", "--proxies", "2", "--out", "x"])
    assert (args.mode, args.time_scale, args.proxies, args.out) == ("live", 0.2, 2, Path("x"))
    assert [m.name for m in args._experiment_modes] == ["sim", "live"]


# ---------------------------------------------------------------- the product alone


def test_without_entry_points_nothing_is_added() -> None:
    assert discover(COMMANDS_GROUP, taken=BUILTIN, entry_points=()) == discover(EXPERIMENT_MODES_GROUP, set(), ())
    assert discover(COMMANDS_GROUP, taken=BUILTIN, entry_points=()).commands == ()


def test_without_tokenpools_dev_the_experiment_offers_only_sim(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="experiment")
    add_experiment_arguments(parser, modes=(SIM,))
    assert parser.parse_args(["exp2"]).mode == "sim"
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["exp1", "--mode", "live"])
    assert exited.value.code == 2
    assert "invalid choice: 'live' (choose from 'sim')" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["exp1", "--time-scale", "0.2"])  # live's options come with live


# ---------------------------------------------------------------- a fake distribution


def test_a_fake_distributions_command_runs_and_its_bad_entry_points_are_reported(
        fake_distribution: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hello", "--who", "tests"]) == 5
    captured = capsys.readouterr()
    assert captured.out.strip() == "hello tests"
    problems = captured.err.splitlines()
    assert problems == [
        f"tokenpools: ignored entry point validate = tp_fake_ext:SHADOW in {COMMANDS_GROUP}: {Skipped.NAME_TAKEN}",
        f"tokenpools: ignored entry point mismatch = tp_fake_ext:OTHER in {COMMANDS_GROUP}: {Skipped.OTHER_NAME}",
        f"tokenpools: ignored entry point string = tp_fake_ext:NOT_A_ROW in {COMMANDS_GROUP}: {Skipped.NOT_A_COMMAND}",
        f"tokenpools: ignored entry point broken = tp_no_such_module:ROW in {COMMANDS_GROUP}: {Skipped.NOT_LOADED} "
        "(ModuleNotFoundError: No module named 'tp_no_such_module')",
    ]


def test_a_fake_distribution_cannot_replace_a_product_command(fake_distribution: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "-q", str(Path(__file__).resolve().parents[2] / "examples" / "exp1.yaml")]) == 0
    assert capsys.readouterr().out.strip().endswith("valid (1 pool, 3 entitlements)")


def test_a_fake_distributions_experiment_mode_is_offered_and_run(fake_distribution: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    modes = [m.name for m in experiment_modes()]
    assert modes[0] == "sim" and "echo" in modes and modes.count("sim") == 1  # its `sim` does not replace ours
    assert main(["experiment", "exp2", "--mode", "echo", "--loud"]) == 7
    captured = capsys.readouterr()
    assert captured.out.strip() == "EXP2"
    assert f"ignored entry point sim = tp_fake_ext:SIM in {EXPERIMENT_MODES_GROUP}: {Skipped.NAME_TAKEN}" in captured.err


def test_entry_points_given_directly_are_judged_the_same_way(fake_distribution: Path) -> None:
    found = discover(COMMANDS_GROUP, taken=BUILTIN, entry_points=[
        EntryPoint("hello", "tp_fake_ext:HELLO", COMMANDS_GROUP),
        EntryPoint("hello", "tp_fake_ext:HELLO", COMMANDS_GROUP),  # the second of one name is refused
    ])
    assert [c.name for c in found.commands] == ["hello"]
    assert found.problems == (f"ignored entry point hello = tp_fake_ext:HELLO in {COMMANDS_GROUP}: {Skipped.NAME_TAKEN}",)


# ---------------------------------------------------------------- the decision


@pytest.mark.parametrize(("name", "loaded", "expected"), [
    ("up", Command("up", "m:f", "h"), None),
    ("up", Command("up", "m:f", "h"), Skipped.NAME_TAKEN),
    ("up", Command("down", "m:f", "h"), Skipped.OTHER_NAME),
    ("up", "m:f", Skipped.NOT_A_COMMAND),
    ("up", ImportError("gone"), Skipped.NOT_LOADED),
])
def test_judge(name: str, loaded: object, expected: Skipped | None) -> None:
    taken = {"validate"} | ({"up"} if expected is Skipped.NAME_TAKEN else set())
    assert judge(name, loaded, taken) is expected


def test_help_marks_the_commands_a_distribution_adds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for name in ("up", "down", "load"):
        assert f"{name} [tokenpools-dev] " in out
    assert "validate check config files" in out  # the product's own: unmarked
    assert "Commands marked [tokenpools-dev] are added by the installed distribution tokenpools-dev" in out
