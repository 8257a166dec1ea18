"""Kafka goes away while requests flow: no request fails because of it, events spool to disk, and once the broker
is back every event is on its topic exactly once per request id (counted over all of them, not sampled)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from pathlib import Path

import pytest
from backend_fixtures import inference_sim_binary  # noqa: F401  (fixture import)
from openai import AsyncOpenAI
from proxy_fixtures import KEYS, produce, read_topic, start_proxy, start_sim, topics  # noqa: F401

from tokenpools.devstack.inference_sim import InferenceSim
from tokenpools.devstack.kafka import KafkaBroker
from tokenpools.proxy.testing import limit_update
from tokenpools.topics.declarations import Topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POOL = "sim-pool"
LIMITS = {"gold": (16, 1e6, 1e12, 900.0), "kvtight": (1, 1.0, 1.0, 1.0), "spot": (1, 1.0, 1.0, 1.0),
          "pre": (1, 1.0, 1.0, 1.0)}
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
    options = {"producer_request_timeout_ms": 2000, "event_queue_size": 100, "heartbeat_interval_s": 0.5}
    async with start_proxy([sim.base_url], kafka_broker.bootstrap, topics, tmp_path, **options) as proxy:
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
        await asyncio.to_thread(kafka_broker.stop if outage == "stop" else kafka_broker.kill)
        try:
            await asyncio.sleep(6.0)  # longer than the producer's request timeout: sends fail, events spool
            await until(lambda: len(ids) - before_outage >= 30)
            during_outage = len(ids) - before_outage
            assert events.degraded and events.counts.spooled > 0, events.counts
        finally:
            await asyncio.to_thread(kafka_broker.start)
        after_restart = len(ids)
        await until(lambda: len(ids) - after_restart >= 30)
        stop.set()
        await asyncio.gather(*workers)
        await proxy.drained()
        counts = events.counts
    assert not failures, failures[:5]
    assert before_outage >= 30 and during_outage >= 30  # requests kept flowing while the broker was away
    assert counts.dropped == 0 and counts.spooled > 0 and counts.drained > 0
    assert counts.sent + counts.drained == counts.queued
    # the proxy packs events of one (topic, pool) into event_batch records: count every element of every record
    on_topics = [await read_topic(kafka_bootstrap, t.name, settle_s=3.0) for t in (topics.requests, topics.completions)]
    assert all(any(v.get("record_type") == "event_batch" for v in values) for values in on_topics)  # the drain packs
    decided, completed = (_events(values) for values in on_topics)
    for records in (decided, completed):
        per_id = Counter(r["request_id"] for r in records)
        duplicated = {k: v for k, v in per_id.items() if v != 1}
        assert not duplicated, f"{len(duplicated)} request ids more than once, e.g. {list(duplicated.items())[:3]}"
        assert set(per_id) == set(ids), f"missing {len(set(ids) - set(per_id))}, unexpected {len(set(per_id) - set(ids))}"
    assert all(c["status"] == "ok" for c in completed)


def _events(values: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events of the records read, a packed record (``topics.batches``) giving each of its elements."""
    return [e for v in values for e in (v["events"] if v.get("record_type") == "event_batch" else [v])]
