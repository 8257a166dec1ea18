"""The composition root of the agents process: ``build_agents(...)`` makes the Faust app and everything it uses.

Nothing happens at import time and there is no module-level app. The app has:

- one agent, ``pools``, over the co-partitioned pool-keyed topics (requests, completions, backend-metrics),
  batching with ``take_events`` and handing each batch to ``PoolProcessor.process`` (a Kafka record may itself be an
  ``event_batch`` of many events, ``topics.batches``: the proxies pack them, so Faust's per-message cost is paid
  once per packed record); a partition's records go in without a hole in their offsets (``streams.progress``),
  and the agent takes its next batch, which is when Faust acks this one, only once the broker holds the batch's
  changelog records (``FaustStore.written``); with them the usage-windows topic, co-partitioned, which carries a
  sharded pool's window summaries from its shards' workers to the pool's own (``streams.shard_windows``,
  ``streams.summaries``);
- one table, ``pool-state``: per pool the serialised ``PoolState`` (``streams.state``), changelog-backed, so a
  restarted worker restores it; the processor writes it through ``FaustStore`` with the pool's partition stated
  explicitly, because the timer writes outside any stream event. ``streams.standby_replicas`` other workers keep
  a copy of each partition's states from the changelog; ``FaustStore`` shows the timer only the active ones;
- a ticker task (our timer, aligned to the windows rather than Faust's fixed-interval ``app.timer``): at every
  window deadline (end + grace, from the injected clock) it computes each owned partition's close horizon
  (``streams.progress``) and calls ``PoolProcessor.tick``, which publishes limit updates, scale commands and the
  entitlements' effective limits (``topics.effective``, for readers outside tokenpools); while a
  due window still waits for its partition's records it looks again every 10 ms. With the proxies' watermarks
  (``streams.watermarks``) a window may close before its deadline: the ticker also looks at every window end and
  whenever the agent saw a watermark pass one (``PoolProcessor.woken``);
- a counter task: every ``counts_interval_ms`` it publishes the fleet's counts of each pool this worker ticks
  (``PoolProcessor.publish_counts``, ``streams.fleet_counts``), which the proxies divide the limits by;
- a ledger task: every ``budgets.publish_interval_s`` it publishes the entitlements' changed budget accounts, usage
  days and alerts (``PoolProcessor.publish_ledgers``, ``streams.ledger``; the ledgers live in the same table, one
  key per entitlement), then the tenant budgets' alerts of the (tenant, budget)s it owns
  (``PoolProcessor.publish_tenant_alerts``, ``streams.tenant_alerts``);
- readers of the specs and heartbeats topics (every worker reads all of them), of the sharded pools' limit updates
  (their shards' counts follow them) and of the budgets topic (the tenant budgets' parts), and the metrics endpoint.

Every Kafka client (the Faust app's broker settings, the readers' consumers) comes from the runtime's
``KafkaClients``, so the ``kafka`` settings' security reaches all of them.

Faust's windowed tables, ``on_window_close``, wall-clock expiry: unused (docs/conventions.md#windows). Values are raw
bytes, decoded by ``streams.decoding`` (the contract codec's verdict) so decoding errors are ours to dead-letter. Only the memory store is
supported (state lives in memory and is rebuilt from the changelog at start).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
from dataclasses import dataclass, field
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from tokenpools.config import StreamsSettings
from tokenpools.errors import PermanentError
from tokenpools.runtime.clock import Clock, SystemClock
from tokenpools.runtime.deadletter import DeadLetters, Send
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.runtime.specs import Catalogue
from tokenpools.streams.admin import source_topics
from tokenpools.streams.budgets.ledger import LedgerParams
from tokenpools.streams.metrics import StreamMetrics, serve
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.processor import PoolProcessor, RawEvent, TickResult
from tokenpools.streams.event_time.progress import (
    MAX_REWINDS,
    CommittedOffsets,
    EndOffsets,
    Horizons,
    KafkaHorizons,
    Progress,
)
from tokenpools.streams.readers import BroadcastReader, apply_budget_part, apply_heartbeat, apply_limits, apply_spec
from tokenpools.streams.budgets.tenant_alerts import Parts
from tokenpools.streams.views import ProxyBook
from tokenpools.topics.declarations import Topics
from tokenpools.topics.limits import PageAssembler

log = logging.getLogger(__name__)


WORKER_HEADER = "tokenpools-worker"  # every record a worker sends names it (topics/README.md#which-worker-sent-it)
LAGGING_POLL_S = 0.01  # while a due window waits for its partition's records, the ticker looks this often
UNSENT_PRUNE = 256  # ``FaustStore``: sent changelog records remembered before the delivered ones are dropped
# ``AgentsOptions.fast_join``: Faust's group timings (seconds) for tests and benchmarks. The session timeout is the
# broker's least by default (group.min.session.timeout.ms): how long a SIGKILLed worker's partitions wait.
FAST_JOIN = {"broker_rebalance_timeout": 2.0, "broker_session_timeout": 6.0, "broker_heartbeat_interval": 0.5,
             "broker_commit_interval": 0.5}


@dataclass(frozen=True, slots=True)
class AgentsOptions:
    """One worker's knobs: its ``streams`` settings group (app id, store; their defaults live there, not here), the
    partition count the source topics have, and the flags of ``tokenpools agents`` and of tests."""

    streams: StreamsSettings
    partitions: int
    batch_max: int = 5000  # records per agent batch
    batch_within_s: float = 0.02  # longest wait to fill a batch (it delays a window's close while traffic flows)
    fast_join: bool = False  # short group timeouts: tests and benchmarks (a restarted worker joins in ~1 s)
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None  # None: no metrics endpoint; 0: a free port
    run_ticker: bool = True
    run_readers: bool = True
    spec_wait_s: float = 10.0  # the first tick waits this long at most for the specs topic to be read
    datadir: str | None = None  # Faust's data directory (the memory store keeps nothing there); default under /tmp
    worker_id: str | None = None  # the ``tokenpools-worker`` header of what this worker sends; default <hostname>-<pid>
    ledger: LedgerParams = field(default_factory=LedgerParams)  # the ``budgets`` settings (``ledger.params_from_settings``)


class FaustStore:
    """The StateStore over a Faust table with the memory store; the changelog partition is given explicitly.

    With standby replicas Faust applies the changelog of the partitions this worker only stands by for to the same
    memory store, so it holds pools another worker ticks. ``get`` and ``items`` see only the keys of the partitions
    ``actives()`` names (None: every partition; the memory store knows each key's partition, whoever wrote it):
    a pool is ticked, published and counted by the one worker its partition is assigned to, and a standby copy costs
    the timer nothing. ``actives()`` is asked again after ``refresh``, which a rebalance calls.

    ``written()`` waits until every changelog record put so far is on the broker: the agent waits for it before
    it takes its next batch, which is when Faust acks (so may commit) the batch's offsets. Faust's own flush before
    a commit does not cover them: ``send_changelog`` puts a record in Faust's producer buffer, and the buffer's
    flush returns after 0.1 s without progress or while the record in hand is still being given to the Kafka
    client, so a commit could pass a batch whose state never reached the changelog (docs/architecture.md)."""

    def __init__(self, table: Any, actives: Callable[[], set[int] | None] = lambda: None) -> None:
        self.table = table
        self._actives = actives
        self._active: set[int] | None = None
        self._stale = True
        self._unsent: list[Any] = []  # changelog records put, not yet known to be on the broker (their futures)

    def refresh(self) -> None:
        """The assignment changed (a rebalance): ask ``actives()`` again at the next read."""
        self._stale = True

    def _active_partitions(self) -> set[int] | None:
        if self._stale:
            self._active, self._stale = self._actives(), False
        return self._active

    def get(self, key: bytes) -> bytes | None:
        store = self.table.data
        active = self._active_partitions()
        if active is not None and store._key_partition.get(key) not in active:
            return None  # a standby copy (or nothing)
        return store.get(key)

    def put(self, key: bytes, value: bytes | None, partition: int) -> None:
        """Set ``key``, or with ``value`` None delete it: a tombstone goes to the changelog, which the memory store's
        restore (``apply_changelog_batch``) takes as a delete."""
        store = self.table.data
        if value is None:
            store.pop(key, None)
            store._key_partition.pop(key, None)
            self._sending(self.table.send_changelog(partition, key, None, value_serializer="raw"))
            return
        store[key] = value
        store._key_partition[key] = partition  # what the memory store drops on revocation
        self._sending(self.table.send_changelog(partition, key, value))

    def _sending(self, sent: Any) -> None:
        if len(self._unsent) >= UNSENT_PRUNE:  # the timer writes while no batch comes: keep the list short
            self._prune()
        self._unsent.append(sent)

    def _prune(self) -> None:
        """Forget the records the broker has acknowledged (a failed one is kept: ``written`` raises its error)."""
        self._unsent = [f for f in self._unsent if not f.done() or f.cancelled() or f.exception() is not None]

    async def written(self) -> None:
        """Return once every changelog record put so far is on the broker; raise what a failed send raised.

        The agent calls it before its next batch (a failure: the batch is not acked, its events are read again),
        and a revocation before the rebalance goes on, so whoever recovers a partition next, this worker
        included, reads all this worker wrote to it: a record arriving after a recovery would be missing from the
        recovered state and, in the changelog, follow the new owner's writes."""
        while self._unsent:
            await asyncio.gather(*list(self._unsent))
            self._prune()

    def items(self) -> list[tuple[bytes, bytes]]:
        store = self.table.data
        active = self._active_partitions()
        if active is None:
            return list(store.items())
        partition_of = store._key_partition
        return [(k, v) for k, v in store.items() if partition_of.get(k) in active]


@dataclass(slots=True)
class Agents:
    app: Any
    agent: Any
    table: Any
    processor: PoolProcessor
    catalogue: Catalogue
    proxies: ProxyBook
    metrics: StreamMetrics
    horizons: Horizons
    clock: Clock
    options: AgentsOptions
    params: StreamParams
    readers: list[BroadcastReader] = field(default_factory=list)
    tenant_parts: Parts = field(default_factory=Parts)  # the budgets topic's tenant-budget parts (every worker)
    metrics_port: int | None = None
    lagging: bool = False

    def ready(self) -> bool:
        """Not while a rebalance or table recovery is in progress (the table would be incomplete)."""
        app = self.app
        if getattr(app, "rebalancing", False):
            return False
        recovery = app.tables.recovery
        return recovery.completed.is_set() and not recovery.in_recovery

    async def tick(self, now_ms: int | None = None, check_ready: bool = True) -> TickResult | None:
        if check_ready and not self.ready():
            return None
        now = self.clock.wall_ms() if now_ms is None else now_ms
        active = self.horizons.active_partitions()
        partitions = sorted(active) if active is not None else list(range(self.options.partitions))
        horizons = await self.horizons.horizons(now, partitions)
        if check_ready and not self.ready():  # a rebalance began meanwhile: its partitions are not this tick's
            return None
        p = self.params
        due = (now - p.grace_ms) // p.width_ms  # windows the wall clock says are closable, through due - 1
        self.lagging = any(h is None or (h - p.grace_ms) // p.width_ms < due for h in horizons.values())
        return await self.processor.tick(now, horizons, active)


def build_agents(params: StreamParams, topics: Topics, catalogue: Catalogue, options: AgentsOptions,
                 kafka: KafkaClients, *, clock: Clock | None = None, horizons: Horizons | None = None,
                 send: Send | None = None) -> Agents:
    """``horizons`` and ``send`` default to the Kafka ones; component tests pass in-memory ones."""
    import faust

    app_id, store_url = options.streams.app_id, options.streams.store_url
    if store_url != "memory://":
        raise PermanentError(f"`streams.store_url` must be memory:// (state is restored from the changelog), "
                             f"got {store_url!r}")
    clock = clock or SystemClock()
    datadir = options.datadir or os.path.join(tempfile.gettempdir(), f"tokenpools-faust-{app_id}")
    session_s = options.streams.session_timeout_s  # a killed worker's pools wait this, plus a rebalance
    timing = FAST_JOIN if options.fast_join else {"broker_session_timeout": session_s,
                                                  "broker_heartbeat_interval": min(3.0, session_s / 5)}
    app = faust.App(
        app_id, **kafka.faust_broker("agents"), store=store_url, web_enabled=False, autodiscover=False,
        topic_partitions=options.partitions, processing_guarantee="at_least_once",
        consumer_auto_offset_reset="earliest", stream_buffer_maxsize=max(4096, options.batch_max * 2),
        producer_linger=0.005, table_standby_replicas=options.streams.standby_replicas, datadir=datadir, **timing)
    sources = source_topics(topics)
    channel = app.topic(*sources, key_serializer="raw", value_serializer="raw")
    outputs = {t.name: app.topic(t.name, key_serializer="raw", value_serializer="raw", partitions=t.partitions)
               for t in (topics.limits, topics.scale, topics.effective_limits, topics.dead_letters, topics.counts,
                         topics.usage_windows, topics.budgets, topics.usage, topics.budget_alerts)}

    worker_id = options.worker_id or f"{socket.gethostname()}-{os.getpid()}"
    headers = ((WORKER_HEADER, worker_id.encode()),)  # a tuple: Faust copies it into each record's own list

    async def send_to_kafka(topic: str, key: bytes, value: bytes | None) -> None:
        await outputs[topic].send(key=key, value=value, headers=headers, force=True)

    send = send or send_to_kafka

    metrics = StreamMetrics()
    table = app.Table("pool-state", partitions=options.partitions, key_type=bytes, value_type=bytes,
                      help="per-pool aggregate state S of the usage windows and signals")
    proxies = ProxyBook()
    dead_letters = DeadLetters(topics.dead_letters.name, app_id, clock, send=send, count=metrics.count_dead_letter)
    progress = Progress()
    end_offsets = EndOffsets(kafka.consumer_factory("agents-end-offsets", group_id=None, enable_auto_commit=False))
    committed_offsets = CommittedOffsets(lambda: kafka.admin("agents-committed"), app_id)
    horizons = horizons or KafkaHorizons(app, sources, progress, end_offsets, committed_offsets)
    store = FaustStore(table, horizons.active_partitions)
    processor = PoolProcessor(params, topics, catalogue, proxies, store, send, dead_letters, metrics, progress,
                              partition_of=_key_partitioner(options.partitions), ledger=options.ledger)

    async def pools(stream: Any) -> Any:
        async for events in stream.take_events(options.batch_max, options.batch_within_s):
            raws = [_raw(e.message) for e in events]
            unplaced = progress.unplaced(raws)
            if unplaced:  # newly assigned: their first records are held to the committed offsets
                try:
                    for (topic, partition), offset in (await horizons.committed(unplaced)).items():
                        progress.start(topic, partition, offset)
                except Exception:  # noqa: BLE001 - the broker away: taken as they come, as before a commit
                    log.warning("committed offsets of %s not known; their first records are taken as they come",
                                unplaced, exc_info=True)
            # no hole in a partition's offsets (``streams.progress``): after one, read again from it
            batch, rewind, accepted = progress.contiguous(raws)
            for (topic, partition), offset in accepted.items():
                log.warning("%s/%d: records from offset %d not found after %d re-reads; going on without them",
                            topic, partition, offset, MAX_REWINDS)
            result = await processor.process(batch)
            await store.written()  # before the next batch, when Faust acks this one's offsets (``FaustStore``)
            for (topic, partition), offset in rewind.items():
                await _read_again(app, topic, partition, offset)
            yield result

    agent = app.agent(channel, name="pools")(pools)

    async def on_revoked(sender: Any, revoked: Any, **_: Any) -> None:
        """Partitions moved away: what this process remembers of them is stale once they come back, and what it
        wrote to their changelog must be there before anyone recovers them (``FaustStore.written``)."""
        progress.forget((tp.topic, tp.partition) for tp in revoked)
        processor.forget()
        store.refresh()
        try:
            await store.written()
        except Exception:  # noqa: BLE001 - the producer's failure is Faust's to handle; this one is logged
            log.exception("changelog records not written before the rebalance")

    async def on_assigned(sender: Any, assigned: Any, **_: Any) -> None:
        """The new assignment: which of the table's keys are this worker's to tick (the others are standbys)."""
        store.refresh()

    async def on_shutdown(sender: Any, **_: Any) -> None:
        await end_offsets.close()  # (each started only if the Kafka horizons asked)
        await committed_offsets.close()

    app.on_partitions_revoked.connect(on_revoked)
    app.on_partitions_assigned.connect(on_assigned)
    app.on_before_shutdown.connect(on_shutdown)
    agents = Agents(app=app, agent=agent, table=table, processor=processor, catalogue=catalogue, proxies=proxies,
                    metrics=metrics, horizons=horizons, clock=clock, options=options, params=params)
    if options.run_readers:
        _add_readers(agents, topics, dead_letters, kafka)
    if options.run_ticker:
        app.task(_ticker(agents))
        app.task(_counter(agents))
        app.task(_ledger_publisher(agents, store))
    if options.metrics_port is not None:
        app.task(_metrics_server(agents))
    return agents


async def _read_again(app: Any, topic: str, partition: int, offset: int) -> None:
    """Have Faust's consumer read ``topic``/``partition`` again from ``offset`` (``streams.progress``)."""
    from faust.types import TP

    log.info("%s/%d: records skipped by the consumer; reading again from offset %d", topic, partition, offset)
    try:
        await app.consumer.seek(TP(topic, partition), offset)
    except Exception:  # noqa: BLE001 - no longer assigned (a rebalance): its next owner reads it
        log.warning("could not seek %s/%d to %d", topic, partition, offset, exc_info=True)


def _key_partitioner(partitions: int) -> Callable[[str], int]:
    """A key's partition on the pool-keyed topics: Kafka's default placement (murmur2), as the proxies place it."""
    from aiokafka.partitioner import DefaultPartitioner

    default, every = DefaultPartitioner(), list(range(partitions))
    return lambda key: default(key.encode(), every, every)  # type: ignore[no-any-return]


def _raw(message: Any) -> RawEvent:
    ts = message.timestamp
    return RawEvent(message.topic, message.partition, message.offset,
                    round(ts * 1000) if ts is not None and ts > 0 else None, message.key, message.value)


def _add_readers(agents: Agents, topics: Topics, dead_letters: DeadLetters, kafka: KafkaClients) -> None:
    factory = kafka.consumer_factory("agents-broadcast", group_id=None, enable_auto_commit=False)

    async def spec(raw: RawEvent) -> None:
        await apply_spec(agents.catalogue, dead_letters, raw)

    async def beat(raw: RawEvent) -> None:
        await apply_heartbeat(agents.proxies, dead_letters, raw)

    assembler = PageAssembler()

    async def limits(raw: RawEvent) -> None:
        await apply_limits(agents.processor, assembler, dead_letters, raw)

    async def part(raw: RawEvent) -> None:
        apply_budget_part(agents.tenant_parts, raw)

    handlers = {topics.specs.name: spec, topics.heartbeats.name: beat, topics.limits.name: limits,
                topics.budgets.name: part}
    for name in broadcast_topics(topics):
        reader = BroadcastReader(factory, name, handlers[name])
        agents.readers.append(reader)
        agents.app.task(_reader_task(reader))


def broadcast_topics(topics: Topics) -> tuple[str, ...]:
    """The topics every worker reads whole, without the group (``BroadcastReader``): the specs, the proxies'
    heartbeats, the limits it published (the shares granted, after a takeover) and the budgets (tenant parts)."""
    return topics.specs.name, topics.heartbeats.name, topics.limits.name, topics.budgets.name


def _reader_task(reader: BroadcastReader) -> Any:
    async def run() -> None:
        await reader.run()

    run.__name__ = f"read-{reader.topic}"
    return run


def next_deadline_ms(now_ms: int, width_ms: int, grace_ms: int) -> int:
    """The first window deadline (end + grace) after ``now_ms``."""
    return ((now_ms - grace_ms) // width_ms + 1) * width_ms + grace_ms


def _ticker(agents: Agents) -> Any:
    async def ticker() -> None:
        if agents.readers:
            try:
                await asyncio.wait_for(asyncio.gather(*(r.ready.wait() for r in agents.readers)),
                                       agents.options.spec_wait_s)
            except asyncio.TimeoutError:
                log.warning("specs/heartbeats not read within %.0f s; ticking with what is known",
                            agents.options.spec_wait_s)
        p = agents.params
        woken = agents.processor.woken
        while True:
            now = agents.clock.wall_ms()
            due_ms = min(next_deadline_ms(now, p.width_ms, p.grace_ms), next_deadline_ms(now, p.width_ms, 0))
            delay_s = (due_ms - now) / 1000 + 0.002
            if agents.lagging:  # a due window waits for its partition's records: look again soon, not next tick
                delay_s = min(delay_s, LAGGING_POLL_S)
            if not woken.is_set():
                try:  # a watermark passing a window end wakes the ticker early (it may close the window)
                    await asyncio.wait_for(woken.wait(), delay_s)
                except asyncio.TimeoutError:
                    pass
            woken.clear()
            try:
                await agents.tick()
            except Exception:  # noqa: BLE001 - a failed tick must not stop the next one; it is logged
                log.exception("tick failed")

    return ticker


async def _on_grid(agents: Agents, interval_ms: int,
                   steps: Sequence[tuple[str, Callable[[], Awaitable[object]]]]) -> None:
    """Forever, 1 ms past each step of the wall-clock grid of ``interval_ms``: each of ``steps`` (what, the call) in
    turn, as long as the agents are ready (a rebalance may begin between two); one that fails is logged as
    "<what> failed" and the rest, and the next round, go on."""
    while True:
        now = agents.clock.wall_ms()
        await asyncio.sleep((interval_ms - now % interval_ms) / 1000 + 0.001)
        for what, step in steps:
            if not agents.ready():
                break
            try:
                await step()
            except Exception:  # noqa: BLE001 - one failed step must not stop the next; it is logged
                log.exception("%s failed", what)


def _counter(agents: Agents) -> Any:
    """Every ``counts_interval_ms`` (on the wall-clock grid): the fleet's counts of every ticked pool to its proxies."""

    async def counter() -> None:
        await _on_grid(agents, agents.params.counts_interval_ms,
                       [("counts", lambda: agents.processor.publish_counts(agents.clock.wall_ms()))])

    return counter


def _ledger_publisher(agents: Agents, store: FaustStore) -> Any:
    """Every ``budgets.publish_interval_s`` (on the wall-clock grid): the ledgers' changed budget accounts, usage days
    and pending alerts (``PoolProcessor.publish_ledgers``), their versions on the changelog before they are sent;
    then the alerts of the tenant budgets this worker owns (``PoolProcessor.publish_tenant_alerts``: the parts just
    published reach the reader later, so a crossing alerts at the next tick at most)."""

    async def ledger_publisher() -> None:
        await _on_grid(agents, agents.options.ledger.publish_interval_ms, [
            ("ledger publication", lambda: agents.processor.publish_ledgers(store.written)),
            ("tenant budget alerts", lambda: agents.processor.publish_tenant_alerts(
                agents.tenant_parts, agents.horizons.active_partitions(), store.written)),
        ])

    return ledger_publisher


def _metrics_server(agents: Agents) -> Any:
    async def metrics_server() -> None:
        runner, agents.metrics_port = await serve(agents.metrics, agents.options.metrics_host,
                                                  agents.options.metrics_port or 0)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()  # type: ignore[attr-defined]

    return metrics_server
