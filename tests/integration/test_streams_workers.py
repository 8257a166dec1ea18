"""Several agents workers in one consumer group: who publishes each pool, and the takeover when one goes or comes.

Four pools on four of the eight partitions (two in each half, two of each parity, so any even split of the
partitions gives both workers pools), a live scripted stream per pool (tick_s=1, grace_s=0.3), standby replicas on
(the default, 1). The same events go to a second set of topics served by one uninterrupted worker: the reference
run. Every record a worker sends names it in the ``tokenpools-worker`` header, so the test knows who sent what.

- two workers at once: every pool's updates come from one worker, both workers have pools, nothing is missed;
- one worker SIGKILLed: the other takes its pools over with the restored state (every version equal to the
  reference run's, versions only growing, none skipped but by a catch-up tick, which publishes only its newest
  windows, a re-published version identical), once the group has noticed (the session timeout) within two ticks;
- a worker added to a running one: the rebalance hands pools over with the same guarantees.

Waits come from the settings: the window width and grace, and the group timings of ``--fast-join``
(``streams.app.FAST_JOIN``); the timeouts only bound a failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import subprocess
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import pytest
from aiokafka.partitioner import murmur2

from tokenpools.config import KafkaSettings
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.streams.admin import ensure_topics
from tokenpools.streams.app import FAST_JOIN, WORKER_HEADER
from tokenpools.streams.table.params import StreamParams
from tokenpools.topics.declarations import Topics, topics_for
from tokenpools.topics.records import DeadLetter, LimitUpdate
from tokenpools_dev.streams import harness
from tokenpools_dev.streams import scripted

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 8
POOLS = {"pool-0": 0, "pool-8": 3, "pool-16": 4, "pool-3": 7}  # name → its partition (murmur2 % 8)
TICK_MS, GRACE_MS = 1000, 300
SESSION_S, REBALANCE_S = FAST_JOIN["broker_session_timeout"], FAST_JOIN["broker_rebalance_timeout"]
STARTUP_S = 60.0  # a worker's start and first join on a loaded 2-core machine: a failure bound, not a wait
CATCH_UP = StreamParams().max_updates_per_tick  # the windows a catch-up tick publishes (the workers' default)
LEAD_S = 3  # the stream starts this long after the workers are in the group (whole seconds: window aligned)


def _config() -> str:
    """The test pool of ``scripted`` four times, its entitlements named after the pool."""
    docs = []
    for pool in POOLS:
        docs.append(scripted.CONFIG_YAML.replace(scripted.POOL, pool).replace("name: copilot", f"name: copilot-{pool}")
                    .replace("name: batch", f"name: batch-{pool}"))
    return "---\n".join(docs)


def _events(base_ms: int, windows: int) -> list[scripted.Scripted]:
    events: list[scripted.Scripted] = []
    for seed, pool in enumerate(POOLS):
        phases = [(n, [dataclasses.replace(load, entitlement=f"{load.entitlement}-{pool}") for load in loads])
                  for n, loads in scripted.two_class_phases(windows)]
        events += scripted.scripted_events(base_ms, TICK_MS, phases, seed=seed, pool=pool)
    return sorted(events, key=lambda e: e[1])


@dataclasses.dataclass
class Run:
    """The workers of the group under test and the reference worker, their topics and what they published."""

    tmp: Path
    bootstrap: str
    uid: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:8])
    workers: dict[str, subprocess.Popen[bytes]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tested: Topics = topics_for(f"wk-{self.uid}.", partitions=PARTITIONS)
        self.reference: Topics = topics_for(f"ref-{self.uid}.", partitions=PARTITIONS)
        self.group = f"agents-{self.uid}"
        self.config = self.tmp / "pools.yaml"
        self.config.write_text(_config())
        self.collected = harness.Collector(self.bootstrap, self.tested.limits.name, partitions=PARTITIONS)
        self.uninterrupted = harness.Collector(self.bootstrap, self.reference.limits.name, partitions=PARTITIONS)
        self.dead = [harness.Collector(self.bootstrap, t.dead_letters.name, DeadLetter) for t in (self.tested, self.reference)]

    def overrides(self, topics: Topics, group: str) -> list[str]:
        return harness.worker_overrides(self.bootstrap, topics, group, PARTITIONS)

    async def start(self) -> None:
        for topics in (self.tested, self.reference):
            await ensure_topics(KafkaClients(KafkaSettings(bootstrap_servers=self.bootstrap)), topics)
        for collector in (self.collected, self.uninterrupted, *self.dead):
            await collector.start()
        self.add("ref", self.reference, f"agents-ref-{self.uid}")

    def add(self, name: str, topics: Topics | None = None, group: str | None = None) -> str:
        """Start worker ``name`` (of the group under test unless told); its id as the header names it."""
        process = harness.start_worker(self.config, self.overrides(topics or self.tested, group or self.group),
                                 self.tmp / f"{name}.log")
        self.workers[name] = process
        return f"{socket.gethostname()}-{process.pid}"

    async def produce(self, events: Sequence[scripted.Scripted]) -> None:
        await harness.produce(self.bootstrap, [self.tested, self.reference], events, live=True, pack_events=10)

    async def stop(self) -> dict[str, str]:
        for process in self.workers.values():
            harness.stop(process)
        for collector in (self.collected, self.uninterrupted, *self.dead):
            await collector.stop()
        for name, collector in (("tested", self.collected), ("reference", self.uninterrupted)):
            # every update with its sender and arrival, in the test's directory: a failure's message is cut short
            with open(self.tmp / f"{name}.jsonl", "w") as f:
                for u, h, arrived in zip(collector.records, collector.headers, collector.arrived_s, strict=True):
                    f.write(json.dumps({"worker": h.get(WORKER_HEADER, b"").decode(), "arrived_s": arrived,
                                        "update": None if u is None else u.model_dump(mode="json")}) + "\n")
        return {name: (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:] for name in self.workers}

    async def wait_through(self, through_ms: int, timeout_s: float) -> None:
        def done(records: list[LimitUpdate]) -> bool:
            newest: dict[str, int] = {}
            for u in records:
                newest[u.pool] = max(newest.get(u.pool, 0), u.version)
            return len(newest) == len(POOLS) and min(newest.values()) >= through_ms

        await self.collected.wait_for(done, timeout_s)
        await self.uninterrupted.wait_for(done, timeout_s)


@dataclasses.dataclass(frozen=True)
class Sent:
    update: LimitUpdate
    worker: str
    arrived_s: float


def _by_pool(collector: harness.Collector) -> dict[str, list[Sent]]:
    out: dict[str, list[Sent]] = defaultdict(list)
    for update, headers, arrived in zip(collector.records, collector.headers, collector.arrived_s):
        assert WORKER_HEADER in headers, f"a limit update without the {WORKER_HEADER} header: {headers}"
        out[update.pool].append(Sent(update, headers[WORKER_HEADER].decode(), arrived))
    return dict(out)


def _fields_that_differ(got: LimitUpdate | None, want: LimitUpdate | None) -> object:
    """The first differing update, field by field (an entitlement's fields by name), for the assertion's message."""
    if got is None or want is None:
        return {"got": got, "want": want}
    g, w = got.model_dump(), want.model_dump()
    out: dict[str, object] = {k: (g[k], w[k]) for k in g if k != "entitlements" and g[k] != w[k]}
    for ge, we in zip(g["entitlements"], w["entitlements"], strict=False):
        out |= {f"{ge['name']}.{k}": (ge[k], we[k]) for k in ge if ge[k] != we[k]}
    return out


def _check(run: Run, through_ms: int, logs: dict[str, str]) -> dict[str, list[str]]:
    """What holds in every scenario; per pool, the workers that published it in turn (runs of one sender)."""
    sent = _by_pool(run.collected)
    assert set(sent) == set(POOLS), logs
    # a record the machine's load made late is late for both runs alike (the copies share a timestamp), whichever
    # worker read it: so the runs' updates may be compared
    # (a set: a worker that takes over re-reads from the last commit, so it may dead-letter a record again)
    late = [{(d.source_topic.split(".", 1)[1], d.partition, d.offset, d.element, d.reason) for d in c.records}
            for c in run.dead]
    assert late[0] == late[1], late
    reference = {(u.pool, u.version): u for u in run.uninterrupted.records if u.version <= through_ms}
    turns: dict[str, list[str]] = {}
    for pool, records in sent.items():
        first: dict[int, LimitUpdate] = {}
        newest = None
        for i, s in enumerate(records):  # in the order the pool's partition holds them
            v = s.update.version
            if v in first:  # published again by a worker that took over: the very same update
                assert s.update == first[v], (pool, v, s.worker)
                continue
            assert newest is None or v > newest, f"{pool}: version {v} after {newest}: a version went back"
            if newest is not None and v != newest + TICK_MS:
                # a catch-up tick computes every window but publishes only its newest ``max_updates_per_tick`` (the
                # topic is compacted): a gap only before that many consecutive versions of one worker, each equal
                # to the uninterrupted run's (below); its windows count as late as the first one skipped
                burst = records[i:i + CATCH_UP]
                assert [r.update.version for r in burst] == [v + k * TICK_MS for k in range(CATCH_UP)] and {
                    r.worker for r in burst} == {s.worker}, f"{pool}: version {v} after {newest}: a window skipped"
            first[v] = s.update
            newest = v
        merged = {(pool, v): u for v, u in first.items() if v <= through_ms}
        expected = {k: u for k, u in reference.items() if k[0] == pool}
        differ = sorted(k[1] for k in merged.keys() | expected.keys() if merged.get(k) != expected.get(k))
        assert not differ, (pool, differ[:3], _fields_that_differ(merged.get((pool, differ[0])),
                                                                expected.get((pool, differ[0]))), logs)
        senders = [s.worker for s in records]
        turns[pool] = [w for i, w in enumerate(senders) if i == 0 or w != senders[i - 1]]
        assert len(turns[pool]) == len(set(turns[pool])), f"{pool}: workers took turns {turns[pool]}: interleaved"
    return turns


def _lateness_s(run: Run, pools: set[str], since_s: float) -> float:
    """The longest time after a window's deadline (end + grace) its update first arrived, over ``pools``'
    windows whose deadline is after ``since_s``: how long those pools went without their updates."""
    worst = 0.0
    for pool, records in _by_pool(run.collected).items():
        newest = None
        for s in records:
            v = s.update.version
            if pool in pools and (newest is None or v > newest):
                # the windows a catch-up skipped (``_check``) waited for this update too
                for version in range(v if newest is None else newest + TICK_MS, v + 1, TICK_MS):
                    deadline_s = (version + GRACE_MS) / 1000
                    if deadline_s >= since_s:
                        worst = max(worst, s.arrived_s - deadline_s)
                newest = v
    return worst


def _report(tmp: Path, name: str, **values: object) -> None:
    """The measured figures, printed (``pytest -s``) and kept in the test's directory."""
    line = json.dumps({"test": name, **values})
    print(line)
    (tmp / "measured.json").write_text(line)


def test_the_pools_partitions_are_as_the_test_assumes() -> None:
    assert {pool: (murmur2(pool.encode()) & 0x7FFFFFFF) % PARTITIONS for pool in POOLS} == POOLS


async def test_two_workers_each_publish_their_own_pools_and_nothing_is_missed(kafka_bootstrap: str,
                                                                               tmp_path: Path) -> None:
    run = Run(tmp_path, kafka_bootstrap)
    windows = 8
    try:
        await run.start()
        ids = {run.add("a"): "a", run.add("b"): "b"}
        await harness.wait_for_group(kafka_bootstrap, run.group, 2, STARTUP_S)
        await harness.wait_for_group(kafka_bootstrap, f"agents-ref-{run.uid}", 1, STARTUP_S)
        base_ms = (int(time.time()) + LEAD_S) * 1000
        through = base_ms + (windows + 2) * TICK_MS  # two empty windows after the stream
        await run.produce(_events(base_ms, windows))
        await run.wait_through(through, (through + GRACE_MS) / 1000 - time.time() + 2 * REBALANCE_S + STARTUP_S)
    finally:
        logs = await run.stop()
    turns = _check(run, through, logs)
    assert all(len(t) == 1 for t in turns.values()), f"a pool changed hands in a stable group: {turns}"
    owners = {pool: ids[t[0]] for pool, t in turns.items()}
    assert set(owners.values()) == {"a", "b"}, f"one worker has every pool: {owners}"
    lateness = _lateness_s(run, set(POOLS), 0)
    _report(tmp_path, "two_workers", owners=owners, worst_lateness_s=round(lateness, 3))
    assert lateness <= 2 * TICK_MS / 1000, f"an update came {lateness:.2f} s after its window's deadline"


async def test_a_killed_workers_pools_resume_from_the_other_with_the_same_state(kafka_bootstrap: str,
                                                                                tmp_path: Path) -> None:
    run = Run(tmp_path, kafka_bootstrap)
    windows = 14
    try:
        await run.start()
        ids = {run.add("a"): "a", run.add("b"): "b"}
        await harness.wait_for_group(kafka_bootstrap, run.group, 2, STARTUP_S)
        await harness.wait_for_group(kafka_bootstrap, f"agents-ref-{run.uid}", 1, STARTUP_S)
        base_ms = (int(time.time()) + LEAD_S) * 1000
        through = base_ms + (windows + 2) * TICK_MS
        producing = asyncio.create_task(run.produce(_events(base_ms, windows)))
        cut = base_ms + 5 * TICK_MS  # every pool has had five windows: the kill is under load
        await run.collected.wait_for(lambda r: len({u.pool for u in r if u.version >= cut}) == len(POOLS),
                                     (cut + GRACE_MS) / 1000 - time.time() + STARTUP_S)
        before = _by_pool(run.collected)
        victim = ids[before["pool-0"][-1].worker]  # the worker of one pool (both have some: test above)
        harness.kill(run.workers[victim])
        killed_s = time.time()
        victims = {pool for pool, records in before.items() if ids[records[-1].worker] == victim}
        await producing
        await run.wait_through(through, (through + GRACE_MS) / 1000 - time.time() + SESSION_S + REBALANCE_S
                               + STARTUP_S)
    finally:
        logs = await run.stop()
    turns = _check(run, through, logs)
    survivor = "b" if victim == "a" else "a"
    for pool, t in turns.items():  # the victim's pools change hands once, the survivor's never
        assert [ids[w] for w in t] == ([victim, survivor] if pool in victims else [survivor]), (pool, t)
    lateness = _lateness_s(run, victims, killed_s)
    ticks = lateness / (TICK_MS / 1000)
    _report(tmp_path, "kill", victims=sorted(victims), worst_lateness_s=round(lateness, 3),
            worst_lateness_ticks=round(ticks, 2), session_timeout_s=SESSION_S)
    # the group notices the loss after the session timeout; the survivor has the pools ticking within two ticks of
    # the rebalance that follows
    bound_s = SESSION_S + REBALANCE_S + 2 * TICK_MS / 1000
    assert lateness <= bound_s, f"the pools went {lateness:.2f} s without updates (bound {bound_s} s)"


async def test_a_worker_added_to_a_running_one_takes_pools_over_with_the_same_state(kafka_bootstrap: str,
                                                                                    tmp_path: Path) -> None:
    run = Run(tmp_path, kafka_bootstrap)
    windows = 14
    try:
        await run.start()
        ids = {run.add("a"): "a"}
        await harness.wait_for_group(kafka_bootstrap, run.group, 1, STARTUP_S)
        await harness.wait_for_group(kafka_bootstrap, f"agents-ref-{run.uid}", 1, STARTUP_S)
        base_ms = (int(time.time()) + LEAD_S) * 1000
        through = base_ms + (windows + 2) * TICK_MS
        producing = asyncio.create_task(run.produce(_events(base_ms, windows)))
        cut = base_ms + 4 * TICK_MS
        await run.collected.wait_for(lambda r: len({u.pool for u in r if u.version >= cut}) == len(POOLS),
                                     (cut + GRACE_MS) / 1000 - time.time() + STARTUP_S)
        ids[run.add("b")] = "b"
        await harness.wait_for_group(kafka_bootstrap, run.group, 2, STARTUP_S)  # B joined: the rebalance begins
        joined_s = time.time()
        await producing
        await run.wait_through(through, (through + GRACE_MS) / 1000 - time.time() + 2 * REBALANCE_S + STARTUP_S)
    finally:
        logs = await run.stop()
    turns = _check(run, through, logs)
    moved = {pool for pool, t in turns.items() if [ids[w] for w in t] == ["a", "b"]}
    assert moved and all([ids[w] for w in t] in (["a"], ["a", "b"]) for t in turns.values()), turns
    assert moved != set(POOLS), f"every pool moved to the new worker: {turns}"
    # the rebalance began before the group was seen Stable: measure from a rebalance's length before that
    lateness = _lateness_s(run, set(POOLS), joined_s - REBALANCE_S)
    _report(tmp_path, "add", moved=sorted(moved), worst_lateness_s=round(lateness, 3),
            worst_lateness_ticks=round(lateness / (TICK_MS / 1000), 2))
    bound_s = REBALANCE_S + 2 * TICK_MS / 1000
    assert lateness <= bound_s, f"pools went {lateness:.2f} s without updates in the rebalance (bound {bound_s} s)"
