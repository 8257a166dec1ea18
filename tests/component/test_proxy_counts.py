"""A proxy following the fleet's counts (proxy/admission/pools.py ``apply_counts``, proxy/admission/own_ledger.py, core/fleet.py).

- one proxy that follows counts decides as the exact enforcer: its share is the whole limit, its bucket is its own;
- with several, a proxy holds its own in flight at the counts instant plus a bounded growth, and its bucket is
  lowered to its budget plus the refill since the instant less what it spent since;
- counts that are stale, expired on arrival, or in the order of an update it does not hold are not followed; when
  they stop coming the update's shares take over; another pool's records are never decoded.
"""

from __future__ import annotations

import pytest

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.inputs.limits_consumer import LimitsApplier
from tokenpools.proxy.observability.metrics import ProxyMetrics
from tokenpools.proxy.admission.own_ledger import OwnLedger
from tokenpools.proxy.admission.pools import FleetOptions, PoolRuntime, UpdateResult
from tokenpools.runtime.clock import FakeClock
from tokenpools.topics.codec import encode
from tokenpools.topics.counts import CountsRecord, encode_counts
from tokenpools_dev.proxy.doubles import limit_update

pytestmark = pytest.mark.component

POOL = PoolSpec("pool-a", "fake-model", Capacity(1000, 1e10, 16))
ENTS = [EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(300, 3e9, 8)),
        EntitlementSpec("spot", "pool-a", ServiceClass.SPOT, 30000)]
FLEET = FleetOptions(counts_ttl_s=2.0, growth_fraction=2.0, demand_window_ms=1_000)


def setup(clock: FakeClock) -> tuple[PoolRuntime, LimitsApplier]:
    rt = PoolRuntime(POOL, ENTS, proxy_id="p1", ttl_s=30, retry_after_s=1, now_s=clock.now_s(),
                     wall_s=clock.wall_ms() / 1000, fleet=FLEET)
    applier = LimitsApplier({"pool-a": rt}, ProxyMetrics(), clock)
    limits = {"gold": (8, 300.0, 3e9, 900.0), "spot": (4, 700.0, 7e9, 1.0)}
    assert applier.handle(encode(limit_update("pool-a", 5, clock.wall_ms(), limits, 16, ()))) == "applied"
    return rt, applier


def counts(clock: FakeClock, t_ms: int, gold: tuple[int, int, int], spot: tuple[int, int, int] = (0, 0, 7000),
           proxies: int = 4, version: int = 5, pool: tuple[int, int] = (0, 0)) -> bytes:
    return encode_counts(CountsRecord("pool-a", version, t_ms, pool[0], pool[1], proxies, (gold[0], spot[0]),
                                      (gold[1], spot[1]), (gold[2], spot[2])))


def test_one_proxy_following_counts_holds_the_whole_limit() -> None:
    clock = FakeClock()
    rt, applier = setup(clock)
    for i in range(3):
        assert rt.controller.admit("gold", f"r{i}", 10, 10, clock.now_s()).admitted
        rt.own.admitted("gold", clock.wall_ms() - 1, 20)
    record = counts(clock, clock.wall_ms(), (3, 1, 2940), proxies=1, pool=(3, 1))
    assert applier.handle_counts(record, key=b"pool-a") == UpdateResult.APPLIED
    assert rt.controller.limits_of("gold").concurrency == 8  # own 3 + the whole headroom 5
    assert rt.controller.pool_concurrency == 16


def test_with_several_proxies_a_proxy_holds_its_own_plus_a_bounded_growth() -> None:
    clock = FakeClock()
    rt, applier = setup(clock)
    t = clock.wall_ms()
    rt.own.admitted("gold", t - 5, 20)  # one of mine at the instant
    clock.advance(0.2)
    rt.own.admitted("gold", clock.wall_ms() - 1, 20)  # one more since: counted as mine, not in the fleet's 6
    # fleet: 6 in flight of 8 (H = 2) among 3 active proxies; I was one of them: g = min(2, max(1, ⌈2·2/3⌉)) = 2
    assert applier.handle_counts(counts(clock, t, (6, 3, 1000)), key=b"pool-a") == UpdateResult.APPLIED
    assert rt.controller.limits_of("gold").concurrency == 1 + 2
    # the bucket: budget min(B, max(R, f·B/A)) = min(1000, max(R, 666.7)), plus 0.2 s × 300 refill, less 20 spent
    expected = min(1000, max(rt.own.largest_reservation_tokens, rt.pool.default_max_tokens, 2 * 1000 / 3)) + 60 - 20
    assert rt.controller.bucket_tokens_of("gold", clock.now_s()) == pytest.approx(expected)


