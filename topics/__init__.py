"""The contract between tokenpools processes: every Kafka topic as data and every record as a frozen, versioned
schema, JSON on the wire. Nothing here talks to Kafka; any language can consume these topics with the JSON Schema
files in ``topics/schemas/``.
"""

from tokenpools.topics.batches import (
    MAX_BATCH_EVENTS,
    EventBatch,
    Watermark,
    batch_value,
    decode_events,
    pack,
    records_of,
)
from tokenpools.topics.codec import DecodeError, decode, decode_any, encode
from tokenpools.topics.declarations import TopicSpec, Topics, topics_for
from tokenpools.topics.records import (
    RECORD_TYPES,
    BackendMetricsSample,
    CompletionStatus,
    DeadLetter,
    DeadLetterReason,
    EffectiveLimit,
    EntitlementLimit,
    LimitUpdate,
    ProxyHeartbeat,
    ProxyShare,
    Record,
    RequestCompleted,
    RequestDecided,
    ScaleCommand,
    SpecRecord,
)

__all__ = [
    "MAX_BATCH_EVENTS",
    "EventBatch",
    "Watermark",
    "batch_value",
    "decode_events",
    "pack",
    "records_of",
    "RECORD_TYPES",
    "BackendMetricsSample",
    "CompletionStatus",
    "DeadLetter",
    "DeadLetterReason",
    "DecodeError",
    "EffectiveLimit",
    "EntitlementLimit",
    "LimitUpdate",
    "ProxyHeartbeat",
    "ProxyShare",
    "Record",
    "RequestCompleted",
    "RequestDecided",
    "ScaleCommand",
    "SpecRecord",
    "TopicSpec",
    "Topics",
    "decode",
    "decode_any",
    "encode",
    "topics_for",
]
