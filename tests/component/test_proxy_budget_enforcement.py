"""Budgets at the proxy (docs/budgets.md#enforcement): the 429 ``budget_exhausted`` with its body, headers and event,
for every service class and before any wait; the reservation held until settlement and the actual usage (cached
prompt tokens apart) counted; the agents' records followed by version; a budget changed with the specs."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tokenpools.core.budgets import BudgetScope, BudgetSpec, OnStale, Period, Usage, Weights, iso_ms, period_bounds
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.app import ProxyApp, build_app
from tokenpools.proxy.admission.budgets import RecordResult
from tokenpools.proxy.admission.estimate import chat_prompt_tokens
from tokenpools.proxy.backends.forward import REFUSED_BY
from tokenpools.runtime.clock import FakeClock
from tokenpools.topics.codec import encode
from tokenpools.topics.records import BudgetStatus
from tokenpools_dev.proxy.doubles import FakeBackend, ProducerHub, offline_options, proxy_config, running

pytestmark = pytest.mark.component

WALL_MS = 1_796_385_600_000  # 2026-12-04T12:00:00Z
POOL = PoolSpec("pool-a", "fake-model", Capacity(10_000, 1e12, 8), default_max_tokens=16)
DAILY = BudgetSpec("daily", Period.DAY, 1000, time_zone="Europe/Berlin")
GOLD = EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(1000, 1e11, 4), budgets=(DAILY,))
SPOT = EntitlementSpec("spot", "pool-a", ServiceClass.SPOT, 30000, budgets=(BudgetSpec("tiny", Period.MONTH, 1),))
KEYS = {"gold": "sk-gold", "spot": "sk-spot"}
MESSAGES = [{"role": "user", "content": "hi"}]
BODY = {"model": "fake-model", "messages": MESSAGES, "max_tokens": 4}
N_IN = chat_prompt_tokens(MESSAGES)


def make_app(backend_url: str, tmp_path: Path, hub: ProducerHub, clock: FakeClock,
             entitlements: list[EntitlementSpec] | None = None, **policy: Any) -> ProxyApp:
    entitlements = entitlements or [GOLD, SPOT]
    keys = {name: key for name, key in KEYS.items() if any(e.name == name for e in entitlements)}
    config = proxy_config({"pool-a": (backend_url,)}, [POOL], entitlements, keys)
    options = offline_options(tmp_path, policy=policy or None)
    options = dataclasses.replace(options, budgets=options.budgets.model_copy(update={"retry_after_max_s": 600}))
    return build_app(config, options, producer_factory=hub.factory, clock=clock)


def status(version: int, through_ms: int, prompt: int, *, allowance: float = 1000, spec: BudgetSpec = DAILY,
           entitlement: str = "gold") -> BudgetStatus:
    start, end = period_bounds(spec.period, spec.time_zone, through_ms)
    return BudgetStatus(pool="pool-a", entitlement=entitlement, tenant="acme", budget=spec.name,
                        scope=BudgetScope.ENTITLEMENT, period=spec.period, time_zone=spec.time_zone,
                        period_start_ms=start, period_end_ms=end, allowance=allowance,
                        spent={"prompt_tokens": prompt, "requests": 1}, spent_units=prompt, version=version,
                        t_ms=through_ms, through_ms=through_ms)


async def settled(app: ProxyApp) -> None:
    events = app.proxy.events
    assert events is not None
    for _ in range(300):
        if not events.queue_depth and not events.in_flight and not app.proxy.handlers.flights:  # type: ignore[union-attr]
            return
        await asyncio.sleep(0.01)


async def post(session: aiohttp.ClientSession, url: str, key: str = "sk-gold",
               body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with session.post(url + "/v1/chat/completions", json=body or BODY,
                            headers={"Authorization": f"Bearer {key}"}) as r:
        return r.status, orjson.loads(await r.read()), dict(r.headers)


async def test_an_exhausted_budget_is_a_429_naming_it_with_the_reset_and_its_event(tmp_path: Path) -> None:
    backend, hub, clock = FakeBackend(), ProducerHub(), FakeClock(wall_ms=WALL_MS)
    async with running(backend.app()) as backend_url:
        app = make_app(backend_url, tmp_path, hub, clock)
        async with running(app) as url, aiohttp.ClientSession() as session:
            follower = app.proxy.budget_follower
            assert follower is not None
            # the agents say 990 of the day's 1000 are spent: the request's n_in + 4 do not fit in the 10 left
            assert follower.handle(encode(status(1, WALL_MS - 1, 990)), "budgets", 0, 0,
                                   b"pool-a/gold/daily") is RecordResult.APPLIED
            status_, body, headers = await post(session, url)
            assert status_ == 429 and backend.started == 0  # never reached the backend
            error = body["error"]
            assert error["code"] == "budget_exhausted" and error["type"] == "insufficient_quota"
            _, end = DAILY.period_at(WALL_MS)
            assert error["budget"] == {"name": "daily", "period": "day", "time_zone": "Europe/Berlin",
                                       "resets_at": iso_ms(end, "Europe/Berlin"), "allowance": 1000.0,
                                       "remaining": 10.0, "request": float(N_IN + 4)}
            assert error["budget"]["resets_at"] == "2026-12-05T00:00:00+01:00"
            retry_ms = min(600_000, end - WALL_MS)
            assert headers["retry-after-ms"] == str(retry_ms)
            assert headers["Retry-After"] == str(math.ceil(retry_ms / 1000))
            assert headers[REFUSED_BY] == "proxy"
            await settled(app)
            (decided,) = [e for e in hub.of("requests") if e.get("record_type") == "request_decided"]
            assert decided["outcome"] == "budget_exhausted" and "daily" in decided["reason"]
            assert decided["retry_after_ms"] == retry_ms and decided["retry_after_s"] == math.ceil(retry_ms / 1000)
            assert decided["cost_tokens"] == N_IN + 4 and decided["entitlement"] == "gold"
            assert app.proxy.metrics.decisions[("pool-a", "gold", "budget_exhausted")] == 1
            metrics = (await (await session.get(url + "/metrics")).read()).decode()
            assert 'tokenpools_proxy_budget_remaining_units{budget="daily",entitlement="gold",pool="pool-a"} 10.0' \
                in metrics


async def test_spot_traffic_is_refused_too_and_a_budget_refusal_never_waits(tmp_path: Path) -> None:
    backend, hub, clock = FakeBackend(), ProducerHub(), FakeClock(wall_ms=WALL_MS)
    async with running(backend.app()) as backend_url:
        app = make_app(backend_url, tmp_path, hub, clock)
        async with running(app) as url, aiohttp.ClientSession() as session:
            status_, body, headers = await post(session, url, "sk-spot")
            assert status_ == 429 and body["error"]["code"] == "budget_exhausted"
            assert body["error"]["budget"]["name"] == "tiny" and body["error"]["budget"]["remaining"] == 1.0
            assert app.proxy.pools["pool-a"].queue.room.capacity == 0 or len(app.proxy.pools["pool-a"].queue) == 0
            await settled(app)
            (decided,) = [e for e in hub.of("requests") if e.get("record_type") == "request_decided"]
            assert decided["outcome"] == "budget_exhausted" and decided["queued_ms"] == 0 and not decided["waits"]


async def test_the_reservation_is_held_until_settlement_and_the_usage_counted_cached_apart(tmp_path: Path) -> None:
    daily = BudgetSpec("daily", Period.DAY, 1000, weights=Weights(prompt=1.0, cached_prompt=0.0, completion=2.0))
    gold = dataclasses.replace(GOLD, budgets=(daily,))
    backend, hub, clock = FakeBackend(chunks=4, prompt_tokens=10, cached_prompt_tokens=6, delay_s=0.3), \
        ProducerHub(), FakeClock(wall_ms=WALL_MS)
    async with running(backend.app()) as backend_url:
        app = make_app(backend_url, tmp_path, hub, clock, [gold])
        book = app.proxy.budgets
        async with running(app) as url, aiohttp.ClientSession() as session:
            call = asyncio.create_task(post(session, url))
            for _ in range(200):  # the backend is answering: the reservation is held
                if backend.started:
                    break
                await asyncio.sleep(0.01)
            assert book.reserved("gold") == Usage(N_IN, 0, 4)
            assert book.state("gold", daily, WALL_MS).remaining_units == 1000 - (N_IN + 4 * 2)
            status_, _, _ = await call
            assert status_ == 200
            await settled(app)
            assert book.reserved("gold") == Usage()
            # the actual usage: 4 uncached prompt tokens at 1, 6 cached at 0, 4 completion tokens at 2
            assert book.state("gold", daily, clock.wall_ms()).remaining_units == 1000 - (4 + 0 + 8)
            (completed,) = [e for e in hub.of("completions") if e.get("record_type") == "request_completed"]
            assert completed["cached_prompt_tokens"] == 6 and completed["prompt_tokens"] == 10


async def test_a_streamed_request_of_a_budgeted_entitlement_is_served_and_settled(tmp_path: Path) -> None:
    """The budget's reservation is not the HTTP request: a stream is answered on the client's connection (found by
    the chaos run, benchmarks/chaos.py: every streamed request of a budgeted entitlement failed with a 500 after its
    admission, while the same request without ``stream`` passed)."""
    backend, hub, clock = FakeBackend(chunks=3), ProducerHub(), FakeClock(wall_ms=WALL_MS)
    async with running(backend.app()) as backend_url:
        app = make_app(backend_url, tmp_path, hub, clock, [GOLD])
        async with running(app) as url, aiohttp.ClientSession() as session:
            body = {**BODY, "stream": True, "stream_options": {"include_usage": True}}
            async with session.post(url + "/v1/chat/completions", json=body,
                                    headers={"Authorization": "Bearer sk-gold"}) as r:
                assert r.status == 200
                text = (await r.read()).decode()
            assert text.rstrip().endswith("data: [DONE]") and '"usage"' in text
            await settled(app)
            assert app.proxy.budgets.reserved("gold") == Usage()
            (completed,) = [e for e in hub.of("completions") if e.get("record_type") == "request_completed"]
            assert completed["status"] == "ok" and completed["completion_tokens"] == 3


async def test_records_are_followed_by_version_and_bad_ones_dead_lettered(tmp_path: Path) -> None:
    backend, hub, clock = FakeBackend(chunks=4, prompt_tokens=10), ProducerHub(), FakeClock(wall_ms=WALL_MS)
    async with running(backend.app()) as backend_url:
        app = make_app(backend_url, tmp_path, hub, clock)
        book = app.proxy.budgets
        async with running(app) as url, aiohttp.ClientSession() as session:
            follower = app.proxy.budget_follower
            assert follower is not None
            assert (await post(session, url))[0] == 200  # own spending: 14 tokens, not in any record yet
            await settled(app)
            own = book.state("gold", DAILY, clock.wall_ms()).remaining_units
            assert own == 1000 - 14
            clock.advance(1.0)
            # a record counting 500 of other proxies' spending up to before our completion
            follower.handle(encode(status(3, WALL_MS - 1, 500)), "budgets", 0, 1, b"pool-a/gold/daily")
            assert book.state("gold", DAILY, clock.wall_ms()).remaining_units == 1000 - 500 - 14
            # the next one covers our completion: counted once, in the record
            follower.handle(encode(status(4, clock.wall_ms(), 514)), "budgets", 0, 2, b"pool-a/gold/daily")
            assert book.state("gold", DAILY, clock.wall_ms()).remaining_units == 1000 - 514
            # an older version arriving late is ignored
            assert follower.handle(encode(status(2, clock.wall_ms(), 999)), "budgets", 0, 3,
                                   b"pool-a/gold/daily") is RecordResult.STALE
            assert (await post(session, url))[0] == 200
            # another pool's bad record is left to its own proxies, a bad one of ours is dead-lettered
            assert follower.handle(b"not json", "budgets", 0, 4, b"pool-b/x/y") is None
            assert follower.handle(b"not json", "budgets", 0, 5, b"pool-a/gold/daily") is None
            await settled(app)
            (dead,) = hub.of("dead-letters")
            assert dead["source_topic"] == "budgets" and dead["offset"] == 5
            assert app.proxy.metrics.budget_records == {("pool-a", "applied"): 2, ("pool-a", "stale"): 1,
                                                        ("pool-a", "invalid"): 1}
            # the agents' account says it is spent: refused
            follower.handle(encode(status(5, clock.wall_ms(), 1000)), "budgets", 0, 6, b"pool-a/gold/daily")
            assert (await post(session, url))[0] == 429


async def test_a_budget_added_changed_or_removed_takes_effect_with_the_specs(tmp_path: Path) -> None:
    plain = dataclasses.replace(GOLD, budgets=())
    backend, hub, clock = FakeBackend(), ProducerHub(), FakeClock(wall_ms=WALL_MS)
    async with running(backend.app()) as backend_url:
        app = make_app(backend_url, tmp_path, hub, clock, [plain])
        base = proxy_config({"pool-a": (backend_url,)}, [POOL], [plain], {"gold": "sk-gold"})
        async with running(app) as url, aiohttp.ClientSession() as session:
            specs = app.proxy.specs
            assert specs is not None
            assert (await post(session, url))[0] == 200
            tiny = dataclasses.replace(plain, budgets=(BudgetSpec("daily", Period.DAY, 2),))
            assert specs.apply(dataclasses.replace(base, entitlements={"gold": tiny}), 2, "test") is None
            status_, body, _ = await post(session, url)
            assert status_ == 429 and body["error"]["budget"]["name"] == "daily"
            roomy = dataclasses.replace(plain, budgets=(BudgetSpec("daily", Period.DAY, 10_000),))
            assert specs.apply(dataclasses.replace(base, entitlements={"gold": roomy}), 3, "test") is None
            assert (await post(session, url))[0] == 200
            assert specs.apply(dataclasses.replace(base, entitlements={"gold": tiny}), 4, "test") is None
            assert (await post(session, url))[0] == 429
            assert specs.apply(dataclasses.replace(base, entitlements={"gold": plain}), 5, "test") is None
            assert (await post(session, url))[0] == 200


async def test_the_budget_is_checked_before_the_rate_checks_and_refuses_without_waiting(tmp_path: Path) -> None:
    backend, hub, clock = FakeBackend(delay_s=0.6), ProducerHub(), FakeClock(wall_ms=WALL_MS)
    async with running(backend.app()) as backend_url:
        cost = N_IN + 4  # n_in and the output estimate (max_tokens, before any completion taught it)
        gold = dataclasses.replace(GOLD, budgets=(BudgetSpec("daily", Period.DAY, 4 * cost + 1),))
        app = make_app(backend_url, tmp_path, hub, clock, [gold], queue_slo_fraction=0.5)
        async with running(app) as url, aiohttp.ClientSession() as session:
            controller = app.proxy.pools["pool-a"].controller
            assert controller.limits_of("gold").concurrency == 4
            slow = [asyncio.create_task(post(session, url)) for _ in range(4)]  # every slot, 4 reservations
            for _ in range(200):
                if controller.in_flight_of("gold") == 4:
                    break
                await asyncio.sleep(0.01)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            status_, body, _ = await post(session, url)
            # the concurrency check would let it wait for a slot; the budget refuses it first, at once
            assert status_ == 429 and body["error"]["code"] == "budget_exhausted"
            assert loop.time() - t0 < 0.4 and controller.in_flight_of("gold") == 4
            assert [s for s, _, _ in await asyncio.gather(*slow)] == [200] * 4


SHARED = BudgetSpec("shared", Period.DAY, 1000, scope=BudgetScope.TENANT)
POOL_B = PoolSpec("pool-b", "fake-model-b", Capacity(10_000, 1e12, 8), default_max_tokens=16)


def part(entitlement: str, pool: str, version: int, through_ms: int, prompt: int) -> tuple[bytes, bytes]:
    """A tenant budget's part as the agents publish it: (value, key)."""
    start, end = SHARED.period_at(through_ms)
    record = BudgetStatus(pool=pool, entitlement=entitlement, tenant="acme", budget=SHARED.name,
                          scope=BudgetScope.TENANT, period=SHARED.period, time_zone=SHARED.time_zone,
                          period_start_ms=start, period_end_ms=end, allowance=SHARED.amount,
                          spent={"prompt_tokens": prompt, "requests": 1}, spent_units=prompt, version=version,
                          t_ms=through_ms, through_ms=through_ms)
    return encode(record), f"{pool}/{entitlement}/{SHARED.name}".encode()


