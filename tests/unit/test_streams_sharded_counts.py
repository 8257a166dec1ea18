"""A sharded pool's counts (docs/scaling.md step 4): format 2 of the counts record (topics/counts.py), one
``FleetCounts`` per shard (streams/fleet_counts.py), and a proxy combining the shards' records (proxy/pools.py).

- format 1 is what a one-shard pool writes, byte for byte the layout it always had; both formats round-trip;
- the property: the same event log (test_streams_sharded.py's) counted once for the pool and once per shard gives
  every entitlement the same row (in the record of the shard that owns it) and the same pool in flight; the pool's
  active proxies summed over shards count a proxy active in two shards twice (never fewer than the pool's), and a
  proxy following the shards' records sets the same limits and buckets as one following the pool's one record
  (the same pool concurrency when no proxy was active in two shards, never more otherwise).
"""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_streams_sharded import ENTITLEMENTS, POOL, PROXIES, event_logs

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.pools import FleetOptions, PoolRuntime, UpdateResult
from tokenpools.streams.fleet_counts import FleetCounts, Rate
from tokenpools.topics.counts import CountsRecord, decode_counts, encode_counts, owned
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


def test_a_shard_record_is_format_2_and_round_trips() -> None:
    record = CountsRecord("pool-a", 7, BASE_MS, 9, 3, 4, (5,), (2,), (1200,), shard=2, shards=3)
    data = encode_counts(record)
    assert data[0] == 2 and struct.unpack_from("<HH", data, struct.calcsize("<BQQIIIHH")) == (2, 3)
    assert decode_counts(data) == record
    assert decode_counts(encode_counts(dataclasses.replace(record, in_flight=(), active=(), bucket_tokens=()))) \
        .shard == 2  # a shard owning none of the pool's entitlements still reports its subtotal
    with pytest.raises(ValueError):
        decode_counts(data[:-1])
    bad = bytearray(data)
    struct.pack_into("<HH", bad, struct.calcsize("<BQQIIIHH"), 3, 3)  # shard 3 of 3
    with pytest.raises(ValueError):
        decode_counts(bytes(bad))
    with pytest.raises(ValueError):
        CountsRecord("pool-a", 7, BASE_MS, 0, 0, 1, (), (), (), shard=1, shards=1)


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
    summed_active = sum(p.pool_active for p in parts)
    assert max(p.pool_active for p in parts) <= whole.pool_active <= summed_active

    one, many = _runtime(1, events, t_ms), _runtime(shards, events, t_ms)
    assert one.apply_counts(whole, 0.05, t_ms + 50) is UpdateResult.APPLIED
    for part in parts:
        assert many.apply_counts(part, 0.05, t_ms + 50) is UpdateResult.APPLIED
    assert many.counts is not None and many.fleet_size == one.fleet_size
    for n in names:
        assert many.controller.limits_of(n) == one.controller.limits_of(n)
        assert many.controller.bucket_tokens_of(n, 0.05) == one.controller.bucket_tokens_of(n, 0.05)
    if summed_active == whole.pool_active:
        assert many.controller.pool_concurrency == one.controller.pool_concurrency
    else:  # a proxy counted in two shards: each proxy's growth only shrinks
        assert many.controller.pool_concurrency <= one.controller.pool_concurrency
