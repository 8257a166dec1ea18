"""Batched event records: many events of one (topic, key) in one Kafka record, so a consumer pays its per-message
cost once per batch instead of once per event.

Wire form (``event_batch``, schema version 1)::

    {"record_type": "event_batch", "schema_version": 1, "events": [<record>, <record>, ...]}
    {"record_type": "event_batch", "schema_version": 1, "proxy_id": "p-1", "watermark_ms": 1700000000123,
     "events": [...]}

A producer that sends all its events of the key itself (a proxy) may add its id and a *watermark*: every event of
this producer for this (topic, key) with ``t_ms`` < ``watermark_ms`` is in this record or an earlier one on this
partition. Consumers keep the newest per (topic, producer) and may close a window once every live producer's
watermark has passed its end (``streams.watermarks``) instead of waiting out the grace. Both fields are optional
and go together; a record without them (an old one, a plain record) simply gives no watermark. An envelope with
zero events is valid only when it carries a watermark: an idle producer's "nothing before W is missing".

Each element is a complete record of the topic (its own ``record_type`` and ``schema_version``), in the order the
producer emitted them; a producer packs only records of one topic and one key (the pool) into a batch, at most
``MAX_BATCH_EVENTS`` of them, and only events close in time (what gathered within its linger): the Kafka record's
timestamp is the batch's send time, and consumers judge lateness by it and expect it to grow along a partition
(``streams.progress``). A batch of one is sent as the plain record, and a plain record stays valid on every
event topic: ``decode_events`` accepts both forms, so old logs and producers that do not batch keep working.

Decoding is per element: one bad element (malformed, unknown version or type, invalid) is reported with its index
and its own JSON while its neighbours decode; only a value that is not a batch nor a record at all (not JSON, an
unknown envelope version, too many elements) is bad as a whole. The happy path is one pydantic-core call for the
whole value; anything it rejects is decoded again element by element by the contract codec, whose verdict wins.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Annotated, Any, Literal, NamedTuple, Optional, Union

import orjson
from pydantic import Field, TypeAdapter, ValidationError, create_model, model_validator

from tokenpools.topics.codec import DecodeError, decode_any
from tokenpools.topics.records import (
    SCHEMA_VERSION,
    BackendMetricsSample,
    DeadLetterReason,
    Record,
    RequestCompleted,
    RequestDecided,
)

BATCH_TYPE = "event_batch"
MAX_BATCH_EVENTS = 10_000  # a consumer refuses larger batches; also the stride of per-element positions
EVENT_RECORDS: tuple[type[Record], ...] = (RequestDecided, RequestCompleted, BackendMetricsSample)
_HEAD = b'{"record_type":"event_batch","schema_version":%d,"events":[' % SCHEMA_VERSION
_TAIL = b"]}"
ENVELOPE_BYTES = len(_HEAD) + len(_TAIL)
_ENVELOPE_FIELDS = {"record_type", "schema_version", "events", "proxy_id", "watermark_ms"}


class Watermark(NamedTuple):
    """``proxy_id`` has handed over every event of its with ``t_ms`` < ``watermark_ms`` for this (topic, key)."""

    proxy_id: str
    watermark_ms: int


def _check_watermark(batch: Any) -> Any:
    if (batch.proxy_id is None) != (batch.watermark_ms is None):
        raise ValueError("`proxy_id` and `watermark_ms` go together (a watermark is one producer's)")
    if not batch.events and batch.watermark_ms is None:
        raise ValueError("an event_batch without events must carry a watermark")
    return batch


def _event_batch_model(types: tuple[type[Record], ...]) -> type[Record]:
    element = Annotated[Union[types], Field(discriminator="record_type")]  # type: ignore[valid-type]
    return create_model(  # type: ignore[call-overload, no-any-return]
        "EventBatch", __base__=Record, __doc__=(
            "Events of one topic and one key (the pool), in emission order. Topic: requests or completions "
            "(or any event topic), key: pool. Each element is a complete record of that topic; `events` may be empty "
            "only when the record carries a watermark (`proxy_id` and `watermark_ms`, together or not at all)."),
        record_type=(Literal["event_batch"], BATCH_TYPE),
        events=(tuple[element, ...], Field(max_length=MAX_BATCH_EVENTS)),  # type: ignore[valid-type]
        proxy_id=(Optional[str], Field(None, min_length=1, max_length=256, strict=True, description=(
            "the producer (proxy) that sent every event of this record, when it declares a watermark"))),
        watermark_ms=(Optional[int], Field(None, ge=0, strict=True, description=(
            "every event of `proxy_id` for this (topic, key) with t_ms below this is in this record or an earlier "
            "one on this partition (epoch ms)"))),
        __validators__={"watermark_pair": model_validator(mode="after")(_check_watermark)},  # type: ignore[dict-item]
    )


EventBatch = _event_batch_model(EVENT_RECORDS)  # the exported schema (topics/schemas/event_batch.v1.json)


class BadElement(NamedTuple):
    """An element (or, with ``index`` None, the whole value) that cannot be used: why, and its own JSON."""

    index: int | None
    error: DecodeError
    payload: bytes


@dataclass(slots=True)
class Decoded:
    """The usable records of one value as (index, record) in order, and the bad elements. ``batched``: the value
    was an ``event_batch`` (a plain record is index 0 of a one-element result); ``watermark``: the envelope's, if
    it carried one (an envelope bad as a whole gives none)."""

    records: list[tuple[int, Record]] = field(default_factory=list)
    bad: list[BadElement] = field(default_factory=list)
    batched: bool = False
    watermark: Watermark | None = None


@lru_cache(maxsize=16)
def _adapter(types: tuple[type[Record], ...]) -> TypeAdapter[Any]:
    union = Union[(*types, _event_batch_model(types))]  # type: ignore[valid-type]
    return TypeAdapter(Annotated[union, Field(discriminator="record_type")])


def decode_events(data: bytes | str | None, allowed: tuple[type[Record], ...] = EVENT_RECORDS) -> Decoded:
    """Every element of a batch (or the one plain record) of the ``allowed`` types; never raises for bad input."""
    if data is None:
        return Decoded(bad=[BadElement(None, DecodeError(DeadLetterReason.MALFORMED,
                                                         "no value (tombstone) on an event topic"), b"")])
    try:
        value = _adapter(allowed).validate_json(data)
    except ValidationError:
        return _decode_slowly(data if isinstance(data, bytes) else data.encode(), allowed)
    events = getattr(value, "events", None)
    if events is None:
        return Decoded(records=[(0, value)])
    mark = None if value.watermark_ms is None else Watermark(value.proxy_id, value.watermark_ms)
    return Decoded(records=list(enumerate(events)), batched=True, watermark=mark)


def records_of(data: bytes | str | None, allowed: tuple[type[Record], ...] = EVENT_RECORDS) -> list[Record]:
    """The usable records of one value, in order (for readers that count or skip what is bad themselves)."""
    return [record for _, record in decode_events(data, allowed).records]


def _decode_slowly(data: bytes, allowed: tuple[type[Record], ...]) -> Decoded:
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError:
        value = None
    if not isinstance(value, dict) or value.get("record_type") != BATCH_TYPE:
        try:
            return Decoded(records=[(0, decode_any(data, allowed))])
        except DecodeError as exc:
            return Decoded(bad=[BadElement(None, exc, data)])
    whole = _envelope_problem(value)
    if whole is not None:
        return Decoded(bad=[BadElement(None, whole, data)], batched=True)
    mark = value.get("watermark_ms")
    out = Decoded(batched=True, watermark=None if mark is None else Watermark(value["proxy_id"], mark))
    for index, element in enumerate(value["events"]):
        payload = orjson.dumps(element)
        try:
            if isinstance(element, dict) and element.get("record_type") == BATCH_TYPE:
                raise DecodeError(DeadLetterReason.UNKNOWN_TYPE, "an event_batch cannot be an element of a batch")
            out.records.append((index, decode_any(payload, allowed)))
        except DecodeError as exc:
            out.bad.append(BadElement(index, exc, payload))
    return out


def _envelope_problem(value: dict[str, Any]) -> DecodeError | None:
    version = value.get("schema_version")
    if version != SCHEMA_VERSION:
        return DecodeError(DeadLetterReason.UNKNOWN_VERSION, f"schema_version {version!r} of record_type "
                           f"'event_batch' is not supported (this consumer reads version {SCHEMA_VERSION})")
    extra = sorted(set(value) - _ENVELOPE_FIELDS)
    events = value.get("events")
    if extra:
        return DecodeError(DeadLetterReason.INVALID, f"EventBatch: unknown fields {extra}")
    proxy_id, mark = value.get("proxy_id"), value.get("watermark_ms")
    if (proxy_id is None) != (mark is None):
        return DecodeError(DeadLetterReason.INVALID, "EventBatch: `proxy_id` and `watermark_ms` go together")
    if mark is not None and not (isinstance(proxy_id, str) and 1 <= len(proxy_id) <= 256
                                 and type(mark) is int and mark >= 0):
        return DecodeError(DeadLetterReason.INVALID, f"EventBatch: a watermark needs a `proxy_id` string and a "
                           f"`watermark_ms` integer >= 0, got {proxy_id!r}, {mark!r}")
    least = 0 if mark is not None else 1
    if not isinstance(events, list) or not least <= len(events) <= MAX_BATCH_EVENTS:
        size = len(events) if isinstance(events, list) else type(events).__name__
        return DecodeError(DeadLetterReason.INVALID, f"EventBatch: `events` must be a list of "
                           f"{least}..{MAX_BATCH_EVENTS} records (0 only with a watermark), got {size}")
    return None


# ---- producing ----------------------------------------------------------------------------------------------
def _head(watermark: Watermark) -> bytes:
    return (b'{"record_type":"event_batch","schema_version":%d,"proxy_id":%s,"watermark_ms":%d,"events":['
            % (SCHEMA_VERSION, orjson.dumps(watermark.proxy_id), watermark.watermark_ms))


def envelope_bytes(watermark: Watermark | None = None) -> int:
    """What the envelope adds to its elements (an upper bound for any watermark of this producer: 20 digits)."""
    if watermark is None:
        return ENVELOPE_BYTES
    return len(_head(Watermark(watermark.proxy_id, 10**19))) + len(_TAIL)


def batch_value(elements: list[bytes], watermark: Watermark | None = None) -> bytes:
    """The value of one Kafka record for these encoded records: without a watermark the plain record for one,
    else an event_batch; with a watermark always the envelope (which may then hold no events at all)."""
    if len(elements) > MAX_BATCH_EVENTS:
        raise ValueError(f"a batch holds at most {MAX_BATCH_EVENTS} events, got {len(elements)}")
    if watermark is not None:
        if not watermark.proxy_id or watermark.watermark_ms < 0:
            raise ValueError(f"a watermark needs a proxy id and a time >= 0, got {watermark!r}")
        return _head(watermark) + b",".join(elements) + _TAIL
    if not elements:
        raise ValueError("a batch without a watermark needs at least one element")
    if len(elements) == 1:
        return elements[0]
    return _HEAD + b",".join(elements) + _TAIL


def pack(elements: Iterable[bytes], max_events: int, max_bytes: int,
         envelope: int = ENVELOPE_BYTES) -> list[list[bytes]]:
    """Consecutive runs of encoded records, each at most ``max_events`` long and ``max_bytes`` once wrapped by
    ``batch_value`` (a record larger than ``max_bytes`` on its own is a run of one: the caller decides).
    ``envelope``: the envelope's own bytes (``envelope_bytes``: more with a watermark)."""
    if not 1 <= max_events <= MAX_BATCH_EVENTS:
        raise ValueError(f"`max_events` must be in 1..{MAX_BATCH_EVENTS}, got {max_events}")
    if max_bytes <= envelope:
        raise ValueError(f"`max_bytes` must exceed the envelope's {envelope} bytes, got {max_bytes}")
    runs: list[list[bytes]] = []
    run: list[bytes] = []
    size = envelope
    for element in elements:
        grown = size + len(element) + (1 if run else 0)
        if run and (len(run) >= max_events or grown > max_bytes):
            runs.append(run)
            run, grown = [], envelope + len(element)
        run.append(element)
        size = grown
    if run:
        runs.append(run)
    return runs
