"""Limit updates and fleet counts from Kafka, applied by version; a watchdog falls back after their TTLs.

The consumer has no group: it gets every partition of the (compacted, pool-keyed) limits topic and reads from
the beginning, so a restarted proxy sees the latest update of each pool at once, and N proxies each see
everything (each takes its own share by proxy id, if the update carries shares). Only pools this proxy serves are
decoded and applied: the record's key (the pool) is compared first. An undecodable record goes to the runtime's
dead-letter handler (logged with ``topic[partition]@offset``, counted) and on to the dead-letter topic through the
event pipeline; the loop keeps going. A broker outage only means no updates: the TTL
watchdog is what acts on it, and the consumer reconnects after a growing delay (``runtime.backoff``).

The counts topic (``topics.counts``) has a consumer of its own, also without a group, that starts at the newest
record (older counts are not followed anyway). Every proxy of a pool reads every record of the topic's partition:
``handle_counts`` compares the record's key with this proxy's pools' names before it decodes anything.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from tokenpools.proxy.aio import bounded
from tokenpools.proxy.outbox.events import EventPipeline
from tokenpools.proxy.observability.metrics import ProxyMetrics
from tokenpools.proxy.admission.pools import PoolRuntime, UpdateResult
from tokenpools.runtime.backoff import Backoff, Retries
from tokenpools.runtime.clock import Clock
from tokenpools.runtime.deadletter import DeadLetters
from tokenpools.topics.codec import DecodeError, decode
from tokenpools.topics.counts import decode_counts
from tokenpools.topics.limits import PageAssembler, pool_of_key
from tokenpools.topics.records import DeadLetterReason, LimitUpdate

log = logging.getLogger(__name__)


class LimitsApplier:
    """The decision half (no Kafka): one record in, the pool's limits maybe changed. ``wake`` is called with a pool
    whose limits changed (an update, counts, a fallback), so its waiters are tried at once (``waiting.Waits``)."""

    def __init__(self, pools: dict[str, PoolRuntime], metrics: ProxyMetrics, clock: Clock,
                 events: EventPipeline | None = None, dead_letter_topic: str = "", consumer_name: str = "",
                 wake: Callable[[PoolRuntime], None] | None = None) -> None:
        self.pools = pools
        self.metrics = metrics
        self.clock = clock
        self.events = events
        self.wake = wake or _no_waiters
        self.dead_letters = DeadLetters(dead_letter_topic, consumer_name, clock, count=self._count_invalid, logger=log)
        self._by_key = {name.encode(): runtime for name, runtime in pools.items()}  # records' keys (pools)
        self._pages = PageAssembler()  # a large pool's update arrives as pages of one version

    def refresh_pools(self) -> None:
        """The proxy's pools changed (live specs): records are matched against the new set from now on."""
        self._by_key = {name.encode(): runtime for name, runtime in self.pools.items()}

    def handle(self, value: bytes | None, topic: str = "", partition: int = 0, offset: int = 0,
               key: bytes | None = None) -> UpdateResult | None:
        if value is None:  # a tombstone on the compacted topic: nothing to apply
            return None
        if key is not None and pool_of_key(key) not in self._by_key:
            return UpdateResult.UNKNOWN_POOL  # another pool's update (keyed by pool): never decoded
        try:
            page = decode(LimitUpdate, value)
        except DecodeError as exc:
            record = self.dead_letters.note(exc.reason, exc.detail, topic, partition, offset, key, value)
            if self.events is not None and self.dead_letters.topic:
                self.events.emit(self.dead_letters.topic, topic, record)
            return None
        runtime = self.pools.get(page.pool)
        if runtime is None:
            return UpdateResult.UNKNOWN_POOL  # another proxy's pool: not ours to count
        update = self._pages.add(page)
        if update is None:
            self.metrics.limit_updates[(page.pool, UpdateResult.INCOMPLETE.value)] += 1
            return UpdateResult.INCOMPLETE
        result = runtime.apply_update(update, self.clock.now_s(), self.clock.wall_ms())
        self.metrics.limit_updates[(update.pool, result.value)] += 1
        if result is UpdateResult.APPLIED:
            self.wake(runtime)
        else:
            log.debug("limits: %s v%d %s", update.pool, update.version, result.value)
        return result

    def handle_counts(self, value: bytes | None, topic: str = "", partition: int = 0, offset: int = 0,
                      key: bytes | None = None) -> UpdateResult | None:
        """One counts record: skipped unless its key names a pool of this proxy, then decoded and followed."""
        if value is None or key is None:
            return None
        runtime = self._by_key.get(key)
        if runtime is None:
            return UpdateResult.UNKNOWN_POOL  # another pool's counts: never decoded
        try:
            record = decode_counts(value)
        except ValueError as exc:
            dead = self.dead_letters.note(DeadLetterReason.MALFORMED, str(exc), topic, partition, offset, key, value)
            if self.events is not None and self.dead_letters.topic:
                self.events.emit(self.dead_letters.topic, topic, dead)
            return None
        wall_ms = self.clock.wall_ms()
        result = runtime.apply_counts(record, self.clock.now_s(), wall_ms)
        self.metrics.counts_records[(record.pool, result.value)] += 1
        self.metrics.counts_age[(record.pool,)].observe(max(0, wall_ms - record.t_ms) / 1000)
        if result is UpdateResult.APPLIED:
            self.wake(runtime)
        return result

    def check_ttl(self) -> None:
        now = self.clock.now_s()
        for name, runtime in self.pools.items():
            changed = False
            if runtime.check_counts(now):
                changed = True
                self.metrics.counts_fallbacks[name] += 1
                log.warning("limits: no fleet counts for pool %s in %.1f s: the update's shares are in force", name,
                            runtime.fleet.counts_ttl_s)
            if runtime.check_ttl(now):
                changed = True
                self.metrics.limit_fallbacks[name] += 1
                log.warning("limits: no update for pool %s in %.0f s: static limits in force", name, runtime.ttl_s)
            if changed:
                self.wake(runtime)

    def _count_invalid(self, _reason: object) -> None:
        self.metrics.limit_records_invalid += 1


