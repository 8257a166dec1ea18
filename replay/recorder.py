"""``tokenpools record``: the event topics → hour-partitioned Parquet, schema-checked and resumable.

How it resumes without duplicates: each flush writes its rows (files named after their partition and first
offset, written to a temporary name and renamed) *before* it commits the consumer group's offsets, and a message is
taken only if its offset is past every offset of its partition already taken or on disk. A rerun also seeks every
newly assigned partition forward to one past the highest offset on disk when the committed offset is behind it, so
neither a crash between write and commit nor a lost commit can record a message twice. (The filter is what makes
this hold: aiokafka delivers records of a partition while the assignment callback is still awaiting, and a seek
made there can move a partition back over records already taken.)

A Kafka record may be an ``event_batch`` of many events (``topics.batches``): each element is one row, with the
record's partition and offset (so the resume rule above holds: a record's rows are always flushed together).
Records or batch elements that do not decode (malformed JSON, unknown schema version, a record type the topic
does not carry) are never written, and a bad element does not keep its neighbours out; they are counted and
logged as ``topic[partition]@offset[element]: reason`` (at most one line per topic per 10 s), and their offsets
are committed like the rest. Partitions come from the consumer group; on a rebalance the
recorder writes and commits what it holds before giving a partition up. Run one recorder group per log directory.
The consumer is the runtime's (``KafkaClients``), so the ``kafka`` settings' security reaches it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tokenpools.runtime.backoff import ThrottledLog
from tokenpools.runtime.clock import Clock, SystemClock
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.topics import topics_for
from tokenpools.topics.batches import decode_events
from tokenpools.topics.declarations import TopicSpec

log = logging.getLogger(__name__)
WARN_INTERVAL_S = 10.0


@dataclass(frozen=True, slots=True)
class RecorderConfig:
    out_dir: Path
    topics: tuple[str, ...] = ("requests", "completions")
    group_id: str = "tokenpools-recorder"
    batch_size: int = 5000
    flush_s: float = 5.0
    idle_exit_s: float | None = None
    poll_ms: int = 500

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, got {self.batch_size}")
        if self.flush_s <= 0:
            raise ValueError(f"`flush_s` must be positive, got {self.flush_s}")
        if self.idle_exit_s is not None and self.idle_exit_s <= 0:
            raise ValueError(f"`idle_exit_s` must be positive, got {self.idle_exit_s}")


@dataclass(slots=True)
class RecorderStats:
    records: int = 0
    files: int = 0
    rejected: int = 0
    skipped: int = 0
    by_table: dict[str, int] = field(default_factory=dict)


def partitions_summary(partitions) -> str:
    """Topic partitions (anything with ``topic`` and ``partition``) as one short text: each topic with how many of
    its partitions and which, as ranges (``t.requests 12 (0-11), t.usage 3 (0, 2, 5)``)."""
    by_topic: dict[str, list[int]] = defaultdict(list)
    for tp in partitions:
        by_topic[tp.topic].append(tp.partition)
    return ", ".join(f"{topic} {len(numbers)} ({_ranges(sorted(numbers))})"
                     for topic, numbers in sorted(by_topic.items())) or "none"


def _ranges(numbers: list[int]) -> str:
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


class _SummariseAssignment(logging.Filter):
    """aiokafka logs a new assignment as the set of every partition, hundreds on one line: say it per topic."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Setting newly assigned partitions %s for group %s" and isinstance(record.args, tuple):
            assigned, group = record.args
            record.msg, record.args = "group %s: assigned %s", (group, partitions_summary(assigned))
        return True


def _table(spec: TopicSpec) -> str:
    return spec.records[0].model_fields["record_type"].default


