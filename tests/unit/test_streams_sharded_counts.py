"""A sharded pool's counts (docs/scaling.md step 4): format 3 of the counts record (topics/counts.py), one
``FleetCounts`` per shard (streams/counts/fleet_counts.py), and a proxy combining the shards' records (proxy/admission/pools.py).

- format 1 is what a one-shard pool writes, byte for byte the layout it always had; format 3 (a shard's record, with
  its active proxies' ids) round-trips; format 2 (the shard's record before the ids) and a truncated record, or one
  whose ids disagree with its header's count, are decode errors that say what is wrong;
- the property: the same event log (test_streams_sharded.py's) counted once for the pool and once per shard gives
  every entitlement the same row (in the record of the shard that owns it), the same pool in flight and the same
  pool active proxies (the distinct ids over the shards: a proxy active in two shards counted once), and a proxy
  following the shards' records sets the same limits, buckets and pool concurrency as one following the pool's one
  record.
"""

from __future__ import annotations

import dataclasses
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_streams_sharded import ENTITLEMENTS, POOL, PROXIES, event_logs

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.admission.pools import FleetOptions, PoolRuntime, UpdateResult
from tokenpools.streams.counts.fleet_counts import FleetCounts, Rate
from tokenpools.topics.counts import CountsRecord, decode_counts, encode_counts, owned, pool_active_of
from tokenpools.topics.records import RequestCompleted, RequestDecided
from tokenpools.topics.shards import shard_of
from tokenpools_dev.proxy.doubles import limit_update

BASE_MS = 1_700_000_000_000


def test_a_one_shard_record_is_format_1_byte_for_byte() -> None:
    record = CountsRecord("pool-a", 7, BASE_MS, 9, 3, 4, (5, 4), (2, 1), (1200, -30))
    expected = (struct.pack("<BQQIIIHH", 1, 7, BASE_MS, 2, 9, 3, 4, 6) + b"pool-a"
                + struct.pack("<2I", 5, 4) + struct.pack("<2H", 2, 1) + struct.pack("<2i", 1200, -30))
    assert encode_counts(record) == expected
    assert decode_counts(expected) == record


HEADER = struct.calcsize("<BQQIIIHH")


def test_a_shard_record_is_format_3_and_round_trips() -> None:
    ids = ("tokenpools-proxy-7c9d8f6b5-x2k4j-1", "tokenpools-proxy-7c9d8f6b5-zq8wd-1", "zeta")
    record = CountsRecord("pool-a", 7, BASE_MS, 9, 3, 4, (5,), (2,), (1200,), shard=2, shards=3, active_proxies=ids)
    data = encode_counts(record)
    assert data[0] == 3 and struct.unpack_from("<HH", data, HEADER) == (2, 3)
    # the header (pool active: the number of ids), shard and shards, the name, the arrays, then the ids front-coded:
    # (bytes shared with the previous id, bytes of the rest, the rest); the second shares 27 bytes with the first
    assert data == (struct.pack("<BQQIIIHH", 3, 7, BASE_MS, 1, 9, 3, 4, 6) + struct.pack("<HH", 2, 3) + b"pool-a"
                     + struct.pack("<I", 5) + struct.pack("<H", 2) + struct.pack("<i", 1200)
                     + bytes([0, 34]) + ids[0].encode() + bytes([27, 7]) + b"zq8wd-1" + bytes([0, 4]) + b"zeta")
    assert decode_counts(data) == record
    assert decode_counts(encode_counts(dataclasses.replace(record, in_flight=(), active=(), bucket_tokens=()))) \
        .shard == 2  # a shard owning none of the pool's entitlements still reports its subtotal
    idle = dataclasses.replace(record, pool_active=0, active_proxies=())
    assert decode_counts(encode_counts(idle)) == idle  # no active proxy: no ids
    long_ids = ("p" * 300 + "a", "p" * 300 + "b", "é" * 200)  # lengths past one varint byte, non-ASCII
    wide = dataclasses.replace(record, active_proxies=long_ids)
    assert decode_counts(encode_counts(wide)) == wide


