"""The recorder's idle exit and its assignment log line, without a broker: a fake consumer hands it what a
proxy sends while idle (watermarks, batches of no events) and a fake clock moves on each poll.

Invariant: only a record (or a value that does not decode) resets the idle clock, so ``--idle-exit-s`` ends a
recording on a live stack whose proxies keep sending watermarks."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import NamedTuple

import pytest

from tokenpools.config import KafkaSettings
from tokenpools.replay.recorder import Recorder, RecorderConfig, partitions_summary
from tokenpools.runtime.clock import FakeClock
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.topics import encode
from tokenpools.topics.batches import Watermark, batch_value
from tokenpools_dev import builders

POLL_S = 1.0


class TP(NamedTuple):
    topic: str
    partition: int


class Message(NamedTuple):
    offset: int
    value: bytes


def _decided(offset: int) -> bytes:
    return encode(builders.decided(f"r{offset}", 1_772_150_400_000 + offset, pool="p", proxy_id="x",
                                   prompt_tokens_est=1, max_tokens=1, cost_tokens=2, kv_bytes=2))


def _watermark(offset: int) -> bytes:
    return batch_value([], Watermark("proxy-0", 1_772_150_400_000 + offset))


class FakeConsumer:
    """Each getmany returns the next poll's messages (then nothing) and moves the clock by one poll."""

    def __init__(self, polls: list[list[bytes]], clock: FakeClock) -> None:
        self.polls, self.clock, self.offset, self.calls = list(polls), clock, 0, 0

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def commit(self, offsets: dict[object, int]) -> None: ...

    def subscribe(self, topics: list[str], listener: object) -> None: ...

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TP, list[Message]]:
        self.calls += 1
        if self.calls > 1000:
            raise AssertionError("the recorder never went idle")
        self.clock.advance(POLL_S)
        values = self.polls.pop(0) if self.polls else []
        messages = [Message(self.offset + i, v) for i, v in enumerate(values)]
        self.offset += len(messages)
        return {TP("t.requests", 0): messages} if messages else {}


class FakeRecorder(Recorder):
    def __init__(self, out: Path, polls: list[list[bytes]], idle_exit_s: float) -> None:
        clock = FakeClock()
        super().__init__(KafkaClients(KafkaSettings(topic_prefix="t.")),
                         RecorderConfig(out_dir=out, topics=("requests",), idle_exit_s=idle_exit_s), clock=clock)
        self.fake = FakeConsumer(polls, clock)

    def _consumer(self) -> FakeConsumer:  # type: ignore[override]
        return self.fake


def test_watermarks_alone_do_not_keep_the_recorder_from_its_idle_exit(tmp_path: Path) -> None:
    polls = [[_decided(0)], [_decided(1)]] + [[_watermark(i)] for i in range(50)]  # a proxy idle for ever after
    rec = FakeRecorder(tmp_path, polls, idle_exit_s=5)
    stats = asyncio.run(rec.run())
    assert stats.records == 2
    assert rec.fake.calls == 2 + 5  # two polls with records, then five of watermarks only: 5 s idle


def test_records_keep_resetting_the_idle_clock(tmp_path: Path) -> None:
    polls = [[_decided(i)] if i % 4 == 0 else [_watermark(i)] for i in range(20)]  # a record every 4 s
    rec = FakeRecorder(tmp_path, polls, idle_exit_s=5)
    stats = asyncio.run(rec.run())
    assert stats.records == 5  # offsets 0, 4, 8, 12, 16: never 5 s apart
    assert rec.fake.calls == 17 + 5


def test_a_value_that_does_not_decode_counts_as_traffic(tmp_path: Path) -> None:
    polls = [[b"{not json"]] * 3
    rec = FakeRecorder(tmp_path, polls, idle_exit_s=2)
    stats = asyncio.run(rec.run())
    assert stats.rejected == 3 and rec.fake.calls == 3 + 2


@pytest.mark.parametrize(("partitions", "text"), [
    ([], "none"),
    ([TP("t.requests", p) for p in range(12)], "t.requests 12 (0-11)"),
    ([TP("t.usage", 5), TP("t.usage", 0), TP("t.usage", 2), TP("t.usage", 3), TP("t.a", 1)],
     "t.a 1 (1), t.usage 4 (0, 2-3, 5)"),
])
def test_partitions_summary(partitions: list[TP], text: str) -> None:
    assert partitions_summary(partitions) == text


def test_the_assignment_line_is_summarised_while_recording(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    coordinator = logging.getLogger("aiokafka.consumer.group_coordinator")
    assigned = {TP(f"t.{name}", p) for name in ("requests", "completions", "limits") for p in range(100)}

    class LoggingConsumer(FakeConsumer):
        def subscribe(self, topics: list[str], listener: object) -> None:
            coordinator.info("Setting newly assigned partitions %s for group %s", assigned, "tokenpools-recorder")

    rec = FakeRecorder(tmp_path, [], idle_exit_s=1)
    rec.fake = LoggingConsumer([], rec.clock)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="aiokafka"):
        asyncio.run(rec.run())
        coordinator.info("Setting newly assigned partitions %s for group %s", {TP("x", 0)}, "g")  # after: untouched
    lines = [r.getMessage() for r in caplog.records if r.name == coordinator.name]
    assert lines[0] == ("group tokenpools-recorder: assigned t.completions 100 (0-99), t.limits 100 (0-99), "
                        "t.requests 100 (0-99)")
    assert lines[1].startswith("Setting newly assigned partitions")


def test_catching_up_over_what_is_on_disk_is_not_idle(tmp_path: Path) -> None:
    """A rerun re-reads records already written (skipped, not written again): that is the topic's traffic, and
    the idle clock starts only after it."""
    first = FakeRecorder(tmp_path, [[_decided(i)] for i in range(3)], idle_exit_s=2)
    assert asyncio.run(first.run()).records == 3
    again = FakeRecorder(tmp_path, [[_decided(i)] for i in range(3)] + [[_watermark(9)]] * 10, idle_exit_s=2)
    stats = asyncio.run(again.run())
    assert stats.records == 0 and stats.skipped == 3
    assert again.fake.calls == 3 + 2
