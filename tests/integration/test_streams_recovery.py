"""Recovery: the worker (``python -m tokenpools agents``) is SIGKILLed mid-stream and a new one takes over.

A live scripted stream (two entitlements, tick_s=1, grace_s=0.3) is produced twice, to two sets of topics: one
served by worker A, killed after a few windows and replaced by worker B; the other by worker C, never interrupted.
B must restore the pool's state from the table's changelog (A had committed offsets, so B does not re-read the
early events) and publish, window after window, exactly the updates C publishes, which are also what the core's
functions give for the same events. Updates A had published and B publishes again are identical.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from tokenpools.config import KafkaSettings, load_config_text
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.streams.admin import ensure_topics
from tokenpools.streams.table.params import StreamParams
from tokenpools.topics.codec import decode_any
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.records import DeadLetter, Record
from tokenpools_dev.kafka import local_kafka
from tokenpools_dev.streams import harness
from tokenpools_dev.streams import scripted

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOWS = 12


async def test_killed_worker_is_replaced_and_the_next_updates_equal_an_uninterrupted_run(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    uid = uuid.uuid4().hex[:8]
    killed, reference = topics_for(f"rec-{uid}.", partitions=2), topics_for(f"ref-{uid}.", partitions=2)
    for topics in (killed, reference):
        await ensure_topics(KafkaClients(KafkaSettings(bootstrap_servers=kafka_bootstrap)), topics)
    config = tmp_path / "pool.yaml"
    config.write_text(scripted.CONFIG_YAML)
    common = ["streams.tick_s=1", "streams.grace_s=0.3", f"kafka.bootstrap_servers={kafka_bootstrap}",
              f"kafka.topic_partitions={killed.requests.partitions}"]  # as created: fewer would be refused
    group = f"agents-{uid}"
    ab = [*common, f"kafka.topic_prefix={killed.requests.name.removesuffix('requests')}", f"streams.app_id={group}"]
    c = [*common, f"kafka.topic_prefix={reference.requests.name.removesuffix('requests')}",
         f"streams.app_id=agents-ref-{uid}"]
    base_ms = (int(time.time()) + 4) * 1000
    events = scripted.scripted_events(base_ms, 1000, scripted.two_class_phases(WINDOWS))
    through = base_ms + (WINDOWS + 2) * 1000  # two empty windows after the stream

    collected = harness.Collector(kafka_bootstrap, killed.limits.name, partitions=killed.limits.partitions)
    uninterrupted = harness.Collector(kafka_bootstrap, reference.limits.name, partitions=reference.limits.partitions)
    dead = [harness.Collector(kafka_bootstrap, t.dead_letters.name, DeadLetter) for t in (killed, reference)]
    workers = {"a": harness.start_worker(config, ab, tmp_path / "a.log"), "c": harness.start_worker(config, c, tmp_path / "c.log")}
    try:
        for collector in (collected, uninterrupted, *dead):
            await collector.start()
        producing = asyncio.create_task(harness.produce(kafka_bootstrap, [killed, reference], events, live=True,
                                                  pack_events=10))  # packed as a proxy packs them
        await collected.wait_for(lambda r: any(u.version >= base_ms + 5_000 for u in r), 40)
        harness.kill(workers["a"])
        from_a = list(collected.records)
        committed = await _committed(kafka_bootstrap, group)
        workers["b"] = harness.start_worker(config, ab, tmp_path / "b.log")
        await producing
        await collected.wait_for(lambda r: r[-1].version >= through, 60)
        await uninterrupted.wait_for(lambda r: r[-1].version >= through, 30)
    finally:
        for name, process in workers.items():
            harness.stop(process)
        for collector in (collected, uninterrupted, *dead):
            await collector.stop()
        logs = {name: (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:] for name in workers}

    assert max(committed.values(), default=0) > 0, f"A had committed no offset: B could just re-read. {logs['a']}"
    from_b = collected.records[len(from_a):]
    by_version_a = {u.version: u for u in from_a}
    for update in from_b:
        if update.version in by_version_a:  # re-published after the restart: the same update
            assert update == by_version_a[update.version]
    assert from_b[0].version <= max(by_version_a) + 1000, "no window skipped across the restart"
    merged = {u.version: u for u in from_a + from_b if u.version <= through}
    reference_run = {u.version: u for u in uninterrupted.records if u.version <= through}
    assert sorted(merged) == sorted(reference_run), logs
    assert merged == reference_run, logs

    # a record the machine's load made late is late for both runs alike (its Kafka timestamp says so): the core's
    # prediction is then for the records the agents counted
    late = [{_identity(decode_any(d.payload)) for d in collector.records} for collector in dead]
    assert late[0] == late[1]
    loaded = load_config_text(scripted.CONFIG_YAML)
    params = StreamParams(width_ms=1000, grace_ms=300)
    counted = [r for r, _ in events if _identity(r) not in late[0]]
    expected = scripted.reference_updates(loaded.pools[scripted.POOL], loaded.entitlements_of(scripted.POOL), counted, params,
                                   through // 1000 - 1)
    assert [merged[u.version] for u in expected] == expected


def _identity(record: Record) -> tuple[str, str]:
    return record.record_type, getattr(record, "request_id", str(getattr(record, "t_ms", "")))  # type: ignore[attr-defined]


async def _committed(bootstrap: str, group: str) -> dict[str, int]:
    admin = local_kafka(bootstrap).admin("test-admin")
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {f"{tp.topic}/{tp.partition}": meta.offset for tp, meta in offsets.items() if "requests" in tp.topic}
