"""Per-proxy watermarks on the agents' side (streams.watermarks): the pure close rule, the book, and the processor
closing a window before end + grace once every live proxy's watermark has passed its end."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.config import load_config_text
from tokenpools.runtime.clock import FakeClock
from tokenpools.runtime.deadletter import DeadLetters
from tokenpools.runtime.specs import Catalogue
from tokenpools.streams.metrics import StreamMetrics
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.processor import DictStore, PoolProcessor, RawEvent
from tokenpools.streams.views import ProxyBook
from tokenpools.streams.event_time.watermarks import WatermarkBook, close_horizon, live_proxies
from tokenpools.topics.batches import Watermark, batch_value
from tokenpools.topics.codec import encode
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.records import ProxyHeartbeat
from tokenpools_dev.streams import scripted

W, G = 1000, 2000
TOPICS = ("t.requests", "t.completions")
BASE_MS = 1_700_000_000_000


def closes(horizon: int, effective: int, end: int) -> bool:
    """Whether the window ending at ``end`` closes with this close horizon (``pool_state.tick``'s rule)."""
    return end + G <= effective


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 50_000), st.sets(st.sampled_from(["a", "b", "c"])),
       st.dictionaries(st.tuples(st.sampled_from(TOPICS + ("t.other",)), st.sampled_from(["a", "b", "c", "d"])),
                       st.integers(0, 60_000)))
def test_early_close_never_happens_while_a_live_proxy_is_behind(horizon: int, live: set[str],
                                                                 marks: dict[tuple[str, str], int]) -> None:
    effective = close_horizon(horizon, W, G, live, marks, TOPICS)
    assert effective >= horizon  # never later than without watermarks
    for end in range(W, 70_000, W):
        if closes(horizon, effective, end) and not closes(horizon, horizon, end):  # an early close
            assert live and end <= horizon
            assert all(marks.get((t, p), -1) >= end for p in live for t in TOPICS)
    if live and all((t, p) in marks for p in live for t in TOPICS):  # the rule is also as early as allowed
        low = min([horizon] + [marks[(t, p)] for p in live for t in TOPICS])
        assert closes(horizon, effective, low // W * W) or low < W


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 50_000), st.sets(st.sampled_from(["a", "b"])))
def test_with_no_watermarks_the_horizon_is_the_old_one(horizon: int, live: set[str]) -> None:
    assert close_horizon(horizon, W, G, live, {}, TOPICS) == horizon
    assert close_horizon(horizon, W, G, set(), {("t.requests", "a"): 10**9}, TOPICS) == horizon


def test_the_close_rule_by_example() -> None:
    marks = {(t, p): m for p, m in (("a", 5_400), ("b", 7_100)) for t in TOPICS}
    assert close_horizon(6_000, W, G, {"a", "b"}, marks, TOPICS) == 5_000 + G  # the slower proxy decides
    assert close_horizon(4_200, W, G, {"a", "b"}, marks, TOPICS) == 4_000 + G  # not past the horizon
    assert close_horizon(9_000, W, G, {"a", "b"}, marks, TOPICS) == 9_000  # the grace has passed anyway
    assert close_horizon(6_000, W, G, {"a", "b", "c"}, marks, TOPICS) == 6_000  # c is live, no watermark
    del marks[("t.completions", "b")]
    assert close_horizon(6_000, W, G, {"a", "b"}, marks, TOPICS) == 6_000  # b declared one topic only
    beat = ProxyHeartbeat(proxy_id="c", t_ms=1_000, pools=("pool-a",), started_ms=0)
    assert live_proxies("pool-a", 20_000, 30_000, {"c": beat}, {"a": 15_000}) == {"a", "c"}
    assert live_proxies("pool-a", 40_000, 30_000, {"c": beat}, {"a": 5_000}) == set()  # both beyond the TTL
    assert live_proxies("pool-b", 20_000, 30_000, {"c": beat}, {}) == set()  # c serves another pool


def test_the_book_keeps_the_newest_watermark_and_forgets_silent_proxies() -> None:
    book = WatermarkBook(TOPICS, W)
    assert book.note("pool-a", 0, "t.requests", "a", 4_500, 4_500)  # the first one passes a window end
    assert not book.note("pool-a", 0, "t.requests", "a", 4_900, 4_900)  # same window
    assert not book.note("pool-a", 0, "t.requests", "a", 3_000, 5_000)  # older: max-merged
    assert book.note("pool-a", 0, "t.requests", "a", 5_001, 5_001)
    assert not book.note("pool-a", 0, "t.other", "a", 9_000, 9_000)  # not an event topic: seen only
    book.note("pool-a", 0, "t.completions", "a", 5_300, 5_300)
    assert book.marks("pool-a") == {("t.requests", "a"): 5_001, ("t.completions", "a"): 5_300}
    assert book.horizon("pool-a", 6_000, G, 30_000, {}) == 5_000 + G
    book.saw("pool-a", 0, "b", 5_500)  # events of b, no watermark: b holds the window back
    assert book.horizon("pool-a", 6_000, G, 30_000, {}) == 6_000
    assert book.horizon("pool-a", 39_000, G, 30_000, {}) == 39_000  # a still counts (seen at 9_000)
    assert book.horizon("pool-a", 40_000, G, 30_000, {}) == 40_000 and book.marks("pool-a") == {}  # forgotten
    book.note("pool-b", 3, "t.requests", "a", 1, 1)
    book.forget([3])
    assert book.marks("pool-b") == {} and book.horizon("pool-b", 10_000, G, 30_000, {}) == 10_000


