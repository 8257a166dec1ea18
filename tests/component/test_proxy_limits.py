"""Limits in force: static at start, updates applied by version, stale and expired ones ignored, TTL fallback to
static limits (never unlimited), per-proxy shares, and the effect on what is admitted."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import aiohttp
import pytest

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.app import build_app
from tokenpools.proxy.inputs.limits_consumer import LimitsApplier
from tokenpools.proxy.observability.metrics import ProxyMetrics
from tokenpools.proxy.admission.pools import LimitsSource, PoolRuntime
from tokenpools.runtime.clock import FakeClock
from tokenpools.topics.codec import decode, encode
from tokenpools.topics.limits import paginate
from tokenpools.topics.records import LimitUpdate, ProxyShare
from tokenpools_dev.proxy.doubles import (
    FakeBackend, ProducerHub, limit_update, offline_options, proxy_config, running)

pytestmark = pytest.mark.component

POOL = PoolSpec("pool-a", "fake-model", Capacity(1000, 1e10, 8))
ENTS = [
    EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(300, 3e9, 3)),
    EntitlementSpec("spot", "pool-a", ServiceClass.SPOT, 30000),
]
TTL = 30.0


def runtime(clock: FakeClock, proxy_id: str = "p1") -> PoolRuntime:
    return PoolRuntime(POOL, ENTS, proxy_id=proxy_id, ttl_s=TTL, retry_after_s=1, now_s=clock.now_s(),
                       wall_s=clock.wall_ms() / 1000)


def applier(clock: FakeClock, rt: PoolRuntime) -> LimitsApplier:
    return LimitsApplier({"pool-a": rt}, ProxyMetrics(), clock)


def update(clock: FakeClock, version: int, gold_slots: int, age_s: float = 0.0,
           proxies: tuple[ProxyShare, ...] = ()) -> bytes:
    limits = {"gold": (gold_slots, 300.0, 3e9, 900.0), "spot": (5, 700.0, 7e9, 1.0)}
    return encode(limit_update("pool-a", version, clock.wall_ms() - int(age_s * 1000), limits, 8, proxies))


def test_static_limits_at_start_are_the_policy_without_measurement_never_unlimited() -> None:
    rt = runtime(FakeClock())
    gold, spot = rt.controller.limits_of("gold"), rt.controller.limits_of("spot")
    assert (gold.concurrency, gold.tokens_per_s) == (3, 300)  # the protected baseline
    assert spot.concurrency == 5 and spot.tokens_per_s == pytest.approx(700)  # what is left of the pool
    for lim in (gold, spot):
        assert all(math.isfinite(v) for v in (lim.tokens_per_s, lim.kv_bytes))
    assert rt.controller.pool_concurrency == 8
    assert rt.in_force.source is LimitsSource.STATIC and rt.in_force.version is None


def test_updates_apply_only_when_newer() -> None:
    clock = FakeClock()
    rt = runtime(clock)
    a = applier(clock, rt)
    assert a.handle(update(clock, 5, 2)) == "applied"
    assert rt.controller.limits_of("gold").concurrency == 2
    assert a.handle(update(clock, 4, 7)) == "stale"  # older
    assert a.handle(update(clock, 5, 7)) == "stale"  # replayed
    assert rt.controller.limits_of("gold").concurrency == 2 and rt.in_force.version == 5
    assert a.handle(update(clock, 6, 1)) == "applied"
    assert rt.controller.limits_of("gold").concurrency == 1
    assert a.metrics.limit_updates == {("pool-a", "applied"): 2, ("pool-a", "stale"): 2}


def test_another_pools_update_is_skipped_by_its_key_before_decoding() -> None:
    clock = FakeClock()
    rt = runtime(clock)
    a = applier(clock, rt)
    assert a.handle(b"not even json", key=b"pool-b") == "unknown_pool"  # never decoded: no dead letter
    assert a.metrics.limit_records_invalid == 0
    assert a.handle(update(clock, 5, 2), key=b"pool-a") == "applied"


def test_a_paged_update_applies_once_every_page_has_arrived() -> None:
    clock = FakeClock()
    rt = runtime(clock)
    a = applier(clock, rt)
    whole = decode(LimitUpdate, update(clock, 5, 2))
    pages = paginate(whole, page_bytes=200)  # one entitlement a page
    assert [k for k, _ in pages] == ["pool-a", "pool-a#1"]
    assert a.handle(encode(pages[1][1]), key=b"pool-a#1") == "incomplete"
    assert rt.in_force.version is None and rt.controller.limits_of("gold").concurrency == 3  # still static
    assert a.handle(encode(pages[0][1]), key=b"pool-a") == "applied"
    assert rt.in_force.version == 5 and rt.controller.limits_of("gold").concurrency == 2


def test_an_update_older_than_the_ttl_is_not_revived() -> None:
    clock = FakeClock()
    rt = runtime(clock)
    assert applier(clock, rt).handle(update(clock, 9, 1, age_s=TTL + 1)) == "expired"
    assert rt.in_force.source is LimitsSource.STATIC and rt.controller.limits_of("gold").concurrency == 3


def test_ttl_fallback_to_static_limits_and_recovery() -> None:
    clock = FakeClock()
    rt = runtime(clock)
    a = applier(clock, rt)
    assert rt.limits_version is None  # static at start
    a.handle(update(clock, 1, 1))
    clock.advance(TTL - 1)
    a.check_ttl()
    assert rt.in_force.source is LimitsSource.UPDATE and rt.limits_version == 1
    clock.advance(2)
    a.check_ttl()
    assert rt.in_force.source is LimitsSource.STATIC and rt.in_force.version == 1
    assert rt.limits_version is None  # what a decision records: no update is in force, though v1 is remembered
    assert rt.controller.limits_of("gold").concurrency == 3 and a.metrics.limit_fallbacks["pool-a"] == 1
    assert a.handle(update(clock, 1, 1)) == "stale"  # the version in force survives the fallback
    assert a.handle(update(clock, 2, 2)) == "applied"
    assert rt.in_force.source is LimitsSource.UPDATE and rt.controller.limits_of("gold").concurrency == 2
    assert rt.limits_version == 2


def test_each_proxy_takes_its_own_share_and_falls_back_to_a_share_of_static() -> None:
    clock = FakeClock()
    shares = (ProxyShare(proxy_id="p1", pool_concurrency=5, entitlements={"gold": (2, 200.0, 2e9), "spot": (3, 1, 1)}),
              ProxyShare(proxy_id="p2", pool_concurrency=3, entitlements={"gold": (1, 100.0, 1e9), "spot": (2, 1, 1)}))
    p1, p2, p3 = runtime(clock, "p1"), runtime(clock, "p2"), runtime(clock, "p3")
    for rt in (p1, p2, p3):
        applier(clock, rt).handle(update(clock, 1, 3, proxies=shares))
    assert (p1.controller.limits_of("gold").concurrency, p1.controller.pool_concurrency) == (2, 5)
    assert (p2.controller.limits_of("gold").concurrency, p2.controller.pool_concurrency) == (1, 3)
    assert p3.in_force.version is None  # not counted in yet: keeps its static limits
    clock.advance(TTL + 1)
    for rt in (p1, p2):
        rt.check_ttl(clock.now_s())
    # two proxies in fallback still enforce the pool's static limits between them, not twice over
    gold = [rt.controller.limits_of("gold") for rt in (p1, p2)]
    assert sum(g.concurrency for g in gold) == 3 and sum(g.tokens_per_s for g in gold) == pytest.approx(300)
    assert p1.controller.pool_concurrency + p2.controller.pool_concurrency == 8


def test_undecodable_records_are_counted_and_dead_lettered(tmp_path: Path) -> None:
    clock = FakeClock()
    rt = runtime(clock)
    hub_events: list[tuple[str, str, object]] = []

    class Sink:
        def emit(self, topic: str, key: str, record: object) -> None:
            hub_events.append((topic, key, record))

    a = LimitsApplier({"pool-a": rt}, ProxyMetrics(), clock, Sink(), "tp.dead-letters", "proxy/p1")  # type: ignore[arg-type]
    assert a.handle(b"{broken", "tp.limits", 2, 17, b"pool-a") is None
    assert a.handle(b'{"schema_version": 9, "record_type": "limit_update"}', "tp.limits", 0, 3) is None
    assert a.handle(None, "tp.limits", 0, 4) is None  # a tombstone
    assert a.metrics.limit_records_invalid == 2
    (topic, key, dead), (_, _, dead2) = hub_events
    assert topic == "tp.dead-letters" and key == "tp.limits"
    assert (dead.partition, dead.offset, dead.reason, dead.consumer) == (2, 17, "malformed", "proxy/p1")  # type: ignore[attr-defined]
    assert dead2.reason == "unknown_version"  # type: ignore[attr-defined]
    assert rt.in_force.source is LimitsSource.STATIC


async def test_an_update_lowers_or_raises_what_is_admitted(tmp_path: Path) -> None:
    """What each limit admits at once: waiting is off (``policy.queue_slo_fraction`` 0), so a request over the
    limit is a 429, not a wait for a slot (test_proxy_queue.py)."""
    backend, hub = FakeBackend(delay_s=0.3), ProducerHub()
    async with running(backend.app()) as backend_url:
        config = proxy_config({"pool-a": (backend_url,)}, [POOL], ENTS, {"spot": "sk-spot"})
        app = build_app(config, offline_options(tmp_path, policy={"queue_slo_fraction": 0}),
                        producer_factory=hub.factory)
        async with running(app) as url, aiohttp.ClientSession() as session:
            proxy = app.proxy
            assert proxy.limits is not None

            async def burst(n: int) -> list[int]:
                async def one() -> int:
                    body = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
                    async with session.post(url + "/v1/chat/completions", json=body,
                                            headers={"Authorization": "Bearer sk-spot"}) as r:
                        return r.status
                return sorted(await asyncio.gather(*(one() for _ in range(n))))

            assert await burst(6) == [200] * 5 + [429]  # static: spot may hold 5
            limits = {"gold": (3, 300.0, 3e9, 900.0), "spot": (2, 700.0, 7e9, 1.0)}
            proxy.limits.handle(encode(limit_update("pool-a", 1, proxy.clock.wall_ms(), limits, 8)))
            assert await burst(6) == [200] * 2 + [429] * 4  # lowered
            limits["spot"] = (6, 700.0, 7e9, 1.0)
            proxy.limits.handle(encode(limit_update("pool-a", 2, proxy.clock.wall_ms(), limits, 8)))
            assert await burst(6) == [200] * 6  # raised
            proxy.limits.handle(encode(limit_update("pool-a", 1, proxy.clock.wall_ms(), {**limits, "spot": (1, 1, 1, 1)}, 8)))
            assert await burst(6) == [200] * 6  # the stale v1 changed nothing
            events = proxy.events
            assert events is not None
            for _ in range(300):
                if not events.queue_depth and not events.in_flight:
                    break
                await asyncio.sleep(0.01)
    # each decision names the update in force when it was made: none while static, then v1, v2, and v2 after the stale v1
    decided = [e for e in hub.of("requests") if e["record_type"] == "request_decided"]
    assert [e.get("limits_version") for e in decided] == [None] * 6 + [1] * 6 + [2] * 12
    assert all("limits_version" not in e for e in decided[:6])  # absent, not null
