"""The one handler for records a consumer cannot use: log ``topic[partition]@offset``, count, dead-letter.

The consumer keeps running. The first record of each reason per interval is logged at WARNING (saying how many were
suppressed since the last warning) and the rest at DEBUG, so a flood of late or malformed records cannot flood the
log; the counts and the dead-letter topic have every one. ``note`` does the logging and counting and returns the
``DeadLetter`` record, for a caller that writes it its own way (the proxy hands it to its event pipeline);
``handle`` also writes it with the ``send`` it was given (the agents produce it directly).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from tokenpools.runtime.backoff import ThrottledLog
from tokenpools.runtime.clock import Clock
from tokenpools.topics.codec import encode
from tokenpools.topics.records import DeadLetter, DeadLetterReason

log = logging.getLogger(__name__)

Send = Callable[[str, bytes, bytes | None], Awaitable[None]]  # topic, key, value (None: a tombstone, compacted topics)
Count = Callable[[DeadLetterReason], None]  # e.g. a Prometheus counter's labels(reason).inc()

MAX_DETAIL_CHARS = 2000
MAX_PAYLOAD_BYTES = 65536


class DeadLetters:
    """Dead letters of one consumer (``consumer`` names it in every record) to ``topic``, keyed by source topic."""

    def __init__(self, topic: str, consumer: str, clock: Clock, *, send: Send | None = None,
                 count: Count | None = None, warn_interval_s: float = 10.0,
                 logger: logging.Logger | None = None) -> None:
        self.topic = topic
        self.consumer = consumer
        self.clock = clock
        self.counts: Counter[DeadLetterReason] = Counter()
        self._send = send
        self._count = count
        self._log = logger or log
        self._throttled = ThrottledLog(self._log, warn_interval_s, clock)

    def note(self, reason: DeadLetterReason, detail: str, topic: str, partition: int, offset: int,
             key: bytes | None, value: bytes | None, element: int | None = None) -> DeadLetter:
        """Log and count one unusable record; its dead-letter record (not written). ``element``: the index of the
        bad element of an event_batch (``value`` is then that element's JSON)."""
        self.counts[reason] += 1
        if self._count is not None:
            self._count(reason)
        where = offset if element is None else f"{offset}[{element}]"
        if not self._throttled.warning(reason.value, "dead letter (%s) %s[%d]@%s: %s", reason.value, topic,
                                       partition, where, detail):
            self._log.debug("dead letter (%s) %s[%d]@%s: %s", reason.value, topic, partition, where, detail)
        return DeadLetter(
            source_topic=topic, partition=max(0, partition), offset=max(0, offset), element=element,
            key=key.decode("utf-8", "replace") if key else None, reason=reason, detail=detail[:MAX_DETAIL_CHARS],
            payload=(value or b"")[:MAX_PAYLOAD_BYTES].decode("utf-8", "replace"), consumer=self.consumer,
            t_ms=self.clock.wall_ms())

    async def handle(self, reason: DeadLetterReason, detail: str, topic: str, partition: int, offset: int,
                     key: bytes | None, value: bytes | None, element: int | None = None) -> DeadLetter:
        """``note``, then write the record to the dead-letter topic (keyed by ``topic``)."""
        if self._send is None:
            raise RuntimeError("DeadLetters.handle needs a `send`; use `note` to write the record yourself")
        record = self.note(reason, detail, topic, partition, offset, key, value, element)
        await self._send(self.topic, topic.encode(), encode(record))
        return record