# ---- the processor -----------------------------------------------------------------------------------------------
PARAMS = StreamParams(width_ms=1000, grace_ms=2000, max_updates_per_tick=1000)
KTOPICS = topics_for("t.")


def processor() -> tuple[PoolProcessor, scripted.Sent, StreamMetrics, ProxyBook]:
    sent, metrics, book = scripted.Sent(), StreamMetrics(), ProxyBook()
    dead = DeadLetters(KTOPICS.dead_letters.name, "agents-test", FakeClock(BASE_MS), send=sent,
                       count=metrics.count_dead_letter)
    catalogue = Catalogue.from_loaded(load_config_text(scripted.CONFIG_YAML))
    return PoolProcessor(PARAMS, KTOPICS, catalogue, book, DictStore(), sent, dead, metrics), sent, metrics, book


def envelope(offset: int, topic: str, records: list, mark: int | None, ts: int, proxy: str = "proxy-1") -> RawEvent:
    value = batch_value([encode(r) for r in records], Watermark(proxy, mark) if mark is not None else None)
    return RawEvent(topic, 2, offset, ts, scripted.POOL.encode(), value)


async def test_a_window_closes_once_every_live_proxy_has_passed_its_end() -> None:
    events = [r for r, _ in scripted.scripted_events(BASE_MS, 1000, scripted.two_class_phases(3))]
    first = [r.model_copy(update={"proxy_id": "proxy-1"}) for r in events
             if r.t_ms < BASE_MS + 1000 and r.record_type in ("request_decided", "request_completed")]
    requests = [r for r in first if r.record_type == "request_decided"]
    completions = [r for r in first if r.record_type == "request_completed"]
    proc, sent, metrics, book = processor()
    end = BASE_MS + 1000
    await proc.process([envelope(0, KTOPICS.requests.name, requests, end - 500, end - 500),
                        envelope(0, KTOPICS.completions.name, completions, end - 500, end - 500)])
    assert (await proc.tick(end + 100)).windows == 0  # watermarks below the end: wait
    await proc.process([envelope(1, KTOPICS.requests.name, [], end + 5, end + 5)])
    assert (await proc.tick(end + 100)).windows == 0  # completions not yet past the end
    proc.woken.clear()
    await proc.process([envelope(1, KTOPICS.completions.name, [], end + 7, end + 7)])
    assert proc.woken.is_set()  # the timer is told
    book.apply(ProxyHeartbeat(proxy_id="proxy-2", t_ms=end, pools=(scripted.POOL,), started_ms=0))
    assert (await proc.tick(end + 100)).windows == 0  # proxy-2 is live and declared nothing
    book.forget("proxy-2")
    result = await proc.tick(end + 100)
    assert result.windows == 1 and [u.version for u in result.updates] == [end]  # 1.9 s before end + grace
    assert metrics.windows_closed_early.labels(scripted.POOL)._value.get() == 1
    assert metrics.watermarks._value.get() == 4
    late = requests[0].model_copy(update={"request_id": "late-one"})
    out = await proc.process([RawEvent(KTOPICS.requests.name, 2, 2, end + 150, scripted.POOL.encode(), encode(late))])
    assert out.outcomes == {"late": 1} and out.dead_letters == 1  # closed early: late as any late event


async def test_without_watermarks_the_processor_ticks_as_before() -> None:
    events = scripted.scripted_events(BASE_MS, 1000, scripted.two_class_phases(4))
    results = []
    for marked in (False, True):
        proc, sent, _, _ = processor()
        raws = [RawEvent(KTOPICS.requests.name if r.record_type == "request_decided" else KTOPICS.completions.name,
                         2, i, ts, scripted.POOL.encode(), encode(r)) for i, (r, ts) in enumerate(events)]
        if marked:  # a watermark from a proxy of an *old* time: no window may close earlier than before
            raws.append(envelope(len(raws), KTOPICS.requests.name, [], BASE_MS, events[-1][1]))
        ticks = [await proc.tick(BASE_MS + t) for t in range(0, 9_000, 250)]
        results.append([(t.windows, [u.version for u in t.updates]) for t in ticks])
        await proc.process(raws)
        results[-1] += [(t.windows, [u.version for u in t.updates])
                        for t in [await proc.tick(BASE_MS + t) for t in range(0, 9_000, 250)]]
    assert results[0] == results[1]
