"""``tokenpools up --proxies 2`` / ``tokenpools load`` / ``tokenpools down`` as a user runs them, on the real stack.

What it proves:
- one command starts the whole stack in the background (readiness checked, one log per component, a state file)
  and another, from another process, stops every process it started;
- with two proxy replicas an entitlement's admitted concurrency *across both* never exceeds its limit, although
  each replica admitted its share of the load and the demand was twice the limit: the agents split the limit
  between the replicas (no ``limit × replicas``). Measured on the proxies' own request/completion events;
- ``tokenpools top``, on a pseudo-terminal against that stack, draws each entitlement's class and limit and today's
  requests exactly as many as the proxies' completion events.

The stack runs ``policy.fleet_enforcement = shares``, the strict mode: never above the limit. The default,
``counts``, trades a bounded overshoot for near-exact refusals (docs/fleet.md); test_live_fleet.py measures it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from terminal_fixtures import Terminal

from tokenpools.replay.experiments import examples_dir
from tokenpools.streams.budgets.ledger import utc_day
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.records import LimitUpdate, RequestCompleted, RequestDecided
from tokenpools_dev.devstack.stack.state import StackState, pid_runs, read_state
from tokenpools_dev.live.observe import TopicRecorder

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LIMIT = 6  # guaranteed-a's concurrency in examples/exp1.yaml
TIME_SCALE = 0.25


def tokenpools(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tokenpools", *args], capture_output=True, text=True,
                          timeout=timeout_s, check=False,
                          env={**os.environ, "COLUMNS": "200", "TOKENPOOLS_POLICY__FLEET_ENFORCEMENT": "shares"})


@dataclass
class TwoProxyRun:
    up: subprocess.CompletedProcess[str]
    down: subprocess.CompletedProcess[str]
    state: StackState | None
    after: StackState | None
    records: dict[str, list[Any]]
    out: Path
    top: dict[str, re.Match[str]]  # per entitlement, its row as ``tokenpools top`` drew it against the stack


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> TwoProxyRun:
    """One stack, one load, one shutdown for the whole module (each step is a CLI command)."""
    tmp = tmp_path_factory.mktemp("two-proxies")
    run_dir = tmp / "stack"
    up = tokenpools("up", "--config", str(examples_dir() / "exp1.yaml"), "--no-kubernetes", "--proxies", "2",
                    "--time-scale", str(TIME_SCALE), "--run-dir", str(run_dir), "--detach")
    state = read_state(run_dir)
    records: dict[str, list[Any]] = {}
    top: dict[str, re.Match[str]] = {}
    try:
        if up.returncode == 0 and state is not None:
            records = asyncio.run(_load_and_record(state, run_dir, tmp / "load"))
            top = _top_rows(state.urls["kafka"], records)
    finally:
        down = tokenpools("down", "--run-dir", str(run_dir))
    return TwoProxyRun(up, down, state, read_state(run_dir), records, tmp, top)


def test_up_starts_every_component_and_down_stops_them(run: TwoProxyRun) -> None:
    assert run.up.returncode == 0, run.up.stderr[-3000:]
    assert run.state is not None and run.state.status == "ready"
    assert "proxy-1" in run.up.stderr and "running in the background" in run.up.stderr  # the status table
    names = {c.name for c in run.state.components}
    assert {"kafka", "sim-qwen3-8b-0", "service-qwen3-8b", "prometheus", "agents", "controller",
            "proxy-0", "proxy-1"} <= names
    assert all(Path(c.log).is_file() and Path(c.log).stat().st_size > 0 for c in run.state.components)
    assert run.down.returncode == 0, run.down.stderr
    assert run.after is not None and run.after.status == "stopped"
    assert not [c.name for c in run.state.components if pid_runs(c.pid, c.cmd_marker)], "left running"


def test_both_replicas_serve_and_the_split_limit_binds(run: TwoProxyRun) -> None:
    decided = [d for d in run.records["requests"] if d.entitlement == "guaranteed-a"]
    assert {d.proxy_id for d in decided if d.outcome.value == "admitted"} == {"proxy-0", "proxy-1"}
    assert sum(d.outcome.value == "concurrency" for d in decided) > 20  # demand ≈ 2 × limit: refused, not queued
    for update in run.records["limits"]:  # the replicas' shares never add up to more than the limit
        shares = [p.entitlements["guaranteed-a"][0] for p in update.proxies if "guaranteed-a" in p.entitlements]
        assert len(update.proxies) == 2 and sum(shares) <= LIMIT, update.proxies
    summary = json.loads((run.out / "load" / "summary.json").read_text())
    assert {r["entitlement"] for r in summary["entitlements"]} == {"guaranteed-a", "spot-b"}


def test_admitted_concurrency_across_replicas_is_never_limit_times_replicas(run: TwoProxyRun) -> None:
    """Across both replicas at most the limit is in flight — except right after the agents move the split, while
    the replica whose share shrank still finishes what it admitted under the old one (see the next test)."""
    peaks = fleet_peaks(run.records, "guaranteed-a")
    assert peaks and max(n for _, n in peaks) >= 4  # the limit was reached
    changes = share_changes(run.records["limits"], "guaranteed-a")
    window_ms = 2 * 1000 * TIME_SCALE * 5.0 + 1000 * TIME_SCALE * 2.0  # two ticks + the grace, wall ms
    over = [(t, n) for t, n in peaks if n > LIMIT]
    assert all(any(c <= t <= c + window_ms for c in changes) for t, _ in over), (over, changes)
    assert max(n for _, n in peaks) < 2 * LIMIT


def test_admitted_concurrency_across_replicas_stays_within_the_limit(run: TwoProxyRun) -> None:
    assert max(n for _, n in fleet_peaks(run.records, "guaranteed-a")) <= LIMIT


def test_top_shows_the_stacks_limits_and_todays_usage(run: TwoProxyRun) -> None:
    """``tokenpools top`` on a terminal, against the stack ``up`` started: each entitlement's class, guaranteed-a's
    concurrency limit (a guaranteed limit is its baseline), and today's requests as many as the proxies' completion
    events of the day (``_top_rows`` waits for that row)."""
    assert set(run.top) == {"guaranteed-a", "spot-b"}, run.top
    guaranteed, spot = run.top["guaranteed-a"], run.top["spot-b"]
    assert guaranteed["service_class"] == "guaranteed" and spot["service_class"] == "spot"
    assert int(guaranteed["slots"]) == LIMIT


def _top_rows(bootstrap: str, records: dict[str, list[Any]]) -> dict[str, re.Match[str]]:
    """Runs ``tokenpools top`` on a pseudo-terminal until it has drawn, for each loaded entitlement, a row whose
    requests today equal its completion events of that UTC day (the agents' usage ledger has caught up)."""
    terminal = Terminal([sys.executable, "-m", "tokenpools", "top", "--set", f"kafka.bootstrap_servers={bootstrap}",
                         "--refresh-ms", "300"])
    rows: dict[str, re.Match[str]] = {}
    try:
        day = terminal.wait_for(r"tokens (\d{4}-\d\d-\d\d)", timeout_s=60).group(1)
        for name in ("guaranteed-a", "spot-b"):
            done = sum(c.entitlement == name and utc_day(c.t_ms) == day for c in records["completions"])
            cells = (r"(?P<service_class>\S+)", r"\S+", r"\S+", r"\S+", r"(?P<slots>\d+)", r"\S+", r"\S+", r"[\d,]+",
                     f"{done:,}")
            rows[name] = terminal.wait_for(r"│ qwen3-8b\s*│\s+" + re.escape(name) + r"\s*│\s+"
                                           + r"\s*│\s+".join(cells) + r"\s", timeout_s=60)
    finally:
        terminal.close()
    return rows


def fleet_peaks(records: dict[str, list[Any]], name: str) -> list[tuple[int, int]]:
    """(t_ms, admitted in flight across all proxies just after) at every admission of ``name``."""
    ends = {c.request_id: c.t_ms for c in records["completions"]}
    events = []
    for d in records["requests"]:
        if d.entitlement == name and d.outcome.value == "admitted" and d.request_id in ends:
            events += [(d.t_ms, 1), (ends[d.request_id], -1)]
    level, out = 0, []
    for t, delta in sorted(events, key=lambda e: (e[0], e[1])):
        level += delta
        if delta > 0:
            out.append((t, level))
    return out


def share_changes(updates: list[LimitUpdate], name: str) -> list[int]:
    """Tick times (ms) of the updates whose per-proxy split of ``name`` differs from the previous update's."""
    out, previous = [], None
    for u in sorted(updates, key=lambda u: u.version):
        split = {p.proxy_id: p.entitlements.get(name, (0,))[0] for p in u.proxies}
        if previous is not None and split != previous:
            out.append(u.t_ms)
        previous = split
    return out


async def _load_and_record(state: StackState, run_dir: Path, out: Path) -> dict[str, list[Any]]:
    topics = topics_for("tokenpools.")
    recorder = TopicRecorder(state.urls["kafka"], [(topics.requests, RequestDecided),
                                                   (topics.completions, RequestCompleted), (topics.limits, LimitUpdate)])
    await recorder.start()
    # 2.8 req/s × 4.4 s ≈ 12 slots of demand for guaranteed-a's 6; spot-b keeps the pool contended
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tokenpools", "load", "--config", str(examples_dir() / "exp1.yaml"),
        "--rate", "guaranteed-a=2.8", "--rate", "spot-b=2", "--duration-s", "40", "--out", str(out),
        "--run-dir", str(run_dir),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    output, _ = await proc.communicate()
    await recorder.stop(settle_s=1.0)
    assert proc.returncode == 0, output.decode()[-3000:]
    return {name.removeprefix("tokenpools."): items for name, items in recorder.records.items()}
