"""The agents' Faust-free shell (streams.processor): decoding, dead letters, the fold per pool, the tick."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from tokenpools.config import load_config_text
from tokenpools.runtime.clock import FakeClock
from tokenpools.runtime.deadletter import DeadLetters
from tokenpools.runtime.specs import Catalogue
from tokenpools.streams.table import state as table_state
from tokenpools.streams.metrics import StreamMetrics
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.processor import DictStore, PoolProcessor, RawEvent
from tokenpools.streams.views import ProxyBook, pool_view
from tokenpools.topics.codec import encode
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.records import DeadLetter, DeadLetterReason, EffectiveLimit, LimitUpdate, ScaleCommand
from tokenpools_dev import builders
from tokenpools_dev.streams import scripted

BASE_MS = 1_700_000_000_000
PARAMS = StreamParams(width_ms=1000, grace_ms=300, max_updates_per_tick=1000)
TOPICS = topics_for("t.")
LOADED = load_config_text(scripted.CONFIG_YAML)
EVENTS = scripted.scripted_events(BASE_MS, 1000, scripted.two_class_phases(8))


def processor(clock=None):
    sent, metrics = scripted.Sent(), StreamMetrics()
    clock = clock or FakeClock(BASE_MS)
    dead = DeadLetters(TOPICS.dead_letters.name, "agents-test", clock, send=sent, count=metrics.count_dead_letter)
    proc = PoolProcessor(PARAMS, TOPICS, Catalogue.from_loaded(LOADED), ProxyBook(), DictStore(), sent, dead, metrics)
    return proc, sent, metrics


def raw(i, record, ts, topic=TOPICS.requests.name, partition=2):
    return RawEvent(topic, partition, i, ts, record.pool.encode(), encode(record))


async def test_a_batch_folds_per_pool_and_bad_records_are_dead_lettered():
    proc, sent, metrics = processor()
    good = [raw(i, r, ts) for i, (r, ts) in enumerate(EVENTS[:40])]
    unknown_version = orjson.dumps({**orjson.loads(good[0].value), "schema_version": 9})
    bad = [
        RawEvent(TOPICS.requests.name, 2, 100, BASE_MS, b"pool-a", b"{not json"),
        RawEvent(TOPICS.requests.name, 2, 101, BASE_MS, b"pool-a", unknown_version),
        RawEvent(TOPICS.requests.name, 2, 102, BASE_MS, b"pool-a", encode(ScaleCommand(
            pool="p", version=1, t_ms=1, desired_replicas=1, current_replicas=1, floor_replicas=0))),
        RawEvent(TOPICS.completions.name, 2, 103, BASE_MS, b"pool-a", b'{"schema_version": 1, "record_type": "request_completed"}'),
        RawEvent(TOPICS.completions.name, 2, 104, BASE_MS, b"pool-a", None),
    ]
    result = await proc.process(good[:20] + bad + good[20:])
    assert result.events == 45 and result.dead_letters == 5 and result.outcomes == {"applied": 40}
    letters = sent.of(TOPICS.dead_letters.name)
    assert [d.reason for d in letters] == [DeadLetterReason.MALFORMED, DeadLetterReason.UNKNOWN_VERSION,
                                           DeadLetterReason.UNKNOWN_TYPE, DeadLetterReason.INVALID,
                                           DeadLetterReason.MALFORMED]
    assert all(isinstance(d, DeadLetter) and d.partition == 2 and d.consumer == "agents-test" for d in letters)
    assert [d.offset for d in letters] == [100, 101, 102, 103, 104] and letters[0].payload == "{not json"
    stored, _ = table_state.read(scripted.POOL, proc.store.items(), 1000)
    assert stored.partition == 2 and sum(w.buckets and 1 or 0 for w in stored.state.windows.values()) >= 1
    assert metrics.dead_letters.labels("malformed")._value.get() == 2


async def test_late_events_are_dead_lettered_and_ticks_publish_keyed_by_pool(caplog):
    proc, sent, metrics = processor()
    await proc.process([raw(i, r, ts) for i, (r, ts) in enumerate(EVENTS)])
    result = await proc.tick(BASE_MS + 12_000)
    updates = sent.of(TOPICS.limits.name)
    assert updates == result.updates and len(updates) == 11 and all(isinstance(u, LimitUpdate) for u in updates)
    assert {k for t, k, _ in sent.records if t == TOPICS.limits.name} == {b"pool-a"}
    assert [c.version for c in sent.of(TOPICS.scale.name)] == [updates[-1].version]
    record, ts = EVENTS[5]
    with caplog.at_level(logging.WARNING):
        late = await proc.process([raw(10_000 + i, record, ts) for i in range(3)])
    assert late.outcomes == {"late": 3} and late.dead_letters == 3
    assert [d.reason for d in sent.of(TOPICS.dead_letters.name)] == [DeadLetterReason.LATE] * 3
    assert sum("dead letter (late)" in r.message for r in caplog.records) == 1  # one warning per interval
    assert metrics.table_pools._value.get() == 1 and metrics.tick_seconds._sum.get() > 0


async def test_ticks_publish_effective_limits_per_entitlement_and_tombstone_the_departed():
    proc, sent, _ = processor()
    await proc.process([raw(i, r, ts) for i, (r, ts) in enumerate(EVENTS)])
    result = await proc.tick(BASE_MS + 12_000)
    assert sent.of(TOPICS.effective_limits.name) == result.effective and result.departed == []
    table = sent.compacted(TOPICS.effective_limits.name)
    assert set(table) == {b"pool-a/copilot", b"pool-a/batch"}
    assert all(isinstance(r, EffectiveLimit) and r.version == result.updates[-1].version for r in table.values())
    first_effective = [i for i, (t, _, _) in enumerate(sent.records) if t == TOPICS.effective_limits.name][0]
    assert all(t != TOPICS.limits.name for t, _, _ in sent.records[first_effective:])  # the proxies' records first
    without_batch = load_config_text("---".join(scripted.CONFIG_YAML.split("---")[:2]))  # the batch entitlement deleted
    assert set(without_batch.entitlements) == {"copilot"}
    proc.catalogue = Catalogue.from_loaded(without_batch)
    record, _ = EVENTS[-1]
    await proc.process([raw(5000, record.model_copy(update={"t_ms": BASE_MS + 12_500}), BASE_MS + 12_500)])
    later = await proc.tick(BASE_MS + 14_000)
    assert later.departed == [("pool-a", "batch")]
    assert sent.records[-1] == (TOPICS.effective_limits.name, b"pool-a/batch", None)  # a tombstone, last
    assert set(sent.compacted(TOPICS.effective_limits.name)) == {b"pool-a/copilot"}


async def test_tick_respects_horizons_and_owned_partitions():
    proc, sent, _ = processor()
    await proc.process([raw(i, r, ts) for i, (r, ts) in enumerate(EVENTS)])
    assert (await proc.tick(BASE_MS + 12_000, {2: None})).updates == []  # no bound yet: nothing closes
    assert (await proc.tick(BASE_MS + 12_000, {2: BASE_MS + 12_000}, active={0, 1})).updates == []
    partial = await proc.tick(BASE_MS + 12_000, {2: BASE_MS + 4_300}, active={2})
    assert [u.version for u in partial.updates] == [BASE_MS + 1000 * k for k in (1, 2, 3, 4)]
    rest = await proc.tick(BASE_MS + 12_000, {2: BASE_MS + 12_000}, active={2})
    assert rest.updates[0].version == BASE_MS + 5_000


def test_fast_decoding_agrees_with_the_codec():
    """streams.decoding accepts what codec.decode_any accepts (the same record) and gives its reason otherwise."""
    import pytest

    from tokenpools.streams.decoding import decode_source
    from tokenpools.streams.processor import SOURCE_RECORDS
    from tokenpools.topics.codec import DecodeError, decode_any

    for record, _ in EVENTS:
        assert decode_source(encode(record), SOURCE_RECORDS).records == [(0, decode_any(encode(record)))]
        assert decode_any(encode(record)) == record
    good = orjson.loads(encode(EVENTS[3][0]))
    bad = [b"{oops", b"[1]", orjson.dumps({**good, "schema_version": 2}), orjson.dumps({**good, "t_ms": -1}),
           orjson.dumps({**good, "surprise": 1}), orjson.dumps({**good, "record_type": "limit_update"}),
           orjson.dumps({**good, "record_type": "nope"})]
    for value in bad:
        decoded = decode_source(value, SOURCE_RECORDS)
        assert decoded.records == [] and [b.index for b in decoded.bad] == [None]
        with pytest.raises(DecodeError) as codec:
            decode_any(value, SOURCE_RECORDS)
        assert decoded.bad[0].error.reason is codec.value.reason and decoded.bad[0].payload == value
    assert decode_source(None, SOURCE_RECORDS).bad[0].error.reason is DeadLetterReason.MALFORMED


def batch_raw(offset, records, ts, topic=TOPICS.requests.name, partition=2, values=None):
    from tokenpools.topics.batches import batch_value

    value = batch_value(values if values is not None else [encode(r) for r in records])
    return RawEvent(topic, partition, offset, ts, records[0].pool.encode(), value)


async def test_batched_records_fold_like_plain_ones_and_bad_or_late_elements_go_alone():
    """The same events as plain records or as batches give the same state and the same limit updates; a bad
    element is dead-lettered with its index and its own JSON, its neighbours are folded; a re-delivered batch
    is recognised element by element; a late element is dead-lettered alone."""
    plain, _, _ = processor()
    await plain.process([raw(i, r, ts) for i, (r, ts) in enumerate(EVENTS)])
    batched, sent, metrics = processor()
    by_topic: dict[str, list] = {}
    for r, ts in EVENTS:
        by_topic.setdefault(TOPICS.requests.name if r.record_type == "request_decided" else
                            TOPICS.completions.name if r.record_type == "request_completed" else
                            TOPICS.backend_metrics.name, []).append((r, ts))
    raws, offsets = [], {}
    for topic, items in by_topic.items():
        chunks = [[items[0]]]
        for item in items[1:]:  # batches of up to 7 within 100 ms (a proxy's linger is a few ms), stamped with
            if len(chunks[-1]) < 7 and item[1] - chunks[-1][0][1] < 100:  # the last element's time: sent then
                chunks[-1].append(item)
            else:
                chunks.append([item])
        for chunk in chunks:
            offsets[topic] = offsets.get(topic, -1) + 1
            raws.append(batch_raw(offsets[topic], [r for r, _ in chunk], max(ts for _, ts in chunk), topic))
    assert max(len(orjson.loads(e.value).get("events", [0])) for e in raws) == 7
    raws.sort(key=lambda e: e.timestamp_ms)
    result = await batched.process(raws)
    assert result.events == len(EVENTS) and result.dead_letters == 0 and result.outcomes == {"applied": len(EVENTS)}
    assert metrics.events.labels("request_decided")._value.get() == sum(
        1 for r, _ in EVENTS if r.record_type == "request_decided")
    again = await batched.process(raws[:5])  # re-delivered after a crash: every element is a duplicate
    assert again.outcomes == {"duplicate": sum(len(orjson.loads(e.value).get("events", [0])) for e in raws[:5])}
    now = BASE_MS + 12_000
    assert (await batched.tick(now)).updates == (await plain.tick(now)).updates

    decided = [r for r, _ in EVENTS if r.record_type == "request_decided"]
    fresh = [r.model_copy(update={"t_ms": BASE_MS + 20_000 + i, "request_id": f"f{i}"})
             for i, r in enumerate(decided[:3])]
    late = decided[0].model_copy(update={"request_id": "late"})  # its window was ticked above
    values = [encode(fresh[0]), b'{"record_type": "request_decided", "schema_version": 1}', encode(late),
              encode(fresh[1]), orjson.dumps({**orjson.loads(encode(fresh[2])), "schema_version": 7})]
    mixed = await batched.process([batch_raw(500, fresh, BASE_MS + 20_010, values=values)])
    assert mixed.events == 5 and mixed.outcomes == {"applied": 2, "late": 1} and mixed.dead_letters == 3
    letters = sent.of(TOPICS.dead_letters.name)
    assert [(d.element, d.reason, d.offset) for d in letters] == [
        (1, DeadLetterReason.INVALID, 500), (4, DeadLetterReason.UNKNOWN_VERSION, 500), (2, DeadLetterReason.LATE, 500)]
    assert orjson.loads(letters[2].payload)["request_id"] == "late"
    assert orjson.loads(letters[1].payload)["schema_version"] == 7


async def test_spec_and_heartbeat_readers_apply_records_tombstones_and_dead_letter_the_rest():
    from tokenpools.streams.readers import apply_heartbeat, apply_spec
    from tokenpools.topics.records import ProxyHeartbeat

    proc, sent, _ = processor()
    catalogue, book, dead = proc.catalogue, proc.proxies, proc.dead_letters
    spec = {"tenantId": "t", "poolRef": {"name": scripted.POOL}, "qos": {"serviceClass": "spot", "sloTargetMs": 900}}
    record = builders.spec_record("TokenEntitlement", "extra", spec, pool=scripted.POOL)
    await apply_spec(catalogue, dead, RawEvent("t.specs", 0, 0, 1, b"TokenEntitlement/extra", encode(record)))
    assert "extra" in [e.name for e in pool_view(catalogue, scripted.POOL).entitlements]
    await apply_spec(catalogue, dead, RawEvent("t.specs", 0, 1, 1, b"TokenEntitlement/extra", None))  # tombstone
    assert "extra" not in [e.name for e in pool_view(catalogue, scripted.POOL).entitlements]
    orphan = record.model_copy(update={"name": "orphan", "spec": {**spec, "poolRef": {"name": "gone"}}})
    await apply_spec(catalogue, dead, RawEvent("t.specs", 0, 2, 1, b"TokenEntitlement/orphan", encode(orphan)))
    await apply_spec(catalogue, dead, RawEvent("t.specs", 0, 3, 1, b"x", b"{"))
    beat = ProxyHeartbeat(proxy_id="p", t_ms=5, pools=(scripted.POOL,), started_ms=0)
    await apply_heartbeat(book, dead, RawEvent("t.heartbeats", 0, 0, 5, b"p", encode(beat)))
    assert set(book.snapshot()) == {"p"}
    await apply_heartbeat(book, dead, RawEvent("t.heartbeats", 0, 1, 5, b"p", None))
    await apply_heartbeat(book, dead, RawEvent("t.heartbeats", 0, 2, 5, b"q", b'{"schema_version": 1}'))
    assert book.snapshot() == {}
    letters = sent.of(TOPICS.dead_letters.name)
    assert [(d.source_topic, d.offset, d.reason) for d in letters] == [
        ("t.specs", 2, DeadLetterReason.INVALID), ("t.specs", 3, DeadLetterReason.MALFORMED),
        ("t.heartbeats", 2, DeadLetterReason.UNKNOWN_TYPE)]
    assert "spec refused, previous specs kept" in letters[0].detail


def test_cli_arguments():
    import argparse

    from tokenpools.streams.main import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--config", "x.yaml", "--http-port", "0", "--fast-join"])
    assert (args.config, args.http_port, args.fast_join, args.batch_max) == ("x.yaml", 0, True, 5000)
    former = parser.parse_args(["--config", "x.yaml", "--metrics-port", "7", "--metrics-host", "0.0.0.0"])
    assert (former.http_port, former.http_host) == (7, "0.0.0.0")  # the former names, still accepted


async def test_a_state_restored_under_the_processor_is_decoded_not_taken_from_its_cache():
    proc, _, _ = processor()
    await proc.process([raw(i, r, ts) for i, (r, ts) in enumerate(EVENTS[:50])])
    # what a changelog restore would bring back: equal bytes, new objects
    snapshot = {key: (bytes(value), partition) for key, (value, partition) in proc.store.data.items()}
    later = [raw(i, r, ts) for i, (r, ts) in enumerate(EVENTS[50:80], start=50)]
    assert (await proc.process(later)).outcomes == {"applied": 30}
    assert (await proc.process(later[:5])).outcomes == {"duplicate": 5}  # from the cached state
    proc.store.data = snapshot
    assert (await proc.process(later)).outcomes == {"applied": 30}  # the restored state had not seen them


# ---- the timer and the event loop: one pool's tick at a time -------------------------------------------------

def pools_config(n: int) -> str:
    """``n`` copies of the scripted pool, ``pool-<i>`` with entitlements ``copilot-<i>`` and ``batch-<i>``."""
    return "---\n".join(scripted.CONFIG_YAML.replace(scripted.POOL, f"pool-{i}").replace("name: copilot", f"name: copilot-{i}")
                        .replace("name: batch", f"name: batch-{i}") for i in range(n))


def pool_events(i: int, windows: int = 6) -> list[tuple[object, int]]:
    phases = [(windows, [scripted.Load(f"copilot-{i}", 6), scripted.Load(f"batch-{i}", 4, proxies=("proxy-1", "proxy-2"))])]
    return scripted.scripted_events(BASE_MS, 1000, phases, seed=i, pool=f"pool-{i}")


class LoggedStore(DictStore):
    """A DictStore that notes every write in a shared log."""

    def __init__(self, log: list[tuple[str, str]]) -> None:
        super().__init__()
        self.log = log

    def put(self, key: bytes, value: bytes | None, partition: int) -> None:
        owner = table_state.owner_of_key(key)
        self.log.append(("put", owner[0] if owner else "?"))
        super().put(key, value, partition)


def pools_processor(n: int, log: list[tuple[str, str]]) -> PoolProcessor:
    """A processor over ``n`` pools, pool ``i`` on partition ``i``."""
    sent, metrics = scripted.Sent(), StreamMetrics()
    dead = DeadLetters(TOPICS.dead_letters.name, "agents-test", FakeClock(BASE_MS), send=sent)
    catalogue = Catalogue.from_loaded(load_config_text(pools_config(n)))
    return PoolProcessor(PARAMS, TOPICS, catalogue, ProxyBook(), LoggedStore(log), sent, dead, metrics)


async def fill(proc: PoolProcessor, pools: range, windows: int = 6) -> None:
    for i in pools:
        await proc.process([raw(k, r, ts, partition=i) for k, (r, ts) in enumerate(pool_events(i, windows))])


async def test_the_timer_gives_the_loop_back_after_every_pool():
    """A probe task that runs whenever the loop is free never sees two pools ticked in a row: the longest stretch the
    timer holds the loop is one pool's tick (and its table write). No clock involved: the order of events is."""
    log: list[tuple[str, str]] = []
    proc = pools_processor(8, log)
    await fill(proc, range(8))
    log.clear()
    done = False

    async def probe() -> None:
        while not done:
            log.append(("probe", ""))
            await asyncio.sleep(0)

    task = asyncio.create_task(probe())
    await asyncio.sleep(0)  # the probe is running
    result = await proc.tick(BASE_MS + 12_000)
    done = True
    await task
    # one pool's tick writes a group of keys (``streams.state``): a run of puts of one pool is one pool's tick
    stretches = [(kind, pool) for i, (kind, pool) in enumerate(log) if kind != "put" or i == 0 or log[i - 1] != (kind, pool)]
    ticked = [pool for kind, pool in stretches if kind == "put"]
    assert sorted(ticked) == [f"pool-{i}" for i in range(8)] == sorted({u.pool for u in result.updates})
    runs, between = [], 0
    for kind, _ in stretches:
        if kind == "put":
            between += 1
        else:
            runs.append(between)
            between = 0
    assert max(runs) == 1  # never two pools' ticks without the loop in between
    assert proc.metrics.pool_tick_seconds._sum.get() > 0


