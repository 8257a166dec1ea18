"""A sharded pool's takeover is exact (docs/scaling.md#as-built):

- a shard's state keeps its in-flight level (at its last closed window's end) and its late floors, and both survive
  the table (snapshot and journal) exactly;
- a new worker of a shard seeds its fleet counts from that state and has the N_e of a worker that folded the shard's
  whole log (the property draws request logs where each completion follows its admission);
- through the agents' shell on two workers: a worker that dies after writing a shard's close and before sending
  its summaries, replaced by one that restores the shard's state, leaves the pool's limit updates as they are
  without the crash (the outbox is sent first); a re-sent outbox that did arrive is dropped by the decision.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_streams_sharded import BASE_MS, ENTITLEMENTS, POOL, PROXIES, _batches, _completed, _decided
from test_streams_sharded_processor import TOPICS, partition_of, published, worker
from test_streams_sharded_processor import events as processor_events

from tokenpools.streams.table import pool_state
from tokenpools.streams.sharding import shard_windows
from tokenpools.streams.table import state as table_state
from tokenpools.streams.counts.fleet_counts import FleetCounts, Rate
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.processor import RawEvent
from tokenpools.topics.codec import encode
from tokenpools.topics.records import BackendMetricsSample, Record
from tokenpools.topics.shards import event_key

PARAMS = StreamParams(width_ms=1000, grace_ms=300, max_updates_per_tick=1000)
RATES = {name: Rate(100.0, 1000.0) for name in ENTITLEMENTS}
END_MS = BASE_MS + 60_000  # after every event of the logs


@st.composite
def request_logs(draw: st.DrawFn) -> tuple[list[tuple[Record, int]], list[int]]:
    """Admissions and refusals, most admissions completed later (by event time and by Kafka timestamp), some of
    them late by up to 2.5 windows; and the timer's instants."""
    events: list[tuple[Record, int]] = []
    for i in range(draw(st.integers(0, 60))):
        t = BASE_MS + draw(st.integers(0, 7_999))
        ts = t + draw(st.sampled_from([0, 5, 40, 250, 900, 2_500]))
        entitlement, proxy = draw(st.sampled_from(ENTITLEMENTS)), draw(st.sampled_from(PROXIES))
        admitted = draw(st.booleans())
        events.append((_decided(i, t, entitlement, proxy, admitted, 50), ts))
        if admitted and draw(st.integers(0, 3)):
            done = t + draw(st.integers(0, 4_000))
            late = draw(st.sampled_from([0, 5, 900, 2_500]))
            events.append((_completed(i, done, entitlement, proxy, 10), max(done + late, ts + 1)))
    events.sort(key=lambda e: e[1])
    ticks = sorted(draw(st.lists(st.integers(BASE_MS, BASE_MS + 12_000), max_size=8)))
    return events, ticks


def _long_requests() -> tuple[list[tuple[Record, int]], list[int]]:
    """Requests admitted in the first windows and completed (or not) after the shard closed them: their N_e is in
    the shard's closed-window level alone (what a worker taking over at the end used to miss)."""
    events: list[tuple[Record, int]] = []
    for i in range(6):
        t = BASE_MS + 100 * i
        events.append((_decided(i, t, ENTITLEMENTS[i % 2], PROXIES[i % 3], True, 50), t))
        if i % 3 == 0:
            events.append((_completed(i, t + 5_000, ENTITLEMENTS[i % 2], PROXIES[i % 3], 10), t + 5_000))
    return sorted(events, key=lambda e: e[1]), [BASE_MS + 3_000, BASE_MS + 9_000]


def _shards_after(events: list[tuple[Record, int]], ticks: list[int], shards: int) -> dict[str, pool_state.PoolState]:
    """Every shard's state after folding the log in the timer's batches and closing at each instant."""
    units = {f"{POOL}#{k}": pool_state.new(f"{POOL}#{k}", PARAMS.width_ms) for k in range(shards)}
    offset = 0
    for batch, now in _batches(events, [*ticks, END_MS]):
        by_key: dict[str, list[tuple[Record, pool_state.Position]]] = {}
        for record, ts in batch:
            key = event_key(POOL, record.entitlement, shards)  # type: ignore[attr-defined]
            by_key.setdefault(key, []).append((record, pool_state.Position(f"requests/{key}", offset, ts)))
            offset += 1
        for key, items in by_key.items():
            units[key], _ = shard_windows.fold_shard(units[key], POOL, items, PARAMS)
        if now != END_MS:  # the last batch folds what came after the last close (open windows)
            for key in units:
                units[key], _ = shard_windows.close(units[key], now, PARAMS, shards)
    return units


