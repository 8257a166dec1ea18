"""``tokenpools record`` against a real broker: rows, hour partitions, rejects, and resuming without duplicates."""

from __future__ import annotations

import uuid
from pathlib import Path

import polars as pl
import pytest
from aiokafka.admin import NewTopic

from tokenpools.config import KafkaSettings
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.replay import trace
from tokenpools.replay.recorder import Recorder, RecorderConfig
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.topics import RequestCompleted, RequestDecided, Topics, encode, topics_for
from tokenpools_dev import builders
from tokenpools_dev.kafka import local_kafka

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
T0_MS = 1_772_150_400_000 + HOUR_MS - 30_000  # 30 s before an hour boundary: the rows span two hours


def _decided(i: int) -> RequestDecided:
    admitted = i % 3 != 0
    return builders.decided(
        f"r{i:04d}", T0_MS + i * 1000, pool="qwen3-8b", entitlement="guaranteed-a" if i % 2 else "spot-b",
        proxy_id="p1", outcome=AdmissionOutcome.ADMITTED if admitted else AdmissionOutcome.REFUSED_CONCURRENCY,
        reason="admitted" if admitted else "limit", retry_after_s=0 if admitted else 1, prompt_tokens_est=64,
        cost_tokens=128, kv_bytes=128 * 147_456 if admitted else 0, priority=818.18 if admitted else 0.0,
    )


def _completed(i: int) -> RequestCompleted:
    return builders.completed(
        f"r{i:04d}", T0_MS + i * 1000 + 4400, pool="qwen3-8b", entitlement="guaranteed-a", proxy_id="p1",
        admitted_t_ms=T0_MS + i * 1000, prompt_tokens=64, completion_tokens=64, reserved_tokens=128,
        kv_bytes=128 * 147_456, ttft_s=0.12, e2e_s=4.4,
    )


async def _create_topics(bootstrap: str, topics: Topics) -> None:
    """The two topics the recorder reads, two partitions each."""
    admin = local_kafka(bootstrap).admin("test-admin")
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t.name, 2, 1) for t in (topics.requests, topics.completions)])
    finally:
        await admin.close()


async def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = local_kafka(bootstrap).producer("test-producer", acks="all")
    await producer.start()
    try:
        for i, value in enumerate(values):
            await producer.send_and_wait(topic, value, key=b"qwen3-8b", partition=i % 2)
    finally:
        await producer.stop()


def _recorder(bootstrap: str, prefix: str, out: Path, group: str) -> Recorder:
    kafka = KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=prefix)
    config = RecorderConfig(out_dir=out, topics=("requests", "completions"), group_id=group, batch_size=7,
                            flush_s=0.3, idle_exit_s=3.0, poll_ms=200)
    return Recorder(KafkaClients(kafka), config)


async def test_records_partitions_by_hour_and_resumes_without_duplicates(kafka_bootstrap: str, tmp_path: Path) -> None:
    prefix = f"rec-{uuid.uuid4().hex[:8]}."
    topics = topics_for(prefix, partitions=2)
    await _create_topics(kafka_bootstrap, topics)
    out = tmp_path / "log"
    group = f"recorder-{uuid.uuid4().hex[:8]}"

    await _produce(kafka_bootstrap, topics.requests.name, [encode(_decided(i)) for i in range(40)] + [b"{not json"])
    await _produce(kafka_bootstrap, topics.completions.name, [encode(_completed(i)) for i in range(1, 40, 3)])
    stats = await _recorder(kafka_bootstrap, prefix, out, group).run()

    decided = trace.read_table(out, trace.REQUESTS)
    assert decided.height == 40 and stats.rejected == 1
    assert sorted(decided["request_id"].to_list()) == [f"r{i:04d}" for i in range(40)]
    assert decided.filter(pl.col("request_id") == "r0003")["outcome"].item() == "concurrency"
    hours = sorted(p.name for p in (out / trace.REQUESTS).iterdir())
    assert hours == ["hour=2026-02-27T00", "hour=2026-02-27T01"]
    assert trace.read_table(out, trace.COMPLETIONS).height == 13

    # stop and rerun with more records: only the new ones are added
    await _produce(kafka_bootstrap, topics.requests.name, [encode(_decided(i)) for i in range(40, 50)])
    stats = await _recorder(kafka_bootstrap, prefix, out, group).run()
    decided = trace.read_table(out, trace.REQUESTS)
    assert stats.records == 10
    assert decided.height == 50 and decided["request_id"].n_unique() == 50

    # a crash after writing but before committing (here: a group with no offsets at all) adds nothing either
    stats = await _recorder(kafka_bootstrap, prefix, out, f"{group}-fresh").run()
    assert stats.records == 0 and stats.skipped > 0
    assert trace.read_table(out, trace.REQUESTS).height == 50


