"""Watermark-only records for idle keys: "nothing of mine before W is missing" (``proxy.watermarks``).

A ``WatermarkSender`` runs beside the event pipeline's sender, as its own task. For each watermarked key that has
stated no watermark for ``interval_s`` (``WatermarkTracker.due``) it sends an ``event_batch`` without events whose
watermark is ``min(now, oldest outstanding)`` — one producer batch per topic partition, on the partition the key's
events go to. None while the broker is away or the spool drains (the pipeline then offers no producer; the drain's
records carry the watermarks). A failed one is counted and not retried: the next one states as much.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from tokenpools.proxy.outbox.producer import Batch, Producer
from tokenpools.proxy.outbox.watermarks import Key, WatermarkTracker
from tokenpools.runtime.clock import Clock
from tokenpools.topics.batches import Watermark, batch_value

PartitionOf = Callable[[Producer, str, str], Awaitable[int]]
"""(producer, topic, key) → the partition the key's events go to (the pipeline's partitioner and metadata)."""


class WatermarkSender:
    """Sends the idle keys' watermark-only records through the pipeline's producer, and counts them."""

    def __init__(self, tracker: WatermarkTracker, clock: Clock, partition: PartitionOf, call_timeout_s: float) -> None:
        self._tracker = tracker
        self._clock = clock
        self._partition = partition
        self._call_timeout_s = call_timeout_s
        self.records = 0  # delivered
        self.errors = 0  # failed to send, or to be delivered

    async def run(self, producer_ready: Callable[[], Producer | None],
                  on_error: Callable[[BaseException], None]) -> None:
        """Until cancelled: wake when the next key falls due and send what is due, if ``producer_ready()`` offers
        a producer (else wait ``interval_s``). ``on_error`` sees each failed send (a producer may need replacing)."""
        interval_s = self._tracker.options.interval_s
        wait_s = 0.0
        while True:
            await asyncio.sleep(wait_s)
            wait_s = interval_s
            producer = producer_ready()
            if producer is None:
                continue
            due, wait_s = self._tracker.due(self._clock.now_s())  # (a key that sent events meanwhile is due later)
            try:
                await self._send(producer, due)
            except Exception as exc:  # noqa: BLE001 - a watermark is not an event: the next one will do
                self.errors += 1
                on_error(exc)

    async def _send(self, producer: Producer, keys: list[Key]) -> None:
        tracker = self._tracker
        batches: dict[tuple[str, int], Batch] = {}
        for topic, key in keys:
            partition = await self._partition(producer, topic, key)
            batch = batches.get((topic, partition))
            if batch is None:
                batch = batches[(topic, partition)] = producer.create_batch()
            mark = tracker.watermark(topic, key, self._clock.wall_ms())  # everything older is acknowledged
            if batch.append(timestamp=None, key=key.encode(),
                            value=batch_value([], Watermark(tracker.options.proxy_id, mark))) is not None:
                tracker.stated(topic, key, self._clock.now_s())
        for (topic, partition), batch in batches.items():
            fut = await asyncio.wait_for(producer.send_batch(batch, topic, partition=partition), self._call_timeout_s)
            fut.add_done_callback(self._delivered)

    def _delivered(self, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self.errors += 1
        else:
            self.records += 1
