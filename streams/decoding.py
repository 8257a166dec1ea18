"""Decoding the agent's source records: one Kafka record → its events, with the contract codec's verdict on
anything bad (``topics.batches.decode_events``: a batch or a plain record, per element).

A batch's elements share the Kafka record's offset, so each gets the position ``offset × MAX_BATCH_EVENTS + index``:
it keeps the order of the partition (every element of offset o comes before every element of o + 1), so the
fold's per-partition de-duplication (``pool_state``: an offset at or before the last one applied is a duplicate)
recognises a re-delivered batch element by element, and a plain record (index 0) the same way as before.
"""

from __future__ import annotations

from tokenpools.topics.batches import MAX_BATCH_EVENTS, BadElement, Decoded, decode_events
from tokenpools.topics.records import Record

SourceRecords = tuple[type[Record], ...]

__all__ = ["BadElement", "Decoded", "decode_source", "element_position"]


def decode_source(data: bytes | None, types: SourceRecords) -> Decoded:
    """The events of one record (good ones with their index) and its bad elements; never raises."""
    return decode_events(data, types)


def element_position(offset: int, index: int) -> int:
    """The position of element ``index`` of the record at ``offset`` (see the module docstring)."""
    return offset * MAX_BATCH_EVENTS + index
