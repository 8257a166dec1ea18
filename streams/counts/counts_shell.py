"""The agents' counts timer (docs/fleet.md): every ``counts_interval_ms`` each pool's fleet counts — per entitlement
the requests in flight, the proxies active and the fleet's bucket level — go to the proxies on the counts topic,
in the entitlement order of the pool's newest limit update.

``CountsPublisher`` owns the pools' and shards' fleet counts (``streams.fleet_counts``, in memory) and the limit
updates their order and rates follow: those this worker sent (``note_published``, from the processor's tick) and
the sharded pools' read from the limits topic (``note_limits``). The processor (``streams.processor``) has each
batch's admissions and completions counted into ``of(pool, state)``, calls ``forget`` on a rebalance, and passes
the agents' counts task's calls on to ``publish`` (``publish_counts``) and the limits reader's to ``note_limits``.
The pools' states (a new count's in-flight levels, whether this worker still holds a shard) are read through the
``PoolTable`` (``streams.pool_table``), how far each proxy has handed its events over through the processor's
``WatermarkBook`` (``streams.watermarks``). The pure parts are ``streams.fleet_counts`` and ``topics.counts``. Its
own idea — what the proxies enforce between two ticks, on its own timer — beside the windows and limits the
processor folds and ticks.
"""

from __future__ import annotations

from collections.abc import Mapping

from tokenpools.streams.table import pool_state
from tokenpools.streams.table.pool_state import PoolState
from tokenpools.streams.table.pool_table import PoolTable
from tokenpools.streams.counts.fleet_counts import FleetCounts, Rate
from tokenpools.streams.metrics import StreamMetrics
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.views import ProxyBook, pool_view
from tokenpools.streams.event_time.watermarks import WatermarkBook
from tokenpools.topics.counts import CountsRecord, encode_counts
from tokenpools.topics.declarations import Topics
from tokenpools.topics.records import LimitUpdate, ProxyHeartbeat
from tokenpools.topics.shards import keys_of, parse_key

from tokenpools.runtime.deadletter import Send
from tokenpools.runtime.specs import Catalogue


class CountsPublisher:
    """The fleet counts of the pools and shards this worker folds, sent on ``topics``' counts topic with ``send``;
    ``proxies`` the live proxies' heartbeats, ``catalogue`` the pools' specs as they are now."""

    def __init__(self, params: StreamParams, topics: Topics, catalogue: Catalogue, proxies: ProxyBook,
                 pool_table: PoolTable, watermarks: WatermarkBook, send: Send, metrics: StreamMetrics) -> None:
        self.params = params
        self.catalogue = catalogue
        self._topics = topics
        self._proxies = proxies
        self._pool_table = pool_table
        self._watermarks = watermarks
        self._send = send
        self._metrics = metrics
        self._counts: dict[str, FleetCounts] = {}  # pool or shard → its fleet counts
        self._published: dict[str, LimitUpdate] = {}  # pool → the last limit update sent: the counts' order and rates
        self._read_limits: dict[str, LimitUpdate] = {}  # sharded pool → the newest update read (``note_limits``)

    def forget(self) -> None:
        """Drop the counts and the updates this worker sent (after a rebalance): a pool's counts start again from its
        state when next folded or published. The updates read from the limits topic are kept (``note_limits``)."""
        self._counts.clear()
        self._published.clear()

    def note_published(self, update: LimitUpdate) -> None:
        """A limit update this worker sent for a pool it still holds: the pool's counts follow its order and rates."""
        self._published[update.pool] = update

    def of(self, key: str, state: PoolState) -> FleetCounts:
        """The fleet counts of a pool or of a shard (``key``: ``<pool>#<k>``); a new one starts from ``state``'s
        in-flight levels (a restore, a rebalance: the level at its last closed window and its open windows'
        changes, a shard's as a pool's, ``shard_windows``) and their reserved tokens."""
        book = self._counts.get(key)
        if book is None:
            book = self._counts[key] = FleetCounts(parse_key(key).pool, self.params.demand_window_ms)
            book.seed(pool_state.in_flight_through(state), state.reserved)
        return book

    def reserved(self, key: str, entitlement: str) -> dict[str, int]:
        """The tokens ``entitlement``'s requests in flight reserved per proxy, in the fleet counts of ``key`` (a pool,
        or a shard ``<pool>#<k>``) at their last instant (``FleetCounts.reserved``): what the budget records carry
        (``streams.ledger_shell``). Empty for a pool or shard this worker has no counts of."""
        book = self._counts.get(key)
        return book.reserved(entitlement) if book is not None and book.cursor_ms is not None else {}

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

    async def publish(self, now_ms: int) -> list[CountsRecord]:
        """Send each ticked pool's fleet counts at its newest instant every live proxy has handed its events over
        for (else ``now_ms`` − grace), on the ``counts_interval_ms`` grid; nothing for a pool without live proxies
        or when that instant was already sent. A sharded pool's counts are its shards': one record from each shard
        this worker folds (``topics.counts``), in the order of the newest limit update it knows of the pool."""
        heartbeats = self._proxies.snapshot()
        records: list[CountsRecord] = []
        for pool in {**self._published, **self._read_limits}:  # no await in this loop (as ``streams.processor``'s)
            view = pool_view(self.catalogue, pool)
            if view is None:
                continue
            shards = view.pool.shards
            update = self._published.get(pool)
            if shards > 1:
                read = self._read_limits.get(pool)
                update = read if update is None or (read is not None and read.version > update.version) else update
                keys = [k for k in keys_of(pool, shards)[1:] if self._pool_table.has(k)]
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
        self._pool_table.drop_index()
        for record in records:
            await self._send(self._topics.counts.name, record.pool.encode(), encode_counts(record))
        if records:
            self._metrics.counts_records.inc(len(records))
        return records

    def _counts_at(self, key: str, update: LimitUpdate, rates: Mapping[str, Rate], now_ms: int,
                   heartbeats: Mapping[str, ProxyHeartbeat], shards: int) -> CountsRecord | None:
        """The counts record of a pool (``key``: its name) or of one of its shards (``<pool>#<k>``), or None."""
        p = self.params
        through, live = self._watermarks.counted_through(key, now_ms, p.heartbeat_ttl_ms, heartbeats)
        shard = parse_key(key)
        if shard.shard is not None:  # heartbeats name the pool, not its shards
            live |= self._watermarks.counted_through(shard.pool, now_ms, p.heartbeat_ttl_ms, heartbeats)[1]
        if not live:
            return None
        if through is None:
            through = now_ms - p.grace_ms
        t_ms = through // p.counts_interval_ms * p.counts_interval_ms
        book = self._counts.get(key)
        if book is None:
            book = self.of(key, self._pool_table.held(key).state)
        if book.cursor_ms is not None and t_ms <= book.cursor_ms:
            return None
        book.advance(t_ms, rates)
        return book.record(update.version, (e.name for e in update.entitlements), rates, live, len(live),
                           shard.shard or 0, shards if shard.shard is not None else 1)
