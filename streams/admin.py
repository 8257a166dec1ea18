"""Create the declared topics that do not exist yet, refuse existing ones with too few partitions, and check the
pool-keyed ones are co-partitioned.

The agents' state table is partitioned like its source topics (one pool's requests, completions, metrics,
limits and scale commands share a partition number), so the worker refuses to start if the existing source
topics disagree on their partition count; it returns the count the table must use. An existing topic with fewer
partitions than declared (``kafka.topic_partitions``) is refused too, each one logged with what it has and what
is wanted: adding partitions moves pools to other partitions, away from their state and their earlier events, so
it is the operator's step (topics/README.md#partitions), never a side effect of a start. More partitions than
declared are used as they are. The admin client is the runtime's (``KafkaClients.admin``), so topic creation
reaches a secured cluster like every other client.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from tokenpools.errors import PermanentError, RetryableError
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.topics.declarations import Topics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Shortfall:
    """An existing topic with fewer partitions than declared."""

    topic: str
    has: int
    wants: int


def shortfalls(topics: Topics, counts: Mapping[str, int]) -> list[Shortfall]:
    """The declared topics whose partition count in ``counts`` (0 or absent: not known) is below the declaration."""
    return [Shortfall(t.name, counts[t.name], t.partitions) for t in topics.all()
            if 0 < counts.get(t.name, 0) < t.partitions]


def refusal(short: list[Shortfall]) -> str:
    """Why the worker does not start, and the two ways out."""
    listed = ", ".join(f"{s.topic} has {s.has}, wants {s.wants}" for s in short)
    return (f"{len(short)} existing topic(s) have fewer partitions than declared: {listed}. Adding partitions moves "
            f"pools to other partitions, away from their state and their earlier events, so tokenpools does not do it "
            f"at start-up: set kafka.topic_partitions to {min(s.has for s in short)} to keep the topics as they are, "
            f"or grow them while the agents are stopped (topics/README.md, section Partitions)")


def source_topics(topics: Topics) -> tuple[str, ...]:
    """The co-partitioned topics the pool agent consumes, requests first; usage-windows carries the window summaries
    of sharded pools to each pool's decision, on the partition of the pool's own key (docs/scaling.md)."""
    return (topics.requests.name, topics.completions.name, topics.backend_metrics.name, topics.usage_windows.name)


async def ensure_topics(kafka: KafkaClients, topics: Topics, timeout_s: float = 30.0, client: str = "admin") -> int:
    """Create missing topics as declared, refuse existing ones with fewer partitions (PermanentError, each one
    logged); the partition count shared by the source topics. ``client`` is the admin client's id suffix."""
    from aiokafka.admin import NewTopic
    from aiokafka.errors import KafkaError, TopicAlreadyExistsError

    admin = kafka.admin(client, request_timeout_ms=int(timeout_s * 1000))
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        present = (t.name for t in topics.all() if t.name in existing)
        # before creating anything: a refused start leaves the topics as it found them
        _refuse_shortfalls(topics, await _partition_counts(admin, dict.fromkeys(present, 1), timeout_s))
        missing = [t for t in topics.all() if t.name not in existing]
        created: dict[str, int] = {}
        if missing:
            response = await admin.create_topics(
                [NewTopic(t.name, t.partitions, 1, topic_configs=t.config()) for t in missing])
            raced = set()  # made meanwhile by another process (or a client's auto-creation): checked below
            for name, code, message in response.topic_errors:
                if code == TopicAlreadyExistsError.errno:
                    raced.add(name)
                elif code != 0:
                    raise PermanentError(f"cannot create topic {name}: error {code} {message}")
            created = {t.name: t.partitions for t in missing if t.name not in raced}
            if created:
                log.info("created topics %s", ", ".join(created))
        # a new topic's partitions show up in the metadata one by one: wait for all of them
        counts = await _partition_counts(admin, {t.name: created.get(t.name, 1) for t in topics.all()}, timeout_s)
        _refuse_shortfalls(topics, counts)
    except KafkaError as exc:
        raise RetryableError(f"Kafka at {kafka.bootstrap_servers} is not reachable: {exc!r}", delay_s=1.0) from None
    finally:
        await admin.close()
    for t in topics.all():
        if counts.get(t.name, 0) > t.partitions:
            log.info("topic %s has %d partitions, more than the %d declared: used as they are", t.name,
                     counts[t.name], t.partitions)
    sources = {name: counts.get(name, 0) for name in source_topics(topics)}
    if len(set(sources.values())) != 1 or 0 in sources.values():
        raise PermanentError(f"source topics must have one partition count (co-partitioned by pool), got {sources}")
    return next(iter(sources.values()))


def _refuse_shortfalls(topics: Topics, counts: Mapping[str, int]) -> None:
    """Log each existing topic with fewer partitions than declared, then raise PermanentError if there is one."""
    short = shortfalls(topics, counts)
    for s in short:
        log.error("topic %s has %d partitions, wants %d (kafka.topic_partitions): refused, see topics/README.md "
                  "section Partitions", s.topic, s.has, s.wants)
    if short:
        raise PermanentError(refusal(short))


async def _partition_counts(admin: object, least: dict[str, int], timeout_s: float) -> dict[str, int]:
    """Partition counts of the topics ``least`` names, waiting (briefly) until each shows at least that many in the
    metadata (a just-created topic shows its partitions one by one)."""
    import asyncio
    import time

    if not least:
        return {}
    deadline = time.monotonic() + timeout_s
    while True:
        described = await admin.describe_topics(list(least))  # type: ignore[attr-defined]
        counts = {d["topic"]: len(d["partitions"]) for d in described}
        if all(counts.get(n, 0) >= k for n, k in least.items()) or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.1)