async def test_a_tenant_budget_is_spent_by_every_entitlement_of_the_tenant_on_every_pool(tmp_path: Path) -> None:
    """gold (pool-a) and batch (pool-b), both of tenant acme, share the tenant budget ``shared`` with remote, an
    entitlement of acme on pool-c this proxy does not serve: the check sums the three parts the agents publish, this
    proxy's own spending after each part and its reservations, and refuses both once the sum is spent; batch leaving
    the budget by a spec change is no longer refused, its spending stays counted for gold
    (docs/budgets.md#tenant-budgets)."""
    gold = dataclasses.replace(GOLD, tenant="acme", budgets=(SHARED,))
    batch = EntitlementSpec("batch", "pool-b", ServiceClass.SPOT, 30000, tenant="acme", budgets=(SHARED,))
    keys = {"gold": "sk-gold", "batch": "sk-batch"}
    body_b = {**BODY, "model": "fake-model-b"}
    cost = N_IN + 4  # what a request reserves: n_in and max_tokens
    backend, hub, clock = FakeBackend(chunks=4, prompt_tokens=10), ProducerHub(), FakeClock(wall_ms=WALL_MS)
    async with running(backend.app()) as backend_url:
        config = proxy_config({"pool-a": (backend_url,), "pool-b": (backend_url,)}, [POOL, POOL_B], [gold, batch],
                              keys)
        options = offline_options(tmp_path)
        app = build_app(config, options, producer_factory=hub.factory, clock=clock)
        book = app.proxy.budgets
        async with running(app) as url, aiohttp.ClientSession() as session:
            follower = app.proxy.budget_follower
            assert follower is not None
            # remote's part, on a pool this proxy does not serve, counts: 1000 - 900 left
            assert follower.handle(*_at(part("remote", "pool-c", 1, WALL_MS - 1, 900))) is RecordResult.APPLIED
            assert (await post(session, url, "sk-gold"))[0] == 200  # 14 tokens of own spending (10 prompt, 4 out)
            await settled(app)
            assert (await post(session, url, "sk-batch", body_b))[0] == 200
            await settled(app)
            for name in ("gold", "batch"):
                assert book.state(name, SHARED, clock.wall_ms(), "acme").remaining_units == 1000 - 900 - 28
            clock.advance(1.0)
            # batch's part covers its completion: counted once, in the part; gold's own stays the proxy's
            spent_b = 1000 - 900 - 14 - (cost - 1)  # its 14 and others': one unit less than a reservation left
            follower.handle(*_at(part("batch", "pool-b", 1, clock.wall_ms(), spent_b)))
            left = 1000 - 900 - spent_b - 14
            assert left == cost - 1
            for name, key, body in (("gold", "sk-gold", BODY), ("batch", "sk-batch", body_b)):
                assert book.state(name, SHARED, clock.wall_ms(), "acme").remaining_units == left
                status_, error, _ = await post(session, url, key, body)
                assert status_ == 429 and error["error"]["budget"]["name"] == "shared"
                assert error["error"]["budget"]["remaining"] == left
            await settled(app)
            decided = [e for e in hub.of("requests") if e.get("outcome") == "budget_exhausted"]
            assert [e["entitlement"] for e in decided] == ["gold", "batch"]
            assert all("tenant acme" in e["reason"] for e in decided)
            # batch leaves the tenant budget: admitted again; what it spent still counts for gold
            specs = app.proxy.specs
            assert specs is not None
            free = dataclasses.replace(batch, budgets=())
            assert specs.apply(dataclasses.replace(config, entitlements={"gold": gold, "batch": free}), 2,
                               "test") is None
            assert (await post(session, url, "sk-batch", body_b))[0] == 200
            await settled(app)
            assert (await post(session, url, "sk-gold"))[0] == 429
            assert book.state("gold", SHARED, clock.wall_ms(), "acme").remaining_units == left


