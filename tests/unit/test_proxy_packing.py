"""How the event sender groups events into Kafka records (``proxy.packing``): per key, in order, within caps —
the queue's events and a batch read back from the spool alike."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tokenpools.proxy.outbox.packing import pack_by_key, pack_spooled
from tokenpools.proxy.outbox.spool import SpoolEntry
from tokenpools.topics.batches import ENVELOPE_BYTES


def _item(key: str, i: int, size: int = 10, t_ms: int | None = None) -> tuple[str, str, bytes, int | None]:
    return ("requests", key, f"{key}{i}".encode().ljust(size, b"."), t_ms)


def test_a_lone_event_stays_one_plain_record_and_keys_keep_their_first_seen_order() -> None:
    items = [_item("b", 0), _item("a", 0), _item("b", 1)]
    units = pack_by_key(items, 500, 64 << 10, ENVELOPE_BYTES)
    assert [(key, len(run)) for key, run, _ in units] == [("b", 2), ("a", 1)]
    assert units[0][2] == [items[0], items[2]] and units[1][1] == [items[1][2]]


def test_runs_respect_the_event_cap() -> None:
    items = [_item("k", i) for i in range(7)]
    units = pack_by_key(items, 3, 64 << 10, ENVELOPE_BYTES)
    assert [len(run) for _, run, _ in units] == [3, 3, 1]


def test_a_watermarked_key_leaves_room_for_its_larger_envelope() -> None:
    items = [_item("k", i, size=40) for i in range(4)]  # 4 × 40 bytes + separators
    cap = ENVELOPE_BYTES + 4 * 40 + 3
    assert len(pack_by_key(items, 500, cap, ENVELOPE_BYTES)) == 1
    marked = [(*i[:3], 1000 + n) for n, i in enumerate(items)]
    assert len(pack_by_key(marked, 500, cap, ENVELOPE_BYTES + 30)) == 2


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 60)), max_size=60), st.integers(1, 5))
def test_every_event_is_in_exactly_one_run_in_its_keys_order(spec: list[tuple[str, int]], cap_events: int) -> None:
    items = [_item(key, i, size) for i, (key, size) in enumerate(spec)]
    units = pack_by_key(items, cap_events, 200, ENVELOPE_BYTES)
    assert sorted(e for _, _, events in units for e in events) == sorted(items)
    for key, run, events in units:
        assert [e[2] for e in events] == run and len(run) <= cap_events and {e[1] for e in events} == {key}
    for key in "abc":
        assert [e for _, _, events in units for e in events if e[1] == key] == [i for i in items if i[1] == key]


def _entry(topic: str, key: str, i: int, size: int = 10) -> SpoolEntry:
    return SpoolEntry(topic, key, f"{key}{i}".encode().ljust(size, b"."), end_offset=100 + i)


def test_a_spool_batch_is_packed_per_topic_and_key_in_spool_order_without_its_corrupt_lines() -> None:
    corrupt = SpoolEntry("", "", b"", end_offset=50)
    entries = [_entry("requests", "b", 0), corrupt, _entry("requests", "a", 1), _entry("completions", "b", 2),
               _entry("requests", "b", 3)]
    runs = pack_spooled(entries, 500, 64 << 10, frozenset(), ENVELOPE_BYTES)
    assert runs == [[entries[0], entries[4]], [entries[2]], [entries[3]]]


def test_a_spool_batch_respects_the_caps_and_a_watermarked_topics_envelope() -> None:
    entries = [_entry("requests", "k", i, size=40) for i in range(4)]
    assert [len(run) for run in pack_spooled(entries, 3, 64 << 10, frozenset(), ENVELOPE_BYTES)] == [3, 1]
    cap = ENVELOPE_BYTES + 4 * 40 + 3
    assert len(pack_spooled(entries, 500, cap, frozenset({"completions"}), ENVELOPE_BYTES + 30)) == 1
    assert len(pack_spooled(entries, 500, cap, frozenset({"requests"}), ENVELOPE_BYTES + 30)) == 2