def _no_waiters(runtime: PoolRuntime) -> None:
    """The ``wake`` of an applier without waiting requests (tests of the limits alone)."""


async def watchdog(applier: LimitsApplier, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        applier.check_ttl()


Handle = Callable[[bytes | None, str, int, int, bytes | None], object]  # (value, topic, partition, offset, key)


def read_to_end(positions: Mapping[Any, int], ends: Mapping[Any, int]) -> bool:
    """Whether a consumer at ``positions`` (the next offset it reads, per partition) has read every record that was
    in its partitions when their ``ends`` were asked; no partition assigned yet is not read to its end."""
    return bool(ends) and all(positions.get(tp, 0) >= end for tp, end in ends.items())


async def consume(handle: Handle, consumer_factory: Callable[[], Any], topic: str,
                  backoff: Backoff | None = None, caught_up: Callable[[], None] | None = None) -> None:
    """Run forever: (re)start the consumer, read every partition, hand each record to ``handle``.

    The consumer has no group (``group_id=None``): subscribing then assigns it all partitions of the topic,
    including ones added later, and with no committed offsets it starts where its ``auto_offset_reset`` says
    (the limits: the earliest record; the counts: the newest). After a failure it waits ``backoff``'s growing
    delay, from the first one again once a consumer has read. ``caught_up`` is called once, after the batch with
    which the consumer has read every record that was in the topic when its partitions were first assigned
    (``read_to_end``; the specs follower's readiness).
    """
    retries = Retries(backoff or Backoff(initial_s=0.5, max_s=10.0))
    while True:
        consumer = consumer_factory()
        try:
            await consumer.start()
            consumer.subscribe([topic])
            log.info("limits: consuming %s", topic)
            ends: dict[Any, int] = {}
            while True:
                batches = await consumer.getmany(timeout_ms=500, max_records=1000)
                retries.succeeded()
                for tp, messages in batches.items():
                    for m in messages:
                        handle(m.value, tp.topic, tp.partition, m.offset, m.key)
                if caught_up is not None:
                    assigned = consumer.assignment()
                    if assigned and not ends:
                        ends = dict(await consumer.end_offsets(list(assigned)))
                    if read_to_end({tp: await consumer.position(tp) for tp in ends}, ends):
                        caught_up()
                        caught_up = None
        except asyncio.CancelledError:
            await _stop_quietly(consumer)
            raise
        except Exception as exc:  # noqa: BLE001 - the broker is away: keep the limits, try again later
            delay_s = retries.failed()
            log.warning("limits: consumer failed (%r); retrying in %.1f s", exc, delay_s)
            await _stop_quietly(consumer)
            await asyncio.sleep(delay_s)


async def _stop_quietly(consumer: Any) -> None:
    await bounded(consumer.stop(), 5.0, "limits: consumer stop")
