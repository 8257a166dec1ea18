"""``tokenpools usage`` and ``tokenpools record`` answer bad input in one line, as a user's shell sees them: each
case runs ``python -m tokenpools`` in its own process (the library log lines a broker that does not answer makes
are on its stderr too), and must exit 2 with one non-empty line on stderr naming the problem, and no traceback.

No service is needed: an unreachable Kafka is ``127.0.0.1:1``, refused at once. The log is a small synthetic one
(two entitlements' completion events, and the spec rows that name their tenants and model), under a folder that is
therefore not a log itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AUTOSCALE = str(ROOT / "examples" / "autoscale.yaml")  # elastic-team has two budgets that price differently
NO_KAFKA = "kafka.bootstrap_servers=127.0.0.1:1"


@dataclass(frozen=True)
class Case:
    """``argv`` may hold ``{log}``, ``{logs}`` (the folder holding it), ``{file}`` (a regular file), ``{tmp}``."""

    id: str
    argv: tuple[str, ...]
    says: str  # a piece of the one line


def case(id: str, *argv: str, says: str) -> Case:
    return Case(id, argv, says)


CASES: tuple[Case, ...] = (
    # usage: the environment
    case("usage-kafka-unreachable", "usage", "--set", NO_KAFKA, "--timeout-s", "3", says="127.0.0.1:1"),
    case("usage-reconcile-topic-unreachable", "usage", "{log}", "--reconcile", "--ledger", "topic", "--set", NO_KAFKA,
         says="127.0.0.1:1"),
    case("usage-csv-in-missing-dir", "usage", "--log", "{log}", "--csv", "/nonexistent-dir/x.csv",
         says="/nonexistent-dir"),
    case("usage-parquet-in-missing-dir", "usage", "{log}", "--parquet", "/nonexistent-dir/x.parquet",
         says="/nonexistent-dir"),
    case("usage-csv-under-a-file", "usage", "{log}", "--csv", "{file}/x.csv", says="{file}"),
    # usage: answers that would be wrong
    case("usage-unknown-tenant", "usage", "--log", "{log}", "--tenant", "nope", says="it has: acme, beta"),
    case("usage-unknown-entitlement", "usage", "{log}", "--entitlement", "nope", says="it has: e-a, e-b"),
    case("usage-inverted-dates", "usage", "{log}", "--since", "2026-12-01", "--until", "2026-11-01",
         says="--since 2026-12-01 is not before --until 2026-11-01"),
    case("usage-equal-dates", "usage", "{log}", "--since", "2026-12", "--until", "2026-12-01", says="--until"),
    case("usage-folder-of-logs", "usage", "--log", "{logs}", says="holds the logs log"),
    case("usage-folder-of-logs-positional", "usage", "{logs}", says="holds the logs log"),
    case("usage-missing-log", "usage", "{tmp}/nolog", says="nolog"),
    case("usage-two-logs", "usage", "{log}", "--log", "{logs}", says="two logs named"),
    # usage: time zones and prices
    case("usage-unknown-zone", "usage", "{log}", "--tz", "Mars/Olympus", says="--tz: unknown time zone 'Mars/Olympus'"),
    case("usage-zone-on-the-topic", "usage", "--tz", "Europe/Berlin", "--set", NO_KAFKA, says="needs a LOG"),
    case("usage-zone-with-reconcile", "usage", "{log}", "--reconcile", "--tz", "Europe/Berlin", says="--reconcile"),
    case("usage-config-with-reconcile", "usage", "{log}", "--reconcile", "--config", AUTOSCALE, "--budget", "monthly",
         says="--config applies to the table"),
    case("usage-tz-budget-without-config", "usage", "{log}", "--tz", "budget", says="--tz budget needs --config"),
    case("usage-tz-budget-two-zones", "usage", "{log}", "--tz", "budget", "--config", AUTOSCALE,
         says="--tz budget: the budgets are in more than one time zone (daily UTC, monthly Europe/Berlin)"),
    case("usage-budget-without-config", "usage", "{log}", "--budget", "monthly", says="--budget needs --config"),
    case("usage-missing-config", "usage", "{log}", "--config", "{tmp}/nope.yaml", says="nope.yaml"),
    case("usage-unknown-budget", "usage", "{log}", "--config", AUTOSCALE, "--budget", "weekly",
         says="no entitlement has a budget named 'weekly' (the budgets: daily, monthly)"),
    case("usage-budgets-price-differently", "usage", "{log}", "--config", AUTOSCALE,
         says="elastic-team's budgets price tokens differently"),
    case("usage-by-year", "usage", "{log}", "--by", "year", says="--by"),
    case("usage-zero-timeout", "usage", "--timeout-s", "0", "--set", NO_KAFKA, says="--timeout-s"),
    # record
    case("record-kafka-unreachable", "record", "--out", "{tmp}/rec", "--no-progress", "--set", NO_KAFKA,
         says="127.0.0.1:1"),
    case("record-unknown-topic", "record", "--out", "{tmp}/rec", "--topics", "nosuch", "--set", NO_KAFKA,
         says="nosuch"),
    case("record-one-unknown-topic-of-two", "record", "--out", "{tmp}/rec", "--topics", "requests,complet",
         "--set", NO_KAFKA, says="complet"),
    case("record-negative-batch", "record", "--out", "{tmp}/rec", "--batch-size", "-1", "--set", NO_KAFKA,
         says="--batch-size"),
    case("record-zero-batch", "record", "--out", "{tmp}/rec", "--batch-size", "0", "--set", NO_KAFKA,
         says="--batch-size"),
    case("record-negative-idle-exit", "record", "--out", "{tmp}/rec", "--idle-exit-s", "-2", "--set", NO_KAFKA,
         says="--idle-exit-s"),
    case("record-nan-idle-exit", "record", "--out", "{tmp}/rec", "--idle-exit-s", "nan", "--set", NO_KAFKA,
         says="--idle-exit-s"),
    case("record-out-under-a-file", "record", "--out", "{file}/x", "--set", NO_KAFKA, says="{file}"),
    case("record-no-out", "record", "--set", NO_KAFKA, says="--out"),
)


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from tokenpools.replay import trace
    from tokenpools_dev import builders

    root = tmp_path_factory.mktemp("usage-record-bad-input")
    log = root / "logs" / "log"
    rows = [trace.record_row(builders.completed(
        f"r{i}", 1_795_000_000_000 + i * 60_000, pool="p1", entitlement=ent, proxy_id="px",
        admitted_t_ms=1_795_000_000_000, prompt_tokens=100, completion_tokens=10, cached_prompt_tokens=0,
        reserved_tokens=164, kv_bytes=1024, ttft_s=0.1, e2e_s=0.5), 0, i)
        for i, ent in enumerate(["e-a", "e-b", "e-a"])]
    trace.write_partitioned(log, trace.COMPLETIONS, trace.frame(trace.COMPLETIONS, rows), 0, -1)
    specs = [trace.record_row(builders.spec_record("TokenEntitlement", ent, {"tenantId": tenant}, pool="p1", state="Bound",
                                                   t_ms=1_795_000_000_000), 0, i)
             for i, (ent, tenant) in enumerate([("e-a", "acme"), ("e-b", "beta")])]
    specs.append(trace.record_row(builders.spec_record("TokenPool", "p1", {"model": "org/m-8b"}, t_ms=1_795_000_000_000), 0, 2))
    trace.write_partitioned(log, "spec", trace.frame("spec", specs), 0, -1)
    regular = root / "regular-file"
    regular.write_text("not a directory\n", encoding="utf-8")
    return {"log": str(log), "logs": str(log.parent), "file": str(regular)}


def test_the_log_is_good_input(paths: dict[str, str], tmp_path: Path) -> None:
    """The cases' log is read without error: each case fails for its own bad input, not for the log."""
    done = _run(["usage", paths["log"], "--by", "month"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "acme" in done.stdout and "beta" in done.stdout and "org/m-8b" in done.stdout and not done.stderr


@pytest.mark.parametrize("bad", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_exit_2(bad: Case, paths: dict[str, str], tmp_path: Path) -> None:
    names = {**paths, "tmp": str(tmp_path)}
    done = _run([a.format(**names) for a in bad.argv], tmp_path)
    err = done.stderr
    assert "Traceback" not in err, err
    assert done.returncode == 2, err
    lines = err.removesuffix("\n").split("\n")
    assert len(lines) == 1 and lines[0].strip(), f"not one line:\n{err}"
    assert bad.says.format(**names) in lines[0], lines[0]
    assert not (tmp_path / "rec").exists(), "record made its --out before the input was checked"


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not (k.upper().startswith("TOKENPOOLS_") and "__" in k)}
    return subprocess.run([sys.executable, "-m", "tokenpools", *argv], capture_output=True, text=True, timeout=120,
                          cwd=cwd, env=env, stdin=subprocess.DEVNULL)
