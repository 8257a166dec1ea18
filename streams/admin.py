"""Create the declared topics that do not exist yet, and check the pool-keyed ones are co-partitioned.

The agents' state table is partitioned like its source topics (one pool's requests, completions, metrics,
limits and scale commands share a partition number), so the worker refuses to start if the existing source
topics disagree on their partition count; it returns the count the table must use. The admin client is the
runtime's (``KafkaClients.admin``), so topic creation reaches a secured cluster like every other client.
"""

from __future__ import annotations

import logging

from tokenpools.errors import PermanentError, RetryableError
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.topics.declarations import Topics

log = logging.getLogger(__name__)


def source_topics(topics: Topics) -> tuple[str, ...]:
    """The co-partitioned topics the pool agent consumes, requests first."""
    return (topics.requests.name, topics.completions.name, topics.backend_metrics.name)


async def ensure_topics(kafka: KafkaClients, topics: Topics, timeout_s: float = 30.0, client: str = "admin") -> int:
    """Create missing topics as declared; the partition count shared by the source topics. ``client`` is the
    admin client's id suffix."""
    from aiokafka.admin import NewTopic
    from aiokafka.errors import KafkaError, TopicAlreadyExistsError

    admin = kafka.admin(client, request_timeout_ms=int(timeout_s * 1000))
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        missing = [t for t in topics.all() if t.name not in existing]
        if missing:
            response = await admin.create_topics(
                [NewTopic(t.name, t.partitions, 1, topic_configs=t.config()) for t in missing])
            for name, code, message in response.topic_errors:
                if code not in (0, TopicAlreadyExistsError.errno):
                    raise PermanentError(f"cannot create topic {name}: error {code} {message}")
            log.info("created topics %s", ", ".join(t.name for t in missing))
        counts = await _partition_counts(admin, source_topics(topics), timeout_s)
    except KafkaError as exc:
        raise RetryableError(f"Kafka at {kafka.bootstrap_servers} is not reachable: {exc!r}", delay_s=1.0) from None
    finally:
        await admin.close()
    if len(set(counts.values())) != 1 or 0 in counts.values():
        raise PermanentError(f"source topics must have one partition count (co-partitioned by pool), got {counts}")
    return next(iter(counts.values()))


async def _partition_counts(admin: object, names: tuple[str, ...], timeout_s: float) -> dict[str, int]:
    """Partition counts, waiting (briefly) for just-created topics to show their partitions in the metadata."""
    import asyncio
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        described = await admin.describe_topics(list(names))  # type: ignore[attr-defined]
        counts = {d["topic"]: len(d["partitions"]) for d in described}
        if all(counts.get(n) for n in names) or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.1)
