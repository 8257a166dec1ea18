"""``tokenpools usage`` against a real broker: completion events and the ledger's usage records go through Kafka,
``tokenpools record`` records both, and the totals reconcile, from the log alone and against the topic.

The ledger's records here are written by the test, as the agents publish them (cumulative per key, a growing
``version``, the compacted ``usage`` topic). What is checked needs only a recorded log holding both completions
and usage records, so the same assertions hold for the agents' own ledger: ``_publish_ledger`` is the one part to
replace by running the agents over the same completions.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import polars as pl
import pytest
from aiokafka.admin import NewTopic

from tokenpools.cli import main
from tokenpools.config import KafkaSettings
from tokenpools.replay import trace, usage, usage_sources
from tokenpools.replay.recorder import Recorder, RecorderConfig
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.topics import RequestCompleted, Topics, encode, topics_for
from tokenpools.topics.batches import batch_value
from tokenpools.topics.records import UsageRecord
from tokenpools_dev import builders
from tokenpools_dev.kafka import local_kafka

pytestmark = pytest.mark.integration

MIDNIGHT_MS = 1_796_083_200_000  # 2026-12-01T00:00:00Z, a UTC midnight and a month end
POOL, MODEL = "qwen3-8b", "nvidia/Qwen3-8B-NVFP4"
TENANTS = {"guaranteed-a": "acme", "spot-b": "beta"}


def _completed(i: int, t_ms: int) -> RequestCompleted:
    return builders.completed(
        f"r{i:04d}", t_ms, pool=POOL, entitlement="guaranteed-a" if i % 3 else "spot-b", proxy_id="p1",
        admitted_t_ms=t_ms - 2000, prompt_tokens=50 + i, cached_prompt_tokens=i % 4 * 5,
        completion_tokens=10 + i % 7, reserved_tokens=128, kv_bytes=4096, ttft_s=0.1, e2e_s=2.0,
    )


# 30 events around midnight, one every 2 s from 30 s before; r0025, which happened before midnight, arrives last
EVENTS = [_completed(i, MIDNIGHT_MS - 30_000 + i * 2000) for i in range(30) if i != 5]
LATE = _completed(5, MIDNIGHT_MS - 20_000)


def _expected(events: list[RequestCompleted]) -> dict[tuple[str, str, str, str], tuple[int, int, int, int]]:
    totals: dict[tuple[str, str, str, str], list[int]] = {}
    for e in events:
        day = "2026-11-30" if e.t_ms < MIDNIGHT_MS else "2026-12-01"
        t = totals.setdefault((TENANTS[e.entitlement], e.entitlement, MODEL, day), [0, 0, 0, 0])
        for k, v in enumerate((e.prompt_tokens, e.cached_prompt_tokens, e.completion_tokens, 1)):
            t[k] += v
    return {k: tuple(v) for k, v in totals.items()}  # type: ignore[misc]


EXPECTED = _expected([*EVENTS, LATE])


async def _create_topics(bootstrap: str, topics: Topics) -> None:
    admin = local_kafka(bootstrap).admin("test-admin")
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t.name, t.partitions, 1, topic_configs=t.config())
                                   for t in (topics.completions, topics.specs, topics.usage)])
    finally:
        await admin.close()


async def _send(bootstrap: str, messages: list[tuple[str, bytes, bytes]]) -> None:
    producer = local_kafka(bootstrap).producer("test-producer", acks="all")
    await producer.start()
    try:
        for topic, key, value in messages:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


async def _publish_events(bootstrap: str, topics: Topics) -> None:
    """The specs, then the completions in batches of 5; one batch sent twice (a spool re-sending it after a
    crash: the same events at new offsets), and the late event last."""
    specs = [builders.spec_record("TokenPool", POOL, {"model": MODEL}, t_ms=MIDNIGHT_MS - 3_600_000)]
    specs += [builders.spec_record("TokenEntitlement", ent, {"tenantId": tenant}, pool=POOL, state="Bound",
                                   t_ms=MIDNIGHT_MS - 3_600_000) for ent, tenant in TENANTS.items()]
    messages = [(topics.specs.name, f"{s.kind}/{s.name}".encode(), encode(s)) for s in specs]
    batches = [batch_value([encode(e) for e in EVENTS[i:i + 5]]) for i in range(0, len(EVENTS), 5)]
    batches.insert(3, batches[1])  # the re-delivery
    batches.append(encode(LATE))
    messages += [(topics.completions.name, POOL.encode(), value) for value in batches]
    await _send(bootstrap, messages)


def _ledger_records(expected: dict[tuple[str, str, str, str], tuple[int, ...]], version: int) -> list[UsageRecord]:
    return [UsageRecord(tenant=tenant, entitlement=ent, pool=POOL, model=model, day=day, labels={"team": tenant},
                        usage={"prompt_tokens": p, "cached_prompt_tokens": c, "completion_tokens": o, "requests": n},
                        version=version, t_ms=MIDNIGHT_MS)
            for (tenant, ent, model, day), (p, c, o, n) in sorted(expected.items())]


async def _publish_ledger(bootstrap: str, topics: Topics, records: list[UsageRecord]) -> None:
    await _send(bootstrap, [(topics.usage.name, f"{r.tenant}/{r.entitlement}/{r.model}/{r.day}".encode(), encode(r))
                            for r in records])


async def _record(bootstrap: str, prefix: str, out: Path) -> None:
    kafka = KafkaClients(KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=prefix))
    config = RecorderConfig(out_dir=out, topics=("completions", "specs", "usage"),
                            group_id=f"recorder-{uuid.uuid4().hex[:8]}", flush_s=0.3, idle_exit_s=3.0, poll_ms=200)
    await Recorder(kafka, config).run()


def _totals(table: pl.DataFrame) -> dict[tuple[str, ...], tuple[int, ...]]:
    return {(r["tenant"], r["entitlement"], r["model"], r["day"]): tuple(r[c] for c in usage.COUNTS)
            for r in table.iter_rows(named=True)}


async def test_a_recorded_log_reconciles_with_its_ledger_and_with_the_topic(
        kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = f"usage-{uuid.uuid4().hex[:8]}."
    topics = topics_for(prefix, partitions=2)
    await _create_topics(kafka_bootstrap, topics)
    await _publish_events(kafka_bootstrap, topics)
    partial = {k: (0, 0, 0, 1) for k in EXPECTED}  # an early version of every key, superseded below
    await _publish_ledger(kafka_bootstrap, topics, _ledger_records(partial, 1) + _ledger_records(EXPECTED, 2))
    log = tmp_path / "log"
    await _record(kafka_bootstrap, prefix, log)

    completed = trace.read_table(log, trace.COMPLETIONS)
    assert completed.height == len(EVENTS) + 1 + 5  # the re-delivered batch is in the log twice
    assert _totals(usage.aggregate(usage_sources.log_events(log))) == EXPECTED
    assert trace.read_table(log, "usage").height == 2 * len(EXPECTED)  # every version was recorded

    kafka = ["--set", f"kafka.bootstrap_servers={kafka_bootstrap}", "--set", f"kafka.topic_prefix={prefix}"]
    assert await asyncio.to_thread(main, ["usage", "--log", str(log), "--reconcile"]) == 0
    assert await asyncio.to_thread(main, ["usage", "--log", str(log), "--reconcile", "--ledger", "topic", *kafka]) == 0
    csv = tmp_path / "topic.csv"
    assert await asyncio.to_thread(main, ["usage", "--by", "month", "--csv", str(csv), *kafka]) == 0
    months = pl.read_csv(csv, schema_overrides={c: pl.Int64 for c in usage.COUNTS})
    assert sorted(months["month"].unique().to_list()) == ["2026-11", "2026-12"]
    assert int(months["requests"].sum()) == len(EVENTS) + 1
    capsys.readouterr()

    # the ledger counts one completion token too many on one day: the topic no longer reconciles, and says where
    key = ("beta", "spot-b", MODEL, "2026-12-01")
    wrong = dict(EXPECTED)
    p, c, o, n = wrong[key]
    wrong[key] = (p, c, o + 1, n)
    await _publish_ledger(kafka_bootstrap, topics, _ledger_records({key: wrong[key]}, 3))
    assert await asyncio.to_thread(main, ["usage", "--log", str(log), "--reconcile", "--ledger", "topic", *kafka]) == 1
    out = capsys.readouterr().out
    assert out.splitlines() == [f"beta/spot-b/{MODEL}/2026-12-01: completion_tokens events {o} ledger {o + 1}"]
