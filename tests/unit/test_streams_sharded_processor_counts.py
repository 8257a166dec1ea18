"""A sharded pool's counts through the agents' Faust-free shell (``streams.processor``, docs/scaling.md step 4): on
two workers owning half the partitions each, every shard's worker publishes a record of its shard once it has read
the pool's limit update from the limits topic (``streams.readers.apply_limits``), and the shards' records together
carry what one worker publishes for the pool unsharded, its active proxies included."""

from __future__ import annotations

from test_streams_sharded_processor import BASE_MS, POOL, SHARDS, TOPICS, partition_of, run, worker

from tokenpools.streams.processor import RawEvent
from tokenpools.streams.readers import apply_limits
from tokenpools.topics.counts import CountsRecord, decode_counts, owned, pool_active_of
from tokenpools.topics.limits import PageAssembler

TICKS = [BASE_MS + 1_500, BASE_MS + 2_700, BASE_MS + 4_400, BASE_MS + 6_000, BASE_MS + 7_500]
NOW = BASE_MS + 7_000  # its counts instant (NOW − grace) has requests in flight


def counts_sent(sent) -> list[CountsRecord]:
    return [decode_counts(value) for topic, key, value in sent.records
            if topic == TOPICS.counts.name and key == POOL.encode()]


async def test_each_shards_worker_publishes_its_shards_counts_and_together_they_are_the_pools():
    single = worker(1, None)
    await run([single], 1, TICKS)
    assert await single[0].publish_counts(NOW)
    [whole] = counts_sent(single[1])
    assert whole.shards == 1

    evens, odds = {0, 2, 4, 6}, {1, 3, 5, 7}
    workers = [worker(SHARDS, evens), worker(SHARDS, odds)]
    await run(workers, SHARDS, TICKS)
    pool_worker = workers[partition_of(POOL) % 2]
    limits = [(key, value) for topic, key, value in pool_worker[1].records if topic == TOPICS.limits.name]
    assert limits
    for proc, _, _ in workers:  # every worker reads the limits topic whole (the pool's decision is on one of them)
        assembler = PageAssembler()
        for offset, (key, value) in enumerate(limits):
            await apply_limits(proc, assembler, proc.dead_letters, RawEvent(TOPICS.limits.name, 0, offset, NOW, key,
                                                                           value))
    for i, (proc, _, _) in enumerate(workers):  # each publishes the shards on its partitions, and only those
        mine = {k for k in range(SHARDS) if partition_of(f"{POOL}#{k}") % 2 == i}
        assert mine and {r.shard for r in await proc.publish_counts(NOW)} == mine
    parts = {r.shard: r for _, sent, _ in workers for r in counts_sent(sent)}
    assert sorted(parts) == list(range(SHARDS))
    names = [e.name for e in single[0].counts._published[POOL].entitlements]  # noqa: SLF001 - the order the records follow
    row = {n: (whole.in_flight[i], whole.active[i], whole.bucket_tokens[i]) for i, n in enumerate(names)}
    for k, part in parts.items():
        assert (part.t_ms, part.limits_version, part.shards) == (whole.t_ms, whole.limits_version, SHARDS)
        for i, n in enumerate(owned(names, k, SHARDS)):
            assert (part.in_flight[i], part.active[i], part.bucket_tokens[i]) == row[n]
    assert sum(p.pool_in_flight for p in parts.values()) == whole.pool_in_flight
    assert pool_active_of(parts.values()) == whole.pool_active  # the distinct ids over the shards
    assert whole.pool_in_flight > 0 and whole.pool_active > 0