class Recorder:
    """Consumes the configured topics of one deployment (``kafka.topic_prefix``) into ``config.out_dir``."""

    def __init__(self, kafka: KafkaClients, config: RecorderConfig, show_progress: bool = False,
                 clock: Clock | None = None) -> None:
        self.kafka = kafka
        self.config = config
        self.show_progress = show_progress
        self.clock = clock or SystemClock()
        declared = topics_for(kafka.topic_prefix)
        try:
            self.specs = {getattr(declared, name).name: getattr(declared, name) for name in config.topics}
        except AttributeError as exc:
            known = [f for f in declared.__dataclass_fields__]
            raise ValueError(f"unknown topic {exc.name!r}; known: {known}") from None
        self.stats = RecorderStats()
        self._buffers: dict[tuple[str, int], list[dict[str, object]]] = defaultdict(list)
        self._pending_commit: dict[object, int] = {}
        self._next: dict[object, int] = {}  # partition -> the lowest offset not yet taken or on disk
        self._warnings = ThrottledLog(log, WARN_INTERVAL_S, self.clock)  # at most one line per topic per interval

    def _consumer(self):
        return self.kafka.consumer("recorder", group_id=self.config.group_id, enable_auto_commit=False,
                                   auto_offset_reset="earliest")

    def _on_disk(self, tp) -> int:
        """One past the highest offset of ``tp`` already written (0 if none)."""
        from tokenpools.replay.trace import max_offsets

        return max_offsets(self.config.out_dir, _table(self.specs[tp.topic])).get(tp.partition, -1) + 1

    def _expected(self, tp) -> int:
        nxt = self._next.get(tp)
        if nxt is None:  # the partition's first record in this process: what is on disk is done
            nxt = self._next[tp] = self._on_disk(tp)
        return nxt

    async def _resume(self, consumer, assigned) -> None:
        """Start each newly assigned partition past what is committed and past what is already on disk."""
        for tp in sorted(assigned):
            done = self._next[tp] = max(self._next.get(tp, 0), self._on_disk(tp))  # (no await before this)
            committed = await consumer.committed(tp)
            if committed is None and done == 0:
                await consumer.seek_to_beginning(tp)
            elif (committed or 0) < done:
                self.stats.skipped += done - (committed or 0)
                consumer.seek(tp, done)

    def _listener(self, consumer):
        from aiokafka import ConsumerRebalanceListener

        recorder = self

        class Resume(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked) -> None:
                await recorder._flush(consumer)  # what we hold is written and committed before another owner starts

            async def on_partitions_assigned(self, assigned) -> None:
                await recorder._resume(consumer, assigned)

        return Resume()

    def _take(self, tp, message) -> bool:
        """Take one message; whether it is traffic for the idle clock: a record, one that does not decode, or one
        taken already (catching up is not idle). A batch of no events, an idle proxy's watermark, is not."""
        from tokenpools.replay.trace import record_row

        spec = self.specs[tp.topic]
        if message.offset < self._expected(tp):  # taken already, or on disk from an earlier run
            self.stats.skipped += 1
            return True
        self._next[tp] = message.offset + 1
        self._pending_commit[tp] = message.offset + 1
        decoded = decode_events(message.value, spec.records)
        for bad in decoded.bad:
            self.stats.rejected += 1
            where = f"{message.offset}" if bad.index is None else f"{message.offset}[{bad.index}]"
            self._warnings.warning(tp.topic, "%s[%d]@%s: not recorded: %s (%d rejected so far)", tp.topic,
                                   tp.partition, where, bad.error, self.stats.rejected)
        for _, record in decoded.records:
            self._buffers[(record.record_type, tp.partition)].append(record_row(record, tp.partition, message.offset))
        return bool(decoded.records or decoded.bad)

    async def _flush(self, consumer) -> None:
        from tokenpools.replay.trace import frame, write_partitioned

        for (table, partition), rows in sorted(self._buffers.items()):
            if not rows:
                continue
            written = write_partitioned(self.config.out_dir, table, frame(table, rows), partition, -1)
            self.stats.files += len(written)
            self.stats.records += len(rows)
            self.stats.by_table[table] = self.stats.by_table.get(table, 0) + len(rows)
        self._buffers.clear()
        if self._pending_commit:
            await consumer.commit(dict(self._pending_commit))
            self._pending_commit.clear()

    async def run(self) -> RecorderStats:
        """Record until interrupted, or until ``idle_exit_s`` passes without a record (a proxy's watermark, a
        batch of no events, is none)."""
        consumer = self._consumer()
        await consumer.start()
        coordinator_log, summarise = logging.getLogger("aiokafka.consumer.group_coordinator"), _SummariseAssignment()
        coordinator_log.addFilter(summarise)
        progress = _Progress(self.show_progress)
        try:
            consumer.subscribe(topics=sorted(self.specs), listener=self._listener(consumer))
            last_record = last_flush = self.clock.now_s()
            while True:
                batch = await consumer.getmany(timeout_ms=self.config.poll_ms, max_records=self.config.batch_size)
                now = self.clock.now_s()
                took = [self._take(tp, message) for tp, messages in batch.items() for message in messages]
                if any(took):  # watermarks alone leave the idle clock running
                    last_record = now
                buffered = sum(len(rows) for rows in self._buffers.values())
                idle = self.config.idle_exit_s is not None and now - last_record >= self.config.idle_exit_s
                if buffered >= self.config.batch_size or now - last_flush >= self.config.flush_s or idle:
                    await self._flush(consumer)
                    last_flush = now
                progress.show(self.stats, buffered)
                if idle:
                    break
        except asyncio.CancelledError:
            await self._flush(consumer)
            raise
        finally:
            progress.close()
            await consumer.stop()
            coordinator_log.removeFilter(summarise)
        return self.stats


class _Progress:
    """A rich status line on stderr: records written, files, rejected (none when disabled)."""

    def __init__(self, enabled: bool) -> None:
        self._progress = None
        if enabled:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                      console=Console(stderr=True))
            self._progress.start()
            self._task = self._progress.add_task("recording")

    def show(self, stats: RecorderStats, buffered: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=(
                f"recording: {stats.records} written in {stats.files} files, {buffered} buffered, "
                f"{stats.rejected} rejected"))

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