def test_a_fleet_over_the_limit_drains_instead_of_refilling_what_ends() -> None:
    """Capacity lost: the pool holds 12 (all mine) against 8 slots. My pool share is 8, not my 12 in flight, so a
    request that ends is not replaced while the pool is over; one of two proxies holding half gets half."""
    clock = FakeClock()
    rt, applier = setup(clock)
    for i in range(12):
        rt.own.admitted("spot", clock.wall_ms() - 5, 10)
    rt._pool_capacity = 8  # as an update after the outage says  # noqa: SLF001
    applier.handle_counts(counts(clock, clock.wall_ms(), (0, 0, 0), (12, 1, 0), proxies=1, pool=(12, 1)),
                          key=b"pool-a")
    assert rt.controller.pool_concurrency == 8
    applier.handle_counts(counts(clock, clock.wall_ms() + 1, (0, 0, 0), (24, 2, 0), proxies=2, pool=(24, 2)),
                          key=b"pool-a")
    assert rt.controller.pool_concurrency == 12 * 8 // 24


def test_counts_not_to_follow_and_counts_that_stop() -> None:
    clock = FakeClock()
    rt, applier = setup(clock)
    t = clock.wall_ms()
    assert applier.handle_counts(counts(clock, t - 3_000, (0, 0, 0)), key=b"pool-a") == UpdateResult.EXPIRED
    assert applier.handle_counts(counts(clock, t, (0, 0, 0), version=4), key=b"pool-a") == \
        UpdateResult.UNKNOWN_VERSION
    assert applier.handle_counts(counts(clock, t, (8, 4, 0)), key=b"pool-a") == UpdateResult.APPLIED
    assert rt.controller.limits_of("gold").concurrency == 0  # the fleet holds all 8, none of them mine
    assert applier.handle_counts(counts(clock, t, (0, 0, 0)), key=b"pool-a") == UpdateResult.STALE
    assert applier.handle_counts(b"garbage", key=b"pool-b") == UpdateResult.UNKNOWN_POOL  # not even decoded
    assert applier.handle_counts(b"garbage", key=b"pool-a") is None  # ours, undecodable: dead-lettered
    assert applier.metrics.limit_records_invalid == 1
    clock.advance(FLEET.counts_ttl_s + 0.5)
    applier.check_ttl()
    assert rt.counts is None and applier.metrics.counts_fallbacks == {"pool-a": 1}
    assert rt.controller.limits_of("gold").concurrency == 2  # the update's 8, divided among the 4 live proxies
    rt.fall_back(clock.now_s())  # and the static limits after the limits TTL: divided the same way
    assert rt.controller.limits_of("gold").concurrency == 2 and rt.controller.pool_concurrency == 16 // 4


def test_the_ledger_answers_for_any_recent_instant() -> None:
    ledger = OwnLedger(demand_window_ms=1_000, horizon_ms=2_000)
    ledger.admitted("a", 1_000, 50)
    ledger.refused("b", 1_100, 30)
    ledger.admitted("a", 1_500, 40)
    ledger.released("a", 1_600, 15)  # reserved 50, used 35
    at = ledger.at(1_200)
    assert at.in_flight == {"a": 1} and at.active == {"a", "b"} and at.pool_in_flight == 1
    assert at.spent_since == {"a": 40 - 15}
    later = ledger.at(2_700)  # b's refusal left the demand window; a still holds one
    assert later.in_flight == {"a": 1} and later.active == {"a"}