def test_bad_shard_records_are_clear_errors() -> None:
    ids = ("proxy-a", "proxy-b", "proxy-c")
    record = CountsRecord("pool-a", 7, BASE_MS, 9, 3, 4, (5,), (2,), (1200,), shard=2, shards=3, active_proxies=ids)
    data = encode_counts(record)
    cut_short = "too short|truncated|has .* bytes|names [0-2] active proxies, its header 3"
    for cut in range(1, len(data)):  # every truncation
        with pytest.raises(ValueError, match=cut_short):
            decode_counts(data[:cut])
    bad = bytearray(data)
    struct.pack_into("<HH", bad, HEADER, 3, 3)  # shard 3 of 3
    with pytest.raises(ValueError, match="shard 3 of 3"):
        decode_counts(bytes(bad))
    for count, message in ((4, "names 3 active proxies, its header 4"), (2, "more active proxies than its 2"),
                           (0, "more active proxies than its 0")):  # the header's count and the ids disagree
        bad = bytearray(data)
        struct.pack_into("<I", bad, 25, count)  # the header's pool active (u32 after format, version, t_ms, E, N)
        with pytest.raises(ValueError, match=message):
            decode_counts(bytes(bad))
    unsorted = data[:-len(b"\x05\x01c")] + b"\x00\x07proxy-a"  # the third id repeats the first
    with pytest.raises(ValueError, match="not sorted and distinct"):
        decode_counts(unsorted)
    with pytest.raises(ValueError, match="truncated"):
        decode_counts(data[:-3] + b"\x09\x01c")  # shares more bytes than the previous id has
    with pytest.raises(ValueError, match="not UTF-8"):
        decode_counts(data[:-3] + b"\x05\x01\xff")
    old = bytearray(data[:HEADER + 4 + len("pool-a") + 10])  # the layout format 2 had: no ids
    old[0] = 2
    with pytest.raises(ValueError, match="format 2: a shard's record without its active proxies' ids"):
        decode_counts(bytes(old))
    with pytest.raises(ValueError, match="format 4"):
        decode_counts(bytes([4]) + data[1:])
    with pytest.raises(ValueError):
        CountsRecord("pool-a", 7, BASE_MS, 0, 0, 1, (), (), (), shard=1, shards=1)
    with pytest.raises(ValueError, match="2 active proxies' ids for `pool_active` 3"):
        dataclasses.replace(record, active_proxies=ids[:2])
    with pytest.raises(ValueError, match="sorted and distinct"):
        dataclasses.replace(record, active_proxies=("b", "a", "c"))
    with pytest.raises(ValueError, match="one-shard record carries no proxy ids"):
        CountsRecord("pool-a", 7, BASE_MS, 0, 1, 1, (), (), (), active_proxies=("a",))


def test_the_ids_cost_about_eight_bytes_per_proxy_of_one_deployment() -> None:
    """The size docs/scaling.md states: P = 200 replicas of one Deployment, ids ``<pod name>-<pid>`` (34 bytes,
    27 of them the Deployment's and ReplicaSet's prefix), all active in one shard."""
    rng = random.Random(7)
    ids = tuple(sorted({"tokenpools-proxy-7c9d8f6b5-" + "".join(rng.choice("bcdfghjklmnpqrstvwxz2456789")
                                                                 for _ in range(5)) + "-1" for _ in range(200)}))
    assert len(ids) == 200
    rows = (0,) * 100
    without = CountsRecord("pool", 1, BASE_MS, 0, 0, 200, rows, rows, rows, shard=0, shards=2)
    data = encode_counts(dataclasses.replace(without, pool_active=200, active_proxies=ids))
    assert len(encode_counts(without)) == 1_041 and len(data) - 1_041 == 1_630  # 8.15 B per proxy, not 34
    assert decode_counts(data).active_proxies == ids


@given(st.lists(st.text(min_size=1, max_size=40), max_size=30, unique=True), st.integers(2, 5))
def test_any_ids_round_trip(ids: list[str], shards: int) -> None:
    record = CountsRecord("pool-a", 7, BASE_MS, 0, len(ids), 9, (), (), (), shard=shards - 1, shards=shards,
                          active_proxies=tuple(sorted(ids)))
    assert decode_counts(encode_counts(record)) == record


def test_owned_keeps_the_update_order() -> None:
    names = sorted(ENTITLEMENTS)
    for shards in (1, 2, 3, 4):
        parts = [owned(names, k, shards) for k in range(shards)]
        assert sorted(n for part in parts for n in part) == names
        assert all(part == sorted(part) for part in parts)