def _at(value_key: tuple[bytes, bytes]) -> tuple[bytes, str, int, int, bytes]:
    value, key = value_key
    return value, "budgets", 0, 0, key


async def test_a_stale_view_refuses_with_503_under_refuse_and_spends_under_spend(tmp_path: Path) -> None:
    """docs/budgets.md#stale-views: gold's budget says refuse, silver's follows the settings (spend). Once their own
    spending has waited longer than budgets.stale_after_s for a record, gold gets 503 budget_unavailable (with
    Retry-After, never reaching the backend) and silver is admitted; a record of gold's budget ends it."""
    refuse = dataclasses.replace(DAILY, on_stale=OnStale.REFUSE)
    gold = dataclasses.replace(GOLD, budgets=(refuse,))
    silver = dataclasses.replace(GOLD, name="silver", budgets=(DAILY,))
    backend, hub, clock = FakeBackend(), ProducerHub(), FakeClock(wall_ms=WALL_MS)
    async with running(backend.app()) as backend_url:
        entitlements = [gold, silver]
        config = proxy_config({"pool-a": (backend_url,)}, [POOL], entitlements, {"gold": "sk-gold", "silver": "sk-silver"})
        options = offline_options(tmp_path)
        options = dataclasses.replace(options, budgets=options.budgets.model_copy(
            update={"stale_after_s": 5.0, "publish_interval_s": 2.0}))
        app = build_app(config, options, producer_factory=hub.factory, clock=clock)
        async with running(app) as url, aiohttp.ClientSession() as session:
            follower = app.proxy.budget_follower
            assert follower is not None
            follower.handle(encode(status(1, WALL_MS - 1, 10)), "budgets", 0, 0, b"pool-a/gold/daily")
            for key in ("sk-gold", "sk-silver"):  # spending the agents have not answered yet
                assert (await post(session, url, key))[0] == 200
            await settled(app)
            clock.advance(4.9)  # not yet stale
            assert (await post(session, url, "sk-gold"))[0] == 200
            await settled(app)
            clock.advance(0.2)  # the first completion waited 5.1 s > 5 s
            started = backend.started
            status_, body, headers = await post(session, url, "sk-gold")
            assert status_ == 503 and backend.started == started
            assert body["error"]["code"] == "budget_unavailable" and "daily" in body["error"]["message"]
            assert body["error"]["type"] == "service_unavailable_error"
            assert headers["Retry-After"] == "2" and headers[REFUSED_BY] == "proxy"
            assert (await post(session, url, "sk-silver"))[0] == 200  # spend: admitted on its own view
            await settled(app)
            decided = [e for e in hub.of("requests") if e.get("record_type") == "request_decided"]
            assert [d["outcome"] for d in decided if d["entitlement"] == "gold"] == ["admitted", "admitted",
                                                                                      "budget_unavailable"]
            assert app.proxy.metrics.decisions[("pool-a", "gold", "budget_unavailable")] == 1
            metrics = (await (await session.get(url + "/metrics")).read()).decode()
            assert ('tokenpools_proxy_budget_unacknowledged_seconds{budget="daily",entitlement="gold",pool="pool-a"} '
                    '5.1') in metrics
            # the agents answer: a newer record arrives, and gold is admitted again
            follower.handle(encode(status(2, clock.wall_ms() - 1, 30)), "budgets", 0, 1, b"pool-a/gold/daily")
            assert (await post(session, url, "sk-gold"))[0] == 200
            await settled(app)


