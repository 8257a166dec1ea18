"""Broadcast topics every worker reads whole: specs (pools, entitlements), proxy heartbeats, the sharded pools'
limit updates (their shards' counts follow them, docs/scaling.md#the-two-stage-topology) and the budgets topic's
tenant-budget parts (their sum alerts, ``streams.tenant_alerts``).

These are small compacted topics every worker needs all of, whatever pool partitions it owns, so they are not
Faust agents (a consumer group would give each to one worker only): each worker runs a group-less consumer that
assigns itself every partition, reads from the beginning and keeps reading. ``ready`` is set once the reader has
reached the end offsets it saw at start, so the first tick can wait for the current specs. Spec records go to the
runtime's follower (``runtime.specs.follow``); a reader that loses the broker reconnects after a growing delay
(``runtime.backoff``), from the first delay again once it has read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tokenpools.runtime.backoff import Backoff, Retries
from tokenpools.runtime.deadletter import DeadLetters
from tokenpools.runtime.specs import Catalogue, SpecOutcome, follow
from tokenpools.streams.processor import PoolProcessor, RawEvent
from tokenpools.streams.budgets.tenant_alerts import Parts
from tokenpools.streams.views import ProxyBook
from tokenpools.topics.codec import DecodeError, decode
from tokenpools.topics.limits import PageAssembler, pool_of_key
from tokenpools.topics.budget_keys import parse_budget_key
from tokenpools.topics.records import BudgetStatus, LimitUpdate, ProxyHeartbeat

log = logging.getLogger(__name__)

Handler = Callable[[RawEvent], Awaitable[None]]


async def apply_spec(catalogue: Catalogue, dead_letters: DeadLetters, raw: RawEvent) -> SpecOutcome:
    return await follow(catalogue, dead_letters, raw.topic, raw.partition, raw.offset, raw.key, raw.value)


async def apply_heartbeat(book: ProxyBook, dead_letters: DeadLetters, raw: RawEvent) -> None:
    if raw.value is None:
        if raw.key:
            book.forget(raw.key.decode("utf-8", "replace"))
        return
    try:
        book.apply(decode(ProxyHeartbeat, raw.value))
    except DecodeError as exc:
        await dead_letters.handle(exc.reason, exc.detail, raw.topic, raw.partition, raw.offset, raw.key, raw.value)


async def apply_limits(processor: PoolProcessor, assembler: PageAssembler, dead_letters: DeadLetters,
                       raw: RawEvent) -> None:
    """A limits record: decoded only when its key names a sharded pool (the others' counts follow the worker's own
    ticks); a whole update (``PageAssembler``) goes to ``PoolProcessor.note_limits``."""
    if raw.value is None or raw.key is None:
        return
    spec = processor.catalogue.pool(pool_of_key(raw.key).decode("utf-8", "replace"))
    if spec is None or spec.shards <= 1:
        return
    try:
        page = decode(LimitUpdate, raw.value)
    except DecodeError as exc:
        await dead_letters.handle(exc.reason, exc.detail, raw.topic, raw.partition, raw.offset, raw.key, raw.value)
        return
    update = assembler.add(page)
    if update is not None:
        processor.note_limits(update)


def apply_budget_part(parts: Parts, raw: RawEvent) -> None:
    """A budgets record: a tenant budget's part is kept (``Parts``), anything else drops its key's part. A record
    that does not decode is skipped, not dead-lettered: every worker reads the topic, and its pool's proxies
    dead-letter it once."""
    if raw.key is None:
        return
    parsed = parse_budget_key(raw.key)  # both key forms name one account: its part is kept once
    key = parsed.account if parsed is not None else raw.key.decode("utf-8", "replace")
    if raw.value is None:
        parts.forget(key)
        return
    try:
        parts.apply(key, decode(BudgetStatus, raw.value))
    except DecodeError:
        parts.forget(key)


class BroadcastReader:
    def __init__(self, consumer_factory: Callable[[], Any], topic: str, handle: Handler,
                 backoff: Backoff | None = None) -> None:
        self._factory = consumer_factory
        self.topic = topic
        self._handle = handle
        self._retries = Retries(backoff or Backoff(initial_s=0.5, max_s=10.0))
        self.ready = asyncio.Event()

    async def run(self) -> None:
        """Forever: (re)start the consumer, read every partition from the beginning, handle each record."""
        from aiokafka import TopicPartition

        while True:
            consumer = self._factory()
            try:
                await consumer.start()
                partitions = await _partitions(consumer, self.topic)
                if not partitions:
                    delay_s = self._retries.failed()
                    log.warning("%s: topic not found; retrying in %.1f s", self.topic, delay_s)
                    self.ready.set()  # nothing to wait for
                    await _stop(consumer)
                    await asyncio.sleep(delay_s)
                    continue
                assignment = [TopicPartition(self.topic, p) for p in sorted(partitions)]
                consumer.assign(assignment)
                await consumer.seek_to_beginning(*assignment)
                ends = await consumer.end_offsets(assignment)
                self._retries.succeeded()
                await self._read(consumer, ends)
            except asyncio.CancelledError:
                await _stop(consumer)
                raise
            except Exception as exc:  # noqa: BLE001 - broker away: keep what we have, try again
                delay_s = self._retries.failed()
                log.warning("%s: reader failed (%r); retrying in %.1f s", self.topic, exc, delay_s)
                await _stop(consumer)
                await asyncio.sleep(delay_s)

    async def _read(self, consumer: Any, ends: dict[Any, int]) -> None:
        while True:
            if not self.ready.is_set() and all([await consumer.position(tp) >= end for tp, end in ends.items()]):
                self.ready.set()
            batches = await consumer.getmany(timeout_ms=500, max_records=1000)
            for tp, messages in batches.items():
                for m in messages:
                    ts = m.timestamp if m.timestamp is not None and m.timestamp >= 0 else None
                    await self._handle(RawEvent(tp.topic, tp.partition, m.offset, ts, m.key, m.value))


async def _partitions(consumer: Any, topic: str, attempts: int = 5) -> set[int]:
    """The topic's partitions, refreshing the metadata a few times (a topic just created may not be in it yet)."""
    for attempt in range(attempts):
        partitions = consumer.partitions_for_topic(topic)
        if partitions:
            return set(partitions)
        await consumer._client.force_metadata_update()  # aiokafka's consumer.topics() does not refresh its own view
        if attempt:
            await asyncio.sleep(0.2)
    return set()


async def _stop(consumer: Any) -> None:
    try:
        await asyncio.wait_for(consumer.stop(), 5.0)
    except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - it is being replaced anyway
        pass
