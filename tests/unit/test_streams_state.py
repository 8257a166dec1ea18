"""Serialisation of S (streams.state), capacity from metrics, close horizons, pool views and heartbeats."""

from __future__ import annotations


import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.config import load_config_text
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState
from tokenpools.runtime.specs import Catalogue
from tokenpools.streams import capacity
from tokenpools.streams.table import pool_state
from tokenpools.streams.table import state as table_state
from tokenpools.streams.table.params import StreamParams, from_settings
from tokenpools.streams.event_time.progress import Progress, horizon
from tokenpools.streams.views import ProxyBook, pool_view
from tokenpools.topics.records import BackendMetricsSample, ProxyHeartbeat
from tokenpools_dev import builders
from tokenpools_dev.streams import scripted

from resend_support import numbered, resent

BASE_MS = 1_700_000_000_000
PARAMS = StreamParams(width_ms=1000, grace_ms=300)
LOADED = load_config_text(scripted.CONFIG_YAML)
EVENTS = scripted.scripted_events(BASE_MS, 1000, scripted.two_class_phases(8))
# the same events with the identity a proxy gives them, and every 7th re-sent a few places later (core.resends)
RESENT = resent(numbered(EVENTS), [(i, i % 5, 500) for i in range(0, len(EVENTS), 7)])[0]


def state_after(n_events: int, horizon_ms: int | None, events=EVENTS) -> pool_state.PoolState:
    state = pool_state.new(scripted.POOL, 1000)
    for i, (record, ts) in enumerate(events[:n_events]):
        position = pool_state.Position("requests/0", i, ts)
        state, outcome = pool_state.apply_event(state, record, PARAMS, position)
        state = pool_state.track_in_flight(state, [(record, position)], [outcome])  # the per-proxy levels round-trip too
    if horizon_ms is not None:
        state = pool_state.tick(state, pool_view(Catalogue.from_loaded(LOADED), scripted.POOL), horizon_ms, PARAMS).state
    return state


def table_of(writes: list[tuple[bytes, bytes | None]], table: dict[bytes, bytes] | None = None) -> dict[bytes, bytes]:
    table = {} if table is None else table
    for key, value in writes:
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return table


def stored_as(state: pool_state.PoolState, partition: int) -> dict[bytes, bytes]:
    """``state`` written as one group (a snapshot) into an empty table."""
    return table_of(table_state.group_writes(table_state.Stored(pool_state.new(state.pool, state.width_ms), None), state, partition)[0])


@settings(max_examples=30, deadline=None)
@given(st.integers(0, len(EVENTS)), st.one_of(st.none(), st.integers(BASE_MS, BASE_MS + 12_000)), st.booleans())
def test_round_trip_is_exact(n_events, horizon_ms, identities):
    """A restored state equals the original (floats included, the re-send streams seen too), so it ticks exactly
    like it."""
    events = RESENT if identities else EVENTS
    state = state_after(n_events, horizon_ms, events)
    assert bool(state.seen) == any(getattr(r, "sequence", None) for r, _ in events[:n_events])
    stored, why = table_state.restore(scripted.POOL, stored_as(state, 3).items(), 1000)
    assert why == "" and stored.stale == () and stored.entries == ()
    assert stored.state == state and stored.partition == 3 and stored.group == 1
    view = pool_view(Catalogue.from_loaded(LOADED), scripted.POOL)
    assert pool_state.tick(stored.state, view, BASE_MS + 20_000, PARAMS) == pool_state.tick(state, view, BASE_MS + 20_000, PARAMS)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, len(EVENTS) - 1), max_size=6), st.integers(0, len(EVENTS)), st.booleans())
def test_batches_write_journal_entries_that_restore_exactly(cuts, ticked_at, identities):
    """Batches after a snapshot write one journal entry each (what they changed, the re-send streams seen
    included); snapshot + entries restore the state the batches left, and a tick's snapshot deletes the entries."""
    events = RESENT if identities else EVENTS
    view = pool_view(Catalogue.from_loaded(LOADED), scripted.POOL)
    horizon_ms = events[ticked_at - 1][1] if ticked_at else BASE_MS
    state = pool_state.tick(state_after(ticked_at, None, events), view, horizon_ms, PARAMS).state
    table = stored_as(state, 3)
    stored = table_state.restore(scripted.POOL, table.items(), 1000)[0]
    start = ticked_at
    for end in sorted({*(c for c in cuts if c > start), len(events)}):
        items = [(r, pool_state.Position("requests/0", i, ts)) for i, (r, ts) in enumerate(events[start:end], start=start)]
        state, outcomes = pool_state.apply_events(state, items, PARAMS)
        state = pool_state.track_in_flight(state, items, outcomes)
        writes, stored = table_state.group_writes(stored, state, 3, table_state.touched(items, outcomes))
        table_of(writes, table)
        start = end
        restored, why = table_state.restore(scripted.POOL, table.items(), 1000)
        assert why == "" and restored.state == state and restored.group == stored.group
    assert len(table) == 1 + len(stored.entries) and all(len(v) <= stored.snapshot_bytes for v in table.values())
    writes, _ = table_state.group_writes(stored, pool_state.tick(state, view, BASE_MS + 20_000, PARAMS).state, 3)
    assert list(table_of(writes, table)) == [table_state.table_key(scripted.POOL)]


