"""A hot pool on two workers (docs/scaling.md#the-two-stage-topology): one pool of four shards, two agents workers
in one group on a real broker. Both fold the pool's events (each sends its shards' window summaries and its shards'
counts records, docs/scaling.md step 4), exactly one publishes the pool's limit updates, and they equal those of
one worker given the same events unsharded (a second set of topics, the pool without ``shards``, keyed by pool: the
reference run).

Four shards, because their keys land on partitions 3, 5 and 6 and the pool's own on 0 (murmur2 % 8): two in each
half and of each parity, so however the group splits the eight partitions in two, both workers own a shard.

Waits come from the settings (window width, grace, the shard grace ``streams.params.from_settings`` derives, the
group timings of ``--fast-join``); the timeouts only bound a failure.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path

import pytest
from aiokafka.partitioner import murmur2

from tokenpools.config import KafkaSettings, load_settings
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.streams.admin import ensure_topics
from tokenpools.streams.app import FAST_JOIN, WORKER_HEADER
from tokenpools.streams.table.params import from_settings
from tokenpools.topics.counts import decode_counts
from tokenpools.topics.declarations import Topics, topics_for
from tokenpools.topics.records import LimitUpdate, Record, WindowSummary
from tokenpools.topics.shards import event_key, shard_of
from tokenpools_dev.streams import harness
from tokenpools_dev.streams import scripted

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS, SHARDS = 8, 4
POOL = "pool-0"
TICK_MS, GRACE_MS = 1000, 300
REBALANCE_S = FAST_JOIN["broker_rebalance_timeout"]
STARTUP_S = 60.0  # a worker's start and first join on a loaded 2-core machine: a failure bound, not a wait
LEAD_S = 3  # the stream starts this long after the workers are in the group (whole seconds: window aligned)
ENTITLEMENTS = {"alpha": "elastic", "bravo": "spot", "charlie": "elastic", "delta": "spot", "foxtrot": "elastic",
                "juliet": "spot"}


def _config(shards: int) -> str:
    pool = scripted.CONFIG_YAML.split("---")[0].replace(scripted.POOL, POOL)
    if shards > 1:
        pool = pool.replace("  defaults: {maxTokens: 64}\n", f"  defaults: {{maxTokens: 64}}\n  shards: {shards}\n")
    docs = [pool]
    for name, cls in ENTITLEMENTS.items():
        resources = "  resources: {tokensPerSecond: 60, kvCacheGiB: 1, concurrency: 2}\n" if cls == "elastic" else ""
        docs.append(f"apiVersion: tokenpools.io/v1alpha1\nkind: TokenEntitlement\nmetadata: {{name: {name}}}\n"
                    f"spec:\n  tenantId: t-{name}\n  poolRef: {{name: {POOL}}}\n"
                    f"  qos: {{serviceClass: {cls}, sloTargetMs: {500 if cls == 'elastic' else 30000}}}\n{resources}")
    return "\n---\n".join(docs)


def _events(base_ms: int, windows: int) -> list[scripted.Scripted]:
    loads = [scripted.Load(name, per_window=6 + 3 * i, refuse_every=5 if i % 2 else 0, proxies=("proxy-1", "proxy-2"))
             for i, name in enumerate(ENTITLEMENTS)]
    return sorted(scripted.scripted_events(base_ms, TICK_MS, [(windows, loads)], pool=POOL), key=lambda e: e[1])


@dataclasses.dataclass
class Run:
    tmp: Path
    bootstrap: str
    uid: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:8])

    def __post_init__(self) -> None:
        self.tested: Topics = topics_for(f"sh-{self.uid}.", partitions=PARTITIONS)
        self.reference: Topics = topics_for(f"ref-{self.uid}.", partitions=PARTITIONS)
        self.group = f"agents-{self.uid}"
        (self.tmp / "sharded.yaml").write_text(_config(SHARDS))
        (self.tmp / "single.yaml").write_text(_config(1))
        self.limits = harness.Collector(self.bootstrap, self.tested.limits.name, partitions=PARTITIONS)
        self.summaries = harness.Collector(self.bootstrap, self.tested.usage_windows.name, WindowSummary,
                                     partitions=PARTITIONS)
        self.uninterrupted = harness.Collector(self.bootstrap, self.reference.limits.name, partitions=PARTITIONS)
        self.counts = harness.Collector(self.bootstrap, self.tested.counts.name, partitions=PARTITIONS,
                                  decoder=decode_counts)
        self.workers: dict[str, object] = {}

    def overrides(self, topics: Topics, group: str) -> list[str]:
        return harness.worker_overrides(self.bootstrap, topics, group, PARTITIONS)

    async def start(self) -> None:
        for topics in (self.tested, self.reference):
            await ensure_topics(KafkaClients(KafkaSettings(bootstrap_servers=self.bootstrap)), topics)
        for collector in (self.limits, self.summaries, self.uninterrupted, self.counts):
            await collector.start()
        self.workers["ref"] = harness.start_worker(self.tmp / "single.yaml", self.overrides(self.reference, f"ref-{self.uid}"),
                                             self.tmp / "ref.log")
        for name in ("a", "b"):
            self.workers[name] = harness.start_worker(self.tmp / "sharded.yaml", self.overrides(self.tested, self.group),
                                                self.tmp / f"{name}.log")

    def key_of(self, record: Record, topics: Topics) -> str:
        shards = SHARDS if topics is self.tested else 1
        return event_key(POOL, getattr(record, "entitlement", None), shards)

    async def stop(self) -> dict[str, str]:
        for process in self.workers.values():
            harness.stop(process)  # type: ignore[arg-type]
        for collector in (self.limits, self.summaries, self.uninterrupted, self.counts):
            await collector.stop()
        return {name: (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:] for name in self.workers}


def test_the_shards_are_where_the_test_assumes() -> None:
    def partition(key: str) -> int:
        return (murmur2(key.encode()) & 0x7FFFFFFF) % PARTITIONS

    assert [partition(f"{POOL}#{k}") for k in range(SHARDS)] == [6, 5, 6, 3] and partition(POOL) == 0
    assert {shard_of(name, SHARDS) for name in ENTITLEMENTS} == {0, 1, 2, 3}  # every shard has events


async def test_two_workers_fold_a_hot_pool_and_one_publishes_what_one_worker_does(kafka_bootstrap: str,
                                                                                  tmp_path: Path) -> None:
    run = Run(tmp_path, kafka_bootstrap)
    windows = 8
    try:
        await run.start()
        await harness.wait_for_group(kafka_bootstrap, run.group, 2, STARTUP_S)
        await harness.wait_for_group(kafka_bootstrap, f"ref-{run.uid}", 1, STARTUP_S)
        base_ms = (int(time.time()) + LEAD_S) * 1000
        through = base_ms + (windows + 2) * TICK_MS  # two empty windows after the stream
        await harness.produce(kafka_bootstrap, [run.tested, run.reference], _events(base_ms, windows), live=True,
                        key_of=run.key_of)

        def done(records: list[LimitUpdate]) -> bool:
            return max((u.version for u in records), default=0) >= through

        # the sharded pool's last update: its deadline, plus (at worst) the shard grace and a rebalance
        shard_grace_ms = from_settings(load_settings({}, run.overrides(run.tested, run.group))).shard_grace_ms
        timeout_s = (through + GRACE_MS + shard_grace_ms) / 1000 - time.time() + 2 * REBALANCE_S + STARTUP_S
        await run.limits.wait_for(done, timeout_s)
        await run.uninterrupted.wait_for(done, timeout_s)
    finally:
        logs = await run.stop()
    senders = {h[WORKER_HEADER] for h in run.limits.headers}
    assert len(senders) == 1, f"the pool's updates came from {senders}: {logs}"
    folding = {h[WORKER_HEADER] for s, h in zip(run.summaries.records, run.summaries.headers) if s.entitlements}
    assert len(folding) == 2, f"the shards' summaries with usage came from {folding}, not from both workers: {logs}"
    counted = {(r.shard, r.shards, h[WORKER_HEADER]) for r, h in zip(run.counts.records, run.counts.headers)}
    assert {shard for shard, _, _ in counted} == set(range(SHARDS)), f"counts of shards {counted}: {logs}"
    assert {shards for _, shards, _ in counted} == {SHARDS}  # format 2, one record per shard
    assert len({worker for _, _, worker in counted}) == 2, f"the counts came from {counted}, not both workers"
    got = {u.version: u for u in run.limits.records if u.version <= through}
    want = {u.version: u for u in run.uninterrupted.records if u.version <= through}
    assert sorted(got) == sorted(want) and len(got) >= windows, (sorted(got), sorted(want))
    differ = [v for v in sorted(got) if got[v] != want[v]]
    assert not differ, (differ[:3], _fields_that_differ(got[differ[0]], want[differ[0]]),
                        _summaries_of(run, differ[0]), logs)


def _fields_that_differ(got: LimitUpdate, want: LimitUpdate) -> dict[str, object]:
    g, w = got.model_dump(), want.model_dump()
    out: dict[str, object] = {k: (g[k], w[k]) for k in g if k != "entitlements" and g[k] != w[k]}
    for ge, we in zip(g["entitlements"], w["entitlements"], strict=False):
        out |= {f"{ge['name']}.{k}": (ge[k], we[k]) for k in ge if ge[k] != we[k]}
    return out


def _summaries_of(run: Run, version: int) -> list[tuple[int, float, list[str]]]:
    """Each shard's summary of the window ending at ``version``: (shard, seconds after the window's deadline it
    arrived, its entitlements), and when the update itself arrived."""
    deadline_s = (version + GRACE_MS) / 1000
    out = [(s.shard, round(at - deadline_s, 3), [e.name for e in s.entitlements])
           for s, at in zip(run.summaries.records, run.summaries.arrived_s) if s.window_end_ms == version]
    out += [(-1, round(at - deadline_s, 3), ["(the update)"])
            for u, at in zip(run.limits.records, run.limits.arrived_s) if u.version == version]
    return out
