"""The agents' topic set-up against a real broker: missing topics created as declared (``kafka.topic_partitions``
for the pool-keyed ones), existing ones with fewer partitions refused with a log line per topic, never grown."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from aiokafka.admin import NewTopic

from tokenpools.config import KafkaSettings
from tokenpools.errors import PermanentError
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.streams.admin import ensure_topics

pytestmark = pytest.mark.integration


async def _partitions(kafka: KafkaClients, names: list[str]) -> dict[str, int]:
    """Partition counts of those topics that exist (describing a missing one would auto-create it on this broker)."""
    admin = kafka.admin("test-describe")
    await admin.start()
    try:
        existing = set(await admin.list_topics()) & set(names)
        return {d["topic"]: len(d["partitions"]) for d in await admin.describe_topics(sorted(existing))}
    finally:
        await admin.close()


async def test_missing_topics_are_created_with_the_configured_partitions(kafka_bootstrap: str) -> None:
    kafka = KafkaClients(KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=f"adm-{uuid.uuid4().hex[:8]}.",
                                       topic_partitions=6))
    topics = kafka.topics()
    assert await ensure_topics(kafka, topics) == 6
    counts = await _partitions(kafka, [t.name for t in topics.all()])
    assert counts == {t.name: 6 if t.scaled else 1 for t in topics.all()}
    assert await ensure_topics(kafka, topics) == 6  # again: nothing to create, nothing refused


async def test_existing_topics_with_fewer_partitions_are_refused_and_named_not_grown(
        kafka_bootstrap: str, caplog: pytest.LogCaptureFixture) -> None:
    prefix = f"adm-{uuid.uuid4().hex[:8]}."
    old = KafkaClients(KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, topic_partitions=2))
    admin = old.admin("test-create")
    await admin.start()
    try:  # a deployment made before the default grew: two topics exist with 2 partitions
        await admin.create_topics([NewTopic(f"{prefix}{n}", 2, 1) for n in ("requests", "limits")])
    finally:
        await admin.close()
    while len(await _partitions(old, [f"{prefix}requests", f"{prefix}limits"])) < 2:  # until listed
        await asyncio.sleep(0.1)
    new = KafkaClients(KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix, topic_partitions=4))
    with caplog.at_level(logging.ERROR, logger="tokenpools.streams.admin"), pytest.raises(PermanentError) as refused:
        await ensure_topics(new, new.topics())
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        f"topic {prefix}requests has 2 partitions, wants 4", f"topic {prefix}limits has 2 partitions, wants 4"]
    assert "set kafka.topic_partitions to 2 to keep the topics as they are" in str(refused.value)
    counts = await _partitions(new, [t.name for t in new.topics().all()])
    assert counts == {f"{prefix}requests": 2, f"{prefix}limits": 2}, "nothing grown, nothing created"
    assert await ensure_topics(old, old.topics()) == 2  # told to keep them: the worker starts on 2
