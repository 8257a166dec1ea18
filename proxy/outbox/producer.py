"""What the event pipeline needs from a Kafka producer, and the real one (aiokafka) that provides it.

The pipeline hands the producer whole batches (``create_batch`` / ``send_batch``), so it chooses the partition
itself, with Kafka's default placement for keyed records (murmur2, as the Java client does).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from tokenpools.config import ProxySettings
from tokenpools.runtime.kafka import KafkaClients


class Batch(Protocol):
    def append(self, *, timestamp: float | None, key: bytes | None, value: bytes | None) -> object | None: ...


class Producer(Protocol):
    """The part of AIOKafkaProducer the pipeline uses."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def flush(self) -> None: ...

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> asyncio.Future[Any]: ...

    async def partitions_for(self, topic: str) -> set[int]: ...

    def create_batch(self) -> Batch: ...

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]: ...


Partitioner = Callable[[bytes, list[int], list[int]], int]

# a producer batch holds several packed event records (``topics.batches``, 64 KiB each by default) per partition and
# request, not one (aiokafka's default is 16 KiB); below the broker's 1 MiB message.max.bytes
PRODUCER_BATCH_BYTES = 512 << 10


def first_partition(key: bytes, partitions: list[int], available: list[int]) -> int:
    """Placement for fakes and tests: everything on the lowest partition."""
    return partitions[0]


class KeyPartitioner:
    """Kafka's default placement (murmur2 of the key, like the Java client), computed once per key: aiokafka's
    murmur2 is pure Python and the proxy's keys (pool names, proxy ids) are few. The event pipeline picks the
    partition itself because it hands the producer whole batches."""

    def __init__(self) -> None:
        from aiokafka.partitioner import DefaultPartitioner

        self._default = DefaultPartitioner()
        self._cache: dict[tuple[bytes, int], int] = {}

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        if key is None:
            return self._default(key, all_partitions, available)  # type: ignore[no-any-return]
        cached = self._cache.get((key, len(all_partitions)))
        if cached is None:
            cached = self._default(key, all_partitions, available)
            if len(self._cache) < 4096:
                self._cache[(key, len(all_partitions))] = cached
        return cached


def kafka_producer_factory(kafka: KafkaClients, proxy_id: str, settings: ProxySettings) -> Callable[[], Producer]:
    """The event pipeline's producer: idempotent, every record acknowledged by all in-sync replicas."""
    return kafka.producer_factory(  # type: ignore[return-value]
        f"proxy-{proxy_id}", acks="all", enable_idempotence=True, linger_ms=settings.producer_linger_ms,
        max_batch_size=PRODUCER_BATCH_BYTES, request_timeout_ms=settings.producer_request_timeout_ms,
        retry_backoff_ms=200)
