"""The usage ledger on a real broker: completions in, usage records out, exact across a worker's SIGKILL.

A live scripted stream (two entitlements) goes to worker A, which is killed once it has published some usage and
replaced by worker B. B restores the entitlements' ledgers from the table's changelog, reads the events again from
A's committed offsets (skipping, ledger by ledger, what its ledger holds) and publishes. The newest usage record of
each (tenant, entitlement, model, day) is then the exact sum of that entitlement's completion events, and each
key's versions only grew across the restart. Recorded (``tokenpools record``'s recorder: completions, specs and the
agents' usage records, every version), the log reconciles: ``tokenpools usage --log DIR --reconcile`` exits 0.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from tokenpools.cli import main
from tokenpools.config import KafkaSettings
from tokenpools.replay import trace
from tokenpools.replay.recorder import Recorder, RecorderConfig
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.streams.admin import ensure_topics
from tokenpools.streams.ledger import utc_day
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.codec import encode
from tokenpools.topics.records import RequestCompleted, SpecRecord, UsageRecord
from tokenpools_dev.kafka import local_kafka
from tokenpools_dev.streams import harness as H
from tokenpools_dev.streams import scripted as T

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOWS = 10


def _totals(events: list[T.Scripted]) -> dict[str, tuple[int, int, int, int]]:
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


async def test_usage_is_exact_and_versions_grow_across_a_killed_worker(kafka_bootstrap: str, tmp_path: Path) -> None:
    uid = uuid.uuid4().hex[:8]
    topics = topics_for(f"led-{uid}.", partitions=2)
    await ensure_topics(KafkaClients(KafkaSettings(bootstrap_servers=kafka_bootstrap)), topics)
    config = tmp_path / "pool.yaml"
    config.write_text(T.CONFIG_YAML)
    group = f"agents-led-{uid}"
    overrides = ["streams.tick_s=1", "streams.grace_s=0.3", f"kafka.bootstrap_servers={kafka_bootstrap}",
                 f"kafka.topic_partitions={topics.requests.partitions}", "budgets.publish_interval_s=0.3",
                 f"kafka.topic_prefix={topics.requests.name.removesuffix('requests')}", f"streams.app_id={group}"]
    base_ms = (int(time.time()) + 4) * 1000
    events = T.scripted_events(base_ms, 1000, T.two_class_phases(WINDOWS))
    expected = _totals(events)
    await _publish_specs(kafka_bootstrap, topics.specs.name, T.CONFIG_YAML, base_ms)
    usage = H.Collector(kafka_bootstrap, topics.usage.name, UsageRecord, partitions=topics.usage.partitions)
    workers = {"a": H.start_worker(config, overrides, tmp_path / "a.log")}
    try:
        await usage.start()
        producing = asyncio.create_task(H.produce(kafka_bootstrap, [topics], events, live=True, pack_events=10))
        await usage.wait_for(lambda r: sum(x.usage.requests for x in r[-2:]) > 20, 40)
        deadline = time.monotonic() + 20
        while not any((committed := await _committed(kafka_bootstrap, group)).values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)  # A acknowledged a batch: B does not just read everything again
        H.kill(workers["a"])
        from_a = len(usage.records)
        committed = await _committed(kafka_bootstrap, group)
        workers["b"] = H.start_worker(config, overrides, tmp_path / "b.log")
        await producing

        def exact(records: list[UsageRecord]) -> bool:
            newest = {}
            for record in records:
                newest[f"{record.tenant}/{record.entitlement}/{record.model}/{record.day}"] = _tokens(record)
            return newest == expected

        await usage.wait_for(exact, 60)
    finally:
        for process in workers.values():
            H.stop(process)
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


async def _publish_specs(bootstrap: str, topic: str, config_yaml: str, t_ms: int) -> None:
    """The config's pool and entitlements on the specs topic as the controller publishes them (pool first): the
    agents see the specs they were started with, and a recorded log knows each entitlement's tenant and model."""
    docs = [d for d in yaml.safe_load_all(config_yaml) if d]
    records = [SpecRecord(kind=d["kind"], name=d["metadata"]["name"],
                          pool=d["metadata"]["name"] if d["kind"] == "TokenPool" else d["spec"]["poolRef"]["name"],
                          generation=1, spec=d["spec"], state="Bound" if d["kind"] == "TokenEntitlement" else None,
                          t_ms=t_ms - 60_000)
               for kind in ("TokenPool", "TokenEntitlement") for d in docs if d["kind"] == kind]
    producer = local_kafka(bootstrap).producer("test-producer", acks="all")
    await producer.start()
    try:
        for record in records:
            await producer.send_and_wait(topic, encode(record), key=f"{record.kind}/{record.name}".encode())
    finally:
        await producer.stop()


async def _committed(bootstrap: str, group: str) -> dict[str, int]:
    admin = local_kafka(bootstrap).admin("test-admin")
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {f"{tp.topic}/{tp.partition}": meta.offset for tp, meta in offsets.items() if "completions" in tp.topic}
