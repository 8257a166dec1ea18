"""Run the chaos scenario live: a local stack as ``tokenpools up --no-kubernetes --proxies 3 --agents-workers 2``
starts it, the closed-loop clients send through a random balancer (each attempt to a proxy a seeded generator picks),
the faults of ``schedule`` are injected while they do, the topics are recorded (``replay.recorder``, as
``tokenpools record``) and ``checker`` reads the history.

Faults act on the stack's own processes (``devstack.stack.lifecycle.Stack``): a proxy or agents worker is a
``Proc`` (SIGKILL, SIGSTOP, and ``start`` again with the same command line: the same port and proxy id), the broker a
``KafkaBroker`` (``pause``/``resume``, ``restart`` on its data). Blocking steps run in a thread so the clients'
event loop keeps sending.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tokenpools.config import KafkaSettings, load_settings
from tokenpools.replay.load import RetryPolicy
from tokenpools_dev.chaos import checker as ck
from tokenpools_dev.chaos import scenario as sc
from tokenpools_dev.chaos.schedule import Fault, FaultKind, schedule
from tokenpools_dev.devstack.process import http_ok
from tokenpools_dev.devstack.stack.config import StackOptions
from tokenpools_dev.devstack.stack.lifecycle import Stack
from tokenpools_dev.loadgen.client import LoadGenerator, LoadOptions
from tokenpools_dev.loadgen.cli import write_records
from tokenpools_dev.loadgen.plan import ADMITTED, LoadResult, summary_rows

if TYPE_CHECKING:
    import polars as pl

Progress = Callable[[str], None]

QUICK = {"load_s": 180.0, "faults": 7, "time_scale": 0.5}
"""Three minutes of load compressed 2× (360 s of experiment): seven faults, one of each kind and one more."""
FULL = {"load_s": 600.0, "faults": 20, "time_scale": 0.5}


@dataclass(frozen=True, slots=True)
class RunOptions:
    out: Path
    seed: int = 1
    load_s: float = QUICK["load_s"]  # wall seconds of load
    faults: int = int(QUICK["faults"])
    time_scale: float = QUICK["time_scale"]
    proxies: int = 3
    workers: int = 2
    producer_timeout_ms: int = 1000  # proxy.producer_request_timeout_ms: the broker's pause outlasts it
    broker_pause_s: float = 2.0  # > the producer timeout, < the 3 s after which the KRaft controller fences it
    proxy_pause_s: float = 3.0
    settle_s: float = 60.0  # at most this long after the load for the ledger to answer every completion
    ready_timeout_s: float = 180.0
    overrides: tuple[str, ...] = ()  # more settings for every component, as `--set KEY=VALUE`

    def __post_init__(self) -> None:
        if self.broker_pause_s * 1000 <= self.producer_timeout_ms:
            raise ValueError(f"the broker's pause ({self.broker_pause_s:g} s) must outlast the producer timeout "
                             f"({self.producer_timeout_ms} ms)")


@dataclass(slots=True)
class ChaosRun:
    figures: ck.Figures
    faults: list[dict[str, object]]
    run_dir: Path
    stack_ready_s: float
    settle_s: float
    client_failures: int
    notes: list[str] = field(default_factory=list)


def run(options: RunOptions, progress: Progress = print) -> ChaosRun:
    s = sc.ChaosScenario(duration_s=options.load_s / options.time_scale)
    faults = schedule(options.seed, options.load_s, options.faults, options.proxies, options.workers)
    out = options.out
    out.mkdir(parents=True, exist_ok=True)
    config = out / "chaos.yaml"
    config.write_text(sc.config_text(s), encoding="utf-8")
    overrides = (f"proxy.producer_request_timeout_ms={options.producer_timeout_ms}", *options.overrides)
    stack_options = StackOptions(config=config, run_dir=out / "stack", proxies=options.proxies,
                                 agents_workers=options.workers, kubernetes=False, time_scale=options.time_scale,
                                 ready_timeout_s=options.ready_timeout_s, overrides=overrides)
    started = time.monotonic()
    with Stack(stack_options) as stack:
        ready_s = time.monotonic() - started
        progress(f"stack ready in {ready_s:.0f} s: {options.proxies} proxies, {options.workers} agents workers; "
                 f"{options.load_s:g} s of load, {len(faults)} faults")
        load, windows, failures = asyncio.run(_load_with_faults(stack, s, faults, options, progress))
        write_records(load, out / "load", summary_rows(load))
        progress(f"load done: {len({a.request_id for a in load.attempts})} requests; settling")
        prefix = load_settings(stack.source.settings_values, overrides).kafka.topic_prefix
        history, settle_s = _settle(stack, s, load, windows, options, prefix, progress)
    figures = ck.figures(history)
    (out / "faults.json").write_text(json.dumps([asdict(w) for w in windows], indent=1))
    return ChaosRun(figures, [{"kind": w.kind.value, "target": w.target, "start_ms": w.start_ms,
                               "end_ms": w.end_ms} for w in windows], out, ready_s, settle_s, failures)


async def _load_with_faults(stack: Stack, s: sc.ChaosScenario, faults: Sequence[Fault], options: RunOptions,
                            progress: Progress) -> tuple[LoadResult, list[ck.FaultWindow], int]:
    balancer = random.Random(f"{options.seed}:balancer")
    load_options = LoadOptions(model=s.model, keys=sc.keys(s), time_scale=options.time_scale,
                               retry=RetryPolicy(max_retries=0), duration_s=s.duration_s, seed=options.seed,
                               drain_timeout_s=60.0, request_timeout_s=60.0)
    generator = LoadGenerator(stack.proxy_urls, load_options,
                              route=lambda _arrival, _attempt: balancer.randrange(len(stack.proxy_urls)))
    windows: list[ck.FaultWindow] = []

    async def inject() -> None:
        t0 = time.monotonic()
        for fault in faults:
            await asyncio.sleep(max(0.0, t0 + fault.at_s - time.monotonic()))
            start_ms = int(time.time() * 1000)
            await asyncio.to_thread(_inject, stack, fault, options)
            windows.append(ck.FaultWindow(fault.kind, fault.target, start_ms, int(time.time() * 1000)))
            progress(f"  {fault.at_s:6.1f} s {fault.kind.value} {fault.target}: "
                     f"{windows[-1].end_ms - start_ms} ms")

    injector = asyncio.create_task(inject())
    try:
        load = await generator.run(clients=sc.clients(s))
    finally:
        await generator.close()
    await injector  # every fault has recovered before the books are read
    return load, windows, generator.failures


def _inject(stack: Stack, fault: Fault, options: RunOptions) -> None:
    t = options.ready_timeout_s
    match fault.kind:
        case FaultKind.AGENTS_KILL:
            worker = stack.agents_workers[fault.target]
            worker.signal(signal.SIGKILL)
            worker.wait(10.0)
            worker.start()
        case FaultKind.BROKER_PAUSE:
            assert stack.kafka is not None
            stack.kafka.pause()
            time.sleep(options.broker_pause_s)
            stack.kafka.resume()
        case FaultKind.BROKER_RESTART:
            assert stack.kafka is not None
            stack.kafka.restart()
        case FaultKind.PROXY_KILL:
            proxy, url = stack.proxies[fault.target], stack.proxy_urls[fault.target]
            proxy.signal(signal.SIGKILL)
            proxy.wait(10.0)
            proxy.start()
            proxy.wait_ready(lambda: http_ok(url + "/healthz"), t, "answering /healthz")
        case FaultKind.CONTROLLER_RESTART:
            assert stack.controller is not None
            stack.controller.stop(15.0)
            stack.controller.start()
        case FaultKind.PROXY_PAUSE:
            pid = stack.proxies[fault.target].pid
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(options.proxy_pause_s)
            finally:
                os.kill(pid, signal.SIGCONT)


def _settle(stack: Stack, s: sc.ChaosScenario, load: LoadResult, windows: list[ck.FaultWindow],
            options: RunOptions, prefix: str, progress: Progress) -> tuple[ck.History, float]:
    """Record the topics until the ledger has answered every completion event (at most ``settle_s``), then the
    history. Each try records into a fresh directory, so a try reads the topics as they are then."""
    t0 = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        time.sleep(3.0)
        in_flight = {i: _in_flight(url) for i, url in enumerate(stack.proxy_urls)}
        log = options.out / f"log-{attempt}"
        asyncio.run(_record(stack.kafka_bootstrap, prefix, log, f"chaos-{options.seed}-{attempt}-{os.getpid()}"))
        history = history_of(log, load, windows, in_flight, s, options.proxies, stack.proxy_urls)
        f = ck.figures(history)
        settled = f.reconciled and f.double_counted == 0 and f.lost_detail.get("ledger_missing", 0) == 0 \
            and f.slots_held_after == 0
        if settled or time.monotonic() - t0 > options.settle_s:
            progress(f"recorded {log} after {time.monotonic() - t0:.0f} s ({attempt} tries)")
            return history, time.monotonic() - t0


async def _record(bootstrap: str, prefix: str, log: Path, group: str) -> None:
    from tokenpools.replay.recorder import Recorder, RecorderConfig
    from tokenpools.runtime.kafka import KafkaClients

    await Recorder(KafkaClients(KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=prefix)),
                   RecorderConfig(out_dir=log, topics=("requests", "completions", "specs", "usage", "budgets"),
                                  group_id=group, flush_s=0.5, idle_exit_s=4.0, poll_ms=200)).run()


def _in_flight(url: str) -> float:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:  # noqa: S310 - the stack's own proxy
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("tokenpools_proxy_in_flight{"))


def history_of(log: Path, load: LoadResult, windows: Sequence[ck.FaultWindow], in_flight: dict[int, float],
               s: sc.ChaosScenario, proxies: int, targets: Sequence[str]) -> ck.History:
    """The checker's history from a recorded log and the clients' records."""
    import polars as pl

    from tokenpools.cli import main
    from tokenpools.replay import trace, usage

    index = {t.rstrip("/"): i for i, t in enumerate(targets)}
    origin_ms = load.origin_s * 1000
    k = load.time_scale

    def wall_ms(t_s: float) -> int:
        return int(origin_ms + t_s * k * 1000)

    attempts = [ck.SentAttempt(a.request_id, index[a.target], wall_ms(a.t_s), wall_ms(a.answered_s),
                               a.proxy_request_id, a.outcome, a.http_status) for a in load.attempts]
    targets_of = {a.proxy_request_id: index[a.target] for a in load.attempts if a.outcome == ADMITTED}
    ends = [ck.AdmittedEnd(c.proxy_request_id, c.entitlement, targets_of.get(c.proxy_request_id, -1),
                           wall_ms(c.admitted_s), wall_ms(c.t_s), c.status) for c in load.completions]
    decided = trace.read_table(log, trace.REQUESTS)
    completed = trace.read_table(log, trace.COMPLETIONS)
    events = [ck.CompletionEvent(r["request_id"], r["entitlement"], r["proxy_id"], r["proxy_start_ms"], r["sequence"],
                                 (r["kafka_partition"], r["kafka_offset"])) for r in completed.iter_rows(named=True)]
    usage_rows = usage.from_records(_table(log, "usage"))
    ledger = {r["entitlement"]: r["requests"] for r in
              usage_rows.group_by("entitlement").agg(pl.col("requests").sum()).iter_rows(named=True)}
    statuses = _table(log, "budget_status")
    budget = None
    if not statuses.is_empty():
        newest = statuses.filter(pl.col("entitlement") == s.budgeted).sort("version").tail(1).row(0, named=True)
        budget = ck.Budget(s.budgeted, int(newest["allowance"]), int(newest["spent_units"]))
    with contextlib.redirect_stdout(sys.stderr):  # its verdict is progress here; stdout is the benchmark's
        reconciled = main(["usage", "--log", str(log), "--reconcile"]) == 0
    return ck.History(attempts, ends, frozenset(decided["request_id"].to_list()), events, ledger, list(windows),
                      in_flight, sc.limits(s), proxies, budget, reconciled)


def _table(log: Path, name: str) -> pl.DataFrame:
    """A recorded table, empty when the log has none of it (no such record was published)."""
    import polars as pl

    from tokenpools.replay import trace

    return trace.read_table(log, name) if trace.table_files(log, name) else pl.DataFrame()