def _in_flight(book: FleetCounts) -> tuple[tuple[int, ...], int]:
    book.advance(END_MS, RATES)
    record = book.record(1, sorted(RATES), RATES, set(PROXIES), len(PROXIES))
    return record.in_flight, record.pool_in_flight


@settings(max_examples=80, deadline=None)
@given(request_logs(), st.sampled_from([2, 3, 4]))
@example(_long_requests(), 2)
def test_a_new_shard_worker_seeds_the_counts_of_one_that_folded_the_whole_log(log, shards):
    events, ticks = log
    for key, unit in _shards_after(events, ticks, shards).items():
        whole = FleetCounts(POOL, 1_000)  # the worker that folded the shard's log from the start
        whole.note(r for r, _ in events if event_key(POOL, r.entitlement, shards) == key)  # type: ignore[attr-defined]
        seeded = FleetCounts(POOL, 1_000)  # the worker that takes the shard over: its state only
        seeded.seed(pool_state.in_flight_through(unit))
        assert _in_flight(seeded) == _in_flight(whole), key


def test_the_closed_windows_level_is_what_a_takeover_would_otherwise_miss():
    """The example above is not vacuous: its requests are in the shard's closed-window level, not in open windows."""
    units = _shards_after(*_long_requests(), 2)
    levels = {key: unit.in_flight for key, unit in units.items() if unit.in_flight}
    assert levels and all(not unit.in_flight_deltas for unit in units.values())
    assert sum(n for unit in units.values() for c in unit.in_flight.values() for n in c.values()) == 4


@settings(max_examples=40, deadline=None)
@given(request_logs(), st.sampled_from([2, 3]))
def test_a_shards_level_floor_and_outbox_survive_the_table(log, shards):
    """The snapshot holds the level, the late floors and the outbox; a batch's journal entry the level and floors
    it moved (late events move both): a restore gives the very state, batch after batch."""
    events, ticks = log
    units = {f"{POOL}#{k}": pool_state.new(f"{POOL}#{k}", PARAMS.width_ms) for k in range(shards)}
    stored = {key: table_state.Stored(unit, None) for key, unit in units.items()}
    tables: dict[str, dict[bytes, bytes]] = {key: {} for key in units}

    def write(key: str, state: pool_state.PoolState, cells: set[table_state.Cell] | None) -> None:
        writes, stored[key] = table_state.group_writes(stored[key], state, 0, cells)
        for k, v in writes:
            if v is None:
                tables[key].pop(k, None)
            else:
                tables[key][k] = v
        restored, why = table_state.restore(key, tables[key].items(), PARAMS.width_ms)
        assert why == "" and restored.state == state

    offset = 0
    for batch, now in _batches(events, [*ticks, END_MS]):
        by_key: dict[str, list[tuple[Record, pool_state.Position]]] = {}
        for record, ts in batch:
            key = event_key(POOL, record.entitlement, shards)  # type: ignore[attr-defined]
            by_key.setdefault(key, []).append((record, pool_state.Position(f"requests/{key}", offset, ts)))
            offset += 1
        for key, items in by_key.items():
            units[key], outcomes = shard_windows.fold_shard(units[key], POOL, items, PARAMS)
            write(key, units[key], table_state.touched(items, outcomes))
        for key in units:
            units[key], _ = shard_windows.close(units[key], now, PARAMS, shards)
            write(key, units[key], None)


# ---- through the agents' shell -----------------------------------------------------------------------------------

TICKS = [BASE_MS + 1_500, BASE_MS + 2_700, BASE_MS + 4_400, BASE_MS + 6_000, BASE_MS + 9_000, BASE_MS + 12_000]
SHARDS = 4