def test_other_versions_and_widths_are_refused_with_the_reason():
    table = stored_as(state_after(20, None), 0)
    stored, why = table_state.restore(scripted.POOL, table.items(), 5000)
    assert why == "window width 1000 ms, now 5000 ms" and stored.state == pool_state.new(scripted.POOL, 5000)
    snapshot = orjson.loads(table[table_state.table_key(scripted.POOL)])
    stored, why = table_state.restore(scripted.POOL, {table_state.table_key(scripted.POOL): orjson.dumps({**snapshot, "v": 3})}.items(), 1000)
    assert why == "state version 3, expected 2" and stored.state == pool_state.new(scripted.POOL, 1000)
    assert table_state.restore(scripted.POOL, {table_state.table_key(scripted.POOL): b"{"}.items(), 1000)[1].startswith("not JSON")
    malformed = {table_state.table_key(scripted.POOL): orjson.dumps({"v": 2, "group": 1})}
    assert table_state.restore(scripted.POOL, malformed.items(), 1000)[1].startswith("malformed state")
    # a table of state version 1 (one value per pool): ignored, the pool starts afresh, its key deleted later
    stored, why = table_state.restore(scripted.POOL, [(b"v1/" + scripted.POOL.encode(), b'{"v": 1}')], 1000)
    assert why == "state version 1, expected 2" and stored.state == pool_state.new(scripted.POOL, 1000)
    assert stored.stale == (b"v1/" + scripted.POOL.encode(),)
    writes, _ = table_state.group_writes(stored, state_after(5, None), 0)
    assert writes[0] == (b"v1/" + scripted.POOL.encode(), None) and writes[-1][0] == table_state.table_key(scripted.POOL)


def test_table_keys_carry_the_state_version():
    assert table_state.table_key("pool-a") == b"v2/pool-a"
    assert table_state.pool_of_key(b"v2/pool-a") == "pool-a" and table_state.pool_of_key(b"v1/pool-a") is None
    entry = table_state.entry_key("pool-a", 7)
    assert table_state.pool_of_key(entry) is None and table_state.owner_of_key(entry) == ("pool-a", 2)
    assert table_state.owner_of_key(b"v1/pool-a") == ("pool-a", 1) and table_state.owner_of_key(b"other") is None


POOL = LOADED.pools[scripted.POOL]


def test_capacity_fresh_stale_and_unknown():
    points = (capacity.MetricsPoint(10_000, 2, 3.0), capacity.MetricsPoint(20_000, None, None))
    fresh = capacity.capacity_at(POOL, points, 12_000, 15_000)
    assert fresh == capacity.PoolCapacity(POOL.per_replica.scaled(2), 2, 3.0, True)
    unknown_ready = capacity.capacity_at(POOL, points, 21_000, 15_000)
    assert unknown_ready.capacity == POOL.capacity() and unknown_ready.backend_waiting is None
    stale = capacity.capacity_at(POOL, points[:1], 30_000, 15_000)
    assert stale == capacity.PoolCapacity(POOL.capacity(), 1, None, False)
    assert capacity.capacity_at(POOL, points, 9_999, 15_000).fresh is False  # nothing at or before the tick
    assert capacity.capacity_at(POOL, (capacity.MetricsPoint(1, 0, 0.0),), 2, 15_000).capacity == Capacity()  # truly zero


def test_stale_field_names_mean_unknown():
    sample = BackendMetricsSample(pool="p", t_ms=5, replicas_ready=0, waiting=0.0, stale=("replicas_ready", "waiting"))
    assert capacity.point_of(sample) == capacity.MetricsPoint(5, None, None)


def test_metrics_points_are_ordered_and_pruned():
    points = ()
    for t in (30, 10, 20, 20):
        points = capacity.insert(points, capacity.MetricsPoint(t, t, None))
    assert [p.t_ms for p in points] == [10, 20, 30]
    assert [p.t_ms for p in capacity.prune(points, 25)] == [20, 30]


def test_horizon_is_the_slowest_source():
    assert horizon(1000, [1000, 700, 1000]) == 700
    assert horizon(1000, [1000, 2000]) == 1000
    assert horizon(1000, [1000, None]) is None
    progress = Progress()
    progress.note("t", 0, 5, 100)
    progress.note("t", 0, 4, 50)  # an older offset never moves it back
    progress.note("t", 0, 6, None)
    assert progress.processed[("t", 0)] == (6, 100)


def test_settings_convert_to_milliseconds():
    from tokenpools.config import load_settings

    params = from_settings(load_settings({}, ["streams.tick_s=1", "streams.grace_s=0.25",
                                              "policy.mean_slo=recompute"]))
    assert (params.width_ms, params.grace_ms, params.staleness_ms, params.mean_slo_frozen) == (1000, 250, 15000, False)
    with pytest.raises(ValueError, match="width_ms"):
        StreamParams(width_ms=0)


def test_a_pool_view_is_the_catalogue_pool_with_its_entitlements_in_their_states():
    catalogue = Catalogue.from_loaded(LOADED)
    spec = {"tenantId": "t", "poolRef": {"name": scripted.POOL}, "qos": {"serviceClass": "spot", "sloTargetMs": 1000}}
    held = builders.spec_record("TokenEntitlement", "batch", spec, pool=scripted.POOL, state="Pending", t_ms=0)
    assert catalogue.apply(held) is None
    view = pool_view(catalogue, scripted.POOL)
    assert view is not None and view.pool == catalogue.pool(scripted.POOL) == LOADED.pools[scripted.POOL]
    assert [(e.name, e.state) for e in view.entitlements] == [
        (e.name, e.state) for e in catalogue.entitlements_of(scripted.POOL)]
    assert view.entitlements[1].state is EntitlementState.PENDING
    assert pool_view(catalogue, "nowhere") is None


def test_proxy_book_keeps_the_newest_heartbeat():
    book = ProxyBook()
    beat = ProxyHeartbeat(proxy_id="p", t_ms=10, pools=("a",), started_ms=0)
    assert book.apply(beat) and not book.apply(beat.model_copy(update={"t_ms": 5}))
    assert book.snapshot()["p"].t_ms == 10
    book.forget("p")
    assert book.snapshot() == {}
