"""A sharded pool through the agents' Faust-free shell (``streams.processor``), on two workers that own half the
partitions each: both fold events, the pool's own worker alone publishes, and what it publishes equals what one
worker publishes for the same pool unsharded (the pure stages' equality is ``test_streams_sharded.py``)."""

from __future__ import annotations

from test_streams_sharded import BASE_MS, ENTITLEMENTS, POOL, PROXIES, _completed, _config, _decided

from tokenpools.config import load_config_text
from tokenpools.runtime.clock import FakeClock
from tokenpools.runtime.deadletter import DeadLetters
from tokenpools.runtime.specs import Catalogue
from tokenpools.streams.metrics import StreamMetrics
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.processor import DictStore, PoolProcessor, RawEvent
from tokenpools.streams.views import ProxyBook
from tokenpools.topics.codec import encode
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.records import BackendMetricsSample, Record
from tokenpools.topics.shards import event_key
from tokenpools_dev.streams import scripted

PARAMS = StreamParams(width_ms=1000, grace_ms=300, max_updates_per_tick=1000)
TOPICS = topics_for("t.", partitions=8)
SHARDS = 4


PLACEMENT = {POOL: 0, f"{POOL}#0": 1, f"{POOL}#1": 2, f"{POOL}#2": 3, f"{POOL}#3": 4}  # (stands in for murmur2)


def partition_of(key: str) -> int:
    return PLACEMENT.get(key, 7)


def worker(shards: int, active: set[int] | None):
    config = _config().replace("  defaults: {maxTokens: 64}\n", f"  defaults: {{maxTokens: 64}}\n  shards: {shards}\n", 1)
    sent, metrics = scripted.Sent(), StreamMetrics()
    dead = DeadLetters(TOPICS.dead_letters.name, "agents-test", FakeClock(BASE_MS), send=sent,
                       count=metrics.count_dead_letter)
    proc = PoolProcessor(PARAMS, TOPICS, Catalogue.from_loaded(load_config_text(config)), ProxyBook(), DictStore(),
                         sent, dead, metrics, partition_of=partition_of)
    return proc, sent, active


def events() -> list[tuple[Record, int]]:
    out: list[tuple[Record, int]] = []
    for i in range(300):
        t = BASE_MS + 23 * i
        entitlement, proxy = ENTITLEMENTS[i % len(ENTITLEMENTS)], PROXIES[i % 2]
        out.append((_decided(i, t, entitlement, proxy, i % 6 != 0, 40 + i % 50), t + 5))
        if i % 6 != 0:
            out.append((_completed(i, t + 400, entitlement, proxy, 10 + i % 30), t + 410))
        if i % 40 == 0:
            out.append((BackendMetricsSample(pool=POOL, t_ms=t, replicas_ready=1, waiting=float(i % 3)), t + 1))
    return sorted(out, key=lambda e: e[1])


async def run(workers, shards: int, ticks: list[int]) -> None:
    offsets: dict[tuple[str, int], int] = {}
    log = events()
    at = 0
    for now in ticks:
        batch = []
        while at < len(log) and log[at][1] <= now:
            batch.append(log[at])
            at += 1
        per_worker: dict[int, list[RawEvent]] = {}
        for record, ts in batch:
            key = event_key(POOL, getattr(record, "entitlement", None), shards)
            topic = TOPICS.backend_metrics.name if isinstance(record, BackendMetricsSample) else TOPICS.requests.name
            partition = partition_of(key)
            offset = offsets[(topic, partition)] = offsets.get((topic, partition), -1) + 1
            owner = next(i for i, (_, _, active) in enumerate(workers) if active is None or partition in active)
            per_worker.setdefault(owner, []).append(RawEvent(topic, partition, offset, ts, key.encode(),
                                                             encode(record)))
        for i, raws in per_worker.items():
            await workers[i][0].process(raws)
        seen = [len(sent.records) for _, sent, _ in workers]
        for proc, _, active in workers:  # stage 1 closes (and, for one shard, the pool ticks)
            await proc.tick(now, None, active)
        for (_, sent, _), since in zip(workers, seen):  # the summaries to the pool's own partition's worker
            for topic, key, value in sent.records[since:]:
                if topic != TOPICS.usage_windows.name:
                    continue
                partition = partition_of(key.decode())
                offset = offsets[(topic, partition)] = offsets.get((topic, partition), -1) + 1
                owner = next(w for w in workers if w[2] is None or partition in w[2])
                await owner[0].process([RawEvent(topic, partition, offset, now, key, value)])
        for proc, _, active in workers:  # the decision ticks once its shards' summaries are in
            await proc.tick(now, None, active)


def published(sent: scripted.Sent) -> list[tuple[str, bytes, bytes | None]]:
    return [r for r in sent.records if r[0] in (TOPICS.limits.name, TOPICS.scale.name, TOPICS.effective_limits.name)]


async def test_two_workers_fold_a_sharded_pool_and_one_publishes_what_one_worker_does_unsharded():
    ticks = [BASE_MS + 1_500, BASE_MS + 2_700, BASE_MS + 4_400, BASE_MS + 6_000, BASE_MS + 9_000, BASE_MS + 12_000]
    single = worker(1, None)
    await run([single], 1, ticks)
    expected = published(single[1])
    assert len([r for r in expected if r[0] == TOPICS.limits.name]) >= 6

    evens, odds = {0, 2, 4, 6}, {1, 3, 5, 7}
    workers = [worker(SHARDS, evens), worker(SHARDS, odds)]
    shard_owner = {partition_of(f"{POOL}#{k}") % 2 for k in range(SHARDS)}
    assert shard_owner == {0, 1}  # the shards are on both workers' partitions
    await run(workers, SHARDS, ticks)
    pool_worker = partition_of(POOL) % 2
    assert published(workers[pool_worker][1]) == expected
    assert published(workers[1 - pool_worker][1]) == []
    for proc, sent, _ in workers:  # both folded events of the pool, and sent its shards' summaries
        assert proc.metrics.events.labels("request_decided")._value.get() > 0
        assert any(t == TOPICS.usage_windows.name for t, _, _ in sent.records)