RATES = {name: Rate(20.0 + 10 * i, (20.0 + 10 * i) * 10) for i, name in enumerate(ENTITLEMENTS)}
SPECS = [EntitlementSpec(name, POOL, ServiceClass.GUARANTEED, 1000, Capacity(rate.tokens_per_s, 1e9, 4))
         for name, rate in RATES.items()]
FLEET = FleetOptions(counts_ttl_s=2.0, growth_fraction=2.0, demand_window_ms=1_000)


def _counts(events: list[RequestDecided | RequestCompleted], t_ms: int, live: set[str], shard: int,
            shards: int) -> CountsRecord:
    book = FleetCounts(POOL, FLEET.demand_window_ms)
    book.note(e for e in events
              if shards == 1 or (e.entitlement is not None and shard_of(e.entitlement, shards) == shard))
    book.advance(t_ms, RATES)
    return book.record(1, sorted(RATES), RATES, live, len(live), shard, shards)


def _runtime(shards: int, events: list[RequestDecided | RequestCompleted], t_ms: int) -> PoolRuntime:
    """A proxy ("proxy-1") of the pool that did its events of the log before ``t_ms`` and holds update 1."""
    rt = PoolRuntime(PoolSpec(POOL, "m", Capacity(1000, 1e10, 12), shards=shards), SPECS, proxy_id=PROXIES[0],
                     ttl_s=30, retry_after_s=1, now_s=0.0, wall_s=BASE_MS / 1000, fleet=FLEET)
    for e in sorted(events, key=lambda e: e.t_ms):
        if e.proxy_id != PROXIES[0] or e.t_ms >= t_ms + 50 or e.entitlement is None:
            continue
        if isinstance(e, RequestCompleted):
            rt.own.released(e.entitlement, e.t_ms, e.reserved_tokens - e.prompt_tokens - e.completion_tokens)
        elif e.outcome is AdmissionOutcome.ADMITTED:
            rt.own.admitted(e.entitlement, e.t_ms, e.cost_tokens)
        else:
            rt.own.refused(e.entitlement, e.t_ms, e.cost_tokens)
    limits = {n: (4, r.tokens_per_s, 1e9, 900.0) for n, r in RATES.items()}
    assert rt.apply_update(limit_update(POOL, 1, t_ms, limits, 12, ()), 0.0, t_ms) is UpdateResult.APPLIED
    return rt


@settings(max_examples=60, deadline=None)
@given(event_logs(), st.sampled_from([2, 3, 4]), st.integers(BASE_MS, BASE_MS + 9_000),
       st.sets(st.sampled_from(PROXIES), min_size=1))
def test_a_proxy_summing_the_shards_sees_the_pools_counts(log, shards, t_ms, live) -> None:
    events = [r for r, _ in log[0] if isinstance(r, (RequestDecided, RequestCompleted))]
    whole = decode_counts(encode_counts(_counts(events, t_ms, live, 0, 1)))
    parts = [decode_counts(encode_counts(_counts(events, t_ms, live, k, shards))) for k in range(shards)]
    names = sorted(RATES)
    row = {n: (whole.in_flight[i], whole.active[i], whole.bucket_tokens[i]) for i, n in enumerate(names)}
    for k, part in enumerate(parts):
        for i, n in enumerate(owned(names, k, shards)):
            assert (part.in_flight[i], part.active[i], part.bucket_tokens[i]) == row[n]
    assert sum(p.pool_in_flight for p in parts) == whole.pool_in_flight
    assert pool_active_of(parts) == whole.pool_active  # distinct ids: a proxy active in two shards counts once
    assert all(p.pool_active == len(p.active_proxies) for p in parts)

    one, many = _runtime(1, events, t_ms), _runtime(shards, events, t_ms)
    assert one.apply_counts(whole, 0.05, t_ms + 50) is UpdateResult.APPLIED
    for part in parts:
        assert many.apply_counts(part, 0.05, t_ms + 50) is UpdateResult.APPLIED
    assert many.counts is not None and many.fleet_size == one.fleet_size
    for n in names:
        assert many.controller.limits_of(n) == one.controller.limits_of(n)
        assert many.controller.bucket_tokens_of(n, 0.05) == one.controller.bucket_tokens_of(n, 0.05)
    assert many.controller.pool_concurrency == one.controller.pool_concurrency
