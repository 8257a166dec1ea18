"""The project's dev broker behaves like the Kafka the streams and the proxy rely on.

Topics with partitions and compaction, ordered idempotent produce, consumer-group offsets, and data
that survives the broker crashing and coming back on the same port -- the basis of later fault tests.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from aiokafka.structs import RecordMetadata

from tokenpools_dev.devstack.kafka import KAFKA_VERSION, KafkaBroker, probe_metadata, probe_serving, tcp_open
from tokenpools_dev.kafka import local_kafka

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30.0
KeyValue = tuple[bytes, bytes | None]


def unique(prefix: str) -> str:
    """Topic and group names are per test, so tests never see each other's data on a shared broker."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@asynccontextmanager
async def admin_client(bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = local_kafka(bootstrap).admin("test-admin")
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def create_topics(bootstrap: str, *topics: NewTopic) -> None:
    async with admin_client(bootstrap) as admin:
        response = await admin.create_topics(list(topics))
    errors = [(name, code, msg) for name, code, msg in response.topic_errors if code != 0]
    assert not errors, errors


async def produce(bootstrap: str, topic: str, records: Sequence[KeyValue], partition: int | None = None) -> list[RecordMetadata]:
    """Pipelined sends (all in flight at once) through an idempotent acks=all producer."""
    producer = local_kafka(bootstrap).producer("test-producer", enable_idempotence=True, acks="all")
    await producer.start()
    try:
        futures = [await producer.send(topic, key=k, value=v, partition=partition) for k, v in records]
        return list(await asyncio.gather(*futures))
    finally:
        await producer.stop()


def group_consumer(bootstrap: str, topic: str, group: str, **options: Any) -> AIOKafkaConsumer:
    """A (not started) member of ``group`` subscribed to ``topic``; ``options`` are aiokafka consumer arguments."""
    consumer = local_kafka(bootstrap).consumer("test-member", group_id=group, **options)
    consumer.subscribe([topic])
    return consumer


async def read_until(consumer: AIOKafkaConsumer, count: int) -> list[ConsumerRecord[bytes, bytes]]:
    records: list[ConsumerRecord[bytes, bytes]] = []
    async with asyncio.timeout(TIMEOUT_S):
        while len(records) < count:
            for batch in (await consumer.getmany(timeout_ms=500)).values():
                records.extend(batch)
    return records


async def read_partition(bootstrap: str, tp: TopicPartition) -> list[ConsumerRecord[bytes, bytes]]:
    """Everything in one partition now, from offset 0, without a group."""
    consumer = local_kafka(bootstrap).consumer("test-reader", enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        records: list[ConsumerRecord[bytes, bytes]] = []
        async with asyncio.timeout(TIMEOUT_S):
            while await consumer.position(tp) < end:
                records.extend((await consumer.getmany(tp, timeout_ms=500)).get(tp, []))
        return records
    finally:
        await consumer.stop()


def by_partition(metas: Sequence[RecordMetadata], records: Sequence[KeyValue]) -> dict[int, list[tuple[int, KeyValue]]]:
    """Produced ``(offset, (key, value))`` per partition, in send order."""
    out: dict[int, list[tuple[int, KeyValue]]] = defaultdict(list)
    for meta, record in zip(metas, records, strict=True):
        out[meta.partition].append((meta.offset, record))
    return dict(out)


def test_module_expects_the_version_the_pom_installs() -> None:
    pom = (REPO / "tools" / "kafka" / "pom.xml").read_text()
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom)
    assert match is not None and match.group(1) == KAFKA_VERSION


async def test_topics_ordered_produce_and_group_offsets(kafka_bootstrap: str) -> None:
    events, state = unique("events"), unique("state")
    await create_topics(
        kafka_bootstrap,
        NewTopic(events, num_partitions=3, replication_factor=1),
        NewTopic(state, num_partitions=3, replication_factor=1, topic_configs={"cleanup.policy": "compact"}),
    )
    async with admin_client(kafka_bootstrap) as admin:
        deadline = time.monotonic() + 10  # a just-created topic's partitions reach the metadata a moment later
        while True:
            described = {t["topic"]: t for t in await admin.describe_topics([events, state])}
            if all(t["partitions"] for t in described.values()) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        [configs] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, state)])
    assert {name: len(t["partitions"]) for name, t in described.items()} == {events: 3, state: 3}
    [(_, _, _, _, entries)] = configs.resources  # (error_code, error_message, type, name, configs)
    assert ("cleanup.policy", "compact") in {(e[0], e[1]) for e in entries}

    records = [(f"tenant-{i % 6}".encode(), str(i).encode()) for i in range(120)]
    produced = by_partition(await produce(kafka_bootstrap, events, records), records)
    assert len(produced) == 3, "six keys should hash onto all three partitions"
    for sent in produced.values():
        offsets = [offset for offset, _ in sent]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), "send order == log order"

    group = unique("group")
    consumer = group_consumer(kafka_bootstrap, events, group, auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        got = await read_until(consumer, len(records))
        consumed: dict[int, list[tuple[int, KeyValue]]] = defaultdict(list)
        for r in got:
            consumed[r.partition].append((r.offset, (r.key, r.value)))
        assert consumed == produced, "each partition comes back complete and in order"
        await consumer.commit()
        tps = [TopicPartition(events, p) for p in range(3)]
        end = await consumer.end_offsets(tps)
        committed = {tp: await consumer.committed(tp) for tp in tps}
    finally:
        await consumer.stop()
    assert committed == {tp: produced[tp.partition][-1][0] + 1 for tp in tps} == end

    async with admin_client(kafka_bootstrap) as admin:
        group_offsets = await admin.list_consumer_group_offsets(group)
    assert {tp: om.offset for tp, om in group_offsets.items()} == committed

    # A new member of the same group resumes at the committed offsets: nothing left to read.
    again = group_consumer(kafka_bootstrap, events, group, enable_auto_commit=False)
    await again.start()
    try:
        async with asyncio.timeout(TIMEOUT_S):
            while not again.assignment():
                assert not await again.getmany(timeout_ms=200)
        assert {tp: await again.position(tp) for tp in tps} == committed
        assert not await again.getmany(timeout_ms=500)
    finally:
        await again.stop()


async def test_compacted_topic_keeps_only_the_latest_value_per_key(kafka_bootstrap: str) -> None:
    topic = unique("pool-state")
    fast_compaction = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01"}
    await create_topics(kafka_bootstrap, NewTopic(topic, num_partitions=1, replication_factor=1, topic_configs=fast_compaction))
    tp = TopicPartition(topic, 0)
    updates: list[KeyValue] = [(f"pool-{k}".encode(), f"v{r}".encode()) for r in range(5) for k in range(4)]
    await produce(kafka_bootstrap, topic, [*updates, (b"gone", b"x"), (b"gone", None)])
    await asyncio.sleep(0.3)  # older than segment.ms: the next append rolls the segment, closing it for the cleaner
    await produce(kafka_bootstrap, topic, [(b"tick", b"roll")])

    latest = {f"pool-{k}".encode(): b"v4" for k in range(4)}
    async with asyncio.timeout(TIMEOUT_S):
        while True:
            records = await read_partition(kafka_bootstrap, tp)
            values = [(r.key, r.value) for r in records if r.key not in (b"tick", b"gone")]
            if sorted(values) == sorted(latest.items()) and (b"gone", b"x") not in [(r.key, r.value) for r in records]:
                break
            await asyncio.sleep(0.5)
    assert len(records) < len(updates), "superseded values were removed"


async def test_records_and_group_offsets_survive_a_broker_crash(kafka_broker: KafkaBroker) -> None:
    bootstrap = kafka_broker.bootstrap
    topic, group = unique("durable"), unique("group")
    await create_topics(bootstrap, NewTopic(topic, num_partitions=3, replication_factor=1))
    records = [(f"k{i % 6}".encode(), str(i).encode()) for i in range(30)]
    produced = by_partition(await produce(bootstrap, topic, records), records)
    tps = [TopicPartition(topic, p) for p in range(3)]
    consumer = group_consumer(bootstrap, topic, group, auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        await read_until(consumer, len(records))
        await consumer.commit()
        committed = {tp: await consumer.committed(tp) for tp in tps}
    finally:
        await consumer.stop()

    await asyncio.to_thread(kafka_broker.kill)
    assert not kafka_broker.is_running and not tcp_open(kafka_broker.port)
    await asyncio.to_thread(kafka_broker.restart)
    assert kafka_broker.bootstrap == bootstrap, "same port: clients configured before the crash reconnect"
    # restart() returned only once the node serves: registered and unfenced, leader of every partition,
    # group coordinator loaded -- so the tests after this one find a broker as good as a fresh one
    await probe_serving(bootstrap, timeout_s=5.0)

    for tp in tps:
        after = [(r.offset, (r.key, r.value)) for r in await read_partition(bootstrap, tp)]
        assert after == produced[tp.partition]
    async with admin_client(bootstrap) as admin:
        group_offsets = await admin.list_consumer_group_offsets(group)
    assert {tp: om.offset for tp, om in group_offsets.items()} == committed
    [meta] = await produce(bootstrap, topic, [(b"k0", b"after-restart")], partition=0)
    assert meta.offset == committed[tps[0]]


async def test_paused_broker_stops_answering_until_resumed(kafka_broker: KafkaBroker) -> None:
    await asyncio.to_thread(kafka_broker.pause)
    try:
        with pytest.raises((TimeoutError, KafkaError)):
            await probe_metadata(kafka_broker.bootstrap, timeout_s=1.0)
    finally:
        await asyncio.to_thread(kafka_broker.resume)
    await probe_metadata(kafka_broker.bootstrap, timeout_s=TIMEOUT_S)
