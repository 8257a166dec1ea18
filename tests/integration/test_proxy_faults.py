"""Kafka goes away while requests flow: no request fails because of it, events spool to disk, and once the broker
is back every event is on its topic exactly once per request id (counted over all of them, not sampled)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from pathlib import Path

import orjson
import pytest
from backend_fixtures import inference_sim_binary  # noqa: F401  (fixture import)
from openai import AsyncOpenAI
from proxy_fixtures import KEYS, produce, read_topic, start_proxy, start_sim, topics  # noqa: F401

from tokenpools.topics.declarations import Topics
from tokenpools_dev import builders
from tokenpools_dev.devstack.inference_sim import InferenceSim
from tokenpools_dev.devstack.kafka import KafkaBroker
from tokenpools_dev.kafka import local_kafka
from tokenpools_dev.proxy.doubles import limit_update

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POOL = "sim-pool"
LIMITS = {"gold": (16, 1e6, 1e12, 900.0), "kvtight": (1, 1.0, 1.0, 1.0), "spot": (1, 1.0, 1.0, 1.0),
          "pre": (1, 1.0, 1.0, 1.0)}
LIMITS_TTL_S = 600
MESSAGES = [{"role": "user", "content": "Hello there, how are you today?"}]


async def until(predicate: Callable[[], bool], timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("outage", ["stop", "kill"])
async def test_broker_outage_loses_no_request_and_no_event(
        outage: str, start_sim: Callable[..., InferenceSim], kafka_broker: KafkaBroker, kafka_bootstrap: str,
        topics: Topics, tmp_path: Path) -> None:
    sim = start_sim(max_num_seqs=32, time_to_first_token=0.02, inter_token_latency=0.005)
    # the outage (~6 s, then the broker's restart) must be shorter than the producer's request timeout, the bound
    # within which a paused broker stores every event once (proxy.events); a queue of 100 makes the events spool
    # within a second. A killed broker is recovered uncleanly: late in full runs it stored a batch twice (116-245
    # events), the producer's retry of one it had stored and not acknowledged, within the bound. So after a kill
    # the promise is the identity: every copy is the same record, and counters count it once (core.resends).
    timeout_ms = 180_000
    options = {"producer_request_timeout_ms": timeout_ms, "event_queue_size": 100, "heartbeat_interval_s": 0.5}
    # the one limit update stays in force however long the broker takes to recover (a run late in a full suite
    # outlived the default limits_ttl_s of 30 s: static limits made gold's requests wait)
    ttl = (f"proxy.limits_ttl_s={LIMITS_TTL_S}",)
    async with start_proxy([sim.base_url], kafka_broker.bootstrap, topics, tmp_path, ttl, **options) as proxy:
        await produce(kafka_bootstrap, topics.limits.name, POOL,
                      limit_update(POOL, 1, int(time.time() * 1000), LIMITS, 32))
        await proxy.wait_version(POOL, 1)
        events = proxy.proxy.events
        assert events is not None
        ids: list[str] = []
        failures: list[str] = []
        stop = asyncio.Event()

        async def worker(i: int) -> None:
            async with AsyncOpenAI(base_url=proxy.base_url, api_key=KEYS["gold"], max_retries=0) as oai:
                n = 0
                while not stop.is_set():
                    n += 1
                    try:
                        if (i + n) % 2:
                            raw = await oai.chat.completions.with_raw_response.create(
                                model="fake-model", messages=MESSAGES, max_tokens=4)
                        else:
                            raw = await oai.chat.completions.with_raw_response.create(
                                model="fake-model", messages=MESSAGES, max_tokens=4, stream=True)
                            async for _ in raw.parse():
                                pass
                        ids.append(raw.headers["X-Request-Id"])
                    except Exception as exc:  # noqa: BLE001 - every failure is a test failure, listed
                        failures.append(repr(exc))

        workers = [asyncio.create_task(worker(i)) for i in range(8)]
        await until(lambda: len(ids) >= 30)
        before_outage = len(ids)
        outage_started = time.monotonic()
        await asyncio.to_thread(kafka_broker.stop if outage == "stop" else kafka_broker.kill)
        try:
            await asyncio.sleep(6.0)  # longer than the producer's request timeout: sends fail, events spool
            await until(lambda: len(ids) - before_outage >= 30)
            during_outage = len(ids) - before_outage
            assert events.degraded and events.counts.spooled > 0, events.counts
        finally:
            await asyncio.to_thread(kafka_broker.start)
        outage_s = time.monotonic() - outage_started
        after_restart = len(ids)
        await until(lambda: len(ids) - after_restart >= 30)
        stop.set()
        await asyncio.gather(*workers)
        await proxy.drained()
        counts = events.counts
    assert not failures, failures[:5]
    assert outage_s < timeout_ms / 1000, f"the broker was away {outage_s:.0f} s: beyond the exactly-once bound"
    assert before_outage >= 30 and during_outage >= 30  # requests kept flowing while the broker was away
    assert counts.dropped == 0 and counts.spooled > 0 and counts.drained > 0
    assert counts.sent + counts.drained == counts.queued
    # the proxy packs events of one (topic, pool) into event_batch records: read_topic gives every element of every
    # record; the Kafka records themselves show the packing (the drain packs what was spooled)
    on_topics = [await read_topic(kafka_bootstrap, t.name, settle_s=3.0) for t in (topics.requests, topics.completions)]
    raw = await _read_raw(kafka_bootstrap, topics.requests.name, topics.completions.name)
    for topic in (topics.requests.name, topics.completions.name):
        values = [orjson.loads(m.value) for (t, _), ms in raw.items() if t == topic for m in ms]
        assert any(v.get("record_type") == "event_batch" for v in values), topic
    decided, completed = on_topics
    # a request has one completion and one final decision; one that waited at the proxy also has the decision that
    # made it wait (``waits``), a record of its own. A long run (late in a full suite, or a slow broker recovery)
    # outlives limits_ttl_s of the one limit update: static limits come in force, and gold's requests may wait.
    waited = sum(1 for r in decided if r.get("waits"))
    for records in (decided, completed):
        per_record = Counter((r["request_id"], bool(r.get("waits"))) for r in records)
        assert {rid for rid, _ in per_record} == set(ids), (
            f"missing {len(set(ids) - {rid for rid, _ in per_record})}, unexpected "
            f"{len({rid for rid, _ in per_record} - set(ids))}")
        duplicated = {k: v for k, v in per_record.items() if v != 1}
        if outage == "stop":  # a paused broker keeps its state: the producer's retries are recognised
            assert not duplicated, f"{len(duplicated)} records more than once, e.g. {list(duplicated.items())[:3]}"
        # each record has one identity, which every copy carries, so every counter counts it once
        identities: dict[tuple[str, bool], set[tuple[Any, ...]]] = {key: set() for key in per_record}
        for r in records:
            identities[(r["request_id"], bool(r.get("waits")))].add(
                (r["entitlement"], r["proxy_id"], r["proxy_start_ms"], r["sequence"]))
        assert all(len(v) == 1 for v in identities.values()), [v for v in identities.values() if len(v) != 1][:3]
        assert len({i for v in identities.values() for i in v}) == len(ids) + (waited if records is decided else 0)
        copies: dict[tuple[str, bool], dict[str, Any]] = {}
        for r in records:
            assert copies.setdefault((r["request_id"], bool(r.get("waits"))), r) == r, "a copy differs from the first"
    assert all(c["status"] == "ok" for c in completed)


async def _read_raw(bootstrap: str, *names: str, settle_s: float = 2.0) -> dict[tuple[str, int], list[Any]]:
    """Every Kafka record of the topics, per (topic, partition), in offset order (packed records as they are)."""
    logs: dict[tuple[str, int], list[Any]] = {}
    consumer = local_kafka(bootstrap).consumer("test-reader", group_id=None, enable_auto_commit=False,
                                               auto_offset_reset="earliest")
    consumer.subscribe(list(names))
    await consumer.start()
    try:
        quiet = time.monotonic()
        while time.monotonic() - quiet < settle_s:
            batch = await consumer.getmany(timeout_ms=200)
            for tp, messages in batch.items():
                logs.setdefault((tp.topic, tp.partition), []).extend(messages)
                quiet = time.monotonic()
    finally:
        await consumer.stop()
    return {tp: sorted(ms, key=lambda m: m.offset) for tp, ms in logs.items()}


async def test_watermarks_stay_honest_through_a_broker_outage(kafka_broker: KafkaBroker, kafka_bootstrap: str,
                                                               topics: Topics, tmp_path: Path) -> None:
    """The proxy's event pipeline with watermarks (``proxy.watermarks``) while the broker is killed and comes back:
    every event exactly once, and on every partition no event comes after a watermark above its time — the
    spooled and re-sent events held their keys' watermarks back — and idle keys' watermarks follow the clock
    again after the drain."""
    from tokenpools.config import KafkaSettings, ProxySettings
    from tokenpools.proxy.outbox.events import EventPipeline
    from tokenpools.proxy.outbox.producer import KeyPartitioner, kafka_producer_factory
    from tokenpools.proxy.outbox.spool import Spool
    from tokenpools.proxy.outbox.watermarks import WatermarkOptions
    from tokenpools.runtime.clock import SystemClock
    from tokenpools.runtime.kafka import KafkaClients

    kafka = KafkaClients(KafkaSettings(bootstrap_servers=kafka_broker.bootstrap))
    factory = kafka_producer_factory(kafka, "wm-proxy", ProxySettings(producer_request_timeout_ms=2000))

    clock = SystemClock()
    pools = ("pool-a", "pool-b", "pool-c")
    marks = WatermarkOptions("wm-proxy", (topics.requests.name, topics.completions.name), pools, interval_s=0.1)
    pipeline = EventPipeline(factory, Spool(tmp_path / "wm.spool"), queue_size=100, partitioner=KeyPartitioner(),
                             call_timeout_s=4.0, watermarks=marks, clock=clock, retry_backoff_s=0.5)
    await pipeline.start()
    n = 0

    async def emit_for(seconds: float) -> None:
        nonlocal n
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            n += 1
            pipeline.emit(topics.requests.name, pools[n % 2], builders.decided(
                f"r{n}", clock.wall_ms(), pool=pools[n % 2], entitlement="gold", proxy_id="wm-proxy",
                prompt_tokens_est=1, max_tokens=1, cost_tokens=2, kv_bytes=2))
            await asyncio.sleep(0.01)

    try:
        await emit_for(2.0)
        await asyncio.to_thread(kafka_broker.kill)
        try:
            await emit_for(6.0)
            assert pipeline.degraded and pipeline.counts.spooled > 0, pipeline.counts
        finally:
            await asyncio.to_thread(kafka_broker.start)
        await emit_for(2.0)
        await until(lambda: pipeline.undelivered() == 0 and not pipeline.degraded)
        await asyncio.sleep(0.5)  # idle watermarks after the drain
        done_ms = clock.wall_ms()
        await asyncio.sleep(0.5)
    finally:
        await pipeline.stop()
    assert pipeline.counts.sent + pipeline.counts.drained == pipeline.counts.queued == n
    assert pipeline.counts.drained > 0 and pipeline.watermark_violations == 0

    from tokenpools.topics.batches import decode_events

    logs = await _read_raw(kafka_bootstrap, topics.requests.name, topics.completions.name)

    seen: Counter[str] = Counter()
    newest: dict[tuple[str, str], int] = {}
    for (topic, _), messages in logs.items():
        decoded = [(m.key.decode(), decode_events(m.value)) for m in messages]
        for at, (key, d) in enumerate(decoded):
            assert d.bad == [] and d.watermark is not None and d.watermark.proxy_id == "wm-proxy"
            seen.update(r.request_id for _, r in d.records)  # type: ignore[attr-defined]
            w = d.watermark.watermark_ms
            later = [r.t_ms for k, e in decoded[at + 1:] if k == key for _, r in e.records]  # type: ignore[attr-defined]
            assert not later or min(later) >= w, (topic, key, w, min(later))
            newest[(topic, key)] = max(newest.get((topic, key), 0), w)
    assert seen == Counter(f"r{i}" for i in range(1, n + 1))  # every event exactly once
    assert all(newest[(t, p)] >= done_ms for t in marks.topics for p in pools)  # idle keys caught up
