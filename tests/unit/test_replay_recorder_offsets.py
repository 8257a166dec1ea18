"""The recorder's resume rule on the data path: a message is taken only past every offset of its partition already
taken or on disk, whatever order the fetcher and the assignment callback interleave in (no broker: messages are
handed to the recorder as the consumer would)."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from tokenpools.config import KafkaSettings
from tokenpools.replay import trace
from tokenpools.replay.recorder import Recorder, RecorderConfig
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.topics import encode
from tokenpools_dev import builders


class TP(NamedTuple):
    topic: str
    partition: int


class Message(NamedTuple):
    offset: int
    value: bytes


def _message(offset: int) -> Message:
    record = builders.decided(f"r{offset}", 1_772_150_400_000 + offset, pool="p", proxy_id="x", prompt_tokens_est=1,
                              max_tokens=1, cost_tokens=2, kv_bytes=2)
    return Message(offset, encode(record))


def _recorder(out: Path) -> Recorder:
    return Recorder(KafkaClients(KafkaSettings(topic_prefix="t.")), RecorderConfig(out_dir=out, topics=("requests",)))


def _taken(recorder: Recorder) -> list[int]:
    return [row["kafka_offset"] for rows in recorder._buffers.values() for row in rows]  # type: ignore[misc]


def test_a_partition_moved_back_over_taken_records_takes_none_of_them_twice(tmp_path: Path) -> None:
    rec = _recorder(tmp_path)
    tp = TP("t.requests", 1)
    for offset in [*range(0, 5), *range(2, 8)]:  # a seek back to 2 after 0-4 were taken
        rec._take(tp, _message(offset))
    assert _taken(rec) == list(range(8)) and rec.stats.skipped == 3
    rec._take(TP("t.requests", 0), _message(0))  # partitions are independent
    assert _taken(rec).count(0) == 2


def test_what_an_earlier_run_wrote_is_skipped_even_before_the_assignment_callback_ran(tmp_path: Path) -> None:
    first = _recorder(tmp_path)
    tp = TP("t.requests", 0)
    for offset in range(5):
        first._take(tp, _message(offset))
    rows = [row for rows in first._buffers.values() for row in rows]  # type: ignore[misc]
    trace.write_partitioned(tmp_path, trace.REQUESTS, trace.frame(trace.REQUESTS, rows), 0, -1)
    again = _recorder(tmp_path)  # a rerun whose last commit was lost: the consumer starts from 0 again
    for offset in range(10):
        again._take(tp, _message(offset))
    assert _taken(again) == [5, 6, 7, 8, 9] and again.stats.skipped == 5
