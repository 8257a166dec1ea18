"""The pools' states in the agents' table: each pool's ``PoolState`` read from its table keys as ``streams.state``
lays them out, kept in memory, and written through.

``PoolTable`` is the one place that reads and writes a pool's state keys. The processor (``streams.processor``)
folds and ticks through it; the ledgers (``streams.ledger_shell``: how far a pool's windows are closed) and the counts
publisher (``streams.counts_shell``: a pool's in-flight levels, whether this worker still holds it) read through it.

Memory and the table: a pool's state in memory is used while the table still holds the very value this process
wrote last under the pool's newest key (``StateStore.get`` returns the object ``put`` was given); otherwise — a
changelog restore, a rebalance, ``forget`` — it is rebuilt from the table's keys. To find a pool's keys the table is
scanned once and the scan kept (``pool → its keys``) until ``drop_index``: a caller that may have read states drops
it when its stretch without awaits ends, since the table may change in any await (a restore, another writer).
"""

from __future__ import annotations

import logging
from typing import Protocol

from tokenpools.streams.metrics import StreamMetrics
from tokenpools.streams.table.pool_state import PoolState
from tokenpools.streams.table.state import Cell, Stored, entry_key, group_writes, owner_of_key, restore, table_key

log = logging.getLogger(__name__)


class StateStore(Protocol):
    """The table: ``get`` returns the very object ``put`` was given (the processor recognises its own writes by
    identity); ``put`` with ``value`` None deletes the key and writes a tombstone (a record with no value) to the
    changelog partition ``partition``, which a restore takes as a delete. Writes of one partition reach its
    changelog in the order they were made."""

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes | None, partition: int) -> None: ...

    def items(self) -> list[tuple[bytes, bytes]]: ...


class DictStore:
    """A StateStore in a dict (tests, benchmarks of the pure path)."""

    def __init__(self) -> None:
        self.data: dict[bytes, tuple[bytes, int]] = {}

    def get(self, key: bytes) -> bytes | None:
        found = self.data.get(key)
        return found[0] if found else None

    def put(self, key: bytes, value: bytes | None, partition: int) -> None:
        if value is None:
            self.data.pop(key, None)
        else:
            self.data[key] = (value, partition)

    def items(self) -> list[tuple[bytes, bytes]]:
        return [(k, v) for k, (v, _) in self.data.items()]


class PoolTable:
    """The pools' stored states in ``store`` (the windows of ``width_ms``), with the assembled state of each in
    memory; ``metrics.state_resets`` counts the states found unusable and started afresh."""

    def __init__(self, store: StateStore, width_ms: int, metrics: StreamMetrics) -> None:
        self.store = store
        self._width_ms = width_ms
        self._metrics = metrics
        self._pools: dict[str, tuple[bytes, bytes | None, Stored]] = {}  # pool → its newest key, value, state
        self._index: dict[str, list[bytes]] | None = None  # pool → its table keys: one scan, until ``drop_index``

    def held(self, pool: str) -> Stored:
        """The pool's state as stored: the one in memory while the table still holds the newest value this
        process saw of the pool (the very object: the table keeps what it was given), else restored from the
        table's keys (a changelog restore, a rebalance), or a new one."""
        cached = self._pools.get(pool)
        if cached is not None and self.store.get(cached[0]) is cached[1]:
            return cached[2]
        if cached is not None:
            self._index = None  # the table changed under this process: look again
        if self._index is None:
            index: dict[str, list[bytes]] = {}
            for key, _ in self.store.items():
                owner = owner_of_key(key)
                if owner is not None:
                    index.setdefault(owner[0], []).append(key)
            self._index = index
        entries = [(k, v) for k in self._index.get(pool, ()) if (v := self.store.get(k)) is not None]
        stored, why = restore(pool, entries, self._width_ms)
        if why:
            log.warning("pool %s: stored state not usable (%s); starting it afresh", pool, why)
            self._metrics.state_resets.inc()
        self._remember(stored)
        return stored

    def remembered(self, pool: str) -> Stored | None:
        """The pool's state in memory, as this process last held it, without looking at the table (None: none)."""
        known = self._pools.get(pool)
        return known[2] if known is not None else None

    def has(self, pool: str) -> bool:
        """The table holds the pool's snapshot now (a rebalance may have taken it, or it was never written)."""
        return self.store.get(table_key(pool)) is not None

    def write(self, before: Stored, state: PoolState, partition: int, cells: set[Cell] | None = None) -> None:
        """Store ``state`` over ``before`` as one write group (``streams.state``): a batch's journal entry
        (``cells``: the cells it touched), or a snapshot (None: a tick)."""
        writes, stored = group_writes(before, state, partition, cells)
        for key, value in writes:
            self.store.put(key, value, partition)
        self._remember(stored)

    def drop_index(self) -> None:
        """Forget the scan of the table's keys: the next restore scans again (see the module docstring)."""
        self._index = None

    def forget(self) -> None:
        """Drop every state in memory (after a rebalance): each is rebuilt from the table when next held."""
        self._pools.clear()
        self._index = None

    def _remember(self, stored: Stored) -> None:
        pool = stored.state.pool
        newest = entry_key(pool, stored.entries[-1]) if stored.entries else table_key(pool)
        self._pools[pool] = (newest, self.store.get(newest), stored)
