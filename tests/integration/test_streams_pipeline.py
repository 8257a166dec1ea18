"""The agents on the real broker, in-process: a scripted stream for two entitlements of different classes (elastic
copilot, spot batch) produces the limit updates the core's functions predict for the same input, in order, with
increasing versions, and each entitlement's effective limits (a tombstone when one is deleted), which the example
consumer reads; bad and late records are dead-lettered with their source; the metrics endpoint reports them.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import pytest

from tokenpools.config import KafkaSettings, StreamsSettings, load_config_text
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.runtime.specs import Catalogue
from tokenpools.streams.admin import ensure_topics
from tokenpools.streams.app import AgentsOptions, build_agents
from tokenpools.streams.table.params import StreamParams
from tokenpools.topics.batches import batch_value
from tokenpools.topics.codec import encode
from tokenpools.topics.counts import decode_counts
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.records import DeadLetter, DeadLetterReason, EffectiveLimit, ScaleCommand
from tokenpools_dev import builders
from tokenpools_dev.kafka import local_kafka
from tokenpools_dev.streams import harness
from tokenpools_dev.streams import scripted

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WINDOWS = 8
# Settings are built directly here, not loaded from the environment, so the test does not depend on the caller's
# TOKENPOOLS_* variables.


async def test_scripted_two_class_stream_gives_the_core_prediction(kafka_bootstrap: str, tmp_path) -> None:
    prefix = f"it-{uuid.uuid4().hex[:8]}."
    topics = topics_for(prefix, partitions=2)
    kafka = KafkaClients(KafkaSettings(bootstrap_servers=kafka_bootstrap))
    partitions = await ensure_topics(kafka, topics)
    params = StreamParams(width_ms=1000, grace_ms=300, max_updates_per_tick=100)  # tick_s=1, grace_s=0.3
    loaded = load_config_text(scripted.CONFIG_YAML)
    base_ms = (int(time.time()) - WINDOWS - 4) * 1000  # the stream is history: it ended ~4 s ago
    events = scripted.scripted_events(base_ms, params.width_ms, scripted.two_class_phases(WINDOWS))
    packed = await harness.produce(kafka_bootstrap, [topics], events, pack_events=20)  # packed as the proxy packs them
    assert packed < len(events) * 0.6
    # a late record (its window closed long before it reached Kafka) and a malformed one
    late = next(r for r, _ in events if r.record_type == "request_decided").model_copy(update={"request_id": "late"})
    await harness.produce(kafka_bootstrap, [topics], [(late, int(time.time() * 1000))])
    await _produce_raw(kafka_bootstrap, topics.completions.name, b"pool-a", b"{definitely not json")
    # a batch with one bad element between two good ones (of a pool without a spec: counted, nothing published)
    now_ms = int(time.time() * 1000)
    other = [r.model_copy(update={"pool": "pool-z", "request_id": f"z{i}", "t_ms": now_ms, "admitted_t_ms": now_ms})
             for i, (r, _) in enumerate(e for e in events if e[0].record_type == "request_completed")][:2]
    await _produce_raw(kafka_bootstrap, topics.completions.name, b"pool-z", batch_value(
        [encode(other[0]), b'{"record_type": "request_completed", "schema_version": 1, "pool": "pool-z"}',
         encode(other[1])]))

    options = AgentsOptions(StreamsSettings(app_id=f"agents-{uuid.uuid4().hex[:8]}"), partitions=partitions,
                            fast_join=True, metrics_port=0, datadir=str(tmp_path / "faust"))
    agents = build_agents(params, topics, Catalogue.from_loaded(loaded), options, kafka)
    limits = await harness.Collector(kafka_bootstrap, topics.limits.name, partitions=topics.limits.partitions).start()
    scale = await harness.Collector(kafka_bootstrap, topics.scale.name, ScaleCommand, topics.scale.partitions).start()
    dead = await harness.Collector(kafka_bootstrap, topics.dead_letters.name, DeadLetter).start()
    effective = await harness.Collector(kafka_bootstrap, topics.effective_limits.name, EffectiveLimit,
                                  topics.effective_limits.partitions).start()
    counts = await harness.Collector(kafka_bootstrap, topics.counts.name, partitions=topics.counts.partitions,
                               decoder=decode_counts).start()
    through = (base_ms // 1000) + WINDOWS + 1  # two empty windows after the last events
    expected = scripted.reference_updates(loaded.pools[scripted.POOL], loaded.entitlements_of(scripted.POOL), [r for r, _ in events],
                                   params, through)
    await agents.app.start()
    try:
        got = await limits.wait_for(lambda r: r and r[-1].version >= expected[-1].version, 60)
        letters = await dead.wait_for(lambda r: len(r) >= 3, 20)
        commands = await scale.wait_for(lambda r: len(r) >= 1, 20)
        want = {(e.name, u.version) for u in expected for e in u.entitlements}
        try:
            await effective.wait_for(lambda r: {(e.entitlement, e.version) for e in r if e is not None} >= want, 20)
        except TimeoutError:
            have = {(e.entitlement, e.version) for e in effective.records if e is not None}
            raise AssertionError((sorted(want - have), sorted(have - want), sorted(have)))
        # the batch entitlement is deleted (its spec's tombstone record, as the controller writes it)
        await _produce_raw(kafka_bootstrap, topics.specs.name, b"TokenEntitlement/batch", encode(builders.spec_record(
            "TokenEntitlement", "batch", pool=scripted.POOL, deleted=True, t_ms=int(time.time() * 1000))))
        await effective.wait_for(lambda r: None in r, 30)
        # counts name the update in force when they were counted: any of those seen (on a busy machine the agents
        # may publish the next update before a counts instant passes every watermark under the last one seen)
        named = {u.version: u for u in got}
        fleet = await counts.wait_for(lambda r: any(c.pool == scripted.POOL and c.limits_version in named for c in r), 20)
        example = await _run_example(kafka_bootstrap, topics.effective_limits.name)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{agents.metrics_port}/metrics") as response:
                exposition = await response.text()
    finally:
        await agents.app.stop()
        for collector in (limits, scale, dead, effective, counts):
            await collector.stop()

    versions = [u.version for u in got]
    assert versions == sorted(set(versions)), "one update per window, in order, versions increasing"
    assert got[: len(expected)] == expected
    assert {e.name for e in got[0].entitlements} == {"copilot", "batch"}
    assert any(u.contended for u in expected) and {0} == {len(u.proxies) for u in expected}  # counts: no shares

    # the fleet counts (every 0.1 s, at an instant every proxy's watermark passed): ordered as the update they name,
    # counting every admission (the late one too) less every completion, per proxy, and every proxy of the script
    last = [c for c in fleet if c.pool == scripted.POOL and c.limits_version in named][-1]
    assert all(c.t_ms % 100 == 0 for c in fleet) and [c.t_ms for c in fleet] == sorted({c.t_ms for c in fleet})
    names = [e.name for e in named[last.limits_version].entitlements]
    net: dict[tuple[str, str], int] = {}
    for record in [r for r, _ in events] + [late]:
        if getattr(record, "entitlement", None) in names and record.t_ms < last.t_ms:
            admitted = getattr(record, "outcome", None) is AdmissionOutcome.ADMITTED
            step = 1 if admitted else -1 if record.record_type == "request_completed" else 0
            net[(record.entitlement, record.proxy_id)] = net.get((record.entitlement, record.proxy_id), 0) + step
    assert last.in_flight == tuple(sum(max(0, n) for (e, _), n in net.items() if e == name) for name in names)
    assert last.proxies == len({r.proxy_id for r, _ in events if getattr(r, "proxy_id", None)})

    records = {(e.entitlement, e.version): e for e in effective.records if e is not None}
    for update in expected:  # the fleet-wide limits are the update's, entitlement by entitlement
        for e in update.entitlements:
            r = records[(e.name, update.version)]
            assert (r.limit.concurrency, r.limit.tokens_per_s, r.limit.kv_bytes, r.priority, r.contended) == (
                e.concurrency, e.tokens_per_s, e.kv_bytes, e.priority, update.contended)
    assert all(k == f"{r.pool}/{r.entitlement}".encode() for k, r in zip(effective.keys, effective.records) if r)
    gone = effective.records.index(None)
    assert effective.keys[gone] == b"pool-a/batch"
    assert all(r.entitlement == "copilot" for r in effective.records[gone + 1:] if r is not None)
    assert example.returncode == 0, example.stderr
    table = example.stdout.splitlines()
    assert any(line.split()[:3] == ["pool-a", "copilot", "elastic"] for line in table), example.stdout
    assert not any(line.split()[:2] == ["pool-a", "batch"] for line in table), example.stdout
    assert "1 entitlements" in table[-1] and "1 tombstones, 0 invalid" in table[-1], table[-1]

    by_reason = {d.reason: d for d in letters}
    assert set(by_reason) == {DeadLetterReason.LATE, DeadLetterReason.MALFORMED, DeadLetterReason.INVALID}
    assert by_reason[DeadLetterReason.INVALID].element == 1 and by_reason[DeadLetterReason.LATE].element is None
    assert by_reason[DeadLetterReason.INVALID].key == "pool-z" and '"pool":"pool-z"' in by_reason[
        DeadLetterReason.INVALID].payload
    assert by_reason[DeadLetterReason.LATE].source_topic == topics.requests.name
    assert by_reason[DeadLetterReason.MALFORMED].source_topic == topics.completions.name
    assert by_reason[DeadLetterReason.MALFORMED].payload == "{definitely not json"

    assert all(c.pool == scripted.POOL and 1 <= c.desired_replicas <= 4 and c.floor_replicas == 1 for c in commands)
    assert 'tokenpools_agents_dead_letters_total{reason="late"} 1.0' in exposition
    assert 'tokenpools_agents_event_outcomes_total{outcome="applied"} %.1f' % (len(events) + 2) in exposition
    assert 'tokenpools_agents_events_total{type="request_decided"}' in exposition
    assert "tokenpools_agents_tick_duration_seconds_count" in exposition


async def _run_example(bootstrap: str, topic: str) -> subprocess.CompletedProcess[str]:
    """examples/effective_limits.py as a third party runs it (it imports no tokenpools: aiokafka, jsonschema and
    the schema file), reading what the topic holds for a few seconds."""
    import asyncio

    script = Path(__file__).resolve().parents[2] / "examples" / "effective_limits.py"
    command = [sys.executable, str(script), "--bootstrap", bootstrap, "--topic", topic, "--max-records", "100000",
               "--timeout-s", "6"]
    return await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)


async def _produce_raw(bootstrap: str, topic: str, key: bytes, value: bytes) -> None:
    producer = local_kafka(bootstrap).producer("test-producer")
    await producer.start()
    try:
        await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


async def test_with_the_proxies_watermarks_a_window_closes_long_before_its_grace(kafka_bootstrap: str,
                                                                                 tmp_path) -> None:
    """The proxy's real event pipeline (packing, watermarks, idle watermark records, a heartbeat) into the real
    broker and the agents with a 2 s grace: each window's update arrives well before end + grace, counted as closed
    early, and nothing is late."""
    import asyncio

    from tokenpools.config import ProxySettings
    from tokenpools.core.outcomes import AdmissionOutcome
    from tokenpools.proxy.outbox.events import EventPipeline
    from tokenpools.proxy.outbox.producer import KeyPartitioner, kafka_producer_factory
    from tokenpools.proxy.outbox.spool import Spool
    from tokenpools.proxy.outbox.watermarks import WatermarkOptions
    from tokenpools.runtime.clock import SystemClock
    from tokenpools.topics.records import ProxyHeartbeat, RequestDecided

    prefix = f"it-{uuid.uuid4().hex[:8]}."
    topics = topics_for(prefix, partitions=2)
    kafka = KafkaClients(KafkaSettings(bootstrap_servers=kafka_bootstrap))
    partitions = await ensure_topics(kafka, topics)
    params = StreamParams(width_ms=1000, grace_ms=2000, max_updates_per_tick=100)
    loaded = load_config_text(scripted.CONFIG_YAML)
    factory = kafka_producer_factory(kafka, "proxy-1", ProxySettings())  # the proxy's own producer

    clock = SystemClock()
    marks = WatermarkOptions("proxy-1", (topics.requests.name, topics.completions.name), (scripted.POOL,), interval_s=0.1)
    pipeline = EventPipeline(factory, Spool(tmp_path / "proxy-1.spool"), queue_size=10_000,
                             partitioner=KeyPartitioner(), watermarks=marks, clock=clock)
    options = AgentsOptions(StreamsSettings(app_id=f"agents-{uuid.uuid4().hex[:8]}"), partitions=partitions,
                            fast_join=True, metrics_port=0, datadir=str(tmp_path / "faust"))
    agents = build_agents(params, topics, Catalogue.from_loaded(loaded), options, kafka)
    limits = await harness.Collector(kafka_bootstrap, topics.limits.name, partitions=topics.limits.partitions).start()
    await pipeline.start()
    await agents.app.start()
    try:
        pipeline.emit(topics.heartbeats.name, "proxy-1", ProxyHeartbeat(
            proxy_id="proxy-1", t_ms=clock.wall_ms(), pools=(scripted.POOL,), started_ms=clock.wall_ms()))
        await asyncio.sleep(3)  # the group joined
        start_ms = clock.wall_ms()
        n = 0
        while clock.wall_ms() < start_ms + 6_000:
            n += 1
            pipeline.emit(topics.requests.name, scripted.POOL, RequestDecided(
                request_id=f"r{n}", pool=scripted.POOL, entitlement="copilot", proxy_id="proxy-1", t_ms=clock.wall_ms(),
                outcome=AdmissionOutcome.ADMITTED, reason="admitted", prompt_tokens_est=10, max_tokens=10,
                cost_tokens=20, kv_bytes=1000, priority=1.0))
            await asyncio.sleep(0.05)
        first_end = (start_ms // 1000 + 2) * 1000
        last_end = (clock.wall_ms() // 1000) * 1000
        got = await limits.wait_for(lambda r: any(u.version >= last_end for u in r), 20)
        arrived = {u.version: a for u, a in zip(limits.records, limits.arrived_s)}
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{agents.metrics_port}/metrics") as response:
                exposition = await response.text()
    finally:
        await agents.app.stop()
        await pipeline.stop()
        await limits.stop()
    windows = [v for v in range(first_end, last_end + 1, 1000)]
    assert windows and all(v in arrived for v in windows), (windows, sorted(arrived))
    after_end_ms = [arrived[v] * 1000 - v for v in windows]
    assert max(after_end_ms) < 1000, after_end_ms  # the grace alone would be 2000 ms after the end
    assert pipeline.counts.sent == n + 1 and pipeline.watermark_records > 0 and pipeline.watermark_violations == 0
    assert 'tokenpools_agents_windows_closed_early_total{pool="pool-a"}' in exposition
    assert 'tokenpools_agents_dead_letters_total{reason="late"}' not in exposition
    assert [u.version for u in got] == sorted({u.version for u in got})
