"""The pools' states in the agents' table (streams.pool_table): held in memory while the table holds what was
written, rebuilt from the table's keys when it does not, one scan of the keys until it is dropped."""

from __future__ import annotations

import logging

from tokenpools.streams.table import pool_state
from tokenpools.streams.table import state as table_state
from tokenpools.streams.metrics import StreamMetrics
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.table.pool_table import DictStore, PoolTable
from tokenpools_dev.streams import scripted

BASE_MS = 1_700_000_000_000
PARAMS = StreamParams(width_ms=1000, grace_ms=300)
EVENTS = scripted.scripted_events(BASE_MS, 1000, scripted.two_class_phases(4))


class CountingStore(DictStore):
    """A DictStore that counts the scans of its keys (``items``)."""

    def __init__(self) -> None:
        super().__init__()
        self.scans = 0

    def items(self) -> list[tuple[bytes, bytes]]:
        self.scans += 1
        return super().items()


def folded(pool: str, n: int) -> pool_state.PoolState:
    """A state of ``pool`` with the first ``n`` scripted events folded."""
    state = pool_state.new(pool, PARAMS.width_ms)
    for i, (record, ts) in enumerate(EVENTS[:n]):
        state, _ = pool_state.apply_event(state, record.model_copy(update={"pool": pool}), PARAMS,
                                 pool_state.Position("requests/0", i, ts))
    return state


def table(store: DictStore | None = None) -> tuple[PoolTable, StreamMetrics]:
    metrics = StreamMetrics()
    return PoolTable(store if store is not None else CountingStore(), PARAMS.width_ms, metrics), metrics


def test_a_pool_is_held_in_memory_while_the_table_holds_what_was_written():
    pools, _ = table()
    assert not pools.has("pool-a") and pools.remembered("pool-a") is None
    state = folded("pool-a", 30)
    pools.write(pools.held("pool-a"), state, 2)
    scans = pools.store.scans  # type: ignore[attr-defined]
    held = pools.held("pool-a")
    assert held.state is state and held.partition == 2 and pools.has("pool-a")
    assert pools.held("pool-a") is held and pools.remembered("pool-a") is held
    assert pools.store.scans == scans  # type: ignore[attr-defined]  # nothing read from the table


def test_a_table_written_by_someone_else_is_read_again():
    pools, _ = table()
    pools.write(pools.held("pool-a"), folded("pool-a", 10), 1)
    restored, _ = table(pools.store)  # another writer of the same table (a changelog restore)
    later = folded("pool-a", 40)
    restored.write(restored.held("pool-a"), later, 1)
    held = pools.held("pool-a")
    assert held.state == later and held.state is not later and held.partition == 1


def test_the_scan_of_the_keys_serves_until_it_is_dropped():
    writer, _ = table()
    for pool in ("pool-a", "pool-b", "pool-c"):
        writer.write(writer.held(pool), folded(pool, 20), 0)
    pools, _ = table(writer.store)
    store: CountingStore = pools.store  # type: ignore[assignment]
    scans = store.scans
    assert pools.held("pool-a").state == folded("pool-a", 20)
    assert pools.held("pool-b").state == folded("pool-b", 20)
    assert store.scans == scans + 1  # one scan for both restores
    pools.drop_index()
    assert pools.held("pool-c").state == folded("pool-c", 20)
    assert store.scans == scans + 2


def test_forget_rebuilds_each_state_from_the_table():
    pools, _ = table()
    state = folded("pool-a", 25)
    pools.write(pools.held("pool-a"), state, 3)
    pools.forget()
    assert pools.remembered("pool-a") is None
    held = pools.held("pool-a")
    assert held.state == state and held.state is not state and held.partition == 3


def test_an_unusable_state_starts_afresh_with_a_warning_of_its_own_and_a_count(caplog):
    store = DictStore()
    store.put(table_state.table_key("pool-a"), b"{", 0)
    pools, metrics = table(store)
    with caplog.at_level(logging.WARNING, logger="tokenpools.streams.table.pool_table"):
        held = pools.held("pool-a")
    assert held.state == pool_state.new("pool-a", PARAMS.width_ms) and held.partition is None
    assert [r.name for r in caplog.records] == ["tokenpools.streams.table.pool_table"]
    assert "pool pool-a: stored state not usable (not JSON" in caplog.records[0].getMessage()
    assert metrics.state_resets._value.get() == 1
    pools.write(held, folded("pool-a", 5), 0)  # the unusable key is replaced by the next write
    assert pools.held("pool-a").state == folded("pool-a", 5)
