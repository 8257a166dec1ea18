"""The Faust app of the agents in-process: ``agent.test_context()`` with the ``memory://`` store, no broker.

Records go in through the agent's test channel as raw bytes (the way they come off Kafka), are decoded and folded
into the ``pool-state`` table; the ticker is driven by hand with a fake clock; what the app would produce is
recorded by an in-memory ``Send``. The changelog messages the table emits are captured and replayed into a
second app, which then ticks exactly like the first: the recovery path without a broker.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from tokenpools.config import KafkaSettings, LoadedConfig, SpecsSource, StreamsSettings, load_config_text
from tokenpools.runtime.clock import FakeClock
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.runtime.specs import Catalogue
from tokenpools.streams.table import pool_state
from tokenpools.streams.table import state as table_state
from tokenpools.streams.app import Agents, AgentsOptions, build_agents
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.event_time.progress import WallClockHorizons
from tokenpools.streams.views import pool_view
from tokenpools.topics.codec import encode
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.records import DeadLetterReason, LimitUpdate
from tokenpools_dev import builders
from tokenpools_dev.streams import scripted

pytestmark = pytest.mark.component

BASE_MS = 1_700_000_000_000
PARAMS = StreamParams(width_ms=1000, grace_ms=300, max_updates_per_tick=1000, proxy_shares=True)  # the shares mode
TOPICS = topics_for("component.")
LOADED = load_config_text(scripted.CONFIG_YAML)
EVENTS = scripted.scripted_events(BASE_MS, 1000, scripted.two_class_phases(8))
END_MS = BASE_MS + 12_000
INTERNAL = "<internal>"  # the source topic the test channel gives every message


class Assigned(WallClockHorizons):
    """Every partition caught up; ``active`` the partitions assigned to this worker (the rest it stands by for)."""

    def __init__(self, active: set[int]) -> None:
        self.active = active

    def active_partitions(self) -> set[int] | None:
        return self.active


class Harness:
    def __init__(self, horizons: WallClockHorizons | None = None, loaded: LoadedConfig = LOADED) -> None:
        self.sent = scripted.Sent()
        self.clock = FakeClock(BASE_MS)
        options = AgentsOptions(StreamsSettings(app_id=f"agents-test-{uuid.uuid4().hex[:8]}"), partitions=4,
                                batch_within_s=0.005, run_ticker=False, run_readers=False)
        kafka = KafkaClients(KafkaSettings(bootstrap_servers="127.0.0.1:9"))
        self.agents: Agents = build_agents(PARAMS, TOPICS, Catalogue.from_loaded(loaded), options, kafka,
                                           clock=self.clock, horizons=horizons or WallClockHorizons(), send=self.sent)
        self.changelog: list[tuple[int, bytes, bytes]] = []
        self.holding = False  # True: the changelog records wait for ``acknowledge`` (a slow broker)
        self.unacknowledged: list = []
        table = self.agents.table
        original = table.send_changelog

        def capture(partition, key, value, *args, **kwargs):
            self.changelog.append((partition, key, value))
            sent = original(partition, key, value, *args, **kwargs)
            self.unacknowledged.append(sent)
            if not self.holding:
                self.acknowledge()
            return sent

        table.send_changelog = capture
        self.agents.app.finalize()
        self.agents.app.flow_control.resume()

    def acknowledge(self) -> None:
        """The broker's acknowledgement of the changelog records sent so far (no broker here: nothing sends them)."""
        for sent in self.unacknowledged:
            if not sent.done():
                sent.set_result(None)
        self.unacknowledged.clear()

    async def put_all(self, agent, events, partition=1):
        results = []
        for record, ts in events:
            self.clock.advance_to(ts)
            await agent.put(encode(record), key=record.pool.encode(), partition=partition, timestamp=ts / 1000)
            results.append(agent.results[agent.processed_offset - 1])
        return results

    def close(self) -> None:
        consumer = self.agents.app._consumer  # the stream creates it; its thread's loop never runs in tests
        if consumer is not None:
            consumer._thread.thread_loop.close()


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    h = Harness()
    try:
        yield h
    finally:
        h.close()


