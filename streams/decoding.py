"""Decoding the agent's source records fast, with the contract codec's exact verdict on anything bad.

The happy path is one pydantic-core call (JSON parsing and validation in Rust, dispatching on ``record_type``),
about half the CPU of ``codec.decode_any``. Whatever it rejects is decoded again by ``codec.decode_any``, whose
``DecodeError`` (malformed, unknown version, unknown type, invalid) is what gets dead-lettered; a record it accepts
is the record ``decode_any`` returns (a unit test checks both).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any, Union

from pydantic import Field, TypeAdapter, ValidationError

from tokenpools.topics.codec import DecodeError, decode_any
from tokenpools.topics.records import DeadLetterReason, Record

SourceRecords = tuple[type[Record], ...]


@lru_cache(maxsize=8)
def _adapter(types: SourceRecords) -> TypeAdapter[Any]:
    return TypeAdapter(Annotated[Union[types], Field(discriminator="record_type")])  # type: ignore[valid-type]


def decode_source(data: bytes | None, types: SourceRecords) -> Record:
    """The record, or ``DecodeError`` with the codec's reason."""
    if data is None:
        raise DecodeError(DeadLetterReason.MALFORMED, "no value (tombstone) on an event topic")
    try:
        return _adapter(types).validate_json(data)
    except ValidationError:
        pass
    record = decode_any(data, types)  # raises the precise DecodeError
    return record  # pragma: no cover - the codec accepted what the fast path did not: take its word
