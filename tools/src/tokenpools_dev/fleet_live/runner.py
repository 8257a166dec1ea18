"""Run the fleet scenario live: for each proxy count, a local stack as ``tokenpools up --no-kubernetes --proxies N``
starts it (``devstack.stack.lifecycle.Stack``), the schedule is sent through its proxies, the stack is stopped.

One stack per proxy count, never one stack reused: the agents split limits between the proxies that announce
themselves, so a single-proxy run must have exactly one proxy alive. The stack is ready only once every proxy
enforces a limit update that names all of them (``Stack.start``); the schedule's warm-up then runs before the
requests that count. The client sends no retries (``RetryPolicy(max_retries=0)``), so a refused request is one
refusal and both runs count the same requests. Each run's attempts and completions are written under
``OUT/proxies-N/load`` and the stack's logs under ``OUT/proxies-N/stack/logs``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenpools.replay.load import Arrival, RetryPolicy
from tokenpools_dev.devstack.stack.config import StackOptions
from tokenpools_dev.devstack.stack.lifecycle import Stack
from tokenpools_dev.fleet_live import scenario as sc
from tokenpools_dev.fleet_live.figures import RunFigures, counts_age_buckets, figures_of, histogram_quantile
from tokenpools_dev.loadgen.client import LoadGenerator, LoadOptions
from tokenpools_dev.loadgen.plan import LoadResult, summary_rows

Progress = Callable[[str], None]

FULL = {"duration_s": 180.0, "warmup_s": 30.0, "time_scale": 1.0}
"""Uncompressed: 150 s measured per run, about 3.5 minutes each with the stack's start."""
QUICK = {"duration_s": 120.0, "warmup_s": 20.0, "time_scale": 0.5}
"""Compressed 2×: 100 s of experiment measured in 50 s of wall time, ~80 s per run on 2 cores (the live test's)."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    out: Path
    proxies: tuple[int, ...] = (1, 4)
    time_scale: float = 1.0  # < 1 compresses the run (the stack's and the schedule's times alike)
    ready_timeout_s: float = 120.0
    drain_timeout_s: float = 60.0  # wall seconds to wait for the last requests after the schedule
    overrides: tuple[str, ...] = ()  # settings for every component, as `--set KEY=VALUE` (e.g. a design's knobs)

    def __post_init__(self) -> None:
        if not self.proxies or min(self.proxies) < 1:
            raise ValueError(f"`proxies` must be counts >= 1, got {self.proxies}")


@dataclass(frozen=True, slots=True)
class FleetRun:
    """One proxy count: its figures and how the run itself went."""

    figures: RunFigures
    load: LoadResult
    targets: tuple[str, ...]
    stack_ready_s: float  # wall seconds for the stack to be ready
    load_wall_s: float  # wall seconds of sending and draining
    client_failures: int  # requests that raised inside the load generator (a bug there, not an outcome)
    loop_lag_p99_ms: float | None  # how late the load generator's 10-ms timer fired, P99 (a CPU-starved client)
    run_dir: Path
    counts_age_s: tuple[float | None, float | None] = (None, None)  # P50, P99 of the counts' age at the proxies


def run(scenario: sc.FleetScenario, options: RunOptions, progress: Progress = print) -> list[FleetRun]:
    """Write the config, then run the same schedule once per proxy count, in the order given."""
    options.out.mkdir(parents=True, exist_ok=True)
    config = options.out / "fleet.yaml"
    config.write_text(sc.config_text(scenario), encoding="utf-8")
    arrivals = sc.schedule(scenario)
    return [run_one(scenario, arrivals, config, p, options, progress) for p in options.proxies]


def run_one(scenario: sc.FleetScenario, arrivals: Sequence[Arrival], config: Path, proxies: int,
            options: RunOptions, progress: Progress = print) -> FleetRun:
    run_dir = options.out / f"proxies-{proxies}"
    stack_options = StackOptions(config=config, run_dir=run_dir / "stack", proxies=proxies, kubernetes=False,
                                 time_scale=options.time_scale, ready_timeout_s=options.ready_timeout_s,
                                 overrides=options.overrides)
    started = time.monotonic()
    with Stack(stack_options) as stack:
        ready_s = time.monotonic() - started
        targets = tuple(stack.proxy_urls)
        progress(f"{proxies} prox{'y' if proxies == 1 else 'ies'}: stack ready in {ready_s:.0f} s; sending "
                 f"{len(arrivals)} requests over {scenario.duration_s:g} s (×{options.time_scale:g}: "
                 f"{scenario.duration_s * options.time_scale:.0f} s wall), {scenario.warmup_s:g} s of warm-up")
        t0 = time.monotonic()
        load, failures, lag = asyncio.run(_send(scenario, arrivals, targets, options))
        load_wall_s = time.monotonic() - t0
        ages = counts_age_buckets([_text(url + "/metrics") for url in targets])
    from tokenpools_dev.loadgen.cli import write_records

    write_records(load, run_dir / "load", summary_rows(load))
    figures = figures_of(load, sc.measured(arrivals, scenario), proxies, targets, scenario.entitlements,
                         scenario.measured_s, scenario.slots)
    progress(f"{proxies} prox{'y' if proxies == 1 else 'ies'}: {figures.requests} requests, "
             f"{100 * figures.refused_fraction:.1f} % refused")
    return FleetRun(figures, load, targets, ready_s, load_wall_s, failures, lag, run_dir,
                    (histogram_quantile(ages, 0.5), histogram_quantile(ages, 0.99)))


def _text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - the stack's own proxy
        return response.read().decode()


async def _send(scenario: sc.FleetScenario, arrivals: Sequence[Arrival], targets: Sequence[str],
                options: RunOptions) -> tuple[LoadResult, int, float | None]:
    table = sc.routes(arrivals, len(targets), scenario.seed)
    load_options = LoadOptions(model=scenario.model, keys=sc.keys(scenario), time_scale=options.time_scale,
                               retry=RetryPolicy(max_retries=0), duration_s=scenario.duration_s, seed=scenario.seed,
                               drain_timeout_s=options.drain_timeout_s)
    generator = LoadGenerator(targets, load_options, route=lambda arrival, _attempt: table[arrival.request_id])
    try:
        load = await generator.run(arrivals)
    finally:
        await generator.close()
    return load, generator.failures, _p99([x * 1000 for x in generator.loop_lags_s])


def _p99(values: list[float]) -> float | None:
    ordered = sorted(values)
    return round(ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)], 2) if ordered else None
