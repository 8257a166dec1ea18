"""The agents' counts timer (docs/fleet.md): every ``counts_interval_ms`` each pool's fleet counts — per entitlement
the requests in flight, the proxies active and the fleet's bucket level — go to the proxies on the counts topic,
in the entitlement order of the pool's newest limit update.

``PoolProcessor`` (``streams.processor``) has it as a base: it holds the table, the catalogue, the watermarks, the
heartbeats and the sender these methods use; the pure parts are ``streams.fleet_counts`` and ``topics.counts``.
Kept apart from the processor because it is its own idea — what the proxies enforce between two ticks, on its own
timer — beside the windows and limits the processor folds and ticks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from tokenpools.streams import pool_state
from tokenpools.streams.pool_state import PoolState
from tokenpools.streams.state import Stored, table_key
from tokenpools.streams.fleet_counts import FleetCounts, Rate
from tokenpools.streams.metrics import StreamMetrics
from tokenpools.streams.params import StreamParams
from tokenpools.streams.views import ProxyBook, pool_view
from tokenpools.streams.watermarks import WatermarkBook
from tokenpools.topics.counts import CountsRecord, encode_counts
from tokenpools.topics.declarations import Topics
from tokenpools.topics.records import LimitUpdate, ProxyHeartbeat
from tokenpools.topics.shards import keys_of, parse_key

from tokenpools.runtime.deadletter import Send
from tokenpools.runtime.specs import Catalogue

if TYPE_CHECKING:
    from tokenpools.streams.processor import StateStore


class CountsShell:
    """The counts timer's methods of ``PoolProcessor``; the attributes below are the processor's."""

    params: StreamParams
    topics: Topics
    catalogue: Catalogue
    proxies: ProxyBook
    store: StateStore
    metrics: StreamMetrics
    watermarks: WatermarkBook
    counts: dict[str, FleetCounts]
    _published: dict[str, LimitUpdate]
    _read_limits: dict[str, LimitUpdate]
    _index: dict[str, list[bytes]] | None
    _send: Send

    def _held(self, pool: str) -> Stored:
        raise NotImplementedError  # the processor's

    def _counts_of(self, key: str, state: PoolState) -> FleetCounts:
        """The fleet counts of a pool or of a shard (``key``: ``<pool>#<k>``); a new one starts from ``state``'s
        in-flight levels (a restore, a rebalance: the level at its last closed window and its open windows'
        changes, a shard's as a pool's, ``shard_windows``)."""
        book = self.counts.get(key)
        if book is None:
            book = self.counts[key] = FleetCounts(parse_key(key).pool, self.params.demand_window_ms)
            book.seed(pool_state.in_flight_through(state))
        return book

    def note_limits(self, update: LimitUpdate) -> None:
        """A limit update read from the limits topic: a sharded pool's shards publish counts in its order and at
        its rates, whichever worker holds the pool's decision (a one-shard pool's counts follow this worker's own
        ticks). Kept across rebalances: a shard a worker takes over counts at once."""
        spec = self.catalogue.pool(update.pool)
        if spec is None or spec.shards <= 1:
            return
        held = self._read_limits.get(update.pool)
        if held is None or update.version > held.version:
            self._read_limits[update.pool] = update

    async def publish_counts(self, now_ms: int) -> list[CountsRecord]:
        """Send each ticked pool's fleet counts at its newest instant every live proxy has handed its events over
        for (else ``now_ms`` − grace), on the ``counts_interval_ms`` grid; nothing for a pool without live proxies
        or when that instant was already sent. A sharded pool's counts are its shards': one record from each shard
        this worker folds (``topics.counts``), in the order of the newest limit update it knows of the pool."""
        heartbeats = self.proxies.snapshot()
        records: list[CountsRecord] = []
        for pool in {**self._published, **self._read_limits}:  # no await in this loop: ``streams.processor``'s docstring
            view = pool_view(self.catalogue, pool)
            if view is None:
                continue
            shards = view.pool.shards
            update = self._published.get(pool)
            if shards > 1:
                read = self._read_limits.get(pool)
                update = read if update is None or (read is not None and read.version > update.version) else update
                keys = [k for k in keys_of(pool, shards)[1:] if self.store.get(table_key(k)) is not None]
            else:
                keys = [pool]
            if update is None:
                continue
            window_s = view.pool.token_bucket_window_s
            rates = {e.name: Rate(e.tokens_per_s, e.tokens_per_s * window_s) for e in update.entitlements}
            for key in keys:
                record = self._counts_at(key, update, rates, now_ms, heartbeats, shards)
                if record is not None:
                    records.append(record)
        self._index = None
        for record in records:
            await self._send(self.topics.counts.name, record.pool.encode(), encode_counts(record))
        if records:
            self.metrics.counts_records.inc(len(records))
        return records

    def _counts_at(self, key: str, update: LimitUpdate, rates: Mapping[str, Rate], now_ms: int,
                   heartbeats: Mapping[str, ProxyHeartbeat], shards: int) -> CountsRecord | None:
        """The counts record of a pool (``key``: its name) or of one of its shards (``<pool>#<k>``), or None."""
        p = self.params
        through, live = self.watermarks.counted_through(key, now_ms, p.heartbeat_ttl_ms, heartbeats)
        shard = parse_key(key)
        if shard.shard is not None:  # heartbeats name the pool, not its shards
            live |= self.watermarks.counted_through(shard.pool, now_ms, p.heartbeat_ttl_ms, heartbeats)[1]
        if not live:
            return None
        if through is None:
            through = now_ms - p.grace_ms
        t_ms = through // p.counts_interval_ms * p.counts_interval_ms
        book = self.counts.get(key)
        if book is None:
            book = self._counts_of(key, self._held(key).state)
        if book.cursor_ms is not None and t_ms <= book.cursor_ms:
            return None
        book.advance(t_ms, rates)
        return book.record(update.version, (e.name for e in update.entitlements), rates, live, len(live),
                           shard.shard or 0, shards if shard.shard is not None else 1)
