"""The agents' shell without Faust: decode a batch of raw records, fold them into the pools' states, tick.

One idea: the agents' shell, the one class that turns batches and timer calls into state writes and sends; the
state, the ledgers and the counts are the collaborators it calls.

The Faust app (``streams.app``) hands this class batches from its agent and calls ``tick`` from its timer; tests
may drive it directly. Storage and sending are injected (``StateStore``, ``Send``), so nothing here knows Kafka.

It holds three collaborators it calls, each owning its own state: the ``PoolTable`` (``streams.pool_table``), the
``Ledgers`` (``streams.ledger_shell``) and the ``CountsPublisher`` (``streams.counts_shell``); the latter two read the
pools' states through the same ``PoolTable``. ``forget`` (a rebalance) reaches each.

State: each pool's ``PoolState`` is kept by the ``PoolTable``, in memory, and written through to the table as
``streams.state`` lays it out (a batch: a journal entry of what it changed; a tick: a snapshot). It is rebuilt from
the table when the table no longer holds what this process wrote last (a changelog restore) and after a rebalance.

Watermarks (``streams.watermarks``): the proxies' packed records declare how far each proxy has handed over its
events; ``process`` notes them once the record's events are folded, and ``tick`` closes a pool's windows as soon as
every live proxy's watermark has passed their end (else at end + grace). ``woken`` is set when a watermark passed
a window end, so the timer can look at once instead of at the next deadline.

Concurrency: the agent and the timer share one event loop. ``process`` reads and writes the states it touches
without awaiting in between; ``tick`` does the same for each pool — reads its state as it is at that moment, ticks
it, writes it back — and yields to the loop between pools, so a batch (or the counts timer) waits for one pool's
tick, never for all of them. A batch that runs in such a pause folds into the stored states: one of a pool ticked
already builds on the ticked state, one of a pool still to come is in the state that pool's tick then reads, so
neither can overwrite the other's work. A rebalance in a pause (``forget``) ends the tick: the pools it did not
reach are ticked by the next one, with the partitions and horizons of then. Sends happen after, pool by pool.

Sharded pools (docs/scaling.md#the-two-stage-topology): the events of a shard key (``<pool>#<k>``) fold into the
shard's own state, which the timer closes into window summaries (``shard_windows``, stage 1) sent to usage-windows;
the summaries, read back on the pool's own partition, fold into the pool's state (``summaries``, stage 2), which
ticks as any pool's once its shards are through. A one-shard pool never meets any of this.

Fleet counts (docs/fleet.md; ``CountsPublisher``, ``streams.counts_shell``): each batch's admissions and completions
move its pools' in-flight counts, which ``publish_counts`` sends to the proxies.

Ledgers (docs/budgets.md#the-ledger-in-the-agents, ``streams.ledger``; ``Ledgers``, ``streams.ledger_shell``): each
batch's completions also fold into their entitlements' budget and usage ledgers, one table key each beside the
pool's (``ledger/<pool>/<entitlement>``), de-duplicated by the ledger's own offsets; ``publish_ledgers`` sends what
changed, versions written first.
Tenant budgets' alerts (``streams.tenant_alerts``): ``publish_tenant_alerts`` sums the parts read from the budgets
topic for the (tenant, budget)s whose owner key's partition this worker holds; their books are table keys too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tokenpools.streams.table import pool_state
from tokenpools.streams.sharding import shard_windows
from tokenpools.streams.budgets import tenant_alerts
from tokenpools.streams.table.pool_state import Outcome, PoolState, Position
from tokenpools.streams.budgets.ledger import LedgerParams, Publication
from tokenpools.streams.table.pool_table import DictStore, PoolTable, StateStore
from tokenpools.streams.table.state import Stored, pool_of_key, touched
from tokenpools.streams.sharding.summaries import Merged, merge_all
from tokenpools.streams.sharding.summaries import heard as shards_heard
from tokenpools.streams.sharding.summaries import horizon as decision_horizon
from tokenpools.streams.table.batch import fold
from tokenpools.streams.decoding import Item, RawEvent, Rejected, decode_source, element_position
from tokenpools.streams.counts.counts_shell import CountsPublisher
from tokenpools.streams.budgets.ledger_shell import Ledgers
from tokenpools.streams.metrics import StreamMetrics
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.event_time.progress import Progress
from tokenpools.streams.views import ProxyBook, pool_view
from tokenpools.streams.event_time.watermarks import WatermarkBook
from tokenpools.topics.codec import encode
from tokenpools.topics.counts import CountsRecord
from tokenpools.topics.declarations import Topics
from tokenpools.topics.effective import effective_limit_key
from tokenpools.topics.limits import pages
from tokenpools.topics.records import (
    BackendMetricsSample,
    BudgetAlert,
    DeadLetterReason,
    EffectiveLimit,
    LimitUpdate,
    ProxyHeartbeat,
    Record,
    RequestCompleted,
    RequestDecided,
    ScaleCommand,
    WindowSummary,
)
from tokenpools.topics.shards import parse_key

from tokenpools.runtime.deadletter import DeadLetters, Send
from tokenpools.runtime.specs import Catalogue

# users import the table's types (homes: streams.pool_table) and the raw record (streams.decoding) from here too
__all__ = ["BatchResult", "DictStore", "PoolProcessor", "RawEvent", "StateStore", "TickResult"]

log = logging.getLogger(__name__)

SOURCE_RECORDS = (RequestDecided, RequestCompleted, BackendMetricsSample, WindowSummary)


@dataclass(slots=True)
class BatchResult:
    events: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    dead_letters: int = 0


@dataclass(slots=True)
class TickResult:
    windows: int = 0
    updates: list[LimitUpdate] = field(default_factory=list)
    scale: list[ScaleCommand] = field(default_factory=list)
    effective: list[EffectiveLimit] = field(default_factory=list)
    departed: list[tuple[str, str]] = field(default_factory=list)  # (pool, entitlement): tombstoned
    summaries: list[WindowSummary] = field(default_factory=list)  # sharded pools' shards' closed windows (stage 1)
    outboxes: dict[str, tuple[WindowSummary, ...]] = field(default_factory=dict)  # shard key → its outbox, sent
    #                                                                               once ``summaries`` are


class PoolProcessor:
    """The agents' batches and timer over one table (the module docstring). It builds and calls ``pool_table``
    (``PoolTable``), ``ledgers`` (``Ledgers``) and ``counts`` (``CountsPublisher``)."""

    def __init__(self, params: StreamParams, topics: Topics, catalogue: Catalogue, proxies: ProxyBook,
                 store: StateStore, send: Send, dead_letters: DeadLetters, metrics: StreamMetrics,
                 progress: Progress | None = None, partition_of: Callable[[str], int] | None = None,
                 ledger: LedgerParams | None = None) -> None:
        self.params = params
        self._partition_of = partition_of or (lambda key: 0)  # an event key's partition (a shard's state is there)
        self.topics = topics
        self._catalogue = catalogue
        self.proxies = proxies
        self._store = store
        self._send = send
        self.dead_letters = dead_letters
        self.metrics = metrics
        self.progress = progress or Progress()
        self._unknown: set[str] = set()  # pools warned about (events but no spec)
        self.watermarks = WatermarkBook((topics.requests.name, topics.completions.name), params.width_ms)
        self.woken = asyncio.Event()  # a watermark passed a window end: the timer may close a window early
        self._generation = 0  # + 1 at every ``forget``: a tick that paused across one stops
        self._heard: dict[str, dict[int, tuple[int | None, int]]] = {}  # sharded pool → shard → (progress, seen at)
        self._sent: dict[str, tuple[WindowSummary, ...]] = {}  # shard key → the outbox this process sent last; kept
        #                                                         across rebalances: a shard back with it is not re-sent
        self.pool_table = PoolTable(store, params.width_ms, metrics)
        self.counts = CountsPublisher(params, topics, catalogue, proxies, self.pool_table, self.watermarks, send,
                                      metrics)
        self.ledgers = Ledgers(ledger or LedgerParams(), params.width_ms, topics, catalogue, store, self.pool_table,
                               send, metrics, self._partition_of, self.counts.reserved)

    @property
    def store(self) -> StateStore:
        """The agents' table: the pools' states (``pool_table``) and the ledgers' keys (``ledgers``)."""
        return self._store

    @store.setter
    def store(self, store: StateStore) -> None:
        """Another table (tests: a worker restored from a changelog): the pool table and the ledgers use it too."""
        self._store = self.pool_table.store = self.ledgers.store = store

    @property
    def catalogue(self) -> Catalogue:
        """The pools' and entitlements' specs, as the processor and its collaborators read them."""
        return self._catalogue

    @catalogue.setter
    def catalogue(self, catalogue: Catalogue) -> None:
        """Another catalogue (tests: a spec changed): the ledgers and the counts read it too."""
        self._catalogue = self.ledgers.catalogue = self.counts.catalogue = catalogue

    # ---- the collaborators' calls, under the names the agents' tasks use ---------------------------------------
    def note_limits(self, update: LimitUpdate) -> None:
        """A limit update read from the limits topic (``CountsPublisher.note_limits``)."""
        self.counts.note_limits(update)

    async def publish_counts(self, now_ms: int) -> list[CountsRecord]:
        """The pools' fleet counts at ``now_ms`` (``CountsPublisher.publish``)."""
        return await self.counts.publish(now_ms)

    async def publish_ledgers(self, written: Callable[[], Awaitable[None]] | None = None) -> list[Publication]:
        """What the ledgers changed since their last publication (``Ledgers.publish_ledgers``)."""
        return await self.ledgers.publish_ledgers(written)

    async def publish_tenant_alerts(self, parts: tenant_alerts.Parts, active: set[int] | None,
                                    written: Callable[[], Awaitable[None]] | None = None) -> list[BudgetAlert]:
        """The alerts of the tenant budgets this worker owns (``Ledgers.publish_tenant_alerts``)."""
        return await self.ledgers.publish_tenant_alerts(parts, active, written)

    # ---- the agent: a batch of records ---------------------------------------------------------------------
    async def process(self, events: Sequence[RawEvent]) -> BatchResult:
        """Fold a batch of Kafka records, each a plain event or an event_batch of many, into the pools' states.

        Every element is an event of its own: it is counted, folded at its own position (``decoding``), and when
        bad or late dead-lettered alone (with its index and its own JSON), never taking its neighbours with it.
        """
        result = BatchResult()
        rejected: list[Rejected] = []
        by_pool: dict[str, tuple[list[Item], list[tuple[Record, Position]]]] = {}
        types: dict[str, int] = {}
        sources: dict[tuple[str, int], str] = {}
        marks: list[tuple[RawEvent, str, int, str | None]] = []  # (record, proxy, watermark, pool from the key)
        seen: dict[tuple[str, int, str], int] = {}  # (pool, partition, proxy) → newest timestamp, no watermark
        summaries: dict[str, tuple[int, list[tuple[WindowSummary, Position]]]] = {}  # pool → (partition, its
        #                                                                              shards' summaries): stage 2
        shard_of_key: dict[bytes | None, str | None] = {}  # a Kafka key → the shard it names (``<pool>#<k>``)
        n = 0
        for raw in events:
            shard = shard_of_key.get(raw.key, "")
            if shard == "":
                shard = shard_of_key[raw.key] = _shard(raw.key)
            decoded = decode_source(raw.value, SOURCE_RECORDS)
            mark = decoded.watermark
            if mark is not None:
                marks.append((raw, mark.proxy_id, mark.watermark_ms, raw.key.decode("utf-8", "replace")
                              if raw.key else None))
            if decoded.bad:
                for bad in decoded.bad:
                    payload = raw.value if bad.index is None else bad.payload
                    rejected.append((raw, bad.index, bad.error.reason, bad.error.detail, payload))
                types["undecodable"] = types.get("undecodable", 0) + len(decoded.bad)
                n += len(decoded.bad)
            source = sources.get((raw.topic, raw.partition))
            if source is None:
                source = sources[(raw.topic, raw.partition)] = f"{raw.topic}/{raw.partition}"
            base, ts, batched = element_position(raw.offset, 0), raw.timestamp_ms, decoded.batched
            for index, record in decoded.records:
                kind = record.record_type  # type: ignore[attr-defined]
                types[kind] = types.get(kind, 0) + 1
                pool = record.pool  # type: ignore[attr-defined]
                if type(record) is WindowSummary:
                    summaries.setdefault(pool, (raw.partition, []))[1].append((record, Position(source, base + index,
                                                                                                   ts)))
                    continue
                if shard is not None and shard.startswith(pool):  # a shard's events fold into its own state
                    pool = shard
                group = by_pool.get(pool)
                if group is None:
                    group = by_pool[pool] = ([], [])
                group[0].append((raw, index if batched else None, record))
                group[1].append((record, Position(source, base + index, ts)))
                if mark is None:
                    proxy = getattr(record, "proxy_id", None)
                    if proxy is not None:
                        at = (pool, raw.partition, proxy)
                        seen[at] = max(seen.get(at, 0), ts or record.t_ms)  # type: ignore[attr-defined]
            n += len(decoded.records)
            if mark is not None and marks[-1][3] is None and decoded.records:
                marks[-1] = (*marks[-1][:3], decoded.records[0][1].pool)  # type: ignore[attr-defined]
        result.events = n
        for pool, (items, positions) in by_pool.items():  # no await in this loop: see the module docstring
            rejected += self._fold(pool, items, positions, result)
        for pool, (partition, received) in summaries.items():
            self._merge(pool, received, partition, result)
        self.pool_table.drop_index()
        for raw in events:
            self.progress.note(raw.topic, raw.partition, raw.offset, raw.timestamp_ms)
        self._note_watermarks(marks, seen)
        for kind, count in types.items():
            self.metrics.events.labels(kind).inc(count)
        for outcome, count in result.outcomes.items():
            self.metrics.outcomes.labels(outcome).inc(count)
        for raw, element, reason, detail, payload in rejected:
            await self.dead_letters.handle(reason, detail, raw.topic, raw.partition, raw.offset, raw.key, payload,
                                           element)
        result.dead_letters = len(rejected)
        return result

    def _note_watermarks(self, marks: list[tuple[RawEvent, str, int, str | None]],
                         seen: Mapping[tuple[str, int, str], int]) -> None:
        """After the batch was folded (a watermark holds for what came before it on its partition)."""
        book = self.watermarks
        for (pool, partition, proxy), ts in seen.items():
            book.saw(pool, partition, proxy, ts)
        passed = False
        for raw, proxy, watermark_ms, of_pool in marks:
            if of_pool is not None:
                ts = raw.timestamp_ms if raw.timestamp_ms is not None else watermark_ms
                passed |= book.note(of_pool, raw.partition, raw.topic, proxy, watermark_ms, ts)
        if marks:
            self.metrics.watermarks.inc(len(marks))
        if passed:
            self.woken.set()

    def _fold(self, pool: str, items: list[Item], positions: list[tuple[Record, Position]],
              result: BatchResult) -> list[Rejected]:
        """One pool's events of the batch (``positions``: each with its position, see ``decoding``) into its state:
        one fold per pool and batch, one group of table writes: what the batch changed (``streams.state``)."""
        partition = items[-1][0].partition
        before = self.pool_table.held(pool)
        state = before.state
        late: list[Rejected] = []
        shard = parse_key(pool)
        book = self.counts.of(pool, state)  # a shard's: its entitlements' counts (docs/scaling.md step 4)
        if shard.shard is not None:  # a sharded pool's shard (stage 1): its windows, closed into summaries
            state, outcomes = shard_windows.fold_shard(state, shard.pool, positions, self.params)
        else:
            state, outcomes = fold(state, positions, self.params)
            state = pool_state.track_in_flight(state, positions, outcomes)  # per-proxy levels for the hold-back
        book.note(record for (record, _), outcome in zip(positions, outcomes)  # type: ignore[misc]
                  if isinstance(record, (RequestDecided, RequestCompleted))
                  and outcome is not Outcome.DUPLICATE and outcome is not Outcome.IGNORED)
        counts = result.outcomes
        tally = Counter(outcomes)
        for outcome, count in tally.items():
            counts[outcome.value] = counts.get(outcome.value, 0) + count
        if Outcome.LATE in tally:
            for (raw, index, record), outcome in zip(items, outcomes):
                if outcome is Outcome.LATE:
                    t_ms = record.t_ms  # type: ignore[attr-defined]
                    payload = raw.value if index is None else encode(record)
                    late.append((raw, index, DeadLetterReason.LATE,
                                 self._late_detail(state, t_ms, raw.timestamp_ms), payload))
        self.pool_table.write(before, state, partition, touched(positions, outcomes))
        late += self.ledgers.fold(pool, partition, items, positions, outcomes)
        return late

    def _merge(self, pool: str, received: list[tuple[WindowSummary, Position]], partition: int,
               result: BatchResult) -> None:
        """A sharded pool's summaries into the pool's own state (stage 2, ``streams.summaries``): a snapshot write,
        once per batch (a summary touches most of the pool's windows)."""
        before = self.pool_table.held(pool)
        state, merged = merge_all(before.state, received)
        for outcome, count in Counter(merged).items():
            key = f"summary_{outcome.value}"
            result.outcomes[key] = result.outcomes.get(key, 0) + count
        if state != before.state:
            self.pool_table.write(before, state, before.partition if before.partition is not None else partition)
        if Merged.APPLIED in merged:
            self.woken.set()  # the pool may tick now: the timer looks at once instead of at the next deadline

    def _late_detail(self, state: PoolState, t_ms: int, timestamp_ms: int | None) -> str:
        w, g = self.params.width_ms, self.params.grace_ms
        end = (t_ms // w + 1) * w
        if state.closed_through is not None and t_ms // w <= state.closed_through:
            why = f"its window was already ticked (through the window ending {(state.closed_through + 1) * w})"
        else:
            why = f"it reached Kafka at {timestamp_ms}, after the window's end + grace ({end} + {g})"
        return f"t_ms {t_ms} is in the window ending {end} ms: late, {why}"

    def put_state(self, state: PoolState, partition: int) -> None:
        """Store ``state`` whole over what the pool had (tests and benchmarks start a processor from a state)."""
        self.pool_table.write(self.pool_table.held(state.pool), state, partition)

    def forget(self) -> None:
        """Drop what this process remembers about the states (after a rebalance); a tick in progress stops."""
        self._generation += 1
        self.pool_table.forget()
        self.watermarks.forget()
        self.counts.forget()
        self._heard.clear()
        self.ledgers.forget()

    # ---- the timer: close windows, tick, publish -------------------------------------------------------------
    def _close_horizon(self, pool: str, horizon: int, proxies: Mapping[str, ProxyHeartbeat]) -> int:
        """The horizon the pool's windows close by: ``horizon``, or later when the watermarks allow."""
        p = self.params
        return self.watermarks.horizon(pool, horizon, p.grace_ms, p.heartbeat_ttl_ms, proxies)

    def _nothing_due(self, pool: str, now_ms: int, horizons: Mapping[int, int | None] | None,
                     active: set[int] | None, proxies: Mapping[str, ProxyHeartbeat]) -> bool:
        """True when this pool has no window to close (known from the state in memory): skipped."""
        known = self.pool_table.remembered(pool)
        if known is None or known.state.closed_through is None or known.partition is None:
            return False
        closed_through, partition = known.state.closed_through, known.partition
        if active is not None and partition not in active:
            return True
        horizon = now_ms if horizons is None else horizons.get(partition)
        if horizon is None:
            return True
        horizon = self._close_horizon(pool, horizon, proxies)
        return (horizon - self.params.grace_ms) // self.params.width_ms - 1 <= closed_through

    async def tick(self, now_ms: int, horizons: Mapping[int, int | None] | None = None,
                   active: set[int] | None = None) -> TickResult:
        """``horizons``: partition → close horizon (ms); None means every partition is at ``now_ms``."""
        started = time.perf_counter()
        result = TickResult()
        proxies = self.proxies.snapshot()
        generation = self._generation
        self._ensure_shards(active)
        entries = self.store.items()
        pools = [pool for key, _ in entries if (pool := pool_of_key(key)) is not None]
        for pool in pools:
            if self._generation != generation:
                break  # a rebalance in a pause: the pools not reached yet wait for the next tick
            if not self.pool_table.has(pool):  # as it is now: a rebalance may have taken it
                continue
            pool_started = time.perf_counter()
            ticked = self._tick_pool(pool, now_ms, horizons, active, proxies, result)
            self.pool_table.drop_index()
            if ticked:
                self.metrics.pool_tick_seconds.observe(time.perf_counter() - pool_started)
                await asyncio.sleep(0)  # between pools (see the module docstring)
        for summary in result.summaries:  # to the pools' decisions first: they may tick at once
            await self._send(self.topics.usage_windows.name, summary.pool.encode(), encode(summary))
        self._sent.update(result.outboxes)
        for update in result.updates:  # a large pool's update goes as pages of one version (``topics.limits``)
            for key, page in pages(update):
                await self._send(self.topics.limits.name, key.encode(), encode(page))
                await asyncio.sleep(0)  # a page at a time: a shares-mode update is many pages
            if self.pool_table.has(update.pool):  # still this worker's (a rebalance in a pause may have taken
                self.counts.note_published(update)  # it): the counts follow its order now
            self.metrics.limit_updates.labels(update.pool).inc()
        for command in result.scale:
            await self._send(self.topics.scale.name, command.pool.encode(), encode(command))
            self.metrics.scale_commands.labels(command.pool).inc()
        effective = self.topics.effective_limits.name  # for readers outside tokenpools: after the proxies' records
        of_pool = None
        for record in result.effective:
            if record.pool != of_pool:  # a pool's records at a time
                of_pool = record.pool
                await asyncio.sleep(0)
            await self._send(effective, effective_limit_key(record.pool, record.entitlement).encode(), encode(record))
        for pool, name in result.departed:
            await self._send(effective, effective_limit_key(pool, name).encode(), None)
        self.metrics.table_pools.set(len(pools))
        self.metrics.table_bytes.set(sum(len(value) for _, value in entries))
        if horizons:
            for partition, h in horizons.items():
                lag = (now_ms - h) / 1000 if h is not None else float("nan")
                self.metrics.horizon_lag_seconds.labels(str(partition)).set(lag)
        self.metrics.tick_seconds.observe(time.perf_counter() - started)
        return result

    def _tick_pool(self, pool: str, now_ms: int, horizons: Mapping[int, int | None] | None,
                   active: set[int] | None, proxies: Mapping[str, ProxyHeartbeat], result: TickResult) -> bool:
        """Tick one pool's stored state into ``result`` and store what changed, without awaiting.
        False when there was nothing to do (no window due, not this worker's, not usable)."""
        if self._nothing_due(pool, now_ms, horizons, active, proxies):
            return False
        stored = self.pool_table.held(pool)
        if stored.partition is None or (active is not None and stored.partition not in active):
            return False
        horizon = now_ms if horizons is None else horizons.get(stored.partition)
        if horizon is None:
            return False
        closing = self._close_horizon(pool, horizon, proxies)
        shard = parse_key(pool)
        if shard.shard is not None:
            return self._close_shard(stored, shard.pool, shard.shard, closing, result)
        view = pool_view(self.catalogue, pool)
        if view is None and pool not in self._unknown:
            self._unknown.add(pool)
            log.warning("pool %s has events but no TokenPool spec: its windows close, nothing is published", pool)
        if view is not None and view.pool.shards > 1:  # the decision of a sharded pool waits for its shards
            shards = view.pool.shards
            heard = self._heard[pool] = shards_heard(self._heard.get(pool, {}), stored.state.offsets, shards, now_ms)
            closing = decision_horizon(stored.state, shards, closing, self.params.grace_ms, self.params.shard_grace_ms,
                                 now_ms, heard)
        out = pool_state.tick(stored.state, view, closing, self.params, proxies)
        if out.state != stored.state:
            self.pool_table.write(stored, out.state, stored.partition)
        if out.windows:
            self.metrics.windows_closed.labels(pool).inc(out.windows)
            g, w = self.params.grace_ms, self.params.width_ms
            early = min(out.windows, (closing - g) // w - (horizon - g) // w)
            if early > 0:
                self.metrics.windows_closed_early.labels(pool).inc(early)
        if out.skipped:
            self.metrics.updates_skipped.labels(pool).inc(out.skipped)
        result.windows += out.windows
        result.updates += out.updates
        result.effective += out.effective
        result.departed += [(pool, name) for name in out.departed]
        if out.scale is not None:
            result.scale.append(out.scale)
        return True

    # ---- sharded pools (docs/scaling.md#the-two-stage-topology) ----------------------------------------------
    def _ensure_shards(self, active: set[int] | None) -> None:
        """Every shard of a sharded pool whose partition this worker owns has a state, events or not, so it tells
        the pool's decision it is through each window (``shard_windows.close``)."""
        for name in self.catalogue.pools:
            spec = self.catalogue.pool(name)
            if spec is None or spec.shards <= 1:
                continue
            for k in range(spec.shards):
                key = f"{name}#{k}"
                partition = self._partition_of(key)
                if (active is None or partition in active) and not self.pool_table.has(key):
                    self.pool_table.write(self.pool_table.held(key), pool_state.new(key, self.params.width_ms),
                                          partition)

    def _close_shard(self, stored: Stored, pool: str, shard: int, closing: int, result: TickResult) -> bool:
        """Stage 1's close of one shard's state: its closed windows as summaries into ``result``, after the outbox
        of its stored state when this process has not sent that one (a takeover, a restore: the worker before may
        have died between writing the close and sending it; the decision drops what it has already)."""
        spec = self.catalogue.pool(pool)
        shards = max(spec.shards if spec is not None else 1, shard + 1)
        outbox, sent = stored.state.outbox, self._sent.get(stored.state.pool)
        unsent = () if sent is outbox or sent == outbox else outbox
        state, summaries = shard_windows.close(stored.state, closing, self.params, shards, unsent)
        if state != stored.state:
            self.pool_table.write(stored, state, stored.partition)  # type: ignore[arg-type]
        if not unsent and not summaries:
            return False
        result.summaries += [*unsent, *summaries]
        result.outboxes[state.pool] = state.outbox
        return True


def _shard(key: bytes | None) -> str | None:
    """The shard a record's Kafka key names (``<pool>#<k>``), or None (a pool's own key)."""
    if not key:
        return None
    name = key.decode("utf-8", "replace")
    return name if parse_key(name).shard is not None else None
