"""Decoding the agent's source records: one Kafka record → its events, with the contract codec's verdict on
anything bad (``topics.batches.decode_events``: a batch or a plain record, per element).

A batch's elements share the Kafka record's offset, so each gets the position ``offset × MAX_BATCH_EVENTS + index``:
it keeps the order of the partition (every element of offset o comes before every element of o + 1), so the
fold's per-partition de-duplication (``pool_state``: an offset at or before the last one applied is a duplicate)
recognises a re-delivered batch element by element, and a plain record (index 0) the same way as before.

``RawEvent`` is a Kafka record as the agent read it; ``Item`` one of its events on the way to a fold, ``Rejected``
one on the way to the dead letters (the processor and the ledgers build both).
"""

from __future__ import annotations

from typing import NamedTuple

from tokenpools.topics.batches import MAX_BATCH_EVENTS, BadElement, Decoded, decode_events
from tokenpools.topics.records import DeadLetterReason, Record

SourceRecords = tuple[type[Record], ...]

__all__ = ["BadElement", "Decoded", "Item", "RawEvent", "Rejected", "decode_source", "element_position"]


class RawEvent(NamedTuple):
    """One record as the agent read it (a NamedTuple: one is built per record, and this is the hot path)."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None


Item = tuple[RawEvent, "int | None", Record]  # the Kafka record, the element's index in its batch (None: plain)
Rejected = tuple[RawEvent, "int | None", DeadLetterReason, str, "bytes | None"]  # ..., reason, detail, payload


def decode_source(data: bytes | None, types: SourceRecords) -> Decoded:
    """The events of one record (good ones with their index) and its bad elements; never raises."""
    return decode_events(data, types)


def element_position(offset: int, index: int) -> int:
    """The position of element ``index`` of the record at ``offset`` (see the module docstring)."""
    return offset * MAX_BATCH_EVENTS + index
