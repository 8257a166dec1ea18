"""Broadcast topics every worker reads whole: specs (pools, entitlements) and proxy heartbeats.

These are small compacted topics every worker needs all of, whatever pool partitions it owns, so they are not
Faust agents (a consumer group would give each to one worker only): each worker runs a group-less consumer that
assigns itself every partition, reads from the beginning and keeps reading. ``ready`` is set once the reader has
reached the end offsets it saw at start, so the first tick can wait for the current specs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from tokenpools.streams.catalogue import Catalogue, ProxyBook
from tokenpools.streams.deadletter import DeadLetters
from tokenpools.streams.processor import RawEvent
from tokenpools.topics.codec import DecodeError, decode
from tokenpools.topics.records import DeadLetterReason, ProxyHeartbeat, SpecRecord

log = logging.getLogger(__name__)

Handler = Callable[[RawEvent], Awaitable[None]]


async def apply_spec(catalogue: Catalogue, dead_letters: DeadLetters, raw: RawEvent) -> None:
    if raw.value is None:  # a tombstone: the key is "<kind>/<name>"
        kind, _, name = (raw.key or b"").decode("utf-8", "replace").partition("/")
        if kind in ("TokenPool", "TokenEntitlement") and name:
            catalogue.apply(SpecRecord(kind=kind, name=name, pool="", spec={}, deleted=True, t_ms=0))  # type: ignore[arg-type]
        return
    try:
        record = decode(SpecRecord, raw.value)
    except DecodeError as exc:
        await dead_letters.handle(exc.reason, exc.detail, raw.topic, raw.partition, raw.offset, raw.key, raw.value)
        return
    problem = catalogue.apply(record)
    if problem is not None:
        await dead_letters.handle(DeadLetterReason.INVALID, f"spec refused, previous specs kept: {problem}",
                                  raw.topic, raw.partition, raw.offset, raw.key, raw.value)


async def apply_heartbeat(book: ProxyBook, dead_letters: DeadLetters, raw: RawEvent) -> None:
    if raw.value is None:
        if raw.key:
            book.forget(raw.key.decode("utf-8", "replace"))
        return
    try:
        book.apply(decode(ProxyHeartbeat, raw.value))
    except DecodeError as exc:
        await dead_letters.handle(exc.reason, exc.detail, raw.topic, raw.partition, raw.offset, raw.key, raw.value)


class BroadcastReader:
    def __init__(self, consumer_factory: Callable[[], Any], topic: str, handle: Handler,
                 retry_backoff_s: float = 1.0) -> None:
        self._factory = consumer_factory
        self.topic = topic
        self._handle = handle
        self._backoff_s = retry_backoff_s
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
                    log.warning("%s: topic not found; retrying in %.1f s", self.topic, self._backoff_s)
                    self.ready.set()  # nothing to wait for
                    await _stop(consumer)
                    await asyncio.sleep(self._backoff_s)
                    continue
                assignment = [TopicPartition(self.topic, p) for p in sorted(partitions)]
                consumer.assign(assignment)
                await consumer.seek_to_beginning(*assignment)
                ends = await consumer.end_offsets(assignment)
                await self._read(consumer, ends)
            except asyncio.CancelledError:
                await _stop(consumer)
                raise
            except Exception as exc:  # noqa: BLE001 - broker away: keep what we have, try again
                log.warning("%s: reader failed (%r); retrying in %.1f s", self.topic, exc, self._backoff_s)
                await _stop(consumer)
                await asyncio.sleep(self._backoff_s)

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
