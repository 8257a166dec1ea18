"""The sender's watermark-only records: an idle key's "nothing of mine before W is missing" (``proxy.watermarks``).

Mixed into ``EventPipeline``: it sends, for each watermarked key as soon as it has sent no record with a watermark
for ``interval_s``, an ``event_batch`` without events whose watermark is ``min(now, oldest outstanding)``
— one producer batch per topic partition, on the partition the key's events go to. None while the broker is away
or the spool drains. A failed one is counted and not retried: the next one states as much.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from tokenpools.proxy.producer import Batch, Producer
from tokenpools.topics.batches import Watermark, batch_value

if TYPE_CHECKING:
    from tokenpools.proxy.events import EventPipeline


class WatermarkSending:
    """Mixed into EventPipeline; uses its producer, partitioner, clock and watermark tracker."""

    async def _watermark_loop(self: EventPipeline) -> None:
        """A watermark-only record for every watermarked key that sent none for ``interval_s`` (``proxy.watermarks``);
        none while the broker is away or the spool drains (the drain's records carry them)."""
        assert self._marks is not None
        interval_s = self._marks.options.interval_s
        wait_s = 0.0
        while True:
            await asyncio.sleep(wait_s)
            wait_s = interval_s
            producer = self._producer
            if producer is None or self._producer_broken or self.degraded:
                continue
            now_s = self._clock.now_s()
            last = {k: self._marked_at.get(k, -1e18) for k in self._marks.keys()}
            due = [k for k, at in last.items() if now_s - at >= interval_s]
            try:
                await self._send_watermarks(producer, due)
            except Exception as exc:  # noqa: BLE001 - a watermark is not an event: the next one will do
                self.watermark_errors += 1
                self._check_fatal(exc)
            # wake when the next key falls due (a key that sent events meanwhile is due later)
            pending = [at + interval_s - now_s for k, at in last.items() if k not in due]
            wait_s = max(0.005, min(pending + [interval_s]))

    async def _send_watermarks(self: EventPipeline, producer: Producer, keys: list[tuple[str, str]]) -> None:
        assert self._marks is not None
        batches: dict[tuple[str, int], Batch] = {}
        for topic, key in keys:
            partitions = self._partitions.get(topic)
            if partitions is None:
                partitions = self._partitions[topic] = sorted(
                    await asyncio.wait_for(producer.partitions_for(topic), self._call_timeout_s))
            partition = self._partitioner(key.encode(), partitions, partitions)
            batch = batches.get((topic, partition))
            if batch is None:
                batch = batches[(topic, partition)] = producer.create_batch()
            mark = self._marks.watermark(topic, key, self._clock.wall_ms())  # everything older is acknowledged
            if batch.append(timestamp=None, key=key.encode(),
                            value=batch_value([], Watermark(self._marks.options.proxy_id, mark))) is not None:
                self._marked_at[(topic, key)] = self._clock.now_s()
        for (topic, partition), batch in batches.items():
            fut = await asyncio.wait_for(producer.send_batch(batch, topic, partition=partition), self._call_timeout_s)
            fut.add_done_callback(self._watermark_delivered)

    def _watermark_delivered(self: EventPipeline, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            self.watermark_errors += 1
        else:
            self.watermark_records += 1

    @property
    def watermark_violations(self: EventPipeline) -> int:
        """Events emitted with a time below a watermark already stated for their key (a wall clock stepped back)."""
        return self._marks.violations if self._marks is not None else 0
