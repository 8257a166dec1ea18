"""The counts publisher on its own (streams.counts_shell.CountsPublisher, no processor): a pool's counts follow the
limit update this worker sent, start from the in-flight levels of the pool's stored state, go once per instant,
and stop after a rebalance until an update is sent again; a one-shard pool's update read from the topic does not
count as one."""

from __future__ import annotations

import asyncio

from tokenpools.config import load_config_text
from tokenpools.runtime.specs import Catalogue
from tokenpools.streams.table import pool_state
from tokenpools.streams.counts.counts_shell import CountsPublisher
from tokenpools.streams.metrics import StreamMetrics
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.table.pool_table import DictStore, PoolTable
from tokenpools.streams.views import ProxyBook, pool_view
from tokenpools.streams.event_time.watermarks import WatermarkBook
from tokenpools.topics.counts import decode_counts
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.records import LimitUpdate, ProxyHeartbeat
from tokenpools_dev.streams import scripted

BASE_MS = 1_700_000_000_000
PARAMS = StreamParams(width_ms=1000, grace_ms=300, max_updates_per_tick=1000)
TOPICS = topics_for("t.")
CATALOGUE = Catalogue.from_loaded(load_config_text(scripted.CONFIG_YAML))
NOW = BASE_MS + 2_800  # the events before BASE_MS + 2_500 folded, the pool ticked: requests still in flight
PROXIES = ("proxy-1", "proxy-2")


def publisher() -> tuple[CountsPublisher, LimitUpdate, pool_state.PoolState, scripted.Sent]:
    events = [(r, ts) for r, ts in scripted.scripted_events(BASE_MS, 1000, scripted.two_class_phases(4)) if ts < NOW - 300]
    items = [(record, pool_state.Position("requests/0", i, ts)) for i, (record, ts) in enumerate(events)]
    state, outcomes = pool_state.apply_events(pool_state.new(scripted.POOL, PARAMS.width_ms), items, PARAMS)
    proxies = ProxyBook()
    for proxy in PROXIES:
        proxies.apply(ProxyHeartbeat(proxy_id=proxy, t_ms=NOW, pools=(scripted.POOL,), started_ms=BASE_MS))
    out = pool_state.tick(pool_state.track_in_flight(state, items, outcomes), pool_view(CATALOGUE, scripted.POOL), NOW, PARAMS,
                 proxies.snapshot())
    metrics, sent = StreamMetrics(), scripted.Sent()
    pools = PoolTable(DictStore(), PARAMS.width_ms, metrics)
    pools.write(pools.held(scripted.POOL), out.state, 0)
    watermarks = WatermarkBook((TOPICS.requests.name, TOPICS.completions.name), PARAMS.width_ms)
    counts = CountsPublisher(PARAMS, TOPICS, CATALOGUE, proxies, pools, watermarks, sent, metrics)
    return counts, out.updates[-1], out.state, sent


def test_counts_follow_the_update_sent_start_from_the_stored_levels_and_go_once_per_instant():
    counts, update, state, sent = publisher()
    assert asyncio.run(counts.publish(NOW)) == []  # no update sent yet: no order to follow
    counts.note_published(update)
    [record] = asyncio.run(counts.publish(NOW))
    assert [decode_counts(value) for topic, _, value in sent.records if topic == TOPICS.counts.name] == [record]
    levels = pool_state.in_flight_through(state)
    assert record.limits_version == update.version and record.proxies == len(PROXIES)
    assert record.in_flight == tuple(sum(levels.get(e.name, {}).values()) for e in update.entitlements)
    assert record.pool_in_flight == sum(record.in_flight) > 0
    assert record.t_ms == (NOW - PARAMS.grace_ms) // PARAMS.counts_interval_ms * PARAMS.counts_interval_ms
    assert asyncio.run(counts.publish(NOW)) == []  # that instant went already


def test_after_a_rebalance_nothing_goes_until_an_update_is_sent_again():
    counts, update, _, _ = publisher()
    counts.note_published(update)
    [before] = asyncio.run(counts.publish(NOW))
    counts.forget()
    later = NOW + PARAMS.counts_interval_ms
    counts.note_limits(update)  # a one-shard pool's update read from the topic: its own worker's ticks rule
    assert asyncio.run(counts.publish(later)) == []
    counts.note_published(update)
    [after] = asyncio.run(counts.publish(later))
    assert after.t_ms == before.t_ms + PARAMS.counts_interval_ms
    assert after.in_flight == before.in_flight  # counted again from the stored state's levels


def test_a_pools_counts_start_from_the_stored_reservations_in_flight():
    """A worker that takes a pool over (here: a new publisher over the stored state) seeds each proxy's reserved
    tokens from the state, so the budget records carry the requests then in flight (docs/budgets.md)."""
    counts, update, state, _ = publisher()
    counts.note_published(update)
    asyncio.run(counts.publish(NOW))
    levels = pool_state.in_flight_through(state)
    assert state.reserved
    for entitlement, per_proxy in levels.items():
        expected = {p: n for p, n in state.reserved.get(entitlement, {}).items() if n > 0 and p in per_proxy}
        assert counts.reserved(scripted.POOL, entitlement) == expected
    assert any(counts.reserved(scripted.POOL, e) for e in levels)
