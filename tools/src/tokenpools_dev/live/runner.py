"""``tokenpools experiment {exp1,exp2} --mode live``: the paper's experiment on a real local stack.

One stack (``devstack.stack.lifecycle.Stack``) serves two passes of the same load, open loop (``replay.experiments``
builds the schedule, the same arrivals the simulation replays) or closed loop (``--set load.mode=closed``: the
experiment's clients, ``loadgen.closed.experiment_clients``, each waiting for its answer before it sends again):

1. ``none`` — the baseline without admission control: the load goes straight to the pool's Service, so every request
   reaches the simulators and queues there;
2. ``token-pools`` — the same load through the proxies, with the agents and the controller running.

Membership and capacity follow the scenario's timeline (``live.control``) in both passes (membership only matters
with the control plane). Each pass records the client's attempts and completions, the control plane's topics (the
token-pools pass's become a recorded log, ``live.relog``) and the backends' Prometheus series; ``live.assemble`` turns a pass into a ``ReplayResult`` so the simulation's
summaries (``replay.results``) and figures (``replay.plots``) apply unchanged; ``live.report`` writes results.json,
the figures and report.md with the live / simulation / paper table.

``time_scale`` k compresses the run: the stack runs every latency and time constant × k (``StackOptions``), the
schedule is sent k times faster, and every time measured is divided by k — the results are in experiment seconds.

``backend`` is what serves the pool: llm-d-inference-sim (the paper's latencies, any time scale) or real vLLM (Exp 1
only, time scale 1): the CPU build serving the tiny model, with the pool and the load rescaled beforehand to what one
replica of it measured (``live.calibrated``, ``live.rescale``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenpools.config import LoadedConfig, StreamsSettings, load_config, load_settings
from tokenpools.replay.experiments import build, examples_dir, split_overrides
from tokenpools.replay.load import Arrival, ClosedLoad
from tokenpools.replay.scenario import Scenario
from tokenpools_dev.devstack.stack.backend import Backend, BackendKind, scrape_timing
from tokenpools_dev.devstack.stack.config import StackOptions, settings_of
from tokenpools_dev.devstack.stack.lifecycle import Stack
from tokenpools_dev.live import control
from tokenpools_dev.live.observe import TopicRecorder, pool_samples
from tokenpools_dev.live.rescale import LiveBackend
from tokenpools_dev.loadgen.client import LoadGenerator, LoadOptions
from tokenpools_dev.loadgen.closed import MODE_KEY, closed_overrides, describe, experiment_clients
from tokenpools_dev.loadgen.keys import keys_for
from tokenpools_dev.loadgen.plan import LoadMode, LoadResult

log = logging.getLogger("tokenpools_dev.live")
POLICIES = ("none", "token-pools")


@dataclass(frozen=True, slots=True)
class LiveOptions:
    name: str
    out: Path
    time_scale: float = 1.0
    overrides: tuple[str, ...] = ()  # Settings keys and load.* (as `--set` of the sim mode), less load.mode
    config: Path | None = None
    kubernetes: bool = False
    proxies: int = 1
    policies: tuple[str, ...] = POLICIES
    sample_s: float = 0.5
    settle_s: float = 2.0  # experiment seconds of idle between passes and before the first
    background_nice: int = 5  # the request path (client, proxy, Service, simulators) goes first on a busy machine
    load_mode: LoadMode = LoadMode.OPEN  # the `--set load.mode` item (``loadgen.closed.split_load_mode``)
    backend: LiveBackend = LiveBackend.SIM  # vLLM: ``config`` and ``load.service_s`` rescaled (live.calibrated)

    def __post_init__(self) -> None:
        if any(item.partition("=")[0].strip() == MODE_KEY for item in self.overrides):
            raise ValueError(f"give {MODE_KEY} as `load_mode`, not among the overrides (split_load_mode)")

    @property
    def stack_backend(self) -> Backend:
        return Backend(BackendKind.VLLM) if self.backend is LiveBackend.VLLM else Backend()


@dataclass(slots=True)
class PassRecord:
    policy: str
    load: LoadResult
    pool: list[tuple[float, int, int, int]]
    topics: dict[str, list[Any]] = field(default_factory=dict)
    failures: int = 0
    applied: list[tuple[float, control.Event]] = field(default_factory=list)
    schedule_lag_p99_s: float | None = None  # how late requests went out after their time (open) or turn (closed)
    loop_lag_p99_ms: float | None = None  # wall ms a 10-ms timer of the load generator fired late
    client_cpu_s: float = 0.0  # CPU seconds of the load generator's process during the pass
    load_mode: LoadMode = LoadMode.OPEN


def sims_per_replica(scenario: Scenario) -> int:
    """How many simulators make one replica so that every capacity change is a number of them up."""
    per = int(scenario.pool.per_replica.concurrency)
    g = per
    for change in scenario.capacity_changes:
        g = math.gcd(g, change.slots_per_replica)
    return per // g if g else 1


def stack_options(options: LiveOptions, scenario: Scenario) -> StackOptions:
    settings_items, _, _ = split_overrides(options.overrides)
    sims = sims_per_replica(scenario)
    config = options.config or examples_dir() / f"{options.name}.yaml"
    lead_s = join_lead_s(streams_settings(load_config(config), options.overrides))
    return StackOptions(config=config, run_dir=options.out / "stack",
                        proxies=options.proxies, kubernetes=options.kubernetes, time_scale=options.time_scale,
                        split={scenario.pool.name: sims} if sims > 1 else {}, overrides=tuple(settings_items),
                        background_nice=options.background_nice, proxies_bind_all=True,
                        backend=options.stack_backend,
                        initial_states={e.name: "Pending" for e in control.initial_membership(
                            control.timeline(scenario, 1, 1, lead_s))})


def streams_settings(source: LoadedConfig, overrides: tuple[str, ...]) -> StreamsSettings:
    """The agents' stream settings as the stack runs them (the file's, with the run's ``--set`` items), in
    experiment seconds (the stack scales them by ``time_scale``)."""
    settings_items, _, _ = split_overrides(overrides)
    return load_settings(source.settings_values, settings_items).streams


def join_lead_s(streams: StreamsSettings) -> float:
    """How far ahead of its traffic a tenant's join is published (``control.membership_lead_s``)."""
    return control.membership_lead_s(streams.tick_s, streams.grace_s)