async def test_the_agent_folds_events_into_the_table_and_the_tick_publishes_the_core_prediction(harness):
    agents = harness.agents
    async with agents.agent.test_context() as agent:
        results = await harness.put_all(agent, EVENTS)
        assert sum(r.outcomes.get("applied", 0) for r in results) == len(EVENTS)
        stored, why = table_state.read(scripted.POOL, agents.table.data.items(), PARAMS.width_ms)
        assert why == "" and stored.partition == 1
        result = await agents.tick(END_MS, check_ready=False)
    expected = scripted.reference_updates(LOADED.pools[scripted.POOL], LOADED.entitlements_of(scripted.POOL), [r for r, _ in EVENTS],
                                   PARAMS, (END_MS - PARAMS.grace_ms) // PARAMS.width_ms - 1)
    assert result.updates == expected == harness.sent.of(TOPICS.limits.name)
    assert [c.version for c in harness.sent.of(TOPICS.scale.name)] == [expected[-1].version]
    effective = harness.sent.of(TOPICS.effective_limits.name)
    assert effective == result.effective and {(r.entitlement, r.version) for r in effective} == {
        (e.name, u.version) for u in expected for e in u.entitlements}
    assert set(harness.sent.compacted(TOPICS.effective_limits.name)) == {b"pool-a/copilot", b"pool-a/batch"}
    assert agents.metrics.events.labels("request_decided")._value.get() > 0


async def test_agents_from_settings_only_tick_no_pool_until_the_specs_topic_brings_one():
    """A settings-only config (issue 31): the agents start with no pools, tick an empty table without a crash, and
    once the specs topic's records bring the pool and its entitlements they fold and tick it as if it had been
    in the file from the start."""
    settings_only = load_config_text("apiVersion: tokenpools.io/v1alpha1\nkind: TokenPoolsSettings\n"
                                     "metadata: {name: s}\nspec: {}\n", "settings.yaml", SpecsSource.TOPIC)
    harness = Harness(loaded=settings_only)
    try:
        agents = harness.agents
        assert agents.catalogue.pools == ()
        async with agents.agent.test_context():
            empty = await agents.tick(BASE_MS, check_ready=False)
        assert empty.updates == [] and harness.sent.of(TOPICS.limits.name) == []
        for raw, doc in zip(LOADED.raw_documents, LOADED.documents, strict=True):
            if raw["kind"] != "TokenPoolsSettings":  # what the controller publishes: pools first, then entitlements
                record = builders.spec_record(raw["kind"], doc.metadata.name, raw["spec"], pool="")
                assert agents.catalogue.apply(record) is None
        assert agents.catalogue.pools == (scripted.POOL,)
        async with agents.agent.test_context() as agent:
            await harness.put_all(agent, EVENTS)
            result = await agents.tick(END_MS, check_ready=False)
    finally:
        harness.close()
    expected = scripted.reference_updates(LOADED.pools[scripted.POOL], LOADED.entitlements_of(scripted.POOL), [r for r, _ in EVENTS],
                                   PARAMS, (END_MS - PARAMS.grace_ms) // PARAMS.width_ms - 1)
    assert result.updates == expected == harness.sent.of(TOPICS.limits.name)


async def test_bad_records_are_dead_lettered_and_the_agent_keeps_running(harness):
    async with harness.agents.agent.test_context() as agent:
        await agent.put(b"\xff not json", key=b"pool-a", partition=0, timestamp=BASE_MS / 1000)
        await agent.put(b'{"schema_version": 2, "record_type": "request_decided"}', key=b"pool-a", partition=0)
        record = next(r for r, _ in EVENTS if r.record_type == "request_decided")
        await agent.put(encode(record), key=b"pool-a", partition=0, timestamp=(END_MS + 5_000) / 1000)  # late
        applied = await harness.put_all(agent, EVENTS[1:3], partition=0)
    assert [r.outcomes for r in applied] == [{"applied": 1}, {"applied": 1}]
    letters = harness.sent.of(TOPICS.dead_letters.name)
    assert [d.reason for d in letters] == [DeadLetterReason.MALFORMED, DeadLetterReason.UNKNOWN_VERSION,
                                           DeadLetterReason.LATE]
    assert [d.offset for d in letters] == [0, 1, 2] and letters[0].payload.endswith("not json")


async def test_a_second_app_restored_from_the_changelog_ticks_like_the_first(harness):
    """Recovery without a broker: replay the first app's changelog into a fresh app's table."""
    half = len(EVENTS) // 2
    async with harness.agents.agent.test_context() as agent:
        await harness.put_all(agent, EVENTS[:half])
        first = await harness.agents.tick(BASE_MS + 4_300, check_ready=False)
    assert harness.changelog, "the table wrote nothing to its changelog"
    restored = Harness()
    try:
        latest = {key: (partition, value) for partition, key, value in harness.changelog}  # what compaction keeps
        for key, (partition, value) in latest.items():
            if value is not None:  # (a tombstone is a delete)
                restored.agents.table.data[key] = value  # what Faust's recovery does with each changelog record
        async with restored.agents.agent.test_context() as agent:
            # at least once: the consumer resumes at the last committed offset, before the last applied one
            agent.sent_offset = half - 10
            outcomes = [r.outcomes for r in await restored.put_all(agent, EVENTS[half - 10:])]
            after_restart = await restored.agents.tick(END_MS, check_ready=False)
    finally:
        restored.close()
    assert outcomes[:10] == [{"duplicate": 1}] * 10 and outcomes[10:] == [{"applied": 1}] * (len(EVENTS) - half)
    uninterrupted = pool_state.tick(_fold(EVENTS), pool_view(Catalogue.from_loaded(LOADED), scripted.POOL), END_MS, PARAMS)
    assert first.updates + after_restart.updates == uninterrupted.updates
    assert all(isinstance(u, LimitUpdate) for u in after_restart.updates)


async def test_a_batch_is_acked_only_once_the_broker_holds_its_changelog_records(harness):
    """Faust acks a batch's events, so may commit their offsets, when the agent asks for its next batch. Were that
    before the batch's changelog records reached the broker, a worker killed in between would leave committed
    offsets past the state its successor restores, and the successor would never count those events (the takeover
    test saw a moved pool's limits differ from an uninterrupted run's for the windows after)."""
    harness.holding = True  # the broker has not acknowledged the changelog records yet
    first, second = EVENTS[0], EVENTS[1]
    async with harness.agents.agent.test_context() as agent:
        harness.clock.advance_to(first[1])
        event = await agent.put(encode(first[0]), key=first[0].pool.encode(), partition=1,
                                timestamp=first[1] / 1000, wait=False)
        for _ in range(50):  # the agent folds the batch and writes its changelog records
            await asyncio.sleep(0.01)
        assert harness.changelog, "the batch wrote nothing to the changelog"
        assert agent.processed_offset == 0 and not event.message.acked, "a batch done before its state was stored"
        harness.holding = False
        harness.acknowledge()
        applied = await harness.put_all(agent, [second])
        assert event.message.acked and agent.results[0].outcomes == applied[0].outcomes == {"applied": 1}


async def test_a_standby_copy_is_not_ticked_until_its_partition_is_assigned_then_it_takes_over(harness):
    """Standby replicas: Faust applies the changelog of a partition this worker only stands by for to the same
    memory store. The timer must not see those pools (one worker publishes per pool); once a rebalance assigns the
    partition, the worker ticks on from the copy exactly like the worker it replaces."""
    half = len(EVENTS) // 2
    async with harness.agents.agent.test_context() as agent:
        await harness.put_all(agent, EVENTS[:half])  # the active worker, partition 1
        first = await harness.agents.tick(BASE_MS + 4_300, check_ready=False)
    assert first.updates
    standby = Harness(Assigned({0}))
    try:
        agents = standby.agents
        for partition, key, value in harness.changelog:  # what Faust's standby reader does with each record
            if value is None:  # a tombstone: a delete, as the memory store's restore takes it
                agents.table.data.pop(key, None)
                agents.table.data._key_partition.pop(key, None)
            else:
                agents.table.data[key] = value
                agents.table.data._key_partition[key] = partition
        store = agents.processor.store
        keys = sorted(agents.table.data)  # the pool's snapshot and journal, as the standby copy holds them
        assert keys and store.items() == [] and all(store.get(k) is None for k in keys)
        idle = await agents.tick(END_MS, check_ready=False)
        assert idle.updates == [] and standby.sent.records == []
        assert agents.metrics.table_pools._value.get() == 0  # the gauge counts only the pools this worker ticks
        await agents.app.on_partitions_revoked.send(set())  # the rebalance that hands partition 1 over
        agents.horizons.active = {0, 1}
        await agents.app.on_partitions_assigned.send(set())
        assert sorted(k for k, _ in store.items()) == keys and all(store.get(k) == agents.table.data[k] for k in keys)
        async with agents.agent.test_context() as agent:
            agent.sent_offset = half - 10  # at least once: from the last committed offset
            outcomes = [r.outcomes for r in await standby.put_all(agent, EVENTS[half - 10:])]
            took_over = await agents.tick(END_MS, check_ready=False)
    finally:
        standby.close()
    assert outcomes[:10] == [{"duplicate": 1}] * 10
    uninterrupted = pool_state.tick(_fold(EVENTS), pool_view(Catalogue.from_loaded(LOADED), scripted.POOL), END_MS, PARAMS)
    assert first.updates + took_over.updates == uninterrupted.updates
    assert agents.metrics.table_pools._value.get() == 1


def _fold(events):
    state = pool_state.new(scripted.POOL, PARAMS.width_ms)
    for record, ts in events:
        state, outcome = pool_state.apply_event(state, record, PARAMS)
        assert outcome is pool_state.Outcome.APPLIED
        state = pool_state.track_in_flight(state, [(record, None)], [outcome])  # what the agent does after each fold
    return state


async def test_batched_records_fold_a_whole_batch_per_message_like_plain_ones(harness):
    """The proxy's packed records: one Faust message per batch, the same table and ticks as plain records; a bad
    or late element is dead-lettered alone (with its index), a re-delivered batch is a duplicate element by element."""
    from tokenpools.topics.batches import batch_value

    batches = scripted.batched(EVENTS, max_events=8, span_ms=100)
    assert len(batches) < len(EVENTS) / 2 and max(len(b) for b, _ in batches) == 8
    agents = harness.agents
    async with agents.agent.test_context() as agent:
        results = []
        for records, ts in batches:
            harness.clock.advance_to(ts)
            await agent.put(batch_value([encode(r) for r in records]), key=scripted.POOL.encode(), partition=1,
                            timestamp=ts / 1000)
            results.append(agent.results[agent.processed_offset - 1])
        assert [r.events for r in results] == [len(b) for b, _ in batches]
        assert sum(r.outcomes.get("applied", 0) for r in results) == len(EVENTS)
        top = agent.sent_offset
        agent.sent_offset = 2  # re-delivered from offset 3 on after a crash (at least once)
        again = []
        for records, ts in batches[3:5]:
            await agent.put(batch_value([encode(r) for r in records]), key=scripted.POOL.encode(), partition=1,
                            timestamp=ts / 1000)
            again.append(agent.results[agent.processed_offset - 1].outcomes)
        assert again == [{"duplicate": len(b)} for b, _ in batches[3:5]]
        result = await agents.tick(END_MS, check_ready=False)
        decided = [r for r, _ in EVENTS if r.record_type == "request_decided"]
        late = decided[0].model_copy(update={"request_id": "late"})  # its window was ticked
        fresh = decided[1].model_copy(update={"request_id": "fresh", "t_ms": END_MS + 10})
        mixed = [encode(late), b'{"record_type": "request_decided"}', encode(fresh)]
        harness.clock.advance_to(END_MS + 20)
        agent.sent_offset = top  # caught up: the next record is a new one
        await agent.put(batch_value(mixed), key=scripted.POOL.encode(), partition=1, timestamp=(END_MS + 20) / 1000)
        assert agent.results[agent.processed_offset - 1].outcomes == {"late": 1, "applied": 1}
    expected = scripted.reference_updates(LOADED.pools[scripted.POOL], LOADED.entitlements_of(scripted.POOL), [r for r, _ in EVENTS],
                                   PARAMS, (END_MS - PARAMS.grace_ms) // PARAMS.width_ms - 1)
    assert result.updates == expected
    letters = harness.sent.of(TOPICS.dead_letters.name)
    assert [(d.element, d.reason) for d in letters] == [(1, DeadLetterReason.UNKNOWN_VERSION),
                                                        (0, DeadLetterReason.LATE)]
    assert len({d.offset for d in letters}) == 1 and letters[0].offset >= top - 1  # the one record they came in
    assert '"request_id":"late"' in letters[1].payload and letters[0].payload == '{"record_type":"request_decided"}'


async def test_watermarks_close_a_window_before_its_grace_and_a_restored_app_falls_back_to_the_grace(harness):
    """Packed records with the proxies' watermarks: once both proxies' watermarks have passed a window's end, the
    next tick closes it (before end + grace) with the update the core predicts; a second app restored from the
    changelog knows no watermarks and closes the next window at end + grace only. (The test channel stamps every
    message with one topic name, so here the event topics are that one; the unit tests cover several.)"""
    from tokenpools.topics.batches import Watermark, batch_value

    agents = harness.agents
    agents.processor.watermarks.topics = (INTERNAL,)
    width = PARAMS.width_ms
    cut = BASE_MS + 4 * width  # the events of the first four windows
    events = [(r, ts) for r, ts in EVENTS if r.t_ms < cut and r.record_type != "backend_metrics"]
    proxies = sorted({r.proxy_id for r, _ in events})
    assert proxies == ["proxy-1", "proxy-2"]
    ticks = []
    async with agents.agent.test_context() as agent:
        await harness.put_all(agent, events)  # plain records, no watermark: both proxies are seen, hence live
        end = cut  # window 3 ends here; its grace would end at cut + 300
        harness.clock.advance_to(end + 20)
        ticks.append(await agents.tick(check_ready=False))  # no watermarks yet: windows 0-2 (grace passed) only
        for proxy in proxies:
            await agent.put(batch_value([], Watermark(proxy, end + 5)), key=scripted.POOL.encode(), partition=1,
                            timestamp=(end + 10) / 1000)
            ticks.append(await agents.tick(check_ready=False))  # after proxy-1's: proxy-2 still holds it back
        assert agents.processor.woken.is_set()
        ticks.append(await agents.tick(check_ready=False))
    closed = [[u.version for u in t.updates] for t in ticks]
    assert closed == [[BASE_MS + width * i for i in (1, 2, 3)], [], [end], []]  # 280 ms before end + grace
    expected = scripted.reference_updates(LOADED.pools[scripted.POOL], LOADED.entitlements_of(scripted.POOL), [r for r, _ in events],
                                   PARAMS, end // width - 1)
    assert [u for t in ticks for u in t.updates] == expected
    assert agents.metrics.windows_closed_early.labels(scripted.POOL)._value.get() == 1

    second = Harness()
    try:
        for partition, key, value in harness.changelog:
            if value is None:  # a tombstone: a delete, as the memory store's restore takes it
                second.agents.table.data.pop(key, None)
                second.agents.table.data._key_partition.pop(key, None)
                continue
            second.agents.table.data[key] = value
            second.agents.table.data._key_partition[key] = partition
        nxt = end + width
        second.clock.advance_to(nxt + 20)
        assert (await second.agents.tick(check_ready=False)).updates == []  # no watermarks known: wait the grace
        second.clock.advance_to(nxt + PARAMS.grace_ms)
        assert [u.version for u in (await second.agents.tick(check_ready=False)).updates] == [nxt]
    finally:
        second.close()


def test_the_group_timings_come_from_the_streams_settings():
    """Outside tests, a killed worker's partitions move after ``streams.session_timeout_s`` (plus a rebalance)."""
    kafka = KafkaClients(KafkaSettings(bootstrap_servers="127.0.0.1:9"))
    settings = StreamsSettings(app_id=f"agents-test-{uuid.uuid4().hex[:8]}", session_timeout_s=7.0,
                               standby_replicas=2)
    agents = build_agents(PARAMS, TOPICS, Catalogue.from_loaded(LOADED),
                          AgentsOptions(settings, partitions=4, run_ticker=False, run_readers=False), kafka)
    conf = agents.app.conf
    assert (conf.broker_session_timeout, conf.broker_heartbeat_interval, conf.table_standby_replicas) == (7.0, 1.4, 2)
