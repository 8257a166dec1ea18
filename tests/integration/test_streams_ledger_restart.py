"""The usage ledger on a real broker: completions in, usage records out, exact across a worker's SIGKILL.

A live scripted stream (two entitlements) goes to worker A, which is killed once it has published some usage and
replaced by worker B. B restores the entitlements' ledgers from the table's changelog, reads the events again from
A's committed offsets (skipping, ledger by ledger, what its ledger holds) and publishes. The newest usage record of
each (tenant, entitlement, model, day) is then the exact sum of that entitlement's completion events, and each
key's versions only grew across the restart. Recorded (``tokenpools record``'s recorder: completions, specs and the
agents' usage records, every version), the log reconciles: ``tokenpools usage --log DIR --reconcile`` exits 0.

The second test adds LATE completions to such a stream: completions of the previous UTC day (their event times
straddle its midnight with some of the new day's), sent after the new day's, some to A before the kill and some to
B after it, so B folds them into the ledger it restored; and one older than the retention in each part, which is
dead-lettered as late and counted nowhere. The earlier day's usage record gets exactly the late ones, and the whole
log reconciles: the events side leaves out, as the ledger does, the completions beyond the retention.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

from tokenpools.cli import main
from tokenpools.config import KafkaSettings
from tokenpools.replay import trace, usage, usage_sources
from tokenpools.replay.recorder import Recorder, RecorderConfig
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.streams.admin import ensure_topics
from tokenpools.streams.budgets.ledger import DAY_MS, utc_day
from tokenpools.topics.declarations import Topics, topics_for
from tokenpools.topics.records import (
    DeadLetter,
    DeadLetterReason,
    RequestCompleted,
    UsageRecord,
)
from tokenpools_dev import builders
from tokenpools_dev.kafka import local_kafka
from tokenpools_dev.streams import harness
from tokenpools_dev.streams import scripted

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOWS = 10


def _totals(events: list[scripted.Scripted]) -> dict[str, tuple[int, int, int, int]]:
    out: dict[str, tuple[int, int, int, int]] = defaultdict(lambda: (0, 0, 0, 0))
    for record, _ in events:
        if isinstance(record, RequestCompleted):
            day = utc_day(record.t_ms)
            key = f"{'tenant-a' if record.entitlement == 'copilot' else 'tenant-b'}/{record.entitlement}/test/model/{day}"
            p, c, o, n = out[key]
            out[key] = (p + record.prompt_tokens, c + record.cached_prompt_tokens, o + record.completion_tokens, n + 1)
    return dict(out)


def _tokens(record: UsageRecord) -> tuple[int, int, int, int]:
    u = record.usage
    return u.prompt_tokens, u.cached_prompt_tokens, u.completion_tokens, u.requests


async def _setup(kafka_bootstrap: str, tmp_path: Path, name: str) -> tuple[str, Topics, Path, str, list[str]]:
    """Fresh topics under a prefix of their own, the scripted pool's config, and a worker's settings overrides:
    (uid, topics, config path, consumer group, overrides)."""
    uid = uuid.uuid4().hex[:8]
    topics = topics_for(f"{name}-{uid}.", partitions=2)
    await ensure_topics(KafkaClients(KafkaSettings(bootstrap_servers=kafka_bootstrap)), topics)
    config = tmp_path / "pool.yaml"
    config.write_text(scripted.CONFIG_YAML)
    group = f"agents-{name}-{uid}"
    overrides = ["streams.tick_s=1", "streams.grace_s=0.3", f"kafka.bootstrap_servers={kafka_bootstrap}",
                 f"kafka.topic_partitions={topics.requests.partitions}", "budgets.publish_interval_s=0.3",
                 f"kafka.topic_prefix={topics.requests.name.removesuffix('requests')}", f"streams.app_id={group}"]
    return uid, topics, config, group, overrides


async def test_usage_is_exact_and_versions_grow_across_a_killed_worker(kafka_bootstrap: str, tmp_path: Path) -> None:
    uid, topics, config, group, overrides = await _setup(kafka_bootstrap, tmp_path, "led")
    base_ms = (int(time.time()) + 4) * 1000
    events = scripted.scripted_events(base_ms, 1000, scripted.two_class_phases(WINDOWS))
    expected = _totals(events)
    await harness.publish_specs(kafka_bootstrap, topics.specs.name, scripted.CONFIG_YAML, base_ms)
    usage = harness.Collector(kafka_bootstrap, topics.usage.name, UsageRecord, partitions=topics.usage.partitions)
    workers = {"a": harness.start_worker(config, overrides, tmp_path / "a.log")}
    try:
        await usage.start()
        producing = asyncio.create_task(harness.produce(kafka_bootstrap, [topics], events, live=True, pack_events=10))
        await usage.wait_for(lambda r: sum(x.usage.requests for x in r[-2:]) > 20, 40)
        deadline = time.monotonic() + 20
        while not any((committed := await _committed(kafka_bootstrap, group)).values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)  # A acknowledged a batch: B does not just read everything again
        harness.kill(workers["a"])
        from_a = len(usage.records)
        committed = await _committed(kafka_bootstrap, group)
        workers["b"] = harness.start_worker(config, overrides, tmp_path / "b.log")
        await producing

        def exact(records: list[UsageRecord]) -> bool:
            newest = {}
            for record in records:
                newest[f"{record.tenant}/{record.entitlement}/{record.model}/{record.day}"] = _tokens(record)
            return newest == expected

        await usage.wait_for(exact, 60)
    finally:
        for process in workers.values():
            harness.stop(process)
        await usage.stop()
        logs = {name: (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:] for name in workers}

    assert max(committed.values(), default=0) > 0, f"A had committed no offset: B could just re-read. {logs['a']}"
    assert 0 < from_a < len(usage.records), logs
    versions: dict[bytes | None, list[int]] = defaultdict(list)
    for key, record in zip(usage.keys, usage.records):
        versions[key].append(record.version)
        assert key == f"{record.tenant}/{record.entitlement}/{record.model}/{record.day}".encode()
    for key, seen in versions.items():
        assert all(a < b for a, b in zip(seen, seen[1:])), (key, seen)

    # the recorded log's completions against the agents' own usage records in it: every key equal
    log = tmp_path / "log"
    prefix = topics.requests.name.removesuffix("requests")
    await Recorder(KafkaClients(KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix)),
                   RecorderConfig(out_dir=log, topics=("completions", "specs", "usage"), group_id=f"rec-{uid}",
                                  flush_s=0.3, idle_exit_s=3.0, poll_ms=200)).run()
    assert trace.read_table(log, "usage").height == len(usage.records)  # every version the agents sent
    assert await asyncio.to_thread(main, ["usage", "--log", str(log), "--reconcile"]) == 0


def _late(request_id: str, entitlement: str, t_ms: int, i: int) -> RequestCompleted:
    """A completion that happened at ``t_ms``, whenever it is sent."""
    prompt = 40 + i
    return builders.completed(request_id, t_ms, pool=scripted.POOL, entitlement=entitlement,
                              admitted_t_ms=t_ms - 500, prompt_tokens=prompt, cached_prompt_tokens=i % 3 * 8,
                              completion_tokens=10 + i % 7, reserved_tokens=prompt + 64,
                              kv_bytes=(prompt + 64) * scripted.KV_PER_TOKEN, ttft_s=0.05, e2e_s=0.5)


def _late_part(part: str, midnight_ms: int, sent_ms: int) -> tuple[list[scripted.Scripted], list[scripted.Scripted]]:
    """Completions around the UTC midnight ``midnight_ms`` (the day the stream is live in starts there), all sent
    at ``sent_ms``, after completions of the live stream: four of the day before (both entitlements) mixed with two
    of the new day; then one three UTC days back, beyond the default retention (3 days: two days late still count).
    Returns (those within the retention, the too-old one)."""
    times = [midnight_ms - 40_000, midnight_ms + 10_000, midnight_ms - 20_000, midnight_ms - 1, midnight_ms,
             midnight_ms - 30_000]
    kept = [(_late(f"late-{part}-{i}", ("copilot", "batch")[i % 2], t, i), sent_ms) for i, t in enumerate(times)]
    too_old = [(_late(f"too-old-{part}", "copilot", midnight_ms - 2 * DAY_MS - 5_000, 9), sent_ms)]
    return kept, too_old


def _newest(records: list[UsageRecord]) -> dict[str, tuple[int, int, int, int]]:
    newest = {}
    for record in records:
        newest[f"{record.tenant}/{record.entitlement}/{record.model}/{record.day}"] = _tokens(record)
    return newest


async def test_late_completions_count_in_their_own_day_across_a_killed_worker(kafka_bootstrap: str,
                                                                               tmp_path: Path) -> None:
    uid, topics, config, group, overrides = await _setup(kafka_bootstrap, tmp_path, "lat")
    base_ms = (int(time.time()) + 4) * 1000
    midnight_ms = base_ms // DAY_MS * DAY_MS
    live = scripted.scripted_events(base_ms, 1000, scripted.two_class_phases(WINDOWS))
    late_a, too_old_a = _late_part("a", midnight_ms, base_ms + 3_000)  # to worker A
    late_b, too_old_b = _late_part("b", midnight_ms, base_ms + 7_000)  # after A's kill: to worker B
    split_ms = base_ms + 5_000
    first = sorted([e for e in live if e[1] <= base_ms + 3_000] + late_a + too_old_a, key=lambda e: e[1])
    then = [e for e in live if base_ms + 3_000 < e[1] < split_ms]
    before = first + then
    after = sorted([e for e in live if e[1] >= split_ms] + late_b + too_old_b, key=lambda e: e[1])
    too_old = {r.request_id for r, _ in too_old_a + too_old_b}
    expected_a = _totals([e for e in before if getattr(e[0], "request_id", None) not in too_old])
    expected = _totals([e for e in before + after if getattr(e[0], "request_id", None) not in too_old])
    day_before, old_day = utc_day(midnight_ms - 1), utc_day(midnight_ms - 2 * DAY_MS - 5_000)
    late_ids = {r.request_id for r, _ in late_a + late_b + too_old_a + too_old_b}
    # the earlier day's keys hold only late completions, some of each part
    assert {k for k in expected if k.endswith(day_before)} == {f"tenant-a/copilot/test/model/{day_before}",
                                                              f"tenant-b/batch/test/model/{day_before}"}
    assert all(expected[k][3] == 4 for k in expected if k.endswith(day_before))
    await harness.publish_specs(kafka_bootstrap, topics.specs.name, scripted.CONFIG_YAML, base_ms)
    usage_topic = harness.Collector(kafka_bootstrap, topics.usage.name, UsageRecord, partitions=topics.usage.partitions)
    dead = harness.Collector(kafka_bootstrap, topics.dead_letters.name, DeadLetter, partitions=topics.dead_letters.partitions)
    workers = {"a": harness.start_worker(config, overrides, tmp_path / "a.log")}

    def dead_late(records: list[DeadLetter]) -> set[str]:
        return {json.loads(r.payload).get("request_id") for r in records if r.reason is DeadLetterReason.LATE}

    try:
        await usage_topic.start()
        await dead.start()
        await harness.produce(kafka_bootstrap, [topics], first, live=True, pack_events=10)
        late_sent = await _end_offsets(kafka_bootstrap, topics.completions.name, topics.completions.partitions)
        await harness.produce(kafka_bootstrap, [topics], then, live=True, pack_events=10)
        # A folded and published everything sent to it, the late completions in their own days
        await usage_topic.wait_for(lambda r: _newest(r) == expected_a, 60)
        deadline = time.monotonic() + 30
        committed = await _committed(kafka_bootstrap, group)
        while not _covers(committed, late_sent) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)  # A acknowledged its late completions: B has them from its restored ledger only
            committed = await _committed(kafka_bootstrap, group)
        harness.kill(workers["a"])
        from_a = len(usage_topic.records)
        workers["b"] = harness.start_worker(config, overrides, tmp_path / "b.log")
        await harness.produce(kafka_bootstrap, [topics], after, live=True, pack_events=10)
        await usage_topic.wait_for(lambda r: _newest(r) == expected, 90)
        await dead.wait_for(lambda r: too_old <= dead_late(r), 30)
    finally:
        for process in workers.values():
            harness.stop(process)
        await usage_topic.stop()
        await dead.stop()
        logs = {name: (tmp_path / f"{name}.log").read_text(errors="replace")[-3000:] for name in workers}

    assert _covers(committed, late_sent), (late_sent, committed, logs["a"])
    assert 0 < from_a < len(usage_topic.records), logs
    # B published the earlier day again: A's late completions (restored) plus its own
    assert any(r.day == day_before for r in usage_topic.records[from_a:]), logs
    assert not [r for r in usage_topic.records if r.day == old_day]  # the too-old completions count nowhere
    # every late completion was dead-lettered as late (the pool's windows had closed on them): a dead letter of
    # reason LATE does not say whether the ledger counted a completion; only the too-old ones it did not
    assert late_ids <= dead_late(dead.records)
    versions: dict[bytes | None, list[int]] = defaultdict(list)
    for key, record in zip(usage_topic.keys, usage_topic.records):
        versions[key].append(record.version)
    for key, seen in versions.items():
        assert all(a < b for a, b in zip(seen, seen[1:])), (key, seen)

    log = tmp_path / "log"
    prefix = topics.requests.name.removesuffix("requests")
    await Recorder(KafkaClients(KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=prefix)),
                   RecorderConfig(out_dir=log, topics=("completions", "specs", "usage"), group_id=f"rec-{uid}",
                                  flush_s=0.3, idle_exit_s=3.0, poll_ms=200)).run()
    events = usage_sources.log_events(log)
    totals = usage.aggregate(events)
    # the log's own events: what the test sent, the too-old completions in their day too
    assert {"/".join(row[:4]): row[4:8] for row in totals.iter_rows()} == {**expected, **_totals(too_old_a + too_old_b)}
    # compared with the events alone, the one difference is the too-old completions' day, which the ledger never
    # counted; the events side of a reconciliation leaves them out as the ledger does, so the whole log reconciles
    differences = usage.reconcile(events, usage_sources.log_ledger(log))
    assert differences.select(*usage.KEY).rows() == [("tenant-a", "copilot", "test/model", old_day)]
    assert differences["ledger_requests"].to_list() == [None]
    assert differences["events_requests"].to_list() == [2]
    ledger_events, left_out = usage_sources.log_ledger_events(log, retention_days=3)
    assert left_out == len(too_old_a + too_old_b) and usage.reconcile(ledger_events, usage_sources.log_ledger(log)).is_empty()
    assert await asyncio.to_thread(main, ["usage", "--log", str(log), "--reconcile"]) == 0
    # with a longer retention than the agents ran with, the too-old day is a difference again
    assert await asyncio.to_thread(main, ["usage", "--log", str(log), "--reconcile",
                                          "--set", "budgets.usage_retention_days=5"]) == 1


def _covers(committed: dict[str, int], ends: dict[str, int]) -> bool:
    return all(committed.get(tp, 0) >= end for tp, end in ends.items())


async def _end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[str, int]:
    """``"topic/partition"`` → the offset the next record produced to it will get, for its non-empty partitions."""
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
