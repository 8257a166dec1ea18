"""How far a partition's events have been processed: the horizon up to which its windows may be closed.

The timer closes windows whose end + grace ≤ horizon. For one pool partition (the same partition number of every
source topic, which are co-partitioned by pool) the horizon is the minimum over its source partitions of:

- the wall clock, when the partition is caught up (everything up to the broker's end offset processed), so an
  idle pool still ticks;
- otherwise the Kafka timestamp of the last record processed from it: a worker catching up after a restart closes
  a window only once it has read past the window's deadline, so the events of the backlog land in their windows
  exactly as they did for the worker that was there when they arrived (no spurious "late" events).

"Caught up" compares the next offset to process with the partition's end as the broker states it now, asked by a
consumer of the agents' own (``EndOffsets``: one request per horizon, for the partitions that would count as caught
up). The Faust consumer's cached high watermark is only its last fetch's: after a rebalance Faust pauses fetching
while the tables recover, so the cache can be below records the proxies wrote meanwhile, and a worker that trusted
it would close windows by the wall clock while those records wait to be read (they would all come late). Asking
through Faust's consumer instead waits behind its long-poll fetch, up to seconds. The cache only spares the
question where it already says "not caught up".

Contiguity (``Progress.contiguous``): the agent folds a source partition's records in offset order without a hole.
The source topics are neither compacted nor written in transactions, so their offsets are consecutive; a record
past the one after the newest processed means the consumer skipped records, which Faust's consumer does around a
rebalance (measured: after a takeover it handed the agent offset 30 of a partition, then 39 on; the skipped ones
were never read, their events lost to the pool's state). The records from the hole on wait, and the agent has the
consumer read the partition again from the first missing offset. A partition's first record after its assignment
is held to the group's committed offset (``Progress.start``, asked of the broker: ``CommittedOffsets``), where the
consumer starts and which the restored state covers (events read again are duplicates): the consumer skips there
too (measured: a takeover's first record of a partition was the committed offset + 1, and a moved pool's limits
differed from the uninterrupted run's). Without a committed offset (a new group) the first record is taken as it
comes.

``horizon`` is pure; ``Progress`` is the bookkeeping the agent does; ``KafkaHorizons`` reads the consumers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol, TypeVar

MAX_REWINDS = 20  # a hole still there after this many re-reads is the broker's (retention): accepted


class Offset(Protocol):
    @property
    def topic(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def offset(self) -> int: ...


R = TypeVar("R", bound=Offset)


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
        self._starts: dict[tuple[str, int], int] = {}  # (topic, partition) → the offset its first record should have
        self._rewinds: dict[tuple[str, int], tuple[int, int]] = {}  # (topic, partition) → (offset, times asked)

    def unplaced(self, records: Iterable[Offset]) -> list[tuple[str, int]]:
        """The source partitions of ``records`` with nothing processed since their assignment and no ``start``."""
        return sorted({tp for r in records if (tp := (r.topic, r.partition)) not in self.processed
                       and tp not in self._starts})

    def start(self, topic: str, partition: int, offset: int) -> None:
        """The partition's first record after its assignment should be ``offset`` (the group's committed offset);
        a first record past it is a hole like any other."""
        self._starts[(topic, partition)] = offset

    def contiguous(self, records: Sequence[R]) -> tuple[list[R], dict[tuple[str, int], int], dict[tuple[str, int], int]]:
        """The records to process now, in order; per source partition the offset to read again from (a hole: the
        partition's records from it on are left out); and the holes accepted (asked ``MAX_REWINDS`` times)."""
        kept: list[R] = []
        rewind: dict[tuple[str, int], int] = {}
        accepted: dict[tuple[str, int], int] = {}
        newest: dict[tuple[str, int], int] = {}
        for record in records:
            tp = (record.topic, record.partition)
            if tp in rewind:
                continue
            last = newest.get(tp)
            if last is None and (done := self.processed.get(tp)) is not None:
                last = done[0]
            elif last is None and (start := self._starts.get(tp)) is not None:
                last = start - 1
            if last is not None and record.offset > last + 1:
                if not self._give_up(tp, last + 1):
                    rewind[tp] = last + 1
                    continue
                accepted[tp] = last + 1
            kept.append(record)
            newest[tp] = record.offset if last is None else max(last, record.offset)
        return kept, rewind, accepted

    def _give_up(self, tp: tuple[str, int], offset: int) -> bool:
        at, times = self._rewinds.get(tp, (offset, 0))
        times = times + 1 if at == offset else 1
        self._rewinds[tp] = (offset, times)
        return times > MAX_REWINDS

    def note(self, topic: str, partition: int, offset: int, timestamp_ms: int | None) -> None:
        previous = self.processed.get((topic, partition))
        if previous is None or offset > previous[0]:
            ts = timestamp_ms if timestamp_ms is not None else (previous[1] if previous else None)
            self.processed[(topic, partition)] = (offset, ts)

    def forget(self, partitions: Iterable[tuple[str, int]]) -> None:
        for tp in partitions:
            self.processed.pop(tp, None)
            self._starts.pop(tp, None)
            self._rewinds.pop(tp, None)


class Horizons(Protocol):
    def active_partitions(self) -> set[int] | None: ...

    async def horizons(self, now_ms: int, partitions: Iterable[int]) -> dict[int, int | None]: ...

    async def committed(self, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The group's committed offset of each (topic, partition) that has one: where the consumer starts it."""
        ...


class WallClockHorizons:
    """Every partition caught up and active: what a single in-process test wants."""

    def active_partitions(self) -> set[int] | None:
        return None

    async def horizons(self, now_ms: int, partitions: Iterable[int]) -> dict[int, int | None]:
        return {p: now_ms for p in partitions}

    async def committed(self, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return {}  # no consumer group: each partition's first record is taken as it comes


class EndOffsets:
    """The broker's end offsets, asked by a consumer of the agents' own (no group, nothing subscribed), on the
    event loop: Faust's consumer answers through its thread, behind a fetch that may wait up to its long-poll."""

    def __init__(self, factory: Any) -> None:
        self._factory = factory  # () -> a not started aiokafka consumer (``KafkaClients.consumer_factory``)
        self._consumer: Any = None

    async def ends(self, tps: list[Any]) -> dict[Any, int]:
        from aiokafka import TopicPartition

        if self._consumer is None:
            consumer = self._factory()
            await consumer.start()
            self._consumer = consumer
        ends = await self._consumer.end_offsets([TopicPartition(tp.topic, tp.partition) for tp in tps])
        return {tp: ends[TopicPartition(tp.topic, tp.partition)] for tp in tps}

    async def close(self) -> None:
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await consumer.stop()


class CommittedOffsets:
    """The consumer group's committed offsets, asked by an admin client of the agents' own on the event loop (Faust
    sets its own copy only when its recovery seeks, which may come after the first records are handed on)."""

    def __init__(self, factory: Any, group: str) -> None:
        self._factory = factory  # () -> a not started aiokafka admin client
        self._group = group
        self._admin: Any = None

    async def committed(self, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        from aiokafka import TopicPartition

        if self._admin is None:
            admin = self._factory()
            await admin.start()
            self._admin = admin
        found = await self._admin.list_consumer_group_offsets(
            self._group, partitions=[TopicPartition(t, p) for t, p in partitions])
        return {(tp.topic, tp.partition): meta.offset for tp, meta in found.items() if meta.offset >= 0}

    async def close(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            await admin.close()


class KafkaHorizons:
    """Horizons from the Faust consumer's positions, the broker's end offsets and the agent's ``Progress``; the
    group's committed offsets (``committed``) where the agent asks them."""

    def __init__(self, app: Any, source_topics: tuple[str, ...], progress: Progress, end_offsets: EndOffsets,
                 committed_offsets: CommittedOffsets) -> None:
        self.app = app
        self.source_topics = source_topics
        self.progress = progress
        self.committed_offsets = committed_offsets
        self.end_offsets = end_offsets

    def active_partitions(self) -> set[int] | None:
        first = self.source_topics[0]
        return {tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == first}

    async def horizons(self, now_ms: int, partitions: Iterable[int]) -> dict[int, int | None]:
        from faust.types import TP

        partitions = list(partitions)
        tps = [TP(t, p) for p in partitions for t in self.source_topics]
        positions = {tp: await self._next_offset(tp) for tp in tps}
        # caught up only by the broker's end offset (module doc), asked once for the partitions the cache would call
        # caught up or cannot tell about; where the cache says "not caught up" it is right
        ask = [tp for tp in tps if positions[tp] is not None and self._cached_caught_up(tp, positions[tp])]
        try:
            ends = await self.end_offsets.ends(ask) if ask else {}
        except Exception:  # noqa: BLE001 - the broker away: not caught up
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

    async def committed(self, partitions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return await self.committed_offsets.committed(partitions)

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
        """What the consumer's cache says, to spare the broker a question whose answer is "not caught up"."""
        if (tp.topic, tp.partition) not in self.progress.processed:
            return True  # nothing processed since assignment: the cache may be from before it
        try:
            highwater = self.app.consumer.highwater(tp)
        except Exception:  # noqa: BLE001
            return True
        return highwater is None or next_offset >= highwater