async def test_batched_records_give_one_row_per_event_and_a_bad_element_keeps_its_neighbours(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    from tokenpools.topics.batches import batch_value

    prefix = f"rec-{uuid.uuid4().hex[:8]}."
    topics = topics_for(prefix, partitions=2)
    await _create_topics(kafka_bootstrap, topics)
    out, group = tmp_path / "log", f"recorder-{uuid.uuid4().hex[:8]}"
    values = [encode(_decided(i)) for i in range(40)]
    values[7] = b'{"record_type": "request_decided", "schema_version": 1}'  # one bad element in the second batch
    batches = [batch_value(values[i:i + 5]) for i in range(0, 40, 5)] + [encode(_decided(40))]  # and a plain one
    await _produce(kafka_bootstrap, topics.requests.name, batches)
    stats = await _recorder(kafka_bootstrap, prefix, out, group).run()
    decided = trace.read_table(out, trace.REQUESTS)
    assert decided.height == 40 and decided["request_id"].n_unique() == 40 and stats.rejected >= 1
    assert sorted(decided["request_id"].to_list()) == [f"r{i:04d}" for i in range(41) if i != 7]
    assert sorted(p.name for p in (out / trace.REQUESTS).iterdir()) == ["hour=2026-02-27T00", "hour=2026-02-27T01"]
    per_offset = decided.group_by("kafka_partition", "kafka_offset").len()["len"].sort().to_list()
    assert per_offset == [1] + [4] + [5] * 7  # a batch's rows carry its record's partition and offset

    assert trace.max_offsets(out, trace.REQUESTS) == {0: 4, 1: 3}
    await _recorder(kafka_bootstrap, prefix, out, f"{group}-fresh").run()  # what is on disk is not added again
    again = trace.read_table(out, trace.REQUESTS)
    assert again.height == 40 and again["request_id"].n_unique() == 40


async def test_idle_exit_ends_while_proxies_send_only_watermarks(kafka_bootstrap: str, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A live stack's idle proxies keep sending watermarks (batches of no events) to the event topics: the
    recorder's --idle-exit-s must still end it, and its assignment log line names topics and counts."""
    import asyncio
    import logging
    import time

    from tokenpools.topics.batches import Watermark, batch_value

    prefix = f"rec-{uuid.uuid4().hex[:8]}."
    topics = topics_for(prefix, partitions=2)
    await _create_topics(kafka_bootstrap, topics)
    out, group = tmp_path / "log", f"recorder-{uuid.uuid4().hex[:8]}"
    await _produce(kafka_bootstrap, topics.requests.name, [encode(_decided(i)) for i in range(3)])
    producer = local_kafka(kafka_bootstrap).producer("test-watermarks", acks="all")
    await producer.start()
    stop = asyncio.Event()

    async def watermarks() -> int:
        sent = 0
        while not stop.is_set():  # every 0.5 s, on both topics and both partitions, as idle proxies do
            for topic in (topics.requests.name, topics.completions.name):
                for partition in (0, 1):
                    mark = Watermark("proxy-0", T0_MS + 100_000 + sent)
                    await producer.send_and_wait(topic, batch_value([], mark), key=b"qwen3-8b", partition=partition)
                    sent += 1
            await asyncio.sleep(0.5)
        return sent

    sender = asyncio.create_task(watermarks())
    try:
        started = time.monotonic()
        with caplog.at_level(logging.INFO, logger="aiokafka"):
            stats = await asyncio.wait_for(_recorder(kafka_bootstrap, prefix, out, group).run(), timeout=60)
        took_s = time.monotonic() - started
    finally:
        stop.set()
        sent = await sender
        await producer.stop()
    assert sent >= 8, "the watermarks were sent while the recorder ran"
    assert stats.records == 3 and stats.rejected == 0
    assert took_s < 30, f"idle exit after {took_s:.1f} s with idle_exit_s 3"
    assigned = [r.getMessage() for r in caplog.records if "assigned" in r.getMessage()]
    assert any(f"{topics.completions.name} 2 (0-1), {topics.requests.name} 2 (0-1)" in line for line in assigned), \
        assigned


async def test_sigterm_writes_what_is_buffered_and_ends_the_command_normally(kafka_bootstrap: str,
                                                                            tmp_path: Path) -> None:
    """``tokenpools record`` as its Deployment runs it, stopped as Kubernetes stops a pod: SIGTERM, between two
    flushes (every 5 s). The rows it holds are written and committed, and the command exits 0 saying so (killed by
    the signal it would exit -15, its buffer lost until a restart re-reads it)."""
    import asyncio
    import signal
    import sys

    prefix = f"rec-{uuid.uuid4().hex[:8]}."
    topics = topics_for(prefix, partitions=2)
    await _create_topics(kafka_bootstrap, topics)
    await _produce(kafka_bootstrap, topics.requests.name, [encode(_decided(i)) for i in range(5)])
    out = tmp_path / "log"
    tokenpools = Path(sys.executable).parent / "tokenpools"
    proc = await asyncio.create_subprocess_exec(
        str(tokenpools), "record", "--out", str(out), "--topics", "requests", "--no-progress",
        "--set", f"kafka.bootstrap_servers={kafka_bootstrap}", "--set", f"kafka.topic_prefix={prefix}",
        stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(60):
            while not any("assigned" in line for line in lines):  # the group's assignment: it reads from here on
                line = await proc.stderr.readline()
                assert line, f"the recorder ended before its assignment: {lines[-5:]}"
                lines.append(line.decode())
        await asyncio.sleep(2.0)  # it has fetched the 5 records; its first flush is due 5 s after its start
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            rest = (await proc.stderr.read()).decode()
            rc = await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert rc == 0, (rc, rest[-2000:])
    assert "recorded 5 records" in rest, rest[-2000:]
    assert trace.read_table(out, trace.REQUESTS).height == 5
