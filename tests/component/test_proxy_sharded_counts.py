"""A proxy following a sharded pool's counts (proxy/admission/pools.py ``apply_counts``; docs/scaling.md step 4): one record
per shard, each with its own entitlements' rows and its subtotal of the pool's row.

- with a fresh record of every shard it admits and refuses exactly as a proxy of the unsharded pool following the
  one record built from the same counts; with one shard's record alone it follows nothing yet;
- the pool's active proxies are the distinct ids over the shards' records: a proxy active in both shards is counted
  once, so the pool's concurrency is the unsharded proxy's, not the smaller one a summed count would give;
- a shard's record of the format before the ids (2) is a malformed record: dead-lettered, never followed;
- each shard's record is judged as a single record is (stale, expired on arrival, another sharding's arrays), and
  one shard whose records stop stops the following after ``counts_ttl_s``, the other shard's records regardless.
"""

from __future__ import annotations

import dataclasses

import pytest

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.inputs.limits_consumer import LimitsApplier
from tokenpools.proxy.observability.metrics import ProxyMetrics
from tokenpools.proxy.admission.pools import FleetOptions, PoolRuntime, UpdateResult
from tokenpools.runtime.clock import FakeClock
from tokenpools.topics.codec import encode
from tokenpools.topics.counts import counts_record, encode_counts
from tokenpools.topics.records import DeadLetterReason
from tokenpools.topics.shards import shard_of
from tokenpools_dev.proxy.doubles import limit_update

pytestmark = pytest.mark.component

POOL = PoolSpec("pool-a", "fake-model", Capacity(1000, 1e10, 16))
ENTS = [EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(300, 3e9, 8)),
        EntitlementSpec("echo", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(300, 3e9, 8))]
NAMES = ("echo", "gold")  # the update's order (sorted)
FLEET = FleetOptions(counts_ttl_s=2.0, growth_fraction=2.0, demand_window_ms=1_000)


def setup(clock: FakeClock, shards: int, pool_concurrency: int = 10) -> tuple[PoolRuntime, LimitsApplier]:
    rt = PoolRuntime(dataclasses.replace(POOL, shards=shards), ENTS, proxy_id="p1", ttl_s=30, retry_after_s=1,
                     now_s=clock.now_s(), wall_s=clock.wall_ms() / 1000, fleet=FLEET)
    applier = LimitsApplier({"pool-a": rt}, ProxyMetrics(), clock)
    limits = {"gold": (8, 300.0, 3e9, 900.0), "echo": (6, 200.0, 3e9, 900.0)}
    update = limit_update("pool-a", 5, clock.wall_ms(), limits, pool_concurrency, ())
    assert applier.handle(encode(update)) == "applied"
    return rt, applier


# the fleet's counts at one instant: per entitlement (in flight, active proxies' ids, bucket), per shard the pool's
IN_FLIGHT, BUCKET = {"gold": 5, "echo": 2}, {"gold": 900.0, "echo": 40.0}
ACTIVE = {"gold": ("p1", "p2", "p3"), "echo": ("p4",)}  # each proxy active in one shard
OVERLAPPING = {"gold": ("p1", "p2", "p3"), "echo": ("p2",)}  # p2 active in both shards


def record(t_ms: int, shard: int, shards: int, version: int = 5,
           active: dict[str, tuple[str, ...]] = ACTIVE) -> bytes:
    """The record of ``shard`` (the whole pool when ``shards`` is 1): its entitlements' rows and its subtotal of the
    pool's row, with its active proxies' ids."""
    mine = [n for n in NAMES if shards == 1 or shard_of(n, shards) == shard]
    ids = {p for n in mine for p in active[n]}
    return encode_counts(counts_record("pool-a", version, t_ms, NAMES, in_flight={n: IN_FLIGHT[n] for n in mine},
                                       active={n: len(active[n]) for n in mine},
                                       bucket_tokens={n: BUCKET[n] for n in mine},
                                       pool_in_flight=sum(IN_FLIGHT[n] for n in mine), pool_active=len(ids),
                                       proxies=4, shard=shard, shards=shards, active_proxies=ids))


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


def test_a_proxy_active_in_both_shards_is_counted_once() -> None:
    clock = FakeClock()
    one, one_applier = setup(clock, 1, pool_concurrency=16)
    two, two_applier = setup(clock, 2, pool_concurrency=16)
    summed, summed_applier = setup(clock, 1, pool_concurrency=16)  # the pool's row with p2 counted twice
    for rt in (one, two, summed):
        rt.own.admitted("gold", clock.wall_ms() - 5, 20)
    t = clock.wall_ms()
    clock.advance(0.1)
    assert one_applier.handle_counts(record(t, 0, 1, active=OVERLAPPING), key=b"pool-a") == UpdateResult.APPLIED
    for shard in (0, 1):
        assert two_applier.handle_counts(record(t, shard, 2, active=OVERLAPPING),
                                         key=b"pool-a") == UpdateResult.APPLIED
    twice = counts_record("pool-a", 5, t, NAMES, in_flight=IN_FLIGHT,
                          active={n: len(OVERLAPPING[n]) for n in NAMES}, bucket_tokens=BUCKET,
                          pool_in_flight=sum(IN_FLIGHT.values()),
                          pool_active=sum(len(ids) for ids in OVERLAPPING.values()), proxies=4)
    assert summed_applier.handle_counts(encode_counts(twice), key=b"pool-a") == UpdateResult.APPLIED
    assert two.counts is not None
    assert two.controller.pool_concurrency == one.controller.pool_concurrency
    assert two.controller.pool_concurrency > summed.controller.pool_concurrency  # the count matters here
    now = clock.now_s()
    for name in NAMES:
        assert two.controller.limits_of(name) == one.controller.limits_of(name)
        assert two.controller.bucket_tokens_of(name, now) == one.controller.bucket_tokens_of(name, now)


def test_a_shard_record_without_ids_is_dead_lettered() -> None:
    clock = FakeClock()
    rt, applier = setup(clock, 2)
    t = clock.wall_ms()
    new = record(t, 0, 2)
    rows_end = len(new) - sum(2 + len(p) for p in ("p1", "p2", "p3"))  # shard 0 holds gold here: 3 ids
    old = bytearray(new[:rows_end])  # format 2's layout: the same header and rows, no ids
    old[0] = 2
    assert applier.handle_counts(bytes(old), key=b"pool-a") is None
    assert applier.dead_letters.counts == {DeadLetterReason.MALFORMED: 1}
    assert rt.counts is None and not rt._shard_counts  # noqa: SLF001 - nothing taken
    assert applier.handle_counts(new, key=b"pool-a") == UpdateResult.APPLIED
