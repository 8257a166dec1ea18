"""The controllers' one Kafka producer, shared by the loops (started lazily, restarted after a failure).

Every send waits for the broker's acknowledgement (``acks=all``, idempotent), so a loop knows a record is on the
topic before it counts it as published; a failure is a ``RetryableError`` and the loop that saw it is restarted
by the supervisor (and republishes: specs are keyed on a compacted topic, samples and status are levels).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from tokenpools.controllers.leader import Acting, ensure_acting
from tokenpools.errors import RetryableError
from tokenpools.topics.codec import encode
from tokenpools.topics.records import Record

log = logging.getLogger(__name__)


class Publisher(Protocol):
    async def publish(self, topic: str, key: str, record: Record | None) -> None:
        """Send ``record`` (None: a tombstone) under ``key`` and wait for the acknowledgement."""


class KafkaPublisher:
    def __init__(self, factory: Callable[[], AIOKafkaProducer], send_timeout_s: float = 15.0) -> None:
        self._factory = factory
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()
        self._send_timeout_s = send_timeout_s
        self.sent = 0

    async def _started(self) -> AIOKafkaProducer:
        async with self._lock:
            if self._producer is None:
                producer = self._factory()
                try:
                    await producer.start()
                except (KafkaError, OSError) as exc:
                    await producer.stop()
                    raise RetryableError(f"Kafka producer cannot start: {exc}", 1.0) from None
                self._producer = producer
            return self._producer

    async def publish(self, topic: str, key: str, record: Record | None) -> None:
        producer = await self._started()
        value = None if record is None else encode(record)
        try:
            await asyncio.wait_for(producer.send_and_wait(topic, value, key=key.encode()), self._send_timeout_s)
        except (KafkaError, OSError, asyncio.TimeoutError) as exc:
            await self._reset(producer)
            raise RetryableError(f"publishing to {topic}: {type(exc).__name__}: {exc}", 1.0) from None
        self.sent += 1

    async def _reset(self, producer: AIOKafkaProducer) -> None:
        async with self._lock:
            if self._producer is producer:
                self._producer = None
        try:
            await producer.stop()
        except Exception as exc:  # noqa: BLE001 — closing a failed producer: nothing left to save
            log.debug("stopping a failed producer: %s", exc)

    async def close(self) -> None:
        async with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()


class LeaderPublisher:
    """Publishes only while this replica leads (``acting``): a paused leader that wakes past its deadline does not
    put a stale record on a topic before its loops are cancelled."""

    def __init__(self, publisher: Publisher, acting: Acting) -> None:
        self._publisher, self._acting = publisher, acting

    async def publish(self, topic: str, key: str, record: Record | None) -> None:
        ensure_acting(self._acting, f"publishing to {topic}")
        await self._publisher.publish(topic, key, record)


class MemoryPublisher:
    """Keeps what it is given (tests and ``--dry-run`` without Kafka)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, Record | None]] = []

    async def publish(self, topic: str, key: str, record: Record | None) -> None:
        self.records.append((topic, key, record))
