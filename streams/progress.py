"""How far a partition's events have been processed: the horizon up to which its windows may be closed.

The timer closes windows whose end + grace ≤ horizon. For one pool partition (the same partition number of every
source topic, which are co-partitioned by pool) the horizon is the minimum over its source partitions of:

- the wall clock, when the partition is caught up (everything up to the broker's high watermark processed), so
  an idle pool still ticks;
- otherwise the Kafka timestamp of the last record processed from it: a worker catching up after a restart closes
  a window only once it has read past the window's deadline, so the events of the backlog land in their windows
  exactly as they did for the worker that was there when they arrived (no spurious "late" events).

``horizon`` is pure; ``Progress`` is the bookkeeping the agent does; ``KafkaHorizons`` reads the consumer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol


def horizon(now_ms: int, bounds: Iterable[int | None]) -> int | None:
    """min(bounds) capped at now; None when any source partition gives no bound yet (nothing may close)."""
    result = now_ms
    for bound in bounds:
        if bound is None:
            return None
        result = min(result, bound)
    return result


class Progress:
    """The last offset and record timestamp processed per (topic, partition), kept by the agent."""

    def __init__(self) -> None:
        self.processed: dict[tuple[str, int], tuple[int, int | None]] = {}

    def note(self, topic: str, partition: int, offset: int, timestamp_ms: int | None) -> None:
        previous = self.processed.get((topic, partition))
        if previous is None or offset > previous[0]:
            ts = timestamp_ms if timestamp_ms is not None else (previous[1] if previous else None)
            self.processed[(topic, partition)] = (offset, ts)

    def forget(self, partitions: Iterable[tuple[str, int]]) -> None:
        for tp in partitions:
            self.processed.pop(tp, None)


class Horizons(Protocol):
    def active_partitions(self) -> set[int] | None: ...

    async def horizons(self, now_ms: int, partitions: Iterable[int]) -> dict[int, int | None]: ...


class WallClockHorizons:
    """Every partition caught up and active: what a single in-process test wants."""

    def active_partitions(self) -> set[int] | None:
        return None

    async def horizons(self, now_ms: int, partitions: Iterable[int]) -> dict[int, int | None]:
        return {p: now_ms for p in partitions}


class KafkaHorizons:
    """Horizons from the Faust consumer's high watermarks and positions and the agent's ``Progress``."""

    def __init__(self, app: Any, source_topics: tuple[str, ...], progress: Progress) -> None:
        self.app = app
        self.source_topics = source_topics
        self.progress = progress

    def active_partitions(self) -> set[int] | None:
        first = self.source_topics[0]
        return {tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == first}

    async def horizons(self, now_ms: int, partitions: Iterable[int]) -> dict[int, int | None]:
        return {p: horizon(now_ms, [await self._bound(t, p, now_ms) for t in self.source_topics]) for p in partitions}

    async def _bound(self, topic: str, partition: int, now_ms: int) -> int | None:
        from faust.types import TP

        tp = TP(topic, partition)
        consumer = self.app.consumer
        done = self.progress.processed.get((topic, partition))
        try:
            highwater = consumer.highwater(tp)
            if done is not None:
                next_offset: int | None = done[0] + 1
            elif consumer._read_offset.get(tp) is None:  # nothing handed to the stream yet: the fetch position
                next_offset = await consumer.position(tp)
            else:
                next_offset = None
        except Exception:  # noqa: BLE001 - not assigned (a rebalance), no fetch yet: not caught up
            highwater, next_offset = None, None
        if highwater is not None and next_offset is not None and next_offset >= highwater:
            return now_ms
        return done[1] if done is not None else None
