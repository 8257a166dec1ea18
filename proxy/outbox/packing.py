"""How the event sender groups events into Kafka records (pure): per key, in order, within the pack caps.

Both the queue's events (``pack_by_key``) and a batch read back from the spool (``pack_spooled``). The items are
already encoded; a run of one stays a plain record, longer runs become ``event_batch`` values
(``topics.batches.pack`` sizes them, counting the envelope a watermarked key's record carries).
"""

from __future__ import annotations

from collections.abc import Container
from typing import Protocol, TypeVar

from tokenpools.topics.batches import ENVELOPE_BYTES, pack
from tokenpools.topics.records import Record

Item = tuple[str, str, Record | bytes]  # topic, key, record (or its encoding)
Encoded = tuple[str, str, bytes, "int | None"]  # topic, key, the record's encoding, its t_ms when watermarked
Packed = tuple[str, list[bytes], list[Encoded]]  # key, the encoded records of one Kafka record, the events


class Spooled(Protocol):
    """What packing reads of a spool entry (``proxy.spool.SpoolEntry``, an I/O shell's type)."""

    @property
    def topic(self) -> str: ...

    @property
    def key(self) -> str: ...

    @property
    def value(self) -> bytes: ...


S = TypeVar("S", bound=Spooled)


def pack_by_key(items: list[Encoded], pack_events: int, pack_bytes: int, watermark_envelope_bytes: int) -> list[Packed]:
    """One partition's records as runs for Kafka records: per key (in first-seen order), each key's events in
    order, every run within ``pack_events`` records and ``pack_bytes`` bytes."""
    by_key: dict[str, list[Encoded]] = {}
    for item in items:
        by_key.setdefault(item[1], []).append(item)
    units: list[Packed] = []
    for key, events in by_key.items():
        if len(events) == 1:
            units.append((key, [events[0][2]], events))
            continue
        start = 0
        envelope = watermark_envelope_bytes if events[0][3] is not None else ENVELOPE_BYTES
        for run in pack([e[2] for e in events], pack_events, pack_bytes, envelope):
            units.append((key, run, events[start:start + len(run)]))
            start += len(run)
    return units


def pack_spooled(entries: list[S], pack_events: int, pack_bytes: int, watermarked: Container[str],
                 watermark_envelope_bytes: int) -> list[list[S]]:
    """A spool batch's events per (topic, key) (in first-seen order), each key's in spool order, in runs within
    the pack caps; a corrupt line (no topic) is in no run (the drain's commit moves past it)."""
    by_key: dict[tuple[str, str], list[S]] = {}
    for entry in entries:
        if entry.topic:
            by_key.setdefault((entry.topic, entry.key), []).append(entry)
    runs: list[list[S]] = []
    for (topic, _), group in by_key.items():
        start = 0
        envelope = watermark_envelope_bytes if topic in watermarked else ENVELOPE_BYTES
        for run in pack([e.value for e in group], pack_events, pack_bytes, envelope):
            runs.append(group[start:start + len(run)])
            start += len(run)
    return runs
