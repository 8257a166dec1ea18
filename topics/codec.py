"""JSON on the wire. Decoding never crashes a consumer: every failure is a ``DecodeError`` with a reason a
dead-letter record can carry.
"""

from __future__ import annotations

from typing import TypeVar

import orjson
from pydantic import ValidationError

from tokenpools.topics.records import RECORD_TYPES, SCHEMA_VERSION, DeadLetterReason, Record

R = TypeVar("R", bound=Record)


class DecodeError(ValueError):
    """A record that cannot be used, and why."""

    def __init__(self, reason: DeadLetterReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


def encode(record: Record) -> bytes:
    return record.__pydantic_serializer__.to_json(record)


def _parse(data: bytes | str) -> dict[str, object]:
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(DeadLetterReason.MALFORMED, f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise DecodeError(DeadLetterReason.MALFORMED, f"expected a JSON object, got {type(value).__name__}")
    version = value.get("schema_version")
    if version != SCHEMA_VERSION:
        raise DecodeError(
            DeadLetterReason.UNKNOWN_VERSION,
            f"schema_version {version!r} of record_type {value.get('record_type')!r} is not supported "
            f"(this consumer reads version {SCHEMA_VERSION})",
        )
    return value


def _validate(cls: type[R], value: dict[str, object]) -> R:
    try:
        return cls.model_validate(value)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<record>'}: {err['msg']}" for err in exc.errors(include_url=False)
        )
        raise DecodeError(DeadLetterReason.INVALID, f"{cls.__name__}: {problems}") from None


def decode(cls: type[R], data: bytes | str) -> R:
    """Decode a record of a known type."""
    value = _parse(data)
    expected = cls.model_fields["record_type"].default
    if value.get("record_type") != expected:
        raise DecodeError(
            DeadLetterReason.UNKNOWN_TYPE, f"expected record_type {expected!r}, got {value.get('record_type')!r}"
        )
    return _validate(cls, value)


def decode_any(data: bytes | str, allowed: tuple[type[Record], ...] | None = None) -> Record:
    """Decode a record of any registered type (or only of ``allowed``), dispatching on ``record_type``."""
    value = _parse(data)
    record_type = value.get("record_type")
    cls = RECORD_TYPES.get(record_type) if isinstance(record_type, str) else None
    if cls is None or (allowed is not None and cls not in allowed):
        names = sorted(c.model_fields["record_type"].default for c in (allowed or tuple(RECORD_TYPES.values())))
        raise DecodeError(DeadLetterReason.UNKNOWN_TYPE, f"record_type {record_type!r} is not one of {names}")
    return _validate(cls, value)