async def test_a_batch_folded_while_the_timer_pauses_is_kept_for_ticked_and_waiting_pools():
    """The timer ticks pool-0, pauses; a batch for pool-0 (ticked) and pool-1 (still to come) runs in the pause.
    Neither is lost or overwritten: the stored states are those of a timer that ticked pool-0, then the batch ran,
    then pool-1 was ticked, one after the other (partitions pick the pools of each step)."""
    later = {i: [(r, ts) for r, ts in pool_events(i, windows=8) if ts >= BASE_MS + 6_000] for i in (0, 1)}
    batch = [raw(10_000 + k, r, ts, partition=i) for i in (0, 1) for k, (r, ts) in enumerate(later[i])]
    assert batch

    concurrent = pools_processor(2, [])
    await fill(concurrent, range(2))
    interleaved = asyncio.Event()

    async def batch_in_the_first_pause() -> None:  # runs when the timer first yields: after pool-0's tick
        assert (await concurrent.process(batch)).outcomes == {"applied": len(batch)}
        interleaved.set()

    task = asyncio.create_task(batch_in_the_first_pause())
    await concurrent.tick(BASE_MS + 6_300)
    await task
    assert interleaved.is_set()

    one_by_one = pools_processor(2, [])
    await fill(one_by_one, range(2))
    await one_by_one.tick(BASE_MS + 6_300, active={0})
    await one_by_one.process(batch)
    await one_by_one.tick(BASE_MS + 6_300, active={1})
    for i in (0, 1):
        entries = table_state.entries_of(f"pool-{i}", concurrent.store.items())
        assert entries and sorted(entries) == sorted(table_state.entries_of(f"pool-{i}", one_by_one.store.items()))
        state = table_state.read(f"pool-{i}", concurrent.store.items(), 1000)[0].state
        assert state.closed_through == (BASE_MS + 6_300 - PARAMS.grace_ms) // 1000 - 1  # the timer's windows
    assert (await concurrent.process(batch)).outcomes == {"duplicate": len(batch)}  # kept in both pools' states


@pytest.mark.parametrize("revoked", [0, 1])
async def test_a_rebalance_during_the_timers_pause_ends_the_tick(revoked: int):
    """A rebalance in a pause (``forget``; one pool's partition revoked, its state gone from the table): the tick
    ends, the pools not reached are left to the next one. What was ticked is sent; the counts follow it only for a
    pool still this worker's."""
    proc = pools_processor(4, [])
    await fill(proc, range(4))

    async def rebalance() -> None:  # runs when the timer first yields: after pool-0's tick
        for key, _ in table_state.entries_of(f"pool-{revoked}", proc.store.items()):
            del proc.store.data[key]
        proc.forget()

    task = asyncio.create_task(rebalance())
    first = await proc.tick(BASE_MS + 12_000)
    await task
    owned = {f"pool-{i}" for i in range(4)} - {f"pool-{revoked}"}
    assert {u.pool for u in first.updates} == {"pool-0"} and set(proc.counts._published) == {"pool-0"} & owned
    rest = await proc.tick(BASE_MS + 12_000)
    assert {u.pool for u in rest.updates} == owned - {"pool-0"}
    assert set(proc.counts._published) == owned
