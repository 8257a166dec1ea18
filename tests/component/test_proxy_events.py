"""The event pipeline against an in-memory producer: never waits on the request path, never both sends and spools a
record, spools when the broker is away, drains in order when it is back, survives a restart, counts everything."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from event_support import balanced, ids, pipeline, record, unpacked, until

from tokenpools.proxy.outbox.events import EventPipeline
from tokenpools.proxy.outbox.spool import Spool
from tokenpools.topics.batches import decode_events, records_of
from tokenpools.topics.codec import encode
from tokenpools.topics.records import RequestDecided
from tokenpools.topics.shards import shard_of
from tokenpools_dev.proxy.doubles import ProducerHub

pytestmark = pytest.mark.component


async def test_records_are_delivered_and_counted(tmp_path: Path) -> None:
    hub = ProducerHub()
    p = pipeline(hub, tmp_path)
    await p.start()
    for i in range(200):
        p.emit("t.requests", "pool-a", record(i))
    await until(lambda: p.counts.sent == 200)
    assert ids(hub) == [f"r{i}" for i in range(200)]
    assert {k for _, k, _ in hub.records} == {b"pool-a"}
    assert p.counts.spooled == 0 and not p.degraded and balanced(p)
    await p.stop()


async def test_emit_never_waits_and_a_full_queue_overflows_to_the_spool(tmp_path: Path) -> None:
    hub = ProducerHub()
    p = pipeline(hub, tmp_path, queue_size=10)
    await p.start()
    for i in range(100):  # no await in between: the sender cannot run
        p.emit("t.requests", "pool-a", record(i))
    assert p.queue_depth == 10 and p.spool.pending == 90 and p.counts.spooled == 90
    await until(lambda: p.counts.sent + p.counts.drained == 100)
    assert sorted(ids(hub)) == sorted(f"r{i}" for i in range(100)) and len(ids(hub)) == 100
    assert ids(hub)[:90] == [f"r{i}" for i in range(10, 100)]  # the spool (older) drains before the queue
    assert p.spool.pending == 0 and balanced(p)
    await p.stop()


async def test_parked_deliveries_complete_once_without_spooling(tmp_path: Path) -> None:
    hub = ProducerHub(down=True)  # like an idempotent producer retrying while the broker is away
    p = pipeline(hub, tmp_path)
    await p.start()
    for i in range(30):
        p.emit("t.requests", "pool-a", record(i))
    await until(lambda: p.in_flight == 30)
    assert not hub.records and balanced(p)
    hub.set_up()
    await until(lambda: p.counts.sent == 30)
    assert ids(hub) == [f"r{i}" for i in range(30)] and p.counts.spooled == 0
    await p.stop()


async def test_overflow_while_deliveries_are_parked_is_degraded_until_the_spool_is_drained(tmp_path: Path) -> None:
    hub = ProducerHub(down=True)  # a killed broker: deliveries stay pending, none fails
    p = pipeline(hub, tmp_path, queue_size=10, batch_size=10)
    await p.start()
    for i in range(10):
        p.emit("t.requests", "pool-a", record(i))
    await until(lambda: p.in_flight == 10)
    assert not p.degraded  # pending deliveries alone are not degraded: the broker may just be slow
    for i in range(10, 40):  # the queue fills and overflows: these events go to the spool
        p.emit("t.requests", "pool-a", record(i))
    assert p.counts.spooled > 0 and p.counts.send_errors == 0 and p.degraded
    hub.set_up()
    await until(lambda: p.counts.sent + p.counts.drained == 40)
    assert not p.degraded and p.spool.pending == 0 and sorted(ids(hub)) == sorted(f"r{i}" for i in range(40))
    await p.stop()


async def test_failed_sends_spool_and_drain_in_order_exactly_once(tmp_path: Path) -> None:
    hub = ProducerHub(fail_sends=True)
    p = pipeline(hub, tmp_path)
    await p.start()
    for i in range(120):
        p.emit("t.requests", "pool-a", record(i))
        if i % 10 == 0:
            await asyncio.sleep(0.01)
    await until(lambda: p.counts.spooled == 120)
    assert p.degraded and not hub.records and balanced(p)
    hub.set_up()
    await until(lambda: p.counts.drained == 120)
    assert ids(hub) == [f"r{i}" for i in range(120)]
    assert not p.degraded and p.spool.pending == 0 and p.spool.size_bytes == 0 and balanced(p)
    p.emit("t.requests", "pool-a", record(999))  # back to the direct path
    await until(lambda: p.counts.sent == 1)
    await p.stop()


async def test_failed_deliveries_go_to_the_spool_not_twice(tmp_path: Path) -> None:
    from aiokafka.errors import KafkaConnectionError

    hub = ProducerHub(down=True)
    p = pipeline(hub, tmp_path, batch_size=10)
    await p.start()
    for i in range(20):
        p.emit("t.requests", "pool-a", record(i))
        await asyncio.sleep(0)
    await until(lambda: p.in_flight == 20)
    assert len(hub.parked) >= 2
    first, hub.parked = hub.parked[0], hub.parked[1:]
    first[0].set_exception(KafkaConnectionError())  # the producer gives up on one batch
    failed = sum(len(records_of(value)) for _, value in first[2])  # the events the failed batch carried
    await until(lambda: p.counts.spooled == failed)
    hub.set_up()
    await until(lambda: p.counts.sent + p.counts.drained == 20)
    assert sorted(ids(hub)) == sorted(f"r{i}" for i in range(20)) and len(ids(hub)) == 20
    assert (p.counts.sent, p.counts.drained) == (20 - failed, failed) and balanced(p)
    await p.stop()


async def test_a_producer_that_cannot_start_spools_until_it_can(tmp_path: Path) -> None:
    hub = ProducerHub(refuse_start=True)
    p = pipeline(hub, tmp_path)
    await p.start()
    for i in range(10):
        p.emit("t.requests", "pool-a", record(i))
    await until(lambda: p.spool.pending == 10)
    hub.set_up()
    await until(lambda: p.counts.drained == 10)
    assert ids(hub) == [f"r{i}" for i in range(10)]
    await p.stop()


async def test_the_spool_survives_a_restart(tmp_path: Path) -> None:
    hub = ProducerHub(fail_sends=True)
    p = pipeline(hub, tmp_path)
    await p.start()
    for i in range(40):
        p.emit("t.requests", "pool-a", record(i))
    await asyncio.sleep(0.1)
    await p.stop()  # broker still away: everything is on disk
    assert not hub.records
    hub.set_up()
    again = pipeline(hub, tmp_path)
    assert again.spool.pending == 40
    await again.start()
    await until(lambda: again.counts.drained == 40)
    assert ids(hub) == [f"r{i}" for i in range(40)]
    await again.stop()
    assert Spool(tmp_path / "p.spool").pending == 0


async def test_corrupt_and_torn_spool_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "p.spool")
    for i in range(5):
        spool.append("t.requests", "pool-a", encode(record(i)))
    spool.close()
    lines = (tmp_path / "p.spool").read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b"r2", b"rX")  # a flipped byte: checksum mismatch
    (tmp_path / "p.spool").write_bytes(b"".join(lines) + lines[4][:20])  # and a torn tail
    hub = ProducerHub()
    p = pipeline(hub, tmp_path)
    assert p.spool.pending == 4 and p.spool.corrupt == 1  # the torn tail was cut at open
    await p.start()
    await until(lambda: p.counts.drained == 4)
    assert ids(hub) == ["r0", "r1", "r3", "r4"] and p.spool.corrupt == 2
    await p.stop()


async def test_only_a_refusing_disk_drops_and_it_is_counted(tmp_path: Path) -> None:
    hub = ProducerHub(fail_sends=True)
    p = pipeline(hub, tmp_path)

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    p.spool.append = full  # type: ignore[method-assign]
    await p.start()
    for i in range(5):
        p.emit("t.requests", "pool-a", record(i))
    await until(lambda: p.counts.dropped == 5)
    assert p.counts.spooled == 0 and balanced(p)
    await p.stop()


async def test_stopping_mid_send_keeps_every_record(tmp_path: Path) -> None:
    hub = ProducerHub(down=True)
    p = pipeline(hub, tmp_path, batch_size=1000)

    async def slow_batch(*_: object, **__: object) -> object:
        await asyncio.sleep(10)  # like add_batch waiting for the previous batch to drain
        raise AssertionError("not reached")

    await p.start()
    assert p._factory is not None
    for i in range(300):
        p.emit("t.requests", "pool-a", record(i))
    await until(lambda: p._producer is not None)
    p._producer.send_batch = slow_batch  # type: ignore[union-attr,method-assign]
    await asyncio.sleep(0.05)  # the sender has popped the records and waits in send_batch
    assert p.queue_depth == 0
    await p.stop(flush_timeout_s=0.1)
    assert Spool(tmp_path / "p.spool").pending == 300 and p.counts.dropped == 0


async def test_a_stuck_producer_is_replaced_and_nothing_is_lost(tmp_path: Path) -> None:
    hub = ProducerHub()
    made = []

    def factory() -> object:
        producer = hub.factory()
        made.append(producer)
        if len(made) == 1:
            async def hang(*_: object, **__: object) -> object:
                await asyncio.sleep(3600)  # never answers, never raises
            producer.partitions_for = hang  # type: ignore[method-assign]
        return producer

    p = EventPipeline(factory, Spool(tmp_path / "p.spool"), queue_size=1000, batch_size=50, retry_backoff_s=0.05,
                      flush_interval_s=0.02, call_timeout_s=0.2)  # type: ignore[arg-type]
    await p.start()
    for i in range(30):
        p.emit("t.requests", "pool-a", record(i))
    await until(lambda: p.counts.sent + p.counts.drained == 30)
    assert len(made) == 2 and sorted(ids(hub)) == sorted(f"r{i}" for i in range(30)) and len(ids(hub)) == 30
    await p.stop()


async def test_a_producer_failing_for_good_is_replaced(tmp_path: Path) -> None:
    from aiokafka.errors import OutOfOrderSequenceNumber

    hub = ProducerHub(fail_sends=True)
    made = []

    def factory() -> object:
        made.append(hub.factory())
        return made[-1]

    p = EventPipeline(factory, Spool(tmp_path / "p.spool"), queue_size=1000, batch_size=50, retry_backoff_s=0.05,
                      flush_interval_s=0.02)  # type: ignore[arg-type]
    await p.start()
    for i in range(20):
        p.emit("t.requests", "pool-a", record(i))
    await until(lambda: p.spool.pending == 20)  # broker away: all spooled
    hub.fail_sends, hub.down = False, True
    await until(lambda: len(hub.parked) > 0)  # draining: the first record is with the producer
    for fut, *_ in hub.parked:  # the restarted broker does not know this producer's sequence any more
        fut.set_exception(OutOfOrderSequenceNumber())
    hub.parked.clear()
    hub.down = False
    await until(lambda: p.counts.drained == 20)
    assert len(made) >= 2 and sorted(ids(hub)) == sorted(f"r{i}" for i in range(20)) and len(ids(hub)) == 20
    await p.stop()


def keyed(i: int, pool: str) -> RequestDecided:
    return record(i).model_copy(update={"pool": pool})


async def test_events_of_one_topic_and_pool_are_packed_within_the_caps(tmp_path: Path) -> None:
    hub = ProducerHub()
    p = pipeline(hub, tmp_path, batch_size=500, pack_events=30, pack_bytes=8 << 10)
    await p.start()
    for i in range(400):  # queued faster than the sender runs: it packs what it finds
        p.emit("t.requests" if i % 4 else "t.completions", f"pool-{i % 3}", keyed(i, f"pool-{i % 3}"))
    await until(lambda: p.counts.sent == 400)
    assert sorted(ids(hub)) == sorted(f"r{i}" for i in range(400)) and len(ids(hub)) == 400
    assert unpacked(hub) < 400 / 5  # far fewer Kafka records than events
    for topic, key, value in hub.records:
        decoded = decode_events(value)
        assert decoded.bad == [] and len(decoded.records) <= 30 and (len(value) <= 8 << 10 or not decoded.batched)
        assert {r.pool for _, r in decoded.records} == {key.decode()}  # one key per record
        assert {topic} == {"t.completions" if int(r.request_id[1:]) % 4 == 0 else "t.requests"
                           for _, r in decoded.records}
    for pool in ("pool-0", "pool-1", "pool-2"):  # each key's events in emission order
        mine = [r for r in ids(hub) if f"pool-{int(r[1:]) % 3}" == pool and int(r[1:]) % 4]
        assert mine == sorted(mine, key=lambda r: int(r[1:]))
    assert balanced(p) and p.counts.spooled == 0
    await p.stop()


async def test_the_drain_packs_and_a_send_failing_half_way_loses_nothing_and_sends_nothing_twice(
        tmp_path: Path) -> None:
    hub = ProducerHub(fail_sends=True)
    p = pipeline(hub, tmp_path, batch_size=100, pack_events=10)
    await p.start()
    for i in range(90):
        p.emit("t.requests", f"pool-{i % 3}", keyed(i, f"pool-{i % 3}"))
    await until(lambda: p.counts.spooled == 90)
    hub.set_up()
    assert p._producer is not None
    real_send, calls = p._producer.send, []

    async def flaky(topic: str, value: bytes, key: bytes | None = None) -> object:
        calls.append(key)
        if len(calls) == 4:  # three packed records handed, then the accumulator refuses one
            from aiokafka.errors import KafkaTimeoutError

            raise KafkaTimeoutError()
        return await real_send(topic, value, key=key)

    p._producer.send = flaky  # type: ignore[method-assign]
    await until(lambda: p.counts.drained == 90)
    assert sorted(ids(hub)) == sorted(f"r{i}" for i in range(90)) and len(ids(hub)) == 90
    assert unpacked(hub) <= 90 / 10 + 3 and p.counts.respooled > 0 and p.counts.dropped == 0
    assert p.spool.pending == 0 and balanced(p)
    await p.stop()


async def test_a_pack_linger_lets_a_trickle_of_events_share_records(tmp_path: Path) -> None:
    counts = {}
    for linger in (0.0, 0.05):
        hub = ProducerHub()
        p = pipeline(hub, tmp_path / str(linger), pack_linger_s=linger)
        await p.start()
        for i in range(40):  # one event every ~2 ms: the sender finds one at a time unless it lingers
            p.emit("t.requests", "pool-a", record(i))
            await asyncio.sleep(0.002)
        await until(lambda: p.counts.sent == 40)
        assert ids(hub) == [f"r{i}" for i in range(40)] and balanced(p)
        counts[linger] = unpacked(hub)
        await p.stop()
    assert counts[0.05] <= 40 / 5 < counts[0.0]
    with pytest.raises(ValueError):
        pipeline(ProducerHub(), tmp_path, pack_linger_s=-1)


# ---- watermarks (proxy.watermarks) -------------------------------------------------------------------------------


async def test_a_sharded_pools_events_go_under_their_entitlements_shard_key(tmp_path: Path) -> None:
    hub = ProducerHub()
    p = EventPipeline(hub.factory, Spool(tmp_path / "p.spool"), queue_size=1000, batch_size=50,
                      flush_interval_s=0.02, shards=lambda pool: 4 if pool == "pool-a" else 1)
    await p.start()
    for i, name in enumerate(("gold", "silver", "gold", "bronze")):
        p.emit("t.requests", "pool-a", record(i).model_copy(update={"entitlement": name}))
    p.emit("t.requests", "pool-b", record(9).model_copy(update={"pool": "pool-b"}))
    p.emit("t.requests", "pool-a", record(10).model_copy(update={"entitlement": None}))
    await until(lambda: p.counts.sent == 6)
    keys = {r.request_id: k.decode() for _, k, v in hub.records for r in records_of(v)}  # type: ignore[attr-defined]
    assert keys == {"r0": "pool-a#1", "r2": "pool-a#1", "r1": f"pool-a#{shard_of('silver', 4)}",
                    "r3": f"pool-a#{shard_of('bronze', 4)}", "r9": "pool-b", "r10": "pool-a"}
    await p.stop()
