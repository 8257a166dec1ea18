"""Every ``tokenpools`` command answers bad input in one line: exit 2, one non-empty line on stderr, no traceback.

The table below holds each command's bad inputs (issue 31's lists and more). Every command ``tokenpools --help``
lists, the product's and those an installed distribution adds (tokenpools-dev's ``up``, ``down``, ``load``), must
have at least one row: ``test_every_command_is_in_the_table`` fails for a new command until it joins. The dev
package's ``experiment --mode live`` has its own rows too.

Each case runs ``tokenpools`` as a user does: a separate process of this venv's console script (so what only a
process shows counts as well: a library's log line, a warning printed at import, the exit code of the interpreter),
in a fresh working directory, with no ``TOKENPOOLS_*__*`` variable but the case's own, stdin from the row, and a
timeout. The cases run in parallel, once per module, and each is then reported as its own test. An unreachable
Kafka is ``127.0.0.1:1``, refused at once without any service. Where a case must fail before any work, its row says
what must not exist afterwards (``absent``). A case that timed out is a failure, and a stack it may have started is
stopped with ``tokenpools down``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytestmark = pytest.mark.component

ROOT = Path(__file__).resolve().parents[2]
TOKENPOOLS = str(Path(sys.executable).with_name("tokenpools"))  # the venv's console script
EXP1 = str(ROOT / "examples" / "exp1.yaml")
EXP2 = str(ROOT / "examples" / "exp2.yaml")
SPACE = str(ROOT / "examples" / "tune-exp1.yaml")
NO_KAFKA = "kafka.bootstrap_servers=127.0.0.1:1"
TIMEOUT_S = 90.0  # one case; they take 1-10 s each on an idle core
WORKERS = 4


@dataclass(frozen=True)
class Case:
    """``argv`` may hold ``{log}``, ``{tmp}`` (the case's own working directory), ``{file}`` (a regular file),
    ``{logs}`` (a folder holding a log but not one), ``{partial}`` (Exp 1's config without guaranteed-c),
    ``{badyaml}`` (a file that is not YAML) and ``{settingsonly}`` (a TokenPoolsSettings document alone)."""

    id: str
    argv: tuple[str, ...]
    says: str  # a piece of the one line that names the problem
    env: dict[str, str] = field(default_factory=dict)
    stdin: str = ""
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
    case("validate-settings-only", "validate", "{settingsonly}",
         says="settings.yaml: no TokenPool document: a file of settings only serves nothing"),
    case("validate-replay-key", "validate", "-q", EXP1, "--set", "replay.backend=nosuch",
         says="--set: replay.backend"),
    case("validate-bad-yaml", "validate", "{badyaml}", says="invalid YAML"),
    case("validate-env-misspelt-field", "validate", "-q", EXP1, env={"TOKENPOOLS_POLICY__ALPHA_DEBTT": "2"},
         says="alpha_debtt"),
    # demo
    case("demo-out-under-a-file", "demo", "--out", "{file}/x", says="{file}"),
    case("demo-unknown-group", "demo", "--out", "{tmp}/demo", "--set", "nosuch.x=1", says="nosuch",
         absent="demo"),
    case("demo-bad-load-number", "demo", "--out", "{tmp}/demo", "--set", "load.factor=x", says="--set: load.factor",
         absent="demo"),
    case("demo-bad-backend", "demo", "--out", "{tmp}/demo", "--set", "replay.backend=nosuch",
         says="--set: replay.backend", absent="demo"),
    case("demo-out-of-range", "demo", "--out", "{tmp}/demo", "--set", "policy.gamma_debt=7",
         says="--set: policy.gamma_debt", absent="demo"),
    # hash-key
    case("hash-key-no-key", "hash-key", stdin="\n", says="no key"),
    case("hash-key-set", "hash-key", "--set", "nosuch.x=1", stdin="k\n", says="--set"),
    # proxy
    case("proxy-missing-config", "proxy", "--config", "{tmp}/nope.yaml", says="nope.yaml"),
    case("proxy-no-config", "proxy", says="--config"),
    case("proxy-unknown-group", "proxy", "--config", EXP1, "--set", "nosuch.x=1", says="nosuch"),
    case("proxy-bad-port", "proxy", "--config", EXP1, "--set", "proxy.port=abc", says="proxy.port"),
    case("proxy-bad-yaml", "proxy", "--config", "{badyaml}", says="invalid YAML"),
    # settings only: the specs topic could bring pools, but with Kafka off nothing follows it
    case("proxy-settings-only-no-kafka", "proxy", "--config", "{settingsonly}", "--no-kafka",
         says="settings.yaml: no TokenPool document, and with Kafka off nothing else can bring one"),
    case("proxy-settings-only-kafka-off", "proxy", "--config", "{settingsonly}", "--set", "proxy.kafka_enabled=false",
         says="with Kafka off nothing else can bring one"),
    # agents
    case("agents-negative-batch-max", "agents", "--config", EXP1, "--batch-max", "-1", "--set", NO_KAFKA,
         says="--batch-max"),
    case("agents-missing-config", "agents", "--config", "{tmp}/nope.yaml", says="nope.yaml"),
    case("agents-bad-yaml", "agents", "--config", "{badyaml}", says="invalid YAML"),
    # controller
    case("controller-negative-interval", "controller", "--config", EXP1, "--no-kubernetes",
         "--metrics-interval-s", "-1", "--set", NO_KAFKA, says="--metrics-interval-s"),
    case("controller-negative-interval-k8s", "controller", "--config", EXP1, "--metrics-interval-s", "-1",
         "--set", NO_KAFKA, says="--metrics-interval-s"),  # no log line before it
    # record
    case("record-kafka-unreachable", "record", "--out", "{tmp}/rec", "--no-progress", "--set", NO_KAFKA,
         says="127.0.0.1:1", absent="rec"),
    case("controller-missing-config", "controller", "--config", "{tmp}/nope.yaml", "--no-kubernetes",
         says="nope.yaml: cannot read: No such file or directory"),
    case("controller-bad-yaml", "controller", "--config", "{badyaml}", says="invalid YAML"),
    case("controller-unknown-group", "controller", "--config", EXP1, "--set", "nosuch.x=1", says="nosuch"),
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
    case("replay-capacity-change-after-the-log", "replay", "{log}", "--config", EXP1, "--capacity-change", "99999=8",
         "--out", "{tmp}/r", says="--capacity-change at 99999 s: the log's load ends", absent="r"),
    case("replay-capacity-change-twice", "replay", "{log}", "--config", EXP1, "--capacity-change", "3=8",
         "--capacity-change", "3=12", "--out", "{tmp}/r", says="--capacity-change names T=3 twice", absent="r"),
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
    case("replay-sweep-of-a-policy-that-decides-nothing", "replay", "{log}", "--config", EXP1, "--policy", "none",
         "--sweep", "policy.alpha_debt=1,4", "--out", "{tmp}/r", says="--policy none decides nothing", absent="r"),
    case("replay-setting-of-a-policy-that-decides-nothing", "replay", "{log}", "--config", EXP1, "--policy", "none",
         "--set", "policy.alpha_debt=2", "--out", "{tmp}/r", says="--set policy.alpha_debt: --policy none decides "
         "nothing", absent="r"),
    case("replay-folder-of-logs", "replay", "{logs}", "--config", EXP1, "--out", "{tmp}/r",
         says="{logs}: not a log directory, but it holds the logs exp1", absent="r"),
    case("replay-sweep-of-a-folder-of-logs", "replay", "{logs}", "--config", EXP1, "--sweep", "policy.alpha_debt=1,2",
         "--out", "{tmp}/r", says="holds the logs exp1", absent="r"),
    case("replay-unknown-policy", "replay", "{log}", "--config", EXP1, "--policy", "nosuch", "--out", "{tmp}/r",
         says="nosuch", absent="r"),
    case("replay-budget-of-no-entitlement", "replay", "{log}", "--config", EXP1, "--budget", "nope=5/day",
         "--out", "{tmp}/r", says="nope", absent="r"),
    case("replay-set-budget-of-no-entitlement", "replay", "{log}", "--config", EXP1, "--set",
         "replay.budget=nope=5/day", "--out", "{tmp}/r", says="nope", absent="r"),
    # tune
    case("tune-folder-of-logs", "tune", "{logs}", "--config", EXP1, "--space", SPACE, "--out", "{tmp}/t",
         says="holds the logs exp1", absent="t"),
    case("tune-bad-space", "tune", "{log}", "--config", EXP1, "--space", "{file}", "--out", "{tmp}/t",
         says="a space file", absent="t"),
    case("tune-zero-trials", "tune", "{log}", "--config", EXP1, "--space", "{file}", "--trials", "0",
         "--out", "{tmp}/t", says="--trials", absent="t"),
    case("tune-bad-backend", "tune", "{log}", "--config", EXP1, "--space", SPACE, "--set", "replay.backend=nosuch",
         "--out", "{tmp}/t", says="--set: replay.backend", absent="t"),
    case("tune-load-key", "tune", "{log}", "--config", EXP1, "--space", SPACE, "--set", "load.seed=2",
         "--out", "{tmp}/t", says="--set: load.seed", absent="t"),
    case("tune-other-config", "tune", "{log}", "--config", EXP2, "--space", SPACE, "--out", "{tmp}/t",
         says="guaranteed-a", absent="t"),
    case("tune-capacity-change-after-the-log", "tune", "{log}", "--config", EXP1, "--space", SPACE,
         "--capacity-change", "99999=8", "--out", "{tmp}/t", says="--capacity-change at 99999 s", absent="t"),
    case("tune-out-under-a-file", "tune", "{log}", "--config", EXP1, "--space", SPACE, "--out", "{file}/x",
         says="{file}"),
    # experiment
    case("experiment-other-config", "experiment", "exp1", "--config", EXP2, "--out", "{tmp}/e", "--no-progress",
         says="guaranteed-c", absent="e"),
    case("experiment-bad-load-mode", "experiment", "exp1", "--set", "load.mode=sideways", "--out", "{tmp}/e",
         "--no-progress", says="--set: load.mode: must be one of open, closed, got 'sideways'", absent="e"),
    case("experiment-bad-load-number", "experiment", "exp1", "--set", "load.seed=one", "--out", "{tmp}/e",
         "--no-progress", says="--set: load.seed", absent="e"),
    case("experiment-bad-service-time", "experiment", "exp1", "--set", "load.service_s=-1", "--out", "{tmp}/e",
         "--no-progress", says="--set: load.service_s", absent="e"),
    case("experiment-zero-compress", "experiment", "exp1", "--set", "load.compress=0", "--out", "{tmp}/e",
         "--no-progress", says="--set: load.compress: must be a number > 0", absent="e"),
    case("experiment-zero-load", "experiment", "exp1", "--set", "load.factor=0", "--out", "{tmp}/e",
         "--no-progress", says="--set: load.factor: must be a number > 0", absent="e"),
    case("experiment-negative-retries", "experiment", "exp1", "--set", "load.max_retries=-1", "--out", "{tmp}/e",
         "--no-progress", says="--set: load.max_retries", absent="e"),
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
    case("experiment-proxies-in-sim", "experiment", "exp1", "--proxies", "3", "--out", "{tmp}/e",
         "--no-progress", says="--proxies does not apply to --mode sim", absent="e"),
    case("experiment-env-misspelt-group", "experiment", "exp1", "--out", "{tmp}/e", "--no-progress",
         env={"TOKENPOOLS_POLCY__ALPHA_DEBT": "1"}, says="TOKENPOOLS_POLCY__ALPHA_DEBT", absent="e"),
    case("experiment-sweep-of-an-unknown-group", "experiment", "exp1", "--sweep", "nosuch.x=1,2", "--out",
         "{tmp}/e", "--no-progress", says="--sweep: nosuch.x", absent="e"),
    case("experiment-load-option-of-the-other-experiment", "experiment", "exp2", "--set", "load.c_always=1",
         "--out", "{tmp}/e", "--no-progress", says="--set: load.c_always: only exp1 reads it", absent="e"),
    case("experiment-swept-load-option-of-the-other-experiment", "experiment", "exp2", "--sweep",
         "load.c_always=0,1", "--out", "{tmp}/e", "--no-progress", says="--sweep: load.c_always", absent="e"),
    case("experiment-unknown-name", "experiment", "exp3", says="exp3"),
    # experiment --mode live (tokenpools-dev): refused before a stack starts
    case("live-zero-time-scale", "experiment", "exp1", "--mode", "live", "--time-scale", "0", "--out", "{tmp}/e",
         "--no-progress", says="--time-scale", absent="e"),
    case("live-time-scale-above-10", "experiment", "exp1", "--mode", "live", "--time-scale", "11",
         "--out", "{tmp}/e", "--no-progress", says="time_scale", absent="e"),
    case("live-no-proxies", "experiment", "exp1", "--mode", "live", "--proxies", "0", "--out", "{tmp}/e",
         "--no-progress", says="--proxies", absent="e"),
    case("live-sweep", "experiment", "exp1", "--mode", "live", "--sweep", "policy.gamma_debt=0.5,0.7",
         "--out", "{tmp}/e", "--no-progress", says="--sweep does not apply to --mode live", absent="e"),
    case("live-out-under-a-file", "experiment", "exp1", "--mode", "live", "--out", "{file}/x", "--no-progress",
         says="{file}"),
    case("live-other-config", "experiment", "exp1", "--mode", "live", "--config", EXP2, "--out", "{tmp}/e",
         "--no-progress", says="guaranteed-c", absent="e"),
    case("live-unknown-backend", "experiment", "exp1", "--mode", "live", "--backend", "nosuch", "--out", "{tmp}/e",
         "--no-progress", says="--backend", absent="e"),
    case("live-vllm-exp2", "experiment", "exp2", "--mode", "live", "--backend", "vllm", "--out", "{tmp}/e",
         "--no-progress", says="--backend vllm runs exp1 only", absent="e"),
    case("live-max-slots-without-vllm", "experiment", "exp1", "--mode", "live", "--max-slots", "4",
         "--out", "{tmp}/e", "--no-progress", says="--max-slots", absent="e"),
    case("live-unknown-group", "experiment", "exp1", "--mode", "live", "--set", "nosuch.x=1", "--out", "{tmp}/e",
         "--no-progress", says="nosuch", absent="e"),
    case("live-env-misspelt-group", "experiment", "exp1", "--mode", "live", "--out", "{tmp}/e", "--no-progress",
         env={"TOKENPOOLS_POLCY__ALPHA_DEBT": "1"}, says="TOKENPOOLS_POLCY__ALPHA_DEBT", absent="e"),
    # fleet
    case("fleet-unknown-group", "fleet", "--set", "nosuch.group=1", "--out", "{tmp}/f", says="--set",
         absent="f"),
    case("fleet-out-under-a-file", "fleet", "--out", "{file}/x", says="{file}"),
    case("fleet-no-proxies", "fleet", "--proxies", "0", says="--proxies"),
    case("fleet-unknown-balancer", "fleet", "--lb", "nosuch", says="--lb"),
    # usage
    case("usage-kafka-unreachable", "usage", "--set", NO_KAFKA, "--timeout-s", "3", says="127.0.0.1:1"),
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
    case("top-kafka-unreachable", "top", "--once", "--set", NO_KAFKA, "--timeout-s", "3", says="127.0.0.1:1"),
    case("top-unknown-group", "top", "--once", "--set", "nosuch.x=1", says="nosuch"),
    case("top-zero-refresh", "top", "--refresh-ms", "0", says="--refresh-ms"),
    # the dev package's commands (tokenpools-dev)
    case("up-bad-backend", "up", "--config", EXP1, "--backend", "vlm", "--run-dir", "{tmp}/stack", "--detach",
         says="--backend", absent="stack"),
    case("down-unknown-option", "down", "--nosuch", says="--nosuch"),
    case("up-split-of-no-pool", "up", "--config", EXP1, "--split", "nope=2", "--run-dir", "{tmp}/stack", "--detach",
         says="--split names pools the config lacks: nope", absent="stack"),
    case("up-split-uneven", "up", "--config", EXP1, "--split", "qwen3-8b=3", "--run-dir", "{tmp}/stack",
         "--detach", says="cannot split into 3", absent="stack"),
    case("up-negative-ready-timeout", "up", "--config", EXP1, "--ready-timeout-s", "-1", "--run-dir", "{tmp}/stack",
         "--detach", says="--ready-timeout-s", absent="stack"),
    case("up-no-agents-workers", "up", "--config", EXP1, "--agents-workers", "0", "--run-dir", "{tmp}/stack",
         "--detach", says="agents_workers", absent="stack"),
    case("up-zero-time-scale", "up", "--config", EXP1, "--time-scale", "0", "--run-dir", "{tmp}/stack", "--detach",
         says="time_scale", absent="stack"),
    case("up-missing-config", "up", "--config", "{tmp}/nope.yaml", "--run-dir", "{tmp}/stack", "--detach",
         says="nope.yaml", absent="stack"),
    case("up-run-dir-under-a-file", "up", "--config", EXP1, "--run-dir", "{file}/x", "--detach", says="{file}"),
    case("up-unknown-group", "up", "--config", EXP1, "--set", "nosuch.x=1", "--run-dir", "{tmp}/stack", "--detach",
         says="nosuch", absent="stack"),
    case("down-run-dir-a-file", "down", "--run-dir", "{file}", says="not a directory"),
    case("down-zero-timeout", "down", "--timeout-s", "0", "--run-dir", "{tmp}/stack", says="--timeout-s"),
    case("load-no-load-given", "load", "--run-dir", "{tmp}/stack", says="--experiment"),
    case("load-target-refused", "load", "--experiment", "exp1", "--target", "http://127.0.0.1:1",
         says="--target http://127.0.0.1:1: nothing answers"),
    case("load-target-not-a-url", "load", "--experiment", "exp1", "--target", "ftp://x", says="--target"),
    case("load-negative-closed", "load", "--config", EXP1, "--closed", "-1", "--target", "http://127.0.0.1:1",
         says="--closed"),
    case("load-no-stack", "load", "--experiment", "exp1", "--run-dir", "{tmp}/stack", says="tokenpools up"),
)



@dataclass(frozen=True)
class Ran:
    code: int | None  # None: timed out
    stderr: str
    tmp: Path
    names: dict[str, str]


def help_commands() -> set[str]:
    """The commands ``tokenpools --help`` lists (argparse's subcommand list: four spaces, then the name)."""
    done = subprocess.run([TOKENPOOLS, "--help"], capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=_environment({}))
    assert done.returncode == 0, done.stderr
    listing = done.stdout.split("COMMAND\n", 1)[1].split("\n\n", 1)[0]
    return {m.group(1) for m in re.finditer(r"^ {4}(\S+)", listing, re.MULTILINE)}


def _environment(extra: dict[str, str]) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not (k.upper().startswith("TOKENPOOLS_") and "__" in k)}
    return {**clean, "COLUMNS": "120", **extra}


def _run(bad: Case, paths: dict[str, str], root: Path) -> Ran:
    tmp = Path(tempfile.mkdtemp(prefix=f"{bad.id}-", dir=root))
    names = {**paths, "tmp": str(tmp)}
    argv = [a.format(**names) for a in bad.argv]
    try:
        done = subprocess.run([TOKENPOOLS, *argv], input=bad.stdin, capture_output=True, text=True,
                              timeout=TIMEOUT_S, cwd=tmp, env=_environment(bad.env))
    except subprocess.TimeoutExpired as exc:
        _stop_stacks(tmp)
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return Ran(None, err, tmp, names)
    return Ran(done.returncode, done.stderr, tmp, names)


def _stop_stacks(tmp: Path) -> None:
    """What a command that should have refused its input started anyway (a local stack) is stopped."""
    for state in tmp.rglob("stack.json"):
        subprocess.run([TOKENPOOLS, "down", "--run-dir", str(state.parent)], capture_output=True, timeout=120,
                       env=_environment({}))


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A small Exp 1 log, a folder that holds it, a regular file, Exp 1's config without guaranteed-c, a file
    that is not YAML, and a config of settings only."""
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
    badyaml = root / "bad.yaml"
    badyaml.write_text("kind: [TokenPool\n", encoding="utf-8")
    settingsonly = root / "settings.yaml"
    settingsonly.write_text("apiVersion: tokenpools.io/v1alpha1\nkind: TokenPoolsSettings\nmetadata: {name: s}\n"
                            "spec: {}\n", encoding="utf-8")
    return {"log": str(log), "logs": str(log.parent), "file": str(regular), "partial": str(partial),
            "badyaml": str(badyaml), "settingsonly": str(settingsonly)}


@pytest.fixture(scope="module")
def ran(paths: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Ran]]:
    """Every case, run in parallel once (the slowest first, so that the pool ends together)."""
    root = tmp_path_factory.mktemp("cases")
    slow_first = sorted(CASES, key=lambda c: c.argv[0] not in {"experiment", "tune", "demo", "replay", "up"})
    with ThreadPoolExecutor(WORKERS) as pool:
        results = dict(zip((c.id for c in slow_first), pool.map(lambda c: _run(c, paths, root), slow_first)))
    yield results


def test_every_command_is_in_the_table() -> None:
    listed = help_commands()
    assert {"validate", "replay", "usage", "record", "fleet", "up", "down", "load"} <= listed, listed
    covered = {c.argv[0] for c in CASES}
    assert listed - covered == set(), "each command of `tokenpools --help` needs a row of bad input in CASES"
    assert any(c.argv[:1] == ("experiment",) and "live" in c.argv for c in CASES)
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("bad", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_exit_2(bad: Case, ran: dict[str, Ran]) -> None:
    result = ran[bad.id]
    err = result.stderr
    assert result.code is not None, f"no answer within {TIMEOUT_S:g} s:\n{err}"
    assert "Traceback" not in err, err
    assert result.code == 2, err
    lines = err.removesuffix("\n").split("\n")
    assert len(lines) == 1 and lines[0].strip(), f"not one line:\n{err}"
    assert bad.says.format(**result.names) in lines[0]
    if bad.absent is not None:
        assert not (result.tmp / bad.absent).exists(), f"{bad.absent} was created before the input was checked"
