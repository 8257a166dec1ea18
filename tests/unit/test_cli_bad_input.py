"""Every ``tokenpools`` command answers bad input in one line: exit 2, one non-empty line on stderr, no traceback.

The table below holds each command's bad inputs (issue 31's lists and more). A command registered in the CLI,
built in or added by an installed distribution (tokenpools-dev's ``up``, ``down``, ``load``), must have at least
one row: ``test_every_command_is_in_the_table`` fails for a new command until it joins.

Cases run in-process through ``tokenpools.cli.main`` unless they need what only a separate process shows (a
library's log line on stderr, e.g. aiokafka's when a broker does not answer): those run ``python -m tokenpools``.
An unreachable Kafka is ``127.0.0.1:1``, refused at once without any service. Where a case must fail before any
work, its row says what must not exist afterwards (``absent``).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tokenpools.cli import installed_commands, main

ROOT = Path(__file__).resolve().parents[2]
EXP1 = str(ROOT / "examples" / "exp1.yaml")
EXP2 = str(ROOT / "examples" / "exp2.yaml")
SPACE = str(ROOT / "examples" / "tune-exp1.yaml")
NO_KAFKA = "kafka.bootstrap_servers=127.0.0.1:1"


@dataclass(frozen=True)
class Case:
    """``argv`` may hold ``{log}``, ``{tmp}``, ``{file}`` (a regular file), ``{logs}`` (a folder holding a log but
    not one) and ``{partial}`` (Exp 1's config without guaranteed-c)."""

    id: str
    argv: tuple[str, ...]
    says: str  # a piece of the one line that names the problem
    env: dict[str, str] = field(default_factory=dict)
    stdin: str = ""
    subprocess: bool = False
    absent: str | None = None  # a path under {tmp} that the command must not have created


def case(id: str, *argv: str, says: str, **kwargs: object) -> Case:
    return Case(id, argv, says, **kwargs)  # type: ignore[arg-type]


CASES: tuple[Case, ...] = (
    # validate
    case("validate-missing-file", "validate", "{tmp}/nope.yaml", says="nope.yaml"),
    case("validate-bad-now", "validate", EXP1, "--now", "yesterday", says="--now"),
    case("validate-env-misspelt-group", "validate", "-q", EXP1, env={"TOKENPOOLS_POLCY__ALPHA_DEBT": "2"},
         says="TOKENPOOLS_POLCY__ALPHA_DEBT"),
    case("validate-unknown-option", "validate", EXP1, "--nosuch", says="--nosuch"),
    case("validate-a-directory", "validate", "{tmp}", says="Is a directory"),
    case("validate-replay-key", "validate", "-q", EXP1, "--set", "replay.backend=nosuch",
         says="--set: replay.backend"),
    # demo
    case("demo-out-under-a-file", "demo", "--out", "{file}/x", says="{file}"),
    case("demo-unknown-group", "demo", "--out", "{tmp}/demo", "--set", "nosuch.x=1", says="nosuch",
         absent="demo"),
    case("demo-bad-load-number", "demo", "--out", "{tmp}/demo", "--set", "load.factor=x", says="--set: load.factor",
         absent="demo"),
    case("demo-bad-backend", "demo", "--out", "{tmp}/demo", "--set", "replay.backend=nosuch",
         says="--set: replay.backend", absent="demo"),
    # hash-key
    case("hash-key-no-key", "hash-key", stdin="\n", says="no key"),
    case("hash-key-set", "hash-key", "--set", "nosuch.x=1", stdin="k\n", says="--set"),
    # proxy
    case("proxy-missing-config", "proxy", "--config", "{tmp}/nope.yaml", says="nope.yaml"),
    case("proxy-no-config", "proxy", says="--config"),
    case("proxy-unknown-group", "proxy", "--config", EXP1, "--set", "nosuch.x=1", says="nosuch"),
    case("proxy-bad-port", "proxy", "--config", EXP1, "--set", "proxy.port=abc", says="proxy.port"),
    # agents
    case("agents-negative-batch-max", "agents", "--config", EXP1, "--batch-max", "-1", "--set", NO_KAFKA,
         says="--batch-max"),
    case("agents-missing-config", "agents", "--config", "{tmp}/nope.yaml", says="nope.yaml"),
    # controller
    case("controller-negative-interval", "controller", "--config", EXP1, "--no-kubernetes",
         "--metrics-interval-s", "-1", "--set", NO_KAFKA, says="--metrics-interval-s"),
    case("controller-negative-interval-k8s", "controller", "--config", EXP1, "--metrics-interval-s", "-1",
         "--set", NO_KAFKA, says="--metrics-interval-s", subprocess=True),  # no log line before it
    # record
    case("record-kafka-unreachable", "record", "--out", "{tmp}/rec", "--no-progress", "--set", NO_KAFKA,
         says="127.0.0.1:1", subprocess=True, absent="rec"),
    case("record-unknown-topic", "record", "--out", "{tmp}/rec", "--topics", "nosuch", "--set", NO_KAFKA,
         says="nosuch", absent="rec"),
    case("record-negative-batch", "record", "--out", "{tmp}/rec", "--batch-size", "-1", "--set", NO_KAFKA,
         says="--batch-size", absent="rec"),
    case("record-negative-idle-exit", "record", "--out", "{tmp}/rec", "--idle-exit-s", "-2", "--set", NO_KAFKA,
         says="--idle-exit-s", absent="rec"),
    case("record-out-under-a-file", "record", "--out", "{file}/x", "--set", NO_KAFKA, says="{file}"),
    case("record-bad-setting", "record", "--out", "{tmp}/rec", "--set", NO_KAFKA, "--set", "proxy.port=abc",
         says="--set: proxy.port", absent="rec"),
    # replay
    case("replay-zero-capacity", "replay", "{log}", "--config", EXP1, "--capacity-change", "30=0",
         "--out", "{tmp}/r", says="--capacity-change", absent="r"),
    case("replay-bad-capacity", "replay", "{log}", "--config", EXP1, "--capacity-change", "soon",
         "--out", "{tmp}/r", says="--capacity-change", absent="r"),
    case("replay-out-under-a-file", "replay", "{log}", "--config", EXP1, "--out", "{file}/x", says="{file}"),
    case("replay-out-is-a-file", "replay", "{log}", "--config", EXP1, "--out", "{file}", says="{file}"),
    case("replay-other-config", "replay", "{log}", "--config", EXP2, "--out", "{tmp}/r",
         says="guaranteed-a", absent="r"),
    case("replay-config-missing-an-entitlement", "replay", "{log}", "--config", "{partial}", "--out", "{tmp}/r",
         says="guaranteed-c", absent="r"),
    case("replay-missing-log", "replay", "{tmp}/nolog", "--config", EXP1, "--out", "{tmp}/r", says="nolog",
         absent="r"),
    case("replay-sweep-of-a-missing-log", "replay", "{tmp}/nolog", "--config", EXP1, "--sweep", "streams.tick_s=2,5",
         "--out", "{tmp}/r", says="nolog", absent="r"),
    case("replay-unknown-group", "replay", "{log}", "--config", EXP1, "--set", "nosuch.x=1", "--out", "{tmp}/r",
         says="nosuch", absent="r"),
    case("replay-bad-backend", "replay", "{log}", "--config", EXP1, "--set", "replay.backend=nosuch",
         "--out", "{tmp}/r", says="--set: replay.backend: must be 'sim' or 'recorded', got 'nosuch'", absent="r"),
    case("replay-negative-grace", "replay", "{log}", "--config", EXP1, "--set", "replay.grace_s=-1",
         "--out", "{tmp}/r", says="--set: replay.grace_s", absent="r"),
    case("replay-unknown-replay-key", "replay", "{log}", "--config", EXP1, "--set", "replay.nosuch=1",
         "--out", "{tmp}/r", says="--set: replay.nosuch", absent="r"),
    case("replay-load-key", "replay", "{log}", "--config", EXP1, "--set", "load.seed=2", "--out", "{tmp}/r",
         says="--set: load.seed", absent="r"),
    case("replay-swept-backend", "replay", "{log}", "--config", EXP1, "--sweep", "replay.backend=sim,nosuch",
         "--out", "{tmp}/r", says="--sweep: replay.backend", absent="r"),
    case("replay-unknown-policy", "replay", "{log}", "--config", EXP1, "--policy", "nosuch", "--out", "{tmp}/r",
         says="nosuch", absent="r"),
    case("replay-budget-of-no-entitlement", "replay", "{log}", "--config", EXP1, "--budget", "nope=5/day",
         "--out", "{tmp}/r", says="nope", absent="r"),
    case("replay-set-budget-of-no-entitlement", "replay", "{log}", "--config", EXP1, "--set",
         "replay.budget=nope=5/day", "--out", "{tmp}/r", says="nope", absent="r"),
    # tune
    case("tune-bad-space", "tune", "{log}", "--config", EXP1, "--space", "{file}", "--out", "{tmp}/t",
         says="a space file", absent="t"),
    case("tune-zero-trials", "tune", "{log}", "--config", EXP1, "--space", "{file}", "--trials", "0",
         "--out", "{tmp}/t", says="--trials", absent="t"),
    case("tune-bad-backend", "tune", "{log}", "--config", EXP1, "--space", SPACE, "--set", "replay.backend=nosuch",
         "--out", "{tmp}/t", says="--set: replay.backend", absent="t"),
    case("tune-load-key", "tune", "{log}", "--config", EXP1, "--space", SPACE, "--set", "load.seed=2",
         "--out", "{tmp}/t", says="--set: load.seed", absent="t"),
    # experiment
    case("experiment-other-config", "experiment", "exp1", "--config", EXP2, "--out", "{tmp}/e", "--no-progress",
         says="guaranteed-c", absent="e"),
    case("experiment-bad-load-mode", "experiment", "exp1", "--set", "load.mode=sideways", "--out", "{tmp}/e",
         "--no-progress", says="--set: load.mode: must be one of open, closed, got 'sideways'", absent="e"),
    case("experiment-bad-load-number", "experiment", "exp1", "--set", "load.seed=one", "--out", "{tmp}/e",
         "--no-progress", says="--set: load.seed", absent="e"),
    case("experiment-bad-service-time", "experiment", "exp1", "--set", "load.service_s=-1", "--out", "{tmp}/e",
         "--no-progress", says="--set: load.service_s", absent="e"),
    case("experiment-bad-backend", "experiment", "exp1", "--set", "replay.backend=nosuch", "--out", "{tmp}/e",
         "--no-progress", says="--set: replay.backend", absent="e"),
    case("experiment-shadow-of-no-entitlement", "experiment", "exp1", "--set", "replay.shadow=nope", "--out",
         "{tmp}/e", "--no-progress", says="--set: replay.shadow", absent="e"),
    case("experiment-bad-sweep", "experiment", "exp1", "--sweep", "policy.gamma_debt=0.5,7", "--out", "{tmp}/e",
         "--no-progress", says="--sweep", absent="e"),
    case("experiment-out-under-a-file", "experiment", "exp1", "--out", "{file}/x", "--no-progress",
         says="{file}"),
    case("experiment-live-option-in-sim", "experiment", "exp1", "--mode", "sim", "--time-scale", "2",
         "--out", "{tmp}/e", "--no-progress", says="--time-scale", absent="e"),
    case("experiment-unknown-name", "experiment", "exp3", says="exp3"),
    # fleet
    case("fleet-unknown-group", "fleet", "--set", "nosuch.group=1", "--out", "{tmp}/f", says="--set",
         absent="f"),
    case("fleet-out-under-a-file", "fleet", "--out", "{file}/x", says="{file}"),
    case("fleet-no-proxies", "fleet", "--proxies", "0", says="--proxies"),
    case("fleet-unknown-balancer", "fleet", "--lb", "nosuch", says="--lb"),
    # usage
    case("usage-kafka-unreachable", "usage", "--set", NO_KAFKA, "--timeout-s", "3", says="127.0.0.1:1",
         subprocess=True),
    case("usage-csv-in-missing-dir", "usage", "--log", "{log}", "--csv", "{tmp}/nodir/x.csv", says="nodir"),
    case("usage-parquet-in-missing-dir", "usage", "--log", "{log}", "--parquet", "{tmp}/nodir/x.parquet",
         says="nodir"),
    case("usage-unknown-tenant", "usage", "--log", "{log}", "--tenant", "nope", says="nope"),
    case("usage-unknown-entitlement", "usage", "--log", "{log}", "--entitlement", "nope", says="nope"),
    case("usage-inverted-dates", "usage", "--log", "{log}", "--since", "2026-12-01", "--until", "2026-11-01",
         says="--since"),
    case("usage-folder-of-logs", "usage", "--log", "{logs}", says="{logs}"),
    case("usage-missing-log", "usage", "--log", "{tmp}/nolog", says="nolog"),
    case("usage-bad-date", "usage", "--log", "{log}", "--since", "December", says="--since"),
    case("usage-bad-set-with-a-log", "usage", "--log", "{log}", "--set", "budgets.usage_retention_days=abc",
         says="budgets.usage_retention_days"),
    case("usage-stale-bound-within-a-publication", "usage", "--log", "{log}", "--set", "budgets.stale_after_s=0.5",
         says="stale_after_s (0.5) must be greater than publish_interval_s (1)"),
    case("usage-by-year", "usage", "--log", "{log}", "--by", "year", says="--by"),
    # calibrate
    case("calibrate-negative-target", "calibrate", "http://127.0.0.1:1", "--model", "m",
         "--ttft-p99-target-ms", "-1", says="--ttft-p99-target-ms"),
    case("calibrate-not-a-url", "calibrate", "not-a-url", "--model", "m", says="not-a-url"),
    # top
    case("top-kafka-unreachable", "top", "--once", "--set", NO_KAFKA, "--timeout-s", "3", says="127.0.0.1:1",
         subprocess=True),
    case("top-unknown-group", "top", "--once", "--set", "nosuch.x=1", says="nosuch"),
    case("top-zero-refresh", "top", "--refresh-ms", "0", says="--refresh-ms"),
    # the dev package's commands (tokenpools-dev)
    case("up-bad-backend", "up", "--config", EXP1, "--backend", "vlm", "--run-dir", "{tmp}/stack", "--detach",
         says="--backend", absent="stack"),
    case("down-unknown-option", "down", "--nosuch", says="--nosuch"),
    case("load-no-stack", "load", "--experiment", "exp1", "--run-dir", "{tmp}/stack", says="tokenpools up"),
)


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A small Exp 1 log, a folder that holds it, a regular file, and Exp 1's config without guaranteed-c."""
    from tokenpools.replay import experiments, logio
    from tokenpools.replay.replayer import replay

    root = tmp_path_factory.mktemp("bad-input")
    log = root / "logs" / "exp1"
    logio.write_log(replay(experiments.build("exp1", ["load.compress=0.1"]), "token-pools"), log)
    regular = root / "regular-file"
    regular.write_text("not a directory\n", encoding="utf-8")
    documents = Path(EXP1).read_text(encoding="utf-8").split("\n---\n")
    partial = root / "exp1-without-c.yaml"
    partial.write_text("\n---\n".join(d for d in documents if "name: guaranteed-c" not in d), encoding="utf-8")
    return {"log": str(log), "logs": str(log.parent), "file": str(regular), "partial": str(partial)}


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.upper().startswith("TOKENPOOLS_") and "__" in name:
            monkeypatch.delenv(name)


def test_every_command_is_in_the_table() -> None:
    registered = {command.name for command in installed_commands()}
    covered = {c.argv[0] for c in CASES}
    assert registered - covered == set(), "each command needs a row of bad input in CASES"
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("bad", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_exit_2(bad: Case, paths: dict[str, str], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    names = {**paths, "tmp": str(tmp_path)}
    argv = [a.format(**names) for a in bad.argv]
    if bad.subprocess:
        done = subprocess.run([sys.executable, "-m", "tokenpools", *argv], input=bad.stdin, capture_output=True,
                              text=True, timeout=120, cwd=tmp_path, env={**os.environ, **bad.env})
        code, err = done.returncode, done.stderr
    else:
        for name, value in bad.env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(sys, "stdin", io.StringIO(bad.stdin))
        monkeypatch.chdir(tmp_path)
        code = main(argv)
        err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert code == 2, err
    lines = err.removesuffix("\n").split("\n")
    assert len(lines) == 1 and lines[0].strip(), f"not one line:\n{err}"
    assert bad.says.format(**names) in lines[0]
    if bad.absent is not None:
        assert not (tmp_path / bad.absent).exists(), f"{bad.absent} was created before the input was checked"
