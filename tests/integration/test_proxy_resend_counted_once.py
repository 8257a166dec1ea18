"""A broker hang longer than the producer's request timeout, the spool's re-send, and each completion counted once.

The proxy's event pipeline (``proxy.events``, the real producer and spool) sends completions numbered as the proxy
numbers them (``proxy_start_ms``, ``sequence`` per entitlement) while the broker is paused (SIGSTOP) for longer
than ``proxy.producer_request_timeout_ms``: batches the broker had received fail on the proxy's side, are spooled
and re-sent once it answers, so the topic may hold some completions twice. Read back in offset order, the agents'
ledger (``streams.ledger.fold``) and the events side of ``tokenpools usage`` (``replay.usage.counted_once``) each
count every completion once: both equal the sum of the distinct completions, to the token.

Whether a hang leaves copies is up to timing: on this machine four hangs of 2.5 s (1 s timeout, ~4,600
completions, ~3,800 of them spooled and drained) left none, the idempotent producer's retries landing each batch
once. The copies themselves are produced on purpose in ``test_streams_ledger_resent.py`` (the real agents).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from proxy_fixtures import topics  # noqa: F401  (fixture import)

from tokenpools.config import KafkaSettings, ProxySettings
from tokenpools.core.budgets import Usage
from tokenpools.proxy.outbox.events import EventPipeline
from tokenpools.proxy.outbox.producer import KeyPartitioner, kafka_producer_factory
from tokenpools.proxy.outbox.spool import Spool
from tokenpools.replay import trace, usage
from tokenpools.runtime.clock import SystemClock
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.streams.budgets import ledger as ledger_algebra
from tokenpools.streams.decoding import element_position
from tokenpools.streams.table.pool_state import Position
from tokenpools.topics.batches import decode_events
from tokenpools.topics.declarations import Topics
from tokenpools.topics.records import RequestCompleted
from tokenpools_dev import builders
from tokenpools_dev.devstack.kafka import KafkaBroker
from tokenpools_dev.kafka import local_kafka

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POOL = "pool-a"
ENTITLEMENTS = ("gold", "silver")
HANGS = 4


async def until(predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _read(bootstrap: str, topic: str, settle_s: float = 2.0) -> list[tuple[RequestCompleted, int, int, int]]:
    """Every completion on ``topic``, with its partition, offset and index in its packed record, in order."""
    out: list[tuple[RequestCompleted, int, int, int]] = []
    consumer = local_kafka(bootstrap).consumer("test-reader", group_id=None, enable_auto_commit=False,
                                               auto_offset_reset="earliest")
    consumer.subscribe([topic])
    await consumer.start()
    try:
        quiet = time.monotonic()
        while time.monotonic() - quiet < settle_s:
            batch = await consumer.getmany(timeout_ms=200)
            for tp, messages in batch.items():
                for m in messages:
                    decoded = decode_events(m.value)
                    assert decoded.bad == []
                    out.extend((r, tp.partition, m.offset, i)  # type: ignore[misc]
                               for i, (_, r) in enumerate(decoded.records))
                quiet = time.monotonic()
    finally:
        await consumer.stop()
    return sorted(out, key=lambda e: (e[1], e[2], e[3]))


async def test_a_spool_resend_after_a_broker_hang_is_counted_once(kafka_broker: KafkaBroker, kafka_bootstrap: str,
                                                                  topics: Topics, tmp_path: Path) -> None:
    kafka = KafkaClients(KafkaSettings(bootstrap_servers=kafka_broker.bootstrap))
    factory = kafka_producer_factory(kafka, "rs-proxy", ProxySettings(producer_request_timeout_ms=1000))
    clock = SystemClock()
    pipeline = EventPipeline(factory, Spool(tmp_path / "rs.spool"), queue_size=100, partitioner=KeyPartitioner(),
                             call_timeout_s=4.0, clock=clock, retry_backoff_s=0.3)
    start_ms = clock.wall_ms()
    numbers: Counter[str] = Counter()
    sent: list[RequestCompleted] = []

    async def emit_for(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            entitlement = ENTITLEMENTS[len(sent) % 2]
            numbers[entitlement] += 1
            n = len(sent)
            record = builders.completed(
                f"rs-proxy-{start_ms:x}-{n:x}", clock.wall_ms(), pool=POOL, entitlement=entitlement,
                proxy_id="rs-proxy", admitted_t_ms=clock.wall_ms(), prompt_tokens=10 + n % 17,
                completion_tokens=1 + n % 5, reserved_tokens=40, kv_bytes=0, e2e_s=0.01, proxy_start_ms=start_ms,
                sequence=numbers[entitlement])
            sent.append(record)
            pipeline.emit(topics.completions.name, POOL, record)
            await asyncio.sleep(0.002)

    await pipeline.start()
    try:
        for _ in range(HANGS):
            await emit_for(1.0)
            await until(lambda: not pipeline.degraded)  # sending straight again: batches in flight when it hangs
            kafka_broker.pause()  # longer than the request timeout, under the 3 s after which the broker is fenced
            try:
                await emit_for(2.5)
            finally:
                kafka_broker.resume()
        await emit_for(1.0)
        await until(lambda: pipeline.undelivered() == 0 and not pipeline.degraded)
    finally:
        await pipeline.stop()
    counts = pipeline.counts
    assert counts.dropped == 0 and counts.spooled > 0, counts  # the hang made the pipeline spool

    on_topic = await _read(kafka_bootstrap, topics.completions.name)
    copies = len(on_topic) - len({(r.entitlement, r.sequence) for r, _, _, _ in on_topic})
    assert {(r.entitlement, r.sequence) for r, _, _, _ in on_topic} == {(r.entitlement, r.sequence) for r in sent}

    def distinct(entitlement: str) -> Usage:
        total = Usage()
        for r in sent:
            if r.entitlement == entitlement:
                total += Usage(r.prompt_tokens, 0, r.completion_tokens, 1)
        return total

    # the agents' ledger, folding the topic in offset order
    resent = 0
    for entitlement in ENTITLEMENTS:
        events = [(r, Position(f"{topics.completions.name}/{p}", element_position(o, i), None))
                  for r, p, o, i in on_topic if r.entitlement == entitlement]
        ledger, outcomes = ledger_algebra.fold(ledger_algebra.new(POOL, entitlement, POOL, 0), events, ledger_algebra.Context(), 3)
        resent += outcomes.count(ledger_algebra.Folded.RESENT)
        total = Usage()
        for day in ledger.days.values():
            total += day.usage
        assert total == distinct(entitlement), entitlement
    assert resent == copies

    # the events side of `tokenpools usage --reconcile`, from the same records as a recorded log holds them
    rows = [trace.record_row(r, p, o) for r, p, o, _ in on_topic]
    once = usage.counted_once(trace.frame(trace.COMPLETIONS, rows))
    assert once.height == len(sent)
    assert int(once["prompt_tokens"].sum()) == sum(r.prompt_tokens for r in sent)
    print(f"completions sent {len(sent)}, on the topic {len(on_topic)} ({copies} held twice), "
          f"spooled {counts.spooled}, drained {counts.drained}")