async def run(workers: list, ticks: list[int], crash: tuple[int, int, bool] | None = None) -> None:
    """``test_streams_sharded_processor.run``, where at ``crash`` = (instant's index, worker, lost) the worker dies
    after its timer wrote its shards' closes, its sends lost (``lost``) or not, and a new worker restores its table
    (the changelog) and goes on with its partitions."""
    offsets: dict[tuple[str, int], int] = {}
    log = processor_events()
    at = 0
    forwarded = [0 for _ in workers]  # per worker: its sends read so far (any tick's summaries go on at the next)
    for i, now in enumerate(ticks):
        batch = []
        while at < len(log) and log[at][1] <= now:
            batch.append(log[at])
            at += 1
        per_worker: dict[int, list[RawEvent]] = {}
        for record, ts in batch:
            key = event_key(POOL, getattr(record, "entitlement", None), SHARDS)
            topic = TOPICS.backend_metrics.name if isinstance(record, BackendMetricsSample) else TOPICS.requests.name
            partition = partition_of(key)
            offset = offsets[(topic, partition)] = offsets.get((topic, partition), -1) + 1
            owner = next(w for w, (_, _, active) in enumerate(workers) if partition in active)
            per_worker.setdefault(owner, []).append(RawEvent(topic, partition, offset, ts, key.encode(),
                                                             encode(record)))
        for w, raws in per_worker.items():
            await workers[w][0].process(raws)
        seen = [len(sent.records) for _, sent, _ in workers]
        for proc, _, active in workers:
            await proc.tick(now, None, active)
        dies = crash is not None and crash[0] == i
        if dies and crash[2]:  # type: ignore[index]
            del workers[crash[1]][1].records[seen[crash[1]]:]  # type: ignore[index]
        for w, (_, sent, _) in enumerate(workers):
            since, forwarded[w] = forwarded[w], len(sent.records)
            for topic, key, value in sent.records[since:]:
                if topic != TOPICS.usage_windows.name:
                    continue
                partition = partition_of(key.decode())
                offset = offsets[(topic, partition)] = offsets.get((topic, partition), -1) + 1
                owner = next(w for w in workers if partition in w[2])
                await owner[0].process([RawEvent(topic, partition, offset, now, key, value)])
        if dies:
            victim = crash[1]  # type: ignore[index]
            old, _, active = workers[victim]
            workers[victim] = worker(SHARDS, active)
            workers[victim][0].store = old.store  # the changelog, restored
            forwarded[victim] = 0
        for proc, _, active in workers:
            await proc.tick(now, None, active)


def _by_topic(records: list[tuple[str, bytes, bytes | None]]) -> list[tuple[str, bytes, bytes | None]]:
    """The limit updates, then the effective limits, each in their order (no scale commands)."""
    return [r for topic in (TOPICS.limits.name, TOPICS.effective_limits.name) for r in records if r[0] == topic]


@pytest.mark.parametrize("lost", [True, False])
async def test_a_shards_worker_dying_between_its_close_and_its_send_changes_no_limit_update(lost):
    single = worker(1, None)
    from test_streams_sharded_processor import run as run_single
    await run_single([single], 1, TICKS)
    expected = published(single[1])
    evens, odds = {0, 2, 4, 6}, {1, 3, 5, 7}
    pool_worker = partition_of(POOL) % 2
    victim = 1 - pool_worker  # the shards' worker: the decision's own sends are not this test's
    assert any(partition_of(f"{POOL}#{k}") % 2 == victim for k in range(SHARDS))
    workers = [worker(SHARDS, evens), worker(SHARDS, odds)]
    await run(workers, TICKS, crash=(2, victim, lost))
    got = published(workers[pool_worker][1])
    if lost:  # the lost windows tick an instant later, two in one tick: its scale command is the newest window's
        got, expected = _by_topic(got), _by_topic(expected)
    assert got == expected
    resent = workers[pool_worker][0].metrics.outcomes.labels("summary_resent")._value.get()
    assert resent == (0 if lost else 4)  # the outboxes of the victim's two shards (two windows each): dropped when
    #                                       they had arrived
    assert any(t == TOPICS.usage_windows.name for t, _, _ in workers[victim][1].records)  # the new worker sends
