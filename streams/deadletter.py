"""The one handler for records an agent cannot use: log ``topic[partition]@offset``, count, dead-letter.

The agent keeps running. Logging is at WARNING for the first record of each reason per interval and at DEBUG
for the rest (the counter and the dead-letter topic have every one), so a flood of late events cannot flood the
log; the warning says how many were suppressed since the last one.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from tokenpools.streams.clock import Clock
from tokenpools.streams.metrics import StreamMetrics
from tokenpools.topics.codec import encode
from tokenpools.topics.records import DeadLetter, DeadLetterReason

log = logging.getLogger(__name__)

Send = Callable[[str, bytes, bytes], Awaitable[None]]  # topic, key, value


class DeadLetters:
    def __init__(self, topic: str, consumer: str, send: Send, metrics: StreamMetrics, clock: Clock,
                 warn_interval_s: float = 10.0) -> None:
        self.topic = topic
        self.consumer = consumer
        self._send = send
        self.metrics = metrics
        self.clock = clock
        self.warn_interval_s = warn_interval_s
        self._last_warning: dict[DeadLetterReason, float] = {}
        self._suppressed: Counter[DeadLetterReason] = Counter()

    async def handle(self, reason: DeadLetterReason, detail: str, topic: str, partition: int, offset: int,
                     key: bytes | None, value: bytes | None, element: int | None = None) -> DeadLetter:
        """``element``: the index of the bad element of an event_batch (``value`` is then that element's JSON)."""
        self.metrics.dead_letters.labels(reason.value).inc()
        self._log(reason, detail, topic, partition, offset if element is None else f"{offset}[{element}]")
        record = DeadLetter(
            source_topic=topic, partition=max(0, partition), offset=max(0, offset), element=element,
            key=key.decode("utf-8", "replace") if key else None, reason=reason, detail=detail[:2000],
            payload=(value or b"")[:65536].decode("utf-8", "replace"), consumer=self.consumer,
            t_ms=self.clock.wall_ms())
        await self._send(self.topic, topic.encode(), encode(record))
        return record

    def _log(self, reason: DeadLetterReason, detail: str, topic: str, partition: int, offset: int | str) -> None:
        now = self.clock.now_s()
        last = self._last_warning.get(reason)
        if last is not None and now - last < self.warn_interval_s:
            self._suppressed[reason] += 1
            log.debug("dead letter (%s) %s[%d]@%s: %s", reason.value, topic, partition, offset, detail)
            return
        self._last_warning[reason] = now
        suppressed = self._suppressed.pop(reason, 0)
        more = f" ({suppressed} more since the last warning)" if suppressed else ""
        log.warning("dead letter (%s) %s[%d]@%s: %s%s", reason.value, topic, partition, offset, detail, more)