async def test_the_other_proxies_reservations_on_a_record_are_spent_and_its_own_level_is_not(tmp_path: Path) -> None:
    """docs/budgets.md#the-others-reservations-in-flight: the proxy built by ``build_app`` names itself on the
    records' levels as its events name it, so its own level there (any) is left out and the others' are spent."""
    backend, hub, clock = FakeBackend(), ProducerHub(), FakeClock(wall_ms=WALL_MS)
    async with running(backend.app()) as backend_url:
        app = make_app(backend_url, tmp_path, hub, clock)
        me = app.proxy.options.proxy_id
        async with running(app) as url, aiohttp.ClientSession() as session:
            follower = app.proxy.budget_follower
            assert follower is not None
            # 900 spent, another proxy holds 90 in flight: 10 left, the request's n_in + 4 do not fit
            busy = status(1, WALL_MS - 1, 900).model_copy(update={"reserved_tokens": {me: 5000, "proxy-b": 90}})
            assert follower.handle(encode(busy), "budgets", 0, 0, b"pool-a/gold/daily") is RecordResult.APPLIED
            status_, body, _ = await post(session, url)
            assert status_ == 429 and body["error"]["budget"]["remaining"] == 10.0 and backend.started == 0
            # the other proxy's requests are done (and cost nothing more); this proxy's own level is not counted
            done = status(2, WALL_MS - 1, 900).model_copy(update={"reserved_tokens": {me: 5000}})
            assert follower.handle(encode(done), "budgets", 0, 1, b"pool-a/gold/daily") is RecordResult.APPLIED
            status_, _, _ = await post(session, url)
            assert status_ == 200
            await settled(app)
            assert {e["proxy_id"] for e in hub.of("requests") if e.get("record_type") == "request_decided"} == {me}