def scenario_for(options: LiveOptions) -> Scenario:
    """The experiment in the pass's load mode: its arrivals or its clients, and what the simulation column replays."""
    return build(options.name, closed_overrides(options.load_mode, options.overrides), options.config, options.sample_s)


def pass_load(scenario: Scenario, options: LiveOptions) -> tuple[tuple[Arrival, ...], tuple[ClosedLoad, ...], str]:
    """(open-loop arrivals, closed-loop clients, what a progress line says) of a pass in the options' mode."""
    if options.load_mode is LoadMode.CLOSED:
        clients = experiment_clients(scenario)
        return (), clients, f"closed loop, {describe(clients)}"
    return tuple(scenario.arrivals), (), f"open loop, {len(scenario.arrivals)} requests"


def run(options: LiveOptions, progress: Any = print) -> dict[str, PassRecord]:
    """Start the stack, run the passes, stop the stack; the raw records of each pass."""
    scenario = scenario_for(options)
    started = time.monotonic()
    with Stack(stack_options(options, scenario)) as stack:
        progress(f"stack ready in {time.monotonic() - started:.0f} s ({stack.run_dir})")
        return asyncio.run(run_passes(stack, scenario, options, progress))


async def run_passes(stack: Stack, scenario: Scenario, options: LiveOptions, progress: Any = print) -> dict[str, PassRecord]:
    from tokenpools.topics.declarations import topics_for
    from tokenpools.topics.records import LimitUpdate, RequestCompleted, RequestDecided, ScaleCommand, SpecRecord

    k = options.time_scale
    assert stack.loaded is not None
    topics = topics_for(settings_of(stack.source).kafka.topic_prefix)
    pool = stack.pool(scenario.pool.name)
    streams = streams_settings(stack.source, options.overrides)
    events = control.timeline(scenario, pool.layout.slots, sims_per_replica(scenario), join_lead_s(streams))
    raw_docs = stack.loaded.raw_documents
    arrivals, clients, what = pass_load(scenario, options)
    names = sorted({a.entitlement for a in arrivals} | {c.entitlement for c in clients})
    keys = keys_for(stack.source, Path(stack.options.config).read_text(encoding="utf-8"), None, names)
    records: dict[str, PassRecord] = {}
    for policy in options.policies:
        await asyncio.to_thread(control.set_up_replicas, pool, len(pool.replicas))
        await control.publish_membership(stack.kafka_bootstrap, topics.specs.name, raw_docs,
                                         control.initial_membership(events))
        await asyncio.sleep(max(options.settle_s, 2 * streams.tick_s) * k)
        recorder = TopicRecorder(stack.kafka_bootstrap, [(topics.limits, LimitUpdate), (topics.scale, ScaleCommand),
                                                         (topics.requests, RequestDecided),
                                                         (topics.completions, RequestCompleted),
                                                         (topics.specs, SpecRecord)])
        await recorder.start()
        targets = stack.proxy_urls if policy == "token-pools" else [pool.service_url]
        generator = LoadGenerator(targets, LoadOptions(model=scenario.pool.model, keys=keys, time_scale=k,
                                                       retry=scenario.retry, duration_s=scenario.duration_s,
                                                       seed=scenario.seed))
        origin = time.time() + 1.0
        progress(f"{scenario.name} {policy}: {what} over {scenario.duration_s:g} s "
                 f"(×{k:g}: {scenario.duration_s * k:.0f} s wall) to {', '.join(targets)}")
        player = asyncio.create_task(control.play(events, origin, k, stack, stack.kafka_bootstrap, topics.specs.name,
                                                  raw_docs, membership=policy == "token-pools"))
        try:
            load = await generator.run(arrivals, origin, clients)
        finally:
            await generator.close()
        applied = await player
        await recorder.stop()
        end = origin + k * load.end_s + 2 * scrape_timing(stack.backend.kind, stack.options.scrape_s)[0]
        await asyncio.sleep(max(0.0, end - time.time()))
        samples = await asyncio.to_thread(pool_samples, stack.prometheus_url, scenario.pool.name, pool.layout.slots,
                                          origin, end, stack.options.scrape_s, k)
        records[policy] = PassRecord(policy, load, samples, dict(recorder.records), generator.failures, applied,
                                     _p99(generator.send_lags_s), _p99([x * 1000 for x in generator.loop_lags_s]),
                                     generator.cpu_s, options.load_mode)
        progress(f"{scenario.name} {policy}: done, {len(load.completions)} admitted requests ended")
    await asyncio.to_thread(control.set_up_replicas, pool, len(pool.replicas))
    return records


def _p99(values: list[float]) -> float | None:
    ordered = sorted(values)
    return round(ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)], 4) if ordered else None
