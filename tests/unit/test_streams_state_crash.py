"""Exactness across crashes (streams.state): the table restored from any prefix of the agents' writes, the source
events read again and folded, and the timer's ticks run again, gives the state the uninterrupted run left.

A worker's changelog writes reach Kafka in order on the pool's partition, so a crash loses a suffix of them. The
run: random batches of the scripted events, in both fleet-enforcement modes, ticks at random horizons between
them (some ahead of the events read: later events of closed windows are late). Every prefix of its writes is
restored into a new processor, which reads every event again from the start (the consumer's committed offsets
may lag the state's anywhere behind), in batches split differently, with the same ticks after the same events. The
events carry no identity, or the one a proxy gives them with some re-sent (``core.resends``: the streams seen are
restored with the rest)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.config import load_config_text
from tokenpools.runtime.clock import FakeClock
from tokenpools.runtime.deadletter import DeadLetters
from tokenpools.runtime.specs import Catalogue
from tokenpools.streams.table import state
from tokenpools.streams.metrics import StreamMetrics
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.processor import DictStore, PoolProcessor, RawEvent
from tokenpools.streams.views import ProxyBook
from tokenpools.topics.codec import encode
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.records import BackendMetricsSample, RequestCompleted
from tokenpools_dev.streams import scripted

from resend_support import numbered, resent

BASE_MS = 1_700_000_000_000
TOPICS = topics_for("t.")
LOADED = load_config_text(scripted.CONFIG_YAML)
PHASES = [(2, [scripted.Load("copilot", 5, proxies=("proxy-1", "proxy-2", "proxy-3"))]),
          (2, [scripted.Load("copilot", 4, refuse_every=3, proxies=("proxy-2", "proxy-3")),
               scripted.Load("batch", 6, refuse_every=2, proxies=("proxy-1", "proxy-4"))]),
          (1, [scripted.Load("batch", 3, proxies=("proxy-4",))])]
EVENTS = scripted.scripted_events(BASE_MS, 1000, PHASES, seed=3)


def raw_events(events=EVENTS) -> list[RawEvent]:
    """Each record on its own topic (requests, completions, backend metrics: three sources), offsets per topic."""
    offsets: dict[str, int] = {}
    out = []
    for record, ts in events:
        topic = (TOPICS.backend_metrics if isinstance(record, BackendMetricsSample) else
                 TOPICS.completions if isinstance(record, RequestCompleted) else TOPICS.requests).name
        offset = offsets[topic] = offsets.get(topic, -1) + 1
        out.append(RawEvent(topic, 0, offset, ts, record.pool.encode(), encode(record)))
    return out


RAW = raw_events()
RESENT = raw_events(resent(numbered(EVENTS), [(i, i % 4, 300) for i in range(0, len(EVENTS), 5)])[0])


class RecordingStore(DictStore):
    """A DictStore that keeps the sequence of its writes, as the changelog would."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[bytes, bytes | None, int]] = []

    def put(self, key: bytes, value: bytes | None, partition: int) -> None:
        self.writes.append((key, value, partition))
        super().put(key, value, partition)


def processor(store: DictStore, shares: bool) -> PoolProcessor:
    params = StreamParams(width_ms=1000, grace_ms=300, max_updates_per_tick=1000, proxy_shares=shares)
    metrics = StreamMetrics()

    async def send(topic: str, key: bytes, value: bytes | None) -> None:
        return None

    dead = DeadLetters(TOPICS.dead_letters.name, "crash-test", FakeClock(BASE_MS), send=send)
    return PoolProcessor(params, TOPICS, Catalogue.from_loaded(LOADED), ProxyBook(), store, send, dead, metrics)


def run(proc: PoolProcessor, cuts: list[int], ticks: dict[int, int], raw: list[RawEvent] = RAW) -> None:
    """Every event, in batches ending at ``cuts``; after event k, the tick at horizon ``ticks[k]`` if any."""
    async def go() -> None:
        start = 0
        for end in sorted({*cuts, *ticks, len(raw)}):
            if end > start:
                await proc.process(raw[start:end])
                start = end
            if end in ticks:
                await proc.tick(ticks[end])

    asyncio.run(go())


def final(store: DictStore) -> dict:
    stored, why = state.read(scripted.POOL, store.items(), 1000)
    assert why == ""
    return state.to_dict(stored.state)


@settings(max_examples=12, deadline=None)
@given(shares=st.booleans(), first=st.lists(st.integers(1, len(RAW)), max_size=8),
       again=st.lists(st.integers(1, len(RAW)), max_size=8),
       ticks=st.dictionaries(st.integers(1, len(RAW)), st.integers(0, 2_500), max_size=5), identities=st.booleans())
def test_restoring_any_prefix_of_the_writes_and_folding_again_gives_the_uninterrupted_state(shares, first, again,
                                                                                            ticks, identities):
    raw = RESENT if identities else RAW
    horizons, at = {}, BASE_MS
    for k in sorted(ticks):  # monotone horizons, near the events read so far (sometimes ahead of them)
        at = max(at, raw[k - 1].timestamp_ms + ticks[k] - 1000)
        horizons[k] = at
    uninterrupted = RecordingStore()
    run(processor(uninterrupted, shares), first, horizons, raw)
    expected = final(uninterrupted)
    writes = uninterrupted.writes
    assert len(writes) > len(horizons)
    for cut in range(len(writes) + 1):
        restored = DictStore()
        for key, value, partition in writes[:cut]:
            restored.put(key, value, partition)
        run(processor(restored, shares), again, horizons, raw)
        assert final(restored) == expected, f"cut after write {cut} of {len(writes)}"
