"""How far a partition's events have been processed: the horizon up to which its windows may be closed.

The timer closes windows whose end + grace ≤ horizon. For one pool partition (the same partition number of every
source topic, which are co-partitioned by pool) the horizon is the minimum over its source partitions of:

- the wall clock, when the partition is caught up (everything up to the broker's high watermark processed), so
  an idle pool still ticks;
- otherwise the Kafka timestamp of the last record processed from it: a worker catching up after a restart closes
  a window only once it has read past the window's deadline, so the events of the backlog land in their windows
  exactly as they did for the worker that was there when they arrived (no spurious "late" events).

"Caught up" compares the next offset to process with the partition's end as the broker states it now
(``highwaters``: one request per horizon, for the partitions that would count as caught up). The consumer's cached
high watermark is only the last fetch's: after a rebalance Faust pauses fetching while the tables recover, so the
cache can be below records the proxies wrote meanwhile, and a worker that trusted it would close windows by the
wall clock while those records wait to be read (they would all come late). The cache only spares the question
where it already says "not caught up".

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
        from faust.types import TP

        partitions = list(partitions)
        tps = [TP(t, p) for p in partitions for t in self.source_topics]
        positions = {tp: await self._next_offset(tp) for tp in tps}
        # caught up only by the broker's end offset: the consumer's cached high watermark is the last fetch's, and
        # Faust pauses a partition's fetching while its tables recover (module doc). One request, and only for the
        # partitions the cache would call caught up or cannot tell about.
        ask = [tp for tp in tps if positions[tp] is not None and self._cached_caught_up(tp, positions[tp])]
        try:
            ends: dict[Any, int] = dict(await self.app.consumer.highwaters(*ask)) if ask else {}
        except Exception:  # noqa: BLE001 - not assigned (a rebalance), broker away: not caught up
            ends = {}
        out: dict[int, int | None] = {}
        for p in partitions:
            bounds = []
            for t in self.source_topics:
                tp, done = TP(t, p), self.progress.processed.get((t, p))
                end_offset, next_offset = ends.get(tp), positions[tp]
                caught_up = end_offset is not None and next_offset is not None and next_offset >= end_offset
                bounds.append(now_ms if caught_up else (done[1] if done is not None else None))
            out[p] = horizon(now_ms, bounds)
        return out

    async def _next_offset(self, tp: Any) -> int | None:
        """The offset of the next record this worker will process from ``tp``, or None when it cannot tell."""
        consumer = self.app.consumer
        done = self.progress.processed.get((tp.topic, tp.partition))
        if done is not None:
            return int(done[0]) + 1
        try:
            if consumer._read_offset.get(tp) is None:  # nothing handed to the stream yet: the fetch position
                return int(await consumer.position(tp))
        except Exception:  # noqa: BLE001 - not assigned (a rebalance), no fetch yet
            return None
        return None  # read but not processed yet

    def _cached_caught_up(self, tp: Any, next_offset: int) -> bool:
        """What the cache says, to spare the broker a question whose answer is "not caught up"."""
        if (tp.topic, tp.partition) not in self.progress.processed:
            return True  # nothing processed since assignment: the cache may be from before it
        try:
            highwater = self.app.consumer.highwater(tp)
        except Exception:  # noqa: BLE001
            return True
        return highwater is None or next_offset >= highwater
