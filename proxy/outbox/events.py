"""Events to Kafka without the request path ever waiting: a bounded in-memory queue, a producer loop, a spool.

One idea: the proxy's event pipeline, from ``emit`` to a delivered or spooled record, in one class because the
queue, the sender and the spool's drain share one ordering and one set of counters.

- ``emit`` is synchronous and O(1): it appends to a deque (or, when the deque is full, writes the record straight
  to the spool — never drops it); it never awaits.
- The sender task encodes the records and packs those of one (topic, key = pool) into one Kafka record, an
  ``event_batch`` of the topic contract (``topics.batches``; at most ``pack_events`` records and ``pack_bytes``
  bytes, a run of one is sent as the plain record), so a consumer pays its per-message cost once per batch. It
  packs what is queued when it runs, so under load the batches grow and a lone event goes out at once; with
  ``pack_linger_s`` > 0 it first lets events gather that long (the producer's linger then adds nothing: set it
  to 0). It hands the Kafka records to the producer
  (idempotent, acks=all, batching by linger) and tracks each delivery future with the events it carries. An
  event whose delivery failed goes to the spool; one that was delivered does not — so an event is never both
  sent and spooled. What is spooled is always the single events, never a packed value, so the counters, the
  spool and its drain stay per event (the drain packs again when it sends). With idempotence the producer
  retries a batch until the broker takes it (the broker de-duplicates by sequence: a re-sent batch is never
  doubled), so a stopped broker leaves futures pending until it returns, for up to the request timeout: aiokafka
  fails a batch that waited that long for a partition leader, and if an earlier attempt of it had reached the
  broker, its spooled events land twice. A paused or cleanly restarted broker stores every event once through
  outages shorter than ``producer_request_timeout_ms`` (30 s by default). Beyond that, and after a broker crash
  (a killed broker, recovered uncleanly, was seen to store again a retried batch it had stored and not
  acknowledged, within the timeout), the promise is at least once: a completion, and a decision with an
  entitlement, carries an identity, ``proxy_start_ms`` and ``sequence``, numbered per (pool, entitlement) and
  kind by ``proxy.handlers``, by which the agents' ledger and pool state count it once (``core.resends``).
- While the spool holds records (broker unreachable, overflow), new records go behind them into the spool and the
  sender drains it in order, one batch at a time. The spool holds single events; the drain packs a batch's events
  of one (topic, key) into ``event_batch`` records (the sender's caps; each key's events in spool order), one
  delivery future per packed record. A batch's read position is committed only once every record handed to the
  producer has a final answer: the delivered events count as drained, the failed ones go back to the spool's tail
  (before the commit, so a crash in between duplicates rather than loses). If not one record could be handed, the
  batch stays at the head for the next attempt. If some were handed and then a send failed, the events never
  handed go to the tail too (packing per key means the handed ones need not be a prefix of the batch, and the
  commit must move past them all, or the next attempt would send them twice).
- Watermarks (``proxy.watermarks``), when configured: every record of a watermarked topic carries one, and a
  ``WatermarkSender`` (``proxy.watermark_sender``) sends watermark-only records for idle keys while the broker takes
  records and the spool is empty.
- Counters: queued (accepted by ``emit``), sent (delivered from memory), spooled (written to the spool), drained
  (delivered from the spool), respooled (failed again while draining), dropped (the disk refused them).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import KafkaError, KafkaTimeoutError

from tokenpools.proxy.aio import bounded
from tokenpools.proxy.outbox.packing import Encoded, Item, Packed, pack_by_key, pack_spooled
from tokenpools.proxy.outbox.producer import Batch, Partitioner, Producer, first_partition
from tokenpools.proxy.outbox.spool import Spool, SpoolEntry
from tokenpools.proxy.outbox.watermark_sender import WatermarkSender
from tokenpools.proxy.outbox.watermarks import WatermarkOptions, WatermarkTracker
from tokenpools.runtime.clock import Clock, SystemClock
from tokenpools.topics.batches import Watermark, batch_value, envelope_bytes, pack
from tokenpools.topics.codec import encode
from tokenpools.topics.records import Record
from tokenpools.topics.shards import event_key

log = logging.getLogger(__name__)


@dataclass(slots=True)
class EventCounts:
    queued: int = 0
    sent: int = 0
    spooled: int = 0
    drained: int = 0
    respooled: int = 0
    dropped: int = 0
    send_errors: int = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}  # type: ignore[attr-defined]


class EventPipeline:
    """The proxy's events on their way to Kafka: ``emit`` on the request path, a sender task, a spool (see the
    module docstring for the order, delivery and counting guarantees)."""

    def __init__(self, producer_factory: Callable[[], Producer] | None, spool: Spool, *, queue_size: int,
                 batch_size: int = 500, retry_backoff_s: float = 1.0, flush_interval_s: float = 0.1,
                 max_record_bytes: int = 900_000, partitioner: Partitioner | None = None,
                 call_timeout_s: float = 15.0, pack_events: int = 500, pack_bytes: int = 64 << 10,
                 pack_linger_s: float = 0.0, watermarks: WatermarkOptions | None = None,
                 clock: Clock | None = None, shards: Callable[[str], int] | None = None) -> None:
        self._factory = producer_factory
        self._shards = shards  # pool → its shards now (None: every pool has one): an event's key (``topics.shards``)
        # every producer call of the sender is bounded: a producer stuck inside aiokafka (seen once after a broker
        # restart) is then replaced instead of silently holding the queue. A call that timed out was cancelled
        # before its records were appended (asyncio.wait_for returns the result if it completed), so spooling
        # them cannot duplicate.
        self._call_timeout_s = call_timeout_s
        self._partitioner = partitioner or first_partition
        self._partitions: dict[str, list[int]] = {}
        self.spool = spool
        self._queue: deque[Item] = deque()
        self._queue_size = queue_size
        self._batch_size = batch_size
        self._backoff_s = retry_backoff_s
        self._flush_interval_s = flush_interval_s
        self._max_record_bytes = max_record_bytes
        pack([], pack_events, pack_bytes)  # checks the caps
        self._pack_events = pack_events
        self._pack_bytes = pack_bytes
        if pack_linger_s < 0:
            raise ValueError(f"`pack_linger_s` must be >= 0, got {pack_linger_s}")
        self._pack_linger_s = pack_linger_s  # > 0: the sender lets events gather this long before it packs
        self._clock: Clock = clock or SystemClock()
        self._marks = WatermarkTracker(watermarks) if watermarks is not None else None
        self._envelope = envelope_bytes(Watermark(watermarks.proxy_id, 0)) if watermarks is not None else 0
        self._watermark_sender = (WatermarkSender(self._marks, self._clock, self._partition, call_timeout_s)
                            if self._marks is not None else None)
        self._wakeup = asyncio.Event()
        self._producer: Producer | None = None
        self._producer_broken = False
        self._in_flight: dict[asyncio.Future[Any], list[Encoded]] = {}  # a delivery → the events it carries
        # the spool batch being drained (what stop() settles if the drain is cancelled half-way)
        self._draining: tuple[list[tuple[asyncio.Future[Any], list[SpoolEntry]]], list[SpoolEntry]] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._held = 0  # popped by the sender, not yet handed to the producer (or spooled)
        self.counts = EventCounts()
        self._unreachable = False
        self.last_error = ""
        self._warned_drop = False

    # ---- the request path -----------------------------------------------------------------------------------
    def emit(self, topic: str, key: str, record: Record) -> None:
        """Queue ``record`` for ``topic`` under ``key``; an event of a sharded pool (``key`` its pool) goes under its
        entitlement's shard key instead (``topics.shards.event_key``)."""
        self.counts.queued += 1
        if self._shards is not None and (n := self._shards(key)) > 1 and getattr(record, "pool", None) == key:
            key = event_key(key, getattr(record, "entitlement", None), n)
        if self._marks is not None and self._marks.tracks(topic):
            self._marks.add(topic, key, record.t_ms)  # type: ignore[attr-defined]
        if len(self._queue) < self._queue_size:
            self._queue.append((topic, key, record))
            if not self._wakeup.is_set():
                self._wakeup.set()
        else:
            self._to_spool(topic, key, record)

    # ---- state ----------------------------------------------------------------------------------------------
    @property
    def degraded(self) -> bool:
        """Events go to the spool instead of straight to Kafka: a send or delivery failed (broker unreachable), or
        the spool holds events (the queue overflowed while deliveries were stuck, or a previous run left some) and
        new ones must queue behind them until the drain has delivered them all."""
        return self._unreachable or self.spool.pending > 0

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        """Records that left the queue and have no final answer yet (held by the sender or by the producer)."""
        return self._held + sum(len(items) for items in self._in_flight.values())

    def undelivered(self) -> int:
        return len(self._queue) + self.in_flight + self.spool.pending

    @property
    def watermark_records(self) -> int:
        """Watermark-only records delivered (idle keys)."""
        return self._watermark_sender.records if self._watermark_sender is not None else 0

    @property
    def watermark_errors(self) -> int:
        """Watermark-only records that failed (not retried: the next one states as much)."""
        return self._watermark_sender.errors if self._watermark_sender is not None else 0

    @property
    def watermark_violations(self) -> int:
        """Events emitted with a time below a watermark already stated for their key (a wall clock stepped back)."""
        return self._marks.violations if self._marks is not None else 0

    # ---- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._factory is None:  # no Kafka: everything is kept in the spool for a later run
            self._unreachable = True
        self._tasks = [asyncio.create_task(self._send_loop(), name="events-sender"),
                       asyncio.create_task(self._flush_loop(), name="events-spooler")]
        if self._marks is not None:
            for topic, key, t_ms in self.spool.pending_times():  # a previous run's events hold their watermarks
                if self._marks.tracks(topic) and t_ms is not None:
                    self._marks.add(topic, key, t_ms)
        if self._watermark_sender is not None:
            self._tasks.append(asyncio.create_task(self._watermark_sender.run(self._taking_records, self._check_fatal),
                                                   name="events-watermarks"))

    async def stop(self, flush_timeout_s: float = 5.0) -> None:
        """Hand over what is queued (within ``flush_timeout_s``: the producer may still be connecting), then spool
        whatever has no final answer and stop."""
        await self._hand_over(flush_timeout_s)
        for task in self._tasks:
            task.cancel()
        await bounded(asyncio.gather(*self._tasks, return_exceptions=True), flush_timeout_s, "events: sender")
        self._tasks = []
        if self._producer is not None and not await bounded(self._producer.flush(), flush_timeout_s,
                                                            "events: flush at shutdown"):
            log.warning("events: %d records undelivered at shutdown go to the spool", self.in_flight)
        for fut, items in list(self._in_flight.items()):
            if not fut.done():  # undecided at exit: keep them (they may be duplicated if the broker got them)
                fut.remove_done_callback(self._delivered)
                self._in_flight.pop(fut, None)
                for item in items:
                    self._to_spool(*item)
        self._settle_at_stop()
        self._move_queue_to_spool()
        await self.spool.sync()
        if self._producer is not None:
            await bounded(self._producer.stop(), flush_timeout_s, "events: producer stop")
            self._producer = None
        self.spool.close()

    async def _hand_over(self, timeout_s: float) -> None:
        """Let the running sender deliver the queue before a clean stop; give up at once when the broker is known
        to be unreachable (the queue goes to the spool, as it would a moment later anyway)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (self._tasks and self._factory is not None and not self.degraded and (self._queue or self.in_flight)
               and loop.time() < deadline):
            if not self._wakeup.is_set():
                self._wakeup.set()
            await asyncio.sleep(0.01)

    # ---- background tasks -----------------------------------------------------------------------------------
    async def _send_loop(self) -> None:
        while True:
            if self._factory is None:
                await asyncio.sleep(3600)
                continue
            if self._producer is None or self._producer_broken:
                if not await self._start_producer():
                    await asyncio.sleep(self._backoff_s)
                    continue
            if self.degraded:
                if not await self._drain_once():
                    await asyncio.sleep(self._backoff_s)
                continue
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self._pack_linger_s > 0 and len(self._queue) < self._batch_size:
                await asyncio.sleep(self._pack_linger_s)  # cancelled here: the queue goes to the spool at stop
            await self._send_from_queue()

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self._flush_interval_s)
            if self.degraded:
                self._move_queue_to_spool()
            await self.spool.sync()

    async def _start_producer(self) -> bool:
        assert self._factory is not None
        if self._producer is not None:
            old, self._producer = self._producer, None
            await bounded(old.stop(), 5.0, "events: stopping a broken producer")
        producer = self._factory()
        try:
            await asyncio.wait_for(producer.start(), self._call_timeout_s)
        except BaseException as exc:  # broker unreachable at start (spool and retry), or shutting down
            await bounded(producer.stop(), 5.0, "events: stopping a producer that did not start")
            if not isinstance(exc, Exception):
                raise
            self._failed(f"producer start: {exc!r}")
            return False
        self._producer = producer
        self._producer_broken = False
        return True

    async def _send_from_queue(self) -> None:
        """Up to one batch of queued records, packed per (topic, key) into Kafka records (``topics.batches``) and
        grouped by topic and partition into producer batches (one ``send_batch`` and one delivery future per
        group). Records popped from the queue but not yet handed to the producer go to the spool if this is
        cancelled."""
        assert self._producer is not None
        pending = deque(self._queue.popleft() for _ in range(min(self._batch_size, len(self._queue))))
        groups: dict[tuple[str, int], list[Encoded]] = {}
        packed: dict[tuple[str, int], list[Packed]] = {}
        self._held = len(pending)
        try:
            while pending:
                topic, key, record = pending[0]
                partitions = self._partitions.get(topic)
                if partitions is None:
                    try:
                        partitions = await self._partitions_of(self._producer, topic)
                    except Exception as exc:  # noqa: BLE001 - no metadata (broker away): keep the records
                        self._send_error(exc)
                        while pending:
                            self._to_spool(*pending.popleft())
                        break
                pending.popleft()
                value = record if isinstance(record, bytes) else encode(record)
                partition = self._partitioner(key.encode(), partitions, partitions)
                t_ms = getattr(record, "t_ms", None) if self._marks is not None and self._marks.tracks(topic) else None
                groups.setdefault((topic, partition), []).append((topic, key, value, t_ms))
            packed = {tp: pack_by_key(items, self._pack_events, self._pack_bytes, self._envelope)  # no await since
                      for tp, items in groups.items()}  # the loop: atomic
            groups = {}
            for (topic, partition), units in packed.items():
                while units:
                    batch, n, members = self._producer.create_batch(), 0, []
                    in_batch: dict[str, list[int]] = {}  # key → the event times of this producer batch so far
                    for key, elements, events in units:
                        value = self._value(topic, key, elements, events, in_batch)
                        if batch.append(timestamp=None, key=key.encode(), value=value) is None:
                            break
                        n += 1
                        members += events
                    if n == 0 and len(units[0][2]) > 1:  # a packed record too large for a producer batch: unpack
                        key, _, events = units[0]
                        units[:1] = [(key, [e[2]], [e]) for e in events]
                        continue
                    if n == 0:  # larger than a whole producer batch: the broker would refuse it too
                        self._dropped(topic, ValueError("record larger than the producer's batch size"),
                                      units[0][0], units[0][2][0][3])
                        del units[:1]
                        self._held -= 1
                        continue
                    await self._send_batch(batch, topic, partition, members)
                    del units[:n]
                    self._held -= len(members)
        except asyncio.CancelledError:
            for item in pending:
                self._to_spool(*item)
            for items in groups.values():
                for encoded in items:
                    self._to_spool(*encoded)
            for units in packed.values():
                for _, _, events in units:
                    for encoded in events:
                        self._to_spool(*encoded)
            raise
        finally:
            self._held = 0

    def _value(self, topic: str, key: str, elements: list[bytes], events: list[Encoded],
               in_batch: dict[str, list[int]]) -> bytes:
        """The Kafka record's value; for a watermarked key an envelope whose watermark leaves out the events of
        this record and of the ones before it in the same producer batch (``proxy.watermarks``)."""
        if self._marks is None or events[0][3] is None:
            return batch_value(elements)
        times = in_batch.setdefault(key, [])
        times += [e[3] for e in events if e[3] is not None]
        return self._stamped(topic, key, elements, times)

    async def _send_batch(self, batch: Batch, topic: str, partition: int,
                          members: list[Encoded]) -> None:
        if not members:
            return
        assert self._producer is not None
        try:
            fut = await asyncio.wait_for(self._producer.send_batch(batch, topic, partition=partition),
                                         self._call_timeout_s)
        except Exception as exc:  # noqa: BLE001 - not queued in the producer: the records are ours to keep
            self._send_error(exc)
            for item in members:
                self._to_spool(*item)
            return
        self._in_flight[fut] = members
        fut.add_done_callback(self._delivered)

    def _delivered(self, fut: asyncio.Future[Any]) -> None:
        items = self._in_flight.pop(fut, None)
        if items is None:
            return
        if fut.cancelled() or fut.exception() is not None:
            self._check_fatal(None if fut.cancelled() else fut.exception())
            self._failed(f"delivery: {fut.exception()!r}" if not fut.cancelled() else "delivery cancelled")
            for item in items:
                self._to_spool(*item)
        else:
            self.counts.sent += len(items)
            if self._marks is not None:
                for topic, key, _, t_ms in items:
                    self._marks.done(topic, key, t_ms)

    # ---- draining the spool ---------------------------------------------------------------------------------
    async def _drain_once(self) -> bool:
        """Deliver one batch from the spool. True when it all went through (and the spool may be empty)."""
        assert self._producer is not None
        self._move_queue_to_spool()
        entries = self.spool.read_batch(self._batch_size)
        if not entries:
            self._unreachable = False
            return True
        handed: list[tuple[asyncio.Future[Any], list[SpoolEntry]]] = []
        self._draining = (handed, entries)
        complete = True
        watermarked = self._marks.topics if self._marks is not None else frozenset()
        for run in pack_spooled(entries, self._pack_events, self._pack_bytes, watermarked, self._envelope):
            try:
                value = self._drain_value(run)
                fut = await asyncio.wait_for(self._producer.send(run[0].topic, value, key=run[0].key.encode()),
                                             self._call_timeout_s)
            except Exception as exc:  # noqa: BLE001 - not appended: kept (at the head, or at the tail)
                self._send_error(exc)
                complete = False
                break
            handed.append((fut, run))
        if handed:
            await asyncio.wait([f for f, _ in handed])
        self._draining = None
        failed = self._settle(handed, entries)
        if failed:
            self._failed(f"drain: {failed} of {sum(len(run) for _, run in handed)} failed ({self.last_error})")
            return False
        if complete and self.spool.pending == 0:
            self._unreachable = False
        return complete

    def _drain_value(self, run: list[SpoolEntry]) -> bytes:
        """A run's Kafka record; on a watermarked topic with the watermark leaving out the run's own events (each
        run is its own delivery, ``proxy.watermarks``): it stays at the oldest event still spooled or in flight."""
        values = [e.value for e in run]
        topic, key = run[0].topic, run[0].key
        if self._marks is None or not self._marks.tracks(topic):
            return batch_value(values)
        return self._stamped(topic, key, values, [e.t_ms for e in run if e.t_ms is not None])

    def _settle(self, handed: list[tuple[asyncio.Future[Any], list[SpoolEntry]]], entries: list[SpoolEntry]) -> int:
        """Failed (and, after a partial hand-over, never handed) events back to the spool's tail, before the
        commit (a crash in between duplicates, never loses), then move the read position past the batch.
        Returns how many failed."""
        real = [e for e in entries if e.topic]
        if not handed and real:  # nothing left the spool: the batch stays at the head
            return 0
        failed = [e for f, run in handed if f.cancelled() or f.exception() is not None for e in run]
        for f, _ in handed:
            if not f.cancelled() and f.exception() is not None:
                self._check_fatal(f.exception())
                self.last_error = f"drain delivery: {f.exception()!r}"
                break
        done = {id(e) for _, run in handed for e in run}
        for entry in failed + [e for e in real if id(e) not in done]:
            self._to_spool(entry.topic, entry.key, entry.value, entry.t_ms, respool=True)
        self.spool.commit(entries[-1].end_offset, len(real))
        if self._marks is not None:
            lost = {id(e) for e in failed}
            for _, run in handed:
                for entry in run:
                    if id(entry) not in lost:
                        self._marks.done(entry.topic, entry.key, entry.t_ms)
        self.counts.drained += len(done) - len(failed)
        return len(failed)

    def _settle_at_stop(self) -> None:
        """A spool batch was being delivered when the sender stopped: settle it if every answer is in."""
        if self._draining is None:
            return
        handed, entries = self._draining
        if all(f.done() for f, _ in handed):
            self._settle(handed, entries)
        else:
            log.warning("events: %d spooled records undecided at exit stay in the spool (may be duplicated)",
                        sum(len(run) for f, run in handed if not f.done()))

    # ---- watermarks and partitions ------------------------------------------------------------------------
    def _stamped(self, topic: str, key: str, elements: list[bytes], leaving_out: list[int]) -> bytes:
        """A watermarked key's record: the events with the watermark this record may state (``proxy.watermarks``)."""
        assert self._marks is not None
        mark = self._marks.watermark(topic, key, self._clock.wall_ms(), leaving_out)
        self._marks.stated(topic, key, self._clock.now_s())
        return batch_value(elements, Watermark(self._marks.options.proxy_id, mark))

    def _taking_records(self) -> Producer | None:
        """The producer, while it takes records straight from the sender (not broken, not degraded)."""
        producer = self._producer
        return None if producer is None or self._producer_broken or self.degraded else producer

    async def _partitions_of(self, producer: Producer, topic: str) -> list[int]:
        """The topic's partitions, asked of the broker once (a failure raises and is asked again next time)."""
        partitions = self._partitions[topic] = sorted(
            await asyncio.wait_for(producer.partitions_for(topic), self._call_timeout_s))
        return partitions

    async def _partition(self, producer: Producer, topic: str, key: str) -> int:
        """The partition a key's records go to (the sender's, so a key's watermarks follow its events)."""
        partitions = self._partitions.get(topic)
        if partitions is None:
            partitions = await self._partitions_of(producer, topic)
        return self._partitioner(key.encode(), partitions, partitions)

    # ---- helpers --------------------------------------------------------------------------------------------
    def _move_queue_to_spool(self) -> None:
        while self._queue:
            self._to_spool(*self._queue.popleft())

    def _to_spool(self, topic: str, key: str, record: Record | bytes, t_ms: int | None = None, *,
                  respool: bool = False) -> None:
        try:
            value = record if isinstance(record, bytes) else encode(record)
            if len(value) > self._max_record_bytes:
                raise ValueError(f"record of {len(value)} bytes exceeds {self._max_record_bytes}")
            self.spool.append(topic, key, value)
        except (OSError, ValueError) as exc:
            self._dropped(topic, exc, key, t_ms if t_ms is not None else getattr(record, "t_ms", None))
            return
        if respool:
            self.counts.respooled += 1
        self.counts.spooled += 1
        if not self._wakeup.is_set():
            self._wakeup.set()

    def _dropped(self, topic: str, exc: BaseException, key: str = "", t_ms: int | None = None) -> None:
        self.counts.dropped += 1
        if self._marks is not None and t_ms is not None:
            self._marks.done(topic, key, t_ms)  # lost for good: it holds no watermark back
        if not self._warned_drop:
            self._warned_drop = True
            log.error("events: DROPPED a record for %s (%s); further drops are counted only", topic, exc)

    def _send_error(self, exc: BaseException) -> None:
        self.counts.send_errors += 1
        self._check_fatal(exc)
        self._failed(f"send: {exc!r}")

    def _check_fatal(self, exc: BaseException | None) -> None:
        """A producer that failed for a non-retriable reason (fenced, out of sequence, unknown producer id after a
        broker crash, stuck) is replaced by a fresh one; retrying with it would fail forever."""
        if exc is None or isinstance(exc, KafkaTimeoutError) or (isinstance(exc, KafkaError) and exc.retriable):
            return
        if not self._producer_broken:
            log.warning("events: producer failed for good (%r): starting a new one", exc)
        self._producer_broken = True

    def _failed(self, why: str) -> None:
        if not self._unreachable:
            log.warning("events: broker unreachable (%s): spooling to %s", why, self.spool.path)
        self._unreachable = True
        self.last_error = why
        self._wakeup.set()  # the sender may be idle: it has a spool to drain now

