"""The batched event record (topics.batches): round trip, both wire forms, per-element verdicts, size caps, the
exported schema."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.topics import batches
from tokenpools.topics.codec import DecodeError, decode_any, encode
from tokenpools.topics.export import schema_files
from tokenpools.topics.records import DeadLetterReason, RequestCompleted, RequestDecided, ScaleCommand
from tokenpools_dev import builders

REQUESTS = (RequestDecided,)


def decided(i: int, pool: str = "pool-a") -> RequestDecided:
    return builders.decided(f"r{i}", 1_700_000_000_000 + i, pool=pool, entitlement="gold" if i % 2 else None,
                            proxy_id="p", prompt_tokens_est=i, max_tokens=8, cost_tokens=i + 8, kv_bytes=3 * i,
                            priority=1.5)


def completed(i: int) -> RequestCompleted:
    return builders.completed(f"r{i}", 10 + i, pool="pool-a", entitlement="gold", proxy_id="p", admitted_t_ms=i,
                              prompt_tokens=1, completion_tokens=2, reserved_tokens=3, kv_bytes=4, e2e_s=0.5)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=40), st.integers(1, 50), st.integers(200, 5000))
def test_packing_and_decoding_round_trip_in_order_within_the_caps(ids: list[int], max_events: int,
                                                                   max_bytes: int) -> None:
    records = [decided(i) for i in ids]
    values = [encode(r) for r in records]
    runs = batches.pack(values, max_events, max_bytes)
    assert [v for run in runs for v in run] == values  # every record once, in order
    back = []
    for run in runs:
        value = batches.batch_value(run)
        assert len(run) <= max_events and (len(value) <= max_bytes or len(run) == 1)
        decoded = batches.decode_events(value, REQUESTS)
        assert decoded.bad == [] and decoded.batched == (len(run) > 1)
        assert [i for i, _ in decoded.records] == list(range(len(run)))
        back += [r for _, r in decoded.records]
    assert back == records


def test_a_plain_record_is_a_batch_of_one_and_the_codec_agrees() -> None:
    for record in (decided(3), completed(4)):
        assert batches.batch_value([encode(record)]) == encode(record)
        assert batches.decode_events(encode(record)).records == [(0, decode_any(encode(record)))]
    value = batches.batch_value([encode(completed(i)) for i in range(3)])
    assert orjson.loads(value)["record_type"] == "event_batch"
    assert batches.EventBatch.model_validate_json(value).events == tuple(completed(i) for i in range(3))
    assert batches.records_of(value, (RequestCompleted,)) == [completed(i) for i in range(3)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["good", "not_object", "invalid", "version", "type", "foreign", "nested"]),
                min_size=2, max_size=20))
def test_bad_elements_are_reported_alone_and_their_neighbours_decode(kinds: list[str]) -> None:
    good = orjson.loads(encode(decided(1)))
    make = {
        "good": lambda i: encode(decided(i)),
        "not_object": lambda i: b"[1, 2]",
        "invalid": lambda i: orjson.dumps({**good, "t_ms": -i - 1}),
        "version": lambda i: orjson.dumps({**good, "schema_version": 9}),
        "type": lambda i: orjson.dumps({**good, "record_type": "nope"}),
        "foreign": lambda i: encode(ScaleCommand(pool="p", version=1, t_ms=1, desired_replicas=1, current_replicas=1,
                                                 floor_replicas=0)),
        "nested": lambda i: batches.batch_value([encode(decided(i)), encode(decided(i + 1))]),
    }
    values = [make[k](i) for i, k in enumerate(kinds)]
    decoded = batches.decode_events(batches.batch_value(values), REQUESTS)
    assert decoded.batched
    assert [i for i, _ in decoded.records] == [i for i, k in enumerate(kinds) if k == "good"]
    assert [r for _, r in decoded.records] == [decided(i) for i, k in enumerate(kinds) if k == "good"]
    assert [b.index for b in decoded.bad] == [i for i, k in enumerate(kinds) if k != "good"]
    for bad in decoded.bad:
        assert orjson.loads(bad.payload) == orjson.loads(values[bad.index])  # the element's own JSON
        if kinds[bad.index] != "nested":  # the codec's own verdict on that element
            with pytest.raises(DecodeError) as codec:
                decode_any(values[bad.index], REQUESTS)
            assert bad.error.reason is codec.value.reason
    expected = {"not_object": DeadLetterReason.MALFORMED, "invalid": DeadLetterReason.INVALID,
                "version": DeadLetterReason.UNKNOWN_VERSION, "type": DeadLetterReason.UNKNOWN_TYPE,
                "foreign": DeadLetterReason.UNKNOWN_TYPE, "nested": DeadLetterReason.UNKNOWN_TYPE}
    assert [b.error.reason for b in decoded.bad] == [expected[kinds[b.index]] for b in decoded.bad]


def test_a_value_that_is_bad_as_a_whole_is_one_bad_element() -> None:
    body = [orjson.loads(encode(decided(i))) for i in range(2)]

    def envelope(**fields: object) -> bytes:
        return orjson.dumps({"record_type": "event_batch", "schema_version": 1, "events": body, **fields})

    cases = {
        b"{nope": DeadLetterReason.MALFORMED,
        b"[]": DeadLetterReason.MALFORMED,
        envelope(schema_version=2): DeadLetterReason.UNKNOWN_VERSION,
        envelope(events=[]): DeadLetterReason.INVALID,
        envelope(events={}): DeadLetterReason.INVALID,
        envelope(x=1): DeadLetterReason.INVALID,
        envelope(events=body * (batches.MAX_BATCH_EVENTS // 2 + 1)): DeadLetterReason.INVALID,
    }
    for value, reason in cases.items():
        decoded = batches.decode_events(value, REQUESTS)
        assert decoded.records == [], value[:80]
        assert [(b.index, b.error.reason) for b in decoded.bad] == [(None, reason)], value[:80]
        assert decoded.bad[0].payload == value
    assert batches.decode_events(None).bad[0].error.reason is DeadLetterReason.MALFORMED


def test_the_caps_are_checked() -> None:
    values = [encode(decided(i)) for i in range(11, 31, 2)]  # all of one size
    size = len(values[0])
    assert {len(v) for v in values} == {size}
    runs = batches.pack(values, 100, batches.ENVELOPE_BYTES + 3 * size + 2)  # three records and two commas fit exactly
    assert [len(r) for r in runs] == [3, 3, 3, 1] and all(len(batches.batch_value(r)) <= batches.ENVELOPE_BYTES + 3 * size + 2
                                                          for r in runs)
    assert [len(r) for r in batches.pack(values, 4, 1 << 20)] == [4, 4, 2]
    assert [len(r) for r in batches.pack(values, 4, batches.ENVELOPE_BYTES + 1)] == [1] * 10  # each alone is too large: alone
    for bad in ((0, 1000), (batches.MAX_BATCH_EVENTS + 1, 1000), (5, batches.ENVELOPE_BYTES)):
        with pytest.raises(ValueError):
            batches.pack(values, *bad)
    with pytest.raises(ValueError):
        batches.batch_value([])
    with pytest.raises(ValueError):
        batches.batch_value([values[0]] * (batches.MAX_BATCH_EVENTS + 1))


def test_the_committed_schemas_are_what_the_models_export() -> None:
    committed = Path(batches.__file__).parent / "schemas"
    files = schema_files()
    assert "event_batch.v1.json" in files
    assert {p.name: p.read_text() for p in committed.glob("*.json")} == files, \
        "run `python -m tokenpools.topics.export`"
    schema = json.loads(files["event_batch.v1.json"])
    assert schema["properties"]["events"]["maxItems"] == batches.MAX_BATCH_EVENTS
    assert "element" in json.loads(files["dead_letter.v1.json"])["properties"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10_000), max_size=30), st.integers(0, 2**62), st.text(min_size=1, max_size=40))
def test_a_watermark_travels_with_the_envelope_and_decodes_in_both_paths(ids: list[int], mark: int,
                                                                         proxy: str) -> None:
    values = [encode(decided(i)) for i in ids]
    watermark = batches.Watermark(proxy, mark)
    value = batches.batch_value(values, watermark)
    assert orjson.loads(value)["record_type"] == "event_batch"  # always the envelope, even for one or none
    assert len(value) <= sum(len(v) for v in values) + max(0, len(values) - 1) + batches.envelope_bytes(watermark)
    fast = batches.decode_events(value, REQUESTS)
    assert fast.bad == [] and fast.batched and fast.watermark == watermark
    assert [r for _, r in fast.records] == [decided(i) for i in ids]
    if ids:  # one bad element sends the value down the slow path: the watermark still holds
        body = orjson.loads(value)
        body["events"].insert(0, {"record_type": "request_decided", "schema_version": 1})
        slow = batches.decode_events(orjson.dumps(body), REQUESTS)
        assert [b.index for b in slow.bad] == [0] and slow.watermark == watermark
        assert [r for _, r in slow.records] == [decided(i) for i in ids]
    runs = batches.pack(values, 7, 2000, batches.envelope_bytes(watermark))
    assert all(len(batches.batch_value(run, watermark)) <= 2000 for run in runs if len(run) > 1)


def test_watermark_envelopes_that_are_bad_and_old_ones_without_a_watermark() -> None:
    body = [orjson.loads(encode(decided(i))) for i in range(2)]

    def envelope(**fields: object) -> bytes:
        return orjson.dumps({"record_type": "event_batch", "schema_version": 1, "events": body, **fields})

    assert batches.decode_events(envelope(), REQUESTS).watermark is None  # an old record: no watermark, events decode
    assert len(batches.decode_events(envelope(), REQUESTS).records) == 2
    idle = batches.decode_events(envelope(events=[], proxy_id="p", watermark_ms=5), REQUESTS)
    assert idle.records == [] and idle.bad == [] and idle.watermark == batches.Watermark("p", 5)
    assert batches.records_of(envelope(events=[], proxy_id="p", watermark_ms=5)) == []
    cases = [envelope(events=[]), envelope(proxy_id="p"), envelope(watermark_ms=5), envelope(events=[], proxy_id="p"),
             envelope(proxy_id="", watermark_ms=5), envelope(proxy_id="p", watermark_ms=-1),
             envelope(proxy_id="p", watermark_ms="5"), envelope(proxy_id=7, watermark_ms=5),
             envelope(proxy_id="p", watermark_ms=1.5)]
    for value in cases:
        decoded = batches.decode_events(value, REQUESTS)
        assert decoded.records == [] and decoded.watermark is None, value
        assert [(b.index, b.error.reason) for b in decoded.bad] == [(None, DeadLetterReason.INVALID)], value
    with pytest.raises(ValueError):
        batches.batch_value([], batches.Watermark("", 1))
    with pytest.raises(ValueError):
        batches.batch_value([], batches.Watermark("p", -1))
    with pytest.raises(ValueError):
        batches.batch_value([])
    assert json.loads(schema_files()["event_batch.v1.json"])["properties"]["watermark_ms"]
