"""The one dead-letter handler (runtime.deadletter): it logs ``topic[partition]@offset`` (throttled), counts, and
writes a record of where the unusable record came from."""

from __future__ import annotations

import logging

import orjson
import pytest

from tokenpools.runtime.clock import FakeClock
from tokenpools.runtime.deadletter import DeadLetters
from tokenpools.topics.records import DeadLetterReason
from tokenpools_dev.streams import scripted


async def test_dead_letters_log_count_and_write_a_record_of_where_it_came_from(
        caplog: pytest.LogCaptureFixture) -> None:
    clock, sent, counted = FakeClock(wall_ms=1_700_000_000_123), scripted.Sent(), []
    logger = logging.getLogger("dead-letter-test")
    dead = DeadLetters("t.dead-letters", "agents", clock, send=sent, count=counted.append, warn_interval_s=10,
                       logger=logger)
    with caplog.at_level(logging.DEBUG, "dead-letter-test"):
        first = await dead.handle(DeadLetterReason.LATE, "window closed", "t.requests", 3, 17, b"pool-a", b'{"x": 1}',
                                  element=2)
        await dead.handle(DeadLetterReason.LATE, "window closed", "t.requests", 3, 18, b"pool-a", b"{}")
        clock.advance(11)
        await dead.handle(DeadLetterReason.LATE, "window closed", "t.requests", 3, 19, None, None)
    assert (first.source_topic, first.partition, first.offset, first.element, first.key) == ("t.requests", 3, 17, 2,
                                                                                             "pool-a")
    assert (first.reason, first.consumer, first.t_ms, orjson.loads(first.payload)) == (
        DeadLetterReason.LATE, "agents", 1_700_000_000_123, {"x": 1})
    assert counted == [DeadLetterReason.LATE] * 3 and dead.counts == {DeadLetterReason.LATE: 3}
    assert [d.offset for d in sent.of("t.dead-letters")] == [17, 18, 19]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["dead letter (late) t.requests[3]@17[2]: window closed",
                        "dead letter (late) t.requests[3]@19: window closed (1 more like this in the last 10 s)"]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG] == [
        "dead letter (late) t.requests[3]@18: window closed"]


async def test_a_dead_letter_can_be_noted_and_written_by_the_caller() -> None:
    dead = DeadLetters("t.dead-letters", "proxy/p1", FakeClock())
    record = dead.note(DeadLetterReason.MALFORMED, "x" * 5000, "t.limits", -1, -1, None, b"\xff" * 70_000)
    assert (record.partition, record.offset, len(record.detail)) == (0, 0, 2000)
    assert len(record.payload) == 65536  # truncated, lossy for binary
    with pytest.raises(RuntimeError, match="needs a `send`"):
        await dead.handle(DeadLetterReason.MALFORMED, "x", "t.limits", 0, 0, None, b"x")
