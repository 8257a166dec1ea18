"""The event pipeline's watermarks: every record carries an honest one (no event of its proxy for that topic and
pool before it is still queued, in flight or spooled), idle keys send watermark-only records, and spooled events
of a previous run hold the watermark until they are drained."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from event_support import balanced, ids, record, until

from tokenpools.proxy.outbox.events import EventPipeline
from tokenpools.proxy.outbox.spool import Spool
from tokenpools.topics.batches import decode_events
from tokenpools.topics.records import RequestDecided
from tokenpools_dev.proxy.doubles import ProducerHub

pytestmark = pytest.mark.component


class StepClock:
    """A wall clock that moves only when told (event times and watermarks in one time base)."""

    def __init__(self, wall_ms: int = 1_700_000_000_000) -> None:
        self.wall = wall_ms

    def now_s(self) -> float:
        return asyncio.get_running_loop().time()

    def wall_ms(self) -> int:
        return self.wall


def marked(hub: ProducerHub, clock: StepClock, path: Path, **kwargs: object) -> EventPipeline:
    from tokenpools.proxy.outbox.watermarks import WatermarkOptions

    options = WatermarkOptions("proxy-1", ("t.requests", "t.completions"), ("pool-a", "pool-b"), interval_s=0.04)
    return EventPipeline(hub.factory, Spool(path / "p.spool"), queue_size=10_000, batch_size=kwargs.pop("batch_size", 50),  # type: ignore[arg-type]
                         retry_backoff_s=0.05, flush_interval_s=0.02, watermarks=options, clock=clock, **kwargs)  # type: ignore[arg-type]


def stamped(i: int, clock: StepClock, pool: str = "pool-a") -> RequestDecided:
    return record(i).model_copy(update={"pool": pool, "t_ms": clock.wall_ms(), "proxy_id": "proxy-1"})


def assert_honest(hub: ProducerHub) -> list[tuple[str, str, int, int]]:
    """Every watermark W on the log: no event of its (topic, key) with t_ms < W comes after it. Returns the
    watermarks as (topic, key, W, events in the record)."""
    log = [(topic, (key or b"").decode(), decode_events(value)) for topic, key, value in hub.records]
    marks = []
    for at, (topic, key, decoded) in enumerate(log):
        assert decoded.bad == []
        if decoded.watermark is None:
            continue
        assert decoded.watermark.proxy_id == "proxy-1"
        w = decoded.watermark.watermark_ms
        later = [r.t_ms for t, k, d in log[at + 1:] if (t, k) == (topic, key) for _, r in d.records]
        assert all(t >= w for t in later), (topic, key, w, min(later))
        marks.append((topic, key, w, len(decoded.records)))
    return marks


async def test_every_record_carries_an_honest_watermark_and_idle_keys_send_watermark_only_records(
        tmp_path: Path) -> None:
    hub, clock = ProducerHub(), StepClock()
    p = marked(hub, clock, tmp_path)
    await p.start()
    for i in range(60):
        p.emit("t.requests", "pool-a", stamped(i, clock))
        clock.wall += 7
        if i % 10 == 0:
            await asyncio.sleep(0.01)
    await until(lambda: p.counts.sent == 60)
    end = clock.wall
    clock.wall += 1000  # idle from here: the watermarks follow the clock once everything is acknowledged
    await until(lambda: {(t, k) for t, k, w, n in assert_honest(hub) if n == 0 and w == end + 1000}
                == {(t, k) for t in ("t.requests", "t.completions") for k in ("pool-a", "pool-b")})
    marks = assert_honest(hub)
    assert all(n > 0 or w <= clock.wall for _, _, w, n in marks)
    data = [w for t, k, w, n in marks if n > 0]
    assert data and all(w <= end for w in data)  # a record of events never claims beyond the clock
    assert ids(hub) == [f"r{i}" for i in range(60)]  # the envelope's events, in order, once
    assert p.watermark_records > 0 and p.watermark_violations == 0 and balanced(p)
    for _, key, value in hub.records:  # every record on a watermarked topic is an envelope, even a lone event
        assert decode_events(value).watermark is not None
    await p.stop()


async def test_watermarks_stay_below_events_in_flight_or_spooled_until_they_are_delivered(tmp_path: Path) -> None:
    from aiokafka.errors import KafkaConnectionError

    hub, clock = ProducerHub(down=True), StepClock()
    p = marked(hub, clock, tmp_path, batch_size=10)
    await p.start()
    first_t = clock.wall
    for i in range(20):
        p.emit("t.requests", "pool-a", stamped(i, clock))
        clock.wall += 5
        await asyncio.sleep(0)
    await until(lambda: p.in_flight == 20)
    clock.wall += 10_000
    await asyncio.sleep(0.1)  # idle-watermark time passes while the deliveries are parked
    parked = [(t, k, decode_events(v)) for _, t, records in hub.parked for k, v in records]
    held = [d.watermark.watermark_ms for t, k, d in parked if not d.records and (t, k) == ("t.requests", b"pool-a")]
    idle = [d.watermark.watermark_ms for t, k, d in parked if (t, k) == ("t.completions", b"pool-a")]
    assert held and max(held) <= first_t  # the oldest parked event holds its key's watermark
    assert idle and max(idle) == clock.wall  # a key with nothing outstanding follows the clock
    first, hub.parked = hub.parked[0], hub.parked[1:]
    first[0].set_exception(KafkaConnectionError())  # one batch fails: its events go to the spool, behind the rest
    await until(lambda: p.counts.spooled > 0)
    hub.set_up()
    await until(lambda: p.counts.sent + p.counts.drained == 20)
    clock.wall += 1000
    await until(lambda: any(w == clock.wall and t == "t.requests" and k == "pool-a"
                            for t, k, w, _ in assert_honest(hub)))
    assert sorted(ids(hub)) == sorted(f"r{i}" for i in range(20)) and len(ids(hub)) == 20
    assert p.counts.drained > 0 and balanced(p) and p.watermark_violations == 0
    await p.stop()


async def test_spooled_events_of_a_previous_run_hold_the_watermark_until_drained(tmp_path: Path) -> None:
    clock = StepClock()
    hub = ProducerHub(refuse_start=True)
    p = marked(hub, clock, tmp_path)
    await p.start()
    times = []
    for i in range(5):
        times.append(clock.wall)
        p.emit("t.requests", "pool-b", stamped(i, clock, "pool-b"))
        clock.wall += 3
    await p.stop()  # nothing delivered: all spooled
    assert not hub.records
    clock.wall += 60_000
    hub = ProducerHub()
    p = marked(hub, clock, tmp_path, pack_events=2)  # the drain sends them in three records
    await p.start()
    await until(lambda: p.counts.drained == 5)
    drained = [(w, n) for t, k, w, n in assert_honest(hub) if (t, k) == ("t.requests", "pool-b") and n]
    # each held at the oldest event not in it and not yet acknowledged (the runs are separate deliveries)
    assert [n for _, n in drained] == [2, 2, 1] and drained[0][0] == times[2]
    assert all(w <= times[4] for w, _ in drained[:2])
    await until(lambda: any(k == "pool-b" and w == clock.wall and n == 0 for t, k, w, n in assert_honest(hub)))
    await p.stop()


def test_the_outstanding_set_and_the_watermark_options() -> None:
    from collections import Counter

    from tokenpools.proxy.outbox.watermarks import Outstanding, WatermarkOptions

    out = Outstanding()
    for t in (5, 3, 3, 9):
        out.add(t)
    assert out.low() == 3 and out.low(Counter({3: 2})) == 5 and out.low(Counter({3: 2, 5: 1})) == 9
    assert out.low() == 3  # leaving out does not remove
    out.remove(3)
    assert out.low() == 3
    out.remove(3)
    assert out.low() == 5 and out.size == 2
    with pytest.raises(KeyError):
        out.remove(3)
    for bad in (dict(proxy_id=""), dict(topics=()), dict(interval_s=0)):
        with pytest.raises(ValueError):
            WatermarkOptions(**{"proxy_id": "p", "topics": ("t",), **bad})  # type: ignore[arg-type]


def test_an_idle_key_is_due_its_watermark_record_interval_s_after_its_last_watermark() -> None:
    from tokenpools.proxy.outbox.watermarks import WatermarkOptions, WatermarkTracker

    tracker = WatermarkTracker(WatermarkOptions("p", ("t",), ("a", "b"), interval_s=0.125))
    assert tracker.due(4.0) == ([("t", "a"), ("t", "b")], 0.125)  # never stated: both due at once
    tracker.stated("t", "a", 4.0)
    tracker.stated("t", "b", 4.0625)
    assert tracker.due(4.125) == ([("t", "a")], 0.0625)  # b falls due 62.5 ms later
    tracker.stated("t", "a", 4.125)
    assert tracker.due(4.1865) == ([], 0.005)  # b is due in 1 ms: never sooner than 5 ms
