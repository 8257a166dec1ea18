"""The usage ledger on a real broker when the broker holds completions twice: each counts once.

A proxy's spool re-sends, after an outage longer than ``proxy.producer_request_timeout_ms``, events the broker had
taken already: the very records, at new offsets. Here the stream's completions carry the proxy's identity
(``proxy_start_ms`` and a ``sequence`` per entitlement, as ``proxy.handlers`` gives them) and a third of them is
produced a second time, later, to the real broker, in batches of their own, as the spool's drain packs them. The
agents' newest usage record of each (tenant, entitlement, model, day) is then the sum of the DISTINCT completions,
and the recorded log reconciles: ``tokenpools usage --log DIR --reconcile`` exits 0, both sides counting by
``core.resends``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from tokenpools.cli import main
from tokenpools.config import KafkaSettings
from tokenpools.replay import trace
from tokenpools.replay.recorder import Recorder, RecorderConfig
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.streams.admin import ensure_topics
from tokenpools.streams.budgets.ledger import utc_day
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.records import RequestCompleted, UsageRecord
from tokenpools_dev.kafka import local_kafka
from tokenpools_dev.streams import harness
from tokenpools_dev.streams import scripted

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOWS = 8


def _identified(events: list[scripted.Scripted], start_ms: int) -> list[scripted.Scripted]:
    """The completions numbered per (pool, entitlement) in the order sent, as one proxy process does."""
    numbers: dict[tuple[str, str], int] = defaultdict(int)
    out: list[scripted.Scripted] = []
    for record, ts in events:
        if isinstance(record, RequestCompleted):
            numbers[(record.pool, record.entitlement)] += 1
            record = record.model_copy(update={"proxy_start_ms": start_ms,
                                               "sequence": numbers[(record.pool, record.entitlement)]})
        out.append((record, ts))
    return out


def _totals(events: list[scripted.Scripted]) -> dict[str, tuple[int, int, int, int]]:
    out: dict[str, tuple[int, int, int, int]] = defaultdict(lambda: (0, 0, 0, 0))
    for record, _ in events:
        if isinstance(record, RequestCompleted):
            tenant = "tenant-a" if record.entitlement == "copilot" else "tenant-b"
            key = f"{tenant}/{record.entitlement}/test/model/{utc_day(record.t_ms)}"
            p, c, o, n = out[key]
            out[key] = (p + record.prompt_tokens, c + record.cached_prompt_tokens, o + record.completion_tokens, n + 1)
    return dict(out)


def _newest(records: list[UsageRecord]) -> dict[str, tuple[int, int, int, int]]:
    newest = {}
    for r in records:
        u = r.usage
        newest[f"{r.tenant}/{r.entitlement}/{r.model}/{r.day}"] = (u.prompt_tokens, u.cached_prompt_tokens,
                                                                   u.completion_tokens, u.requests)
    return newest


async def test_a_completion_the_broker_holds_twice_counts_once_in_the_ledger_and_the_reconciliation(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    uid = uuid.uuid4().hex[:8]
    topics = topics_for(f"res-{uid}.", partitions=2)
    await ensure_topics(KafkaClients(KafkaSettings(bootstrap_servers=kafka_bootstrap)), topics)
    config = tmp_path / "pool.yaml"
    config.write_text(scripted.CONFIG_YAML)
    prefix = topics.requests.name.removesuffix("requests")
    group = f"agents-res-{uid}"
    overrides = ["streams.tick_s=1", "streams.grace_s=0.3", f"kafka.bootstrap_servers={kafka_bootstrap}",
                 f"kafka.topic_partitions={topics.requests.partitions}", "budgets.publish_interval_s=0.3",
                 f"kafka.topic_prefix={prefix}", f"streams.app_id={group}"]
    base_ms = (int(time.time()) + 4) * 1000
    events = _identified(scripted.scripted_events(base_ms, 1000, scripted.two_class_phases(WINDOWS)), base_ms - 60_000)
    completions = [(r, ts) for r, ts in events if isinstance(r, RequestCompleted)]
    resent = completions[: len(completions) // 3]  # the spool's re-send: the same records, a few seconds on
    assert len(resent) > 10
    last_ms = max(ts for _, ts in events)
    expected = _totals(events)
    await harness.publish_specs(kafka_bootstrap, topics.specs.name, scripted.CONFIG_YAML, base_ms)
    collected = harness.Collector(kafka_bootstrap, topics.usage.name, UsageRecord, partitions=topics.usage.partitions)
    worker = harness.start_worker(config, overrides, tmp_path / "w.log")
    try:
        await collected.start()
        await harness.produce(kafka_bootstrap, [topics], events, live=True, pack_events=10)
        await harness.produce(kafka_bootstrap, [topics], [(r, last_ms + 500) for r, _ in resent], live=True, pack_events=10)
        ends = await _end_offsets(kafka_bootstrap, topics.completions.name, topics.completions.partitions)
        deadline = time.monotonic() + 60
        while not _covers(await _committed(kafka_bootstrap, group), ends):  # the agents folded the copies too
            assert time.monotonic() < deadline, "the agents did not acknowledge every completion"
            await asyncio.sleep(0.3)
        await asyncio.sleep(1.5)  # a few more publications: a double count would show in a newer version
        await collected.wait_for(lambda r: _newest(r) == expected, 30)
        newest = _newest(collected.records)
    finally:
        harness.stop(worker)
        await collected.stop()
        log_tail = (tmp_path / "w.log").read_text(errors="replace")[-3000:]
    assert newest == expected, log_tail

    log = tmp_path / "log"
    await Recorder(KafkaClients(KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix)),
                   RecorderConfig(out_dir=log, topics=("completions", "specs", "usage"), group_id=f"rec-{uid}",
                                  flush_s=0.3, idle_exit_s=3.0, poll_ms=200)).run()
    recorded = trace.read_table(log, trace.COMPLETIONS)
    assert recorded.height == len(completions) + len(resent)  # the broker holds the re-sent ones twice
    assert recorded["sequence"].null_count() == 0
    assert await asyncio.to_thread(main, ["usage", "--log", str(log), "--reconcile"]) == 0


def _covers(committed: dict[str, int], ends: dict[str, int]) -> bool:
    return all(committed.get(tp, 0) >= end for tp, end in ends.items())


async def _end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[str, int]:
    from aiokafka import TopicPartition

    consumer = local_kafka(bootstrap).consumer("test-ends", enable_auto_commit=False)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
    finally:
        await consumer.stop()
    return {f"{tp.topic}/{tp.partition}": end for tp, end in ends.items() if end > 0}


async def _committed(bootstrap: str, group: str) -> dict[str, int]:
    admin = local_kafka(bootstrap).admin("test-admin")
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {f"{tp.topic}/{tp.partition}": meta.offset for tp, meta in offsets.items() if "completions" in tp.topic}
