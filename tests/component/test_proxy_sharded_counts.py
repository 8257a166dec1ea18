"""A proxy following a sharded pool's counts (proxy/pools.py ``apply_counts``; docs/scaling.md step 4): one record
per shard, each with its own entitlements' rows and its subtotal of the pool's row.

- with a fresh record of every shard it admits and refuses exactly as a proxy of the unsharded pool following the
  one record built from the same counts; with one shard's record alone it follows nothing yet;
- each shard's record is judged as a single record is (stale, expired on arrival, another sharding's arrays), and
  one shard whose records stop stops the following after ``counts_ttl_s``, the other shard's records regardless.
"""

from __future__ import annotations

import dataclasses

import pytest

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.limits_consumer import LimitsApplier
from tokenpools.proxy.metrics import ProxyMetrics
from tokenpools.proxy.pools import FleetOptions, PoolRuntime, UpdateResult
from tokenpools.runtime.clock import FakeClock
from tokenpools.topics.codec import encode
from tokenpools.topics.counts import counts_record, encode_counts
from tokenpools.topics.shards import shard_of
from tokenpools_dev.proxy.doubles import limit_update

pytestmark = pytest.mark.component

POOL = PoolSpec("pool-a", "fake-model", Capacity(1000, 1e10, 16))
ENTS = [EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(300, 3e9, 8)),
        EntitlementSpec("echo", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(300, 3e9, 8))]
NAMES = ("echo", "gold")  # the update's order (sorted)
FLEET = FleetOptions(counts_ttl_s=2.0, growth_fraction=2.0, demand_window_ms=1_000)


def setup(clock: FakeClock, shards: int) -> tuple[PoolRuntime, LimitsApplier]:
    rt = PoolRuntime(dataclasses.replace(POOL, shards=shards), ENTS, proxy_id="p1", ttl_s=30, retry_after_s=1,
                     now_s=clock.now_s(), wall_s=clock.wall_ms() / 1000, fleet=FLEET)
    applier = LimitsApplier({"pool-a": rt}, ProxyMetrics(), clock)
    limits = {"gold": (8, 300.0, 3e9, 900.0), "echo": (6, 200.0, 3e9, 900.0)}
    assert applier.handle(encode(limit_update("pool-a", 5, clock.wall_ms(), limits, 10, ()))) == "applied"
    return rt, applier


# the fleet's counts at one instant: per entitlement (in flight, active proxies, bucket), per shard the pool's row
IN_FLIGHT, ACTIVE, BUCKET = {"gold": 5, "echo": 2}, {"gold": 3, "echo": 1}, {"gold": 900.0, "echo": 40.0}


def record(t_ms: int, shard: int, shards: int, version: int = 5) -> bytes:
    """The record of ``shard`` (the whole pool when ``shards`` is 1): its entitlements' rows and its subtotal of the
    pool's row (each proxy active in one shard here, so the subtotals of active proxies add up exactly)."""
    mine = [n for n in NAMES if shards == 1 or shard_of(n, shards) == shard]
    return encode_counts(counts_record("pool-a", version, t_ms, NAMES, {n: IN_FLIGHT[n] for n in mine},
                                       {n: ACTIVE[n] for n in mine}, {n: BUCKET[n] for n in mine},
                                       sum(IN_FLIGHT[n] for n in mine), sum(ACTIVE[n] for n in mine), 4, shard,
                                       shards))


def test_the_entitlements_are_on_both_shards() -> None:
    assert {shard_of(n, 2) for n in NAMES} == {0, 1}


def test_a_proxy_following_two_shards_admits_and_refuses_as_with_one_record() -> None:
    clock = FakeClock()
    one, one_applier = setup(clock, 1)
    two, two_applier = setup(clock, 2)
    for rt in (one, two):
        rt.own.admitted("gold", clock.wall_ms() - 5, 20)  # one of mine at the instant
    t = clock.wall_ms()
    clock.advance(0.1)
    assert one_applier.handle_counts(record(t, 0, 1), key=b"pool-a") == UpdateResult.APPLIED
    assert two_applier.handle_counts(record(t, 1, 2), key=b"pool-a") == UpdateResult.APPLIED
    assert two.counts is None  # one shard's record alone: nothing followed yet, the update's shares hold
    assert two_applier.handle_counts(record(t, 0, 2), key=b"pool-a") == UpdateResult.APPLIED
    assert two.counts is not None and two.fleet_size == one.fleet_size == 4
    now = clock.now_s()
    for name in NAMES:
        assert two.controller.limits_of(name) == one.controller.limits_of(name)
        assert two.controller.bucket_tokens_of(name, now) == one.controller.bucket_tokens_of(name, now)
    assert two.controller.pool_concurrency == one.controller.pool_concurrency
    decisions: dict[str, list[list[bool]]] = {"one": [], "two": []}
    for label, rt in (("one", one), ("two", two)):
        for name in NAMES:
            decisions[label].append([rt.controller.admit(name, f"{name}{i}", 10, 10, now).admitted
                                     for i in range(8)])
    assert decisions["one"] == decisions["two"]
    assert any(not ok for row in decisions["two"] for ok in row)  # the counts bind: some are refused


def test_each_shard_is_judged_as_a_single_record_is() -> None:
    clock = FakeClock()
    rt, applier = setup(clock, 2)
    t = clock.wall_ms()
    assert applier.handle_counts(record(t - 3_000, 0, 2), key=b"pool-a") == UpdateResult.EXPIRED
    assert applier.handle_counts(record(t, 0, 2, version=4), key=b"pool-a") == UpdateResult.UNKNOWN_VERSION
    assert applier.handle_counts(record(t, 0, 3), key=b"pool-a") == UpdateResult.UNKNOWN_VERSION  # other sharding
    assert applier.handle_counts(record(t, 0, 1), key=b"pool-a") == UpdateResult.UNKNOWN_VERSION  # a v1 record
    assert applier.handle_counts(record(t, 0, 2), key=b"pool-a") == UpdateResult.APPLIED
    assert applier.handle_counts(record(t, 0, 2), key=b"pool-a") == UpdateResult.STALE
    assert applier.handle_counts(record(t, 1, 2), key=b"pool-a") == UpdateResult.APPLIED  # per shard: not stale
    assert rt.counts is not None


def test_one_shard_that_stops_stops_the_following() -> None:
    clock = FakeClock()
    rt, applier = setup(clock, 2)
    t = clock.wall_ms()
    applier.handle_counts(record(t, 0, 2), key=b"pool-a")
    applier.handle_counts(record(t, 1, 2), key=b"pool-a")
    assert rt.counts is not None
    for step in range(1, 26):  # shard 0 keeps coming every 0.1 s; shard 1 is silent
        clock.advance(0.1)
        applier.handle_counts(record(t + 100 * step, 0, 2), key=b"pool-a")
        applier.check_ttl()
    assert rt.counts is None and applier.metrics.counts_fallbacks == {"pool-a": 1}
    assert rt.controller.limits_of("gold").concurrency == 2  # the update's 8, divided among the 4 live proxies
    applier.handle_counts(record(clock.wall_ms(), 0, 2), key=b"pool-a")
    assert rt.counts is None  # shard 1 is still missing: not followed
    applier.handle_counts(record(clock.wall_ms(), 1, 2), key=b"pool-a")
    assert rt.counts is not None  # both fresh again
