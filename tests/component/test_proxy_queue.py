"""Waiting instead of refusing (docs/queueing.md), through the real proxy in front of the in-process backend.

A request refused for a moment waits for its check and is admitted the moment it passes (a release, a limit
update, a token bucket that refills), or gets its 429 at its deadline; a higher priority is served first; a client
that leaves while it waits leaves the line; a proxy with waiting off refuses at once, as before. Each scenario
names its entitlement's ``queue_timeout_ms`` so its timing does not hang on the policy's SLO fraction.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.waiting import WaitOutcome
from tokenpools.proxy.app import Proxy, build_app
from tokenpools.proxy.admission.pools import PoolRuntime
from tokenpools.topics.codec import encode
from tokenpools_dev.proxy.doubles import FakeBackend, ProducerHub, limit_update, offline_options, proxy_config, running

pytestmark = pytest.mark.component

POOL = PoolSpec("pool-a", "fake-model", Capacity(10_000, 1e12, 8), kv_bytes_per_token=1, default_max_tokens=32,
                token_bucket_window_s=10)
ENTITLEMENTS = [
    EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(1000, 1e9, 2), queue_timeout_ms=3000),
    EntitlementSpec("elastic", "pool-a", ServiceClass.ELASTIC, 5000, Capacity(100, 1e9, 1), queue_timeout_ms=3000),
    EntitlementSpec("short", "pool-a", ServiceClass.ELASTIC, 5000, Capacity(100, 1e9, 1), queue_timeout_ms=300),
    EntitlementSpec("hold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(100, 1e9, 1)),
    EntitlementSpec("hi", "pool-a", ServiceClass.ELASTIC, 5000, Capacity(100, 1e9, 1), queue_timeout_ms=5000),
    EntitlementSpec("lo", "pool-a", ServiceClass.SPOT, 30000, queue_timeout_ms=5000),
    EntitlementSpec("pre", "pool-a", ServiceClass.PREEMPTIBLE, 30000),
    EntitlementSpec("plain", "pool-a", ServiceClass.ELASTIC, 5000, Capacity(100, 1e9, 1)),  # the policy's timeout
]
KEYS = {e.name: f"sk-{e.name}" for e in ENTITLEMENTS}
# (concurrency, tokens/s, KV bytes, priority)
LIMITS = {"gold": (2, 100.0, 1e9, 500.0), "elastic": (1, 1000.0, 1e9, 50.0), "short": (1, 1000.0, 1e9, 50.0),
          "hold": (1, 1000.0, 1e9, 900.0), "hi": (1, 1000.0, 1e9, 400.0), "lo": (1, 1000.0, 1e9, 1.0),
          "pre": (2, 1000.0, 1e9, 0.1), "plain": (1, 1000.0, 1e9, 50.0)}


@dataclasses.dataclass
class Env:
    url: str
    backend: FakeBackend
    hub: ProducerHub
    proxy: Proxy
    session: aiohttp.ClientSession
    version: int = 0

    @property
    def pool(self) -> PoolRuntime:
        return self.proxy.pools["pool-a"]

    def apply(self, limits: dict[str, tuple[int, float, float, float]], pool_concurrency: int = 8) -> None:
        self.version += 1
        assert self.proxy.limits is not None
        update = limit_update("pool-a", self.version, self.proxy.clock.wall_ms(), limits, pool_concurrency)
        assert self.proxy.limits.handle(encode(update)) == "applied"

    async def call(self, entitlement: str, content: str = "hello", **body: object) -> tuple[int, dict[str, Any], float]:
        """One chat request: its status, its JSON body (plus its "headers", lower-case) and how long it took (s)."""
        t0 = time.monotonic()
        payload = {"model": "fake-model", "messages": [{"role": "user", "content": content}], **body}
        async with self.session.post(self.url + "/v1/chat/completions", json=payload,
                                     headers={"Authorization": f"Bearer {KEYS[entitlement]}"}) as r:
            headers = {name.lower(): value for name, value in r.headers.items()}
            return r.status, {**(await r.json()), "headers": headers}, time.monotonic() - t0

    def start(self, entitlement: str, content: str = "hello", **body: object) -> asyncio.Task[tuple[int, dict[str, Any], float]]:
        return asyncio.create_task(self.call(entitlement, content, **body))

    async def decided(self) -> list[dict[str, Any]]:
        await self._settled()
        return self.hub.of("requests")

    async def completed(self) -> list[dict[str, Any]]:
        await self._settled()
        return self.hub.of("completions")

    async def _settled(self) -> None:
        for _ in range(200):
            events = self.proxy.events
            assert events is not None
            if not events.queue_depth and not events.in_flight:
                return
            await asyncio.sleep(0.01)

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        async with self.session.get(self.url + "/metrics") as r:
            text = await r.text()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}


def sample(metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return metrics.get((name, tuple(sorted({"pool": "pool-a", **labels}.items()))), 0.0)


async def until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


@asynccontextmanager
async def proxy_env(tmp_path: Path, *, policy: dict[str, Any] | None = None, **proxy: Any) -> AsyncIterator[Env]:
    backend = FakeBackend()
    hub = ProducerHub()
    async with running(backend.app()) as backend_url:
        config = proxy_config({"pool-a": (backend_url,)}, [POOL], ENTITLEMENTS, KEYS)
        app = build_app(config, offline_options(tmp_path, policy=policy, **proxy), producer_factory=hub.factory)
        async with running(app) as url, aiohttp.ClientSession() as session:
            env = Env(url, backend, hub, app.proxy, session)
            env.apply(LIMITS)
            yield env


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with proxy_env(tmp_path) as e:
        yield e


async def holding(env: Env, entitlement: str, delay_s: float) -> asyncio.Task[tuple[int, dict[str, Any], float]]:
    """A request of ``entitlement`` that the backend holds for ``delay_s``, once the backend has it."""
    env.backend.delay_s = delay_s
    before = env.backend.started
    task = env.start(entitlement, "holder")
    await until(lambda: env.backend.started > before)
    env.backend.delay_s = 0.0  # the requests that follow are answered at once
    return task


async def test_a_request_refused_for_concurrency_waits_and_is_admitted_when_the_holder_finishes(env: Env) -> None:
    holder = await holding(env, "elastic", 0.5)  # elastic may hold 1
    waiter = env.start("elastic", "waiter")
    await until(lambda: len(env.pool.queue) == 1)
    during = await env.metrics()
    assert sample(during, "tokenpools_proxy_waiters") == 1
    status, body, took_s = await waiter
    assert status == 200 and body["choices"][0]["message"]["content"]
    assert (await holder)[0] == 200
    assert 0.3 < took_s < 2.0  # it waited for the holder (0.5 s from its start), not for its 3 s deadline
    decided = {d["request_id"]: d for d in await env.decided()}
    (mine,) = [d for d in decided.values() if d["queued_ms"] > 0]
    assert mine["outcome"] == "admitted" and 300 <= mine["queued_ms"] <= 1000
    assert [d["queued_ms"] for d in decided.values() if d is not mine] == [0]  # the holder did not wait
    assert mine["request_id"] == body["headers"]["x-request-id"]
    # the wait started with a refusal event the agents count as demand at once, then the final decision
    (start,) = [d for d in await env.decided() if d["waits"]]
    assert start["request_id"] == mine["request_id"] and start["outcome"] == "concurrency" and start["queued_ms"] == 0
    assert start["t_ms"] <= mine["t_ms"] - 300
    after = await env.metrics()
    assert sample(after, "tokenpools_proxy_waiters") == 0
    assert sample(after, "tokenpools_proxy_queue_outcomes_total", outcome="admitted") == 1
    assert sample(after, "tokenpools_proxy_wait_seconds_count", outcome="admitted") == 1
    assert 0.3 <= sample(after, "tokenpools_proxy_wait_seconds_sum", outcome="admitted") <= 1.0
    completed = {c["request_id"]: c for c in await env.completed()}
    assert completed[mine["request_id"]]["e2e_s"] >= mine["queued_ms"] / 1000  # the client's time includes the wait
    assert env.pool.controller.in_flight == 0 and env.pool.queue.room.used == 0


async def test_a_waiter_past_its_deadline_gets_a_429_with_retry_after_ms(env: Env) -> None:
    holder = await holding(env, "short", 1.5)  # short waits at most 300 ms
    status, body, took_s = await env.call("short", "waiter")
    assert status == 429 and body["error"]["code"] == "concurrency"
    assert 0.28 <= took_s < 1.0  # its deadline, well before the holder ends
    assert 50 <= int(body["headers"]["retry-after-ms"]) <= 1000 and body["headers"]["retry-after"] == "1"
    assert body["headers"]["x-tokenpools-refused-by"] == "proxy"
    decided = await env.decided()
    refusal = next(d for d in decided if d["outcome"] == "concurrency" and not d["waits"])
    assert [d["request_id"] for d in decided if d["waits"]] == [refusal["request_id"]]
    assert refusal["queued_ms"] >= 300 and refusal["retry_after_ms"] == int(body["headers"]["retry-after-ms"])
    metrics = await env.metrics()
    assert sample(metrics, "tokenpools_proxy_queue_outcomes_total", outcome="timed_out") == 1
    assert sample(metrics, "tokenpools_proxy_wait_seconds_count", outcome="timed_out") == 1
    assert (await holder)[0] == 200


async def test_the_retry_of_a_request_refused_after_its_wait_is_linked_on_both_of_its_records(env: Env) -> None:
    """docs/tuning.md#how-the-proxy-links-attempts: the refusal a wait ends with opens a chain, so the same body sent
    again is its retry, on the refusal its wait starts with and on its final decision alike."""
    holder = await holding(env, "short", 1.5)  # short waits at most 300 ms: both attempts time out
    first = await env.call("short", "waiter")
    retry = await env.call("short", "waiter")
    assert first[0] == retry[0] == 429
    r0, r1 = first[1]["headers"]["x-request-id"], retry[1]["headers"]["x-request-id"]
    decided = await env.decided()
    fields = [(d["waits"], d.get("attempt"), d.get("first_request_id"), d.get("retry_link"))
              for d in decided if d["request_id"] in (r0, r1)]
    assert fields == [(True, None, None, None), (False, None, None, None),
                      (True, 1, r0, "heuristic"), (False, 1, r0, "heuristic")]
    assert (await holder)[0] == 200


async def test_a_slot_estimated_to_free_after_the_deadline_is_refused_at_once(env: Env) -> None:
    """Once the proxy has learned that a request of "short" holds its slot ~0.6 s, a request refused for that slot
    (1 release of 1 in flight: 0.6 s, past its 300-ms deadline) gets its 429 at once, with that estimate, instead
    of a wait that would time out and add 300 ms to its client's retry."""
    first = await holding(env, "short", 0.6)
    assert (await first)[0] == 200  # the release teaches S ~ 0.6 s
    holder = await holding(env, "short", 1.5)
    status, body, took_s = await env.call("short", "refused")
    assert status == 429 and body["error"]["code"] == "concurrency"
    assert took_s < 0.25  # not its 300-ms deadline
    assert 550 <= int(body["headers"]["retry-after-ms"]) <= 1000
    decided = await env.decided()
    assert not [d for d in decided if d["waits"]]  # it never waited
    metrics = await env.metrics()
    assert sample(metrics, "tokenpools_proxy_queue_outcomes_total", outcome="too_long") == 1
    assert sample(metrics, "tokenpools_proxy_queue_outcomes_total", outcome="timed_out") == 0
    assert (await holder)[0] == 200


async def test_a_slot_kept_for_a_protected_limit_goes_to_it_not_to_an_earlier_waiter_of_another_class(env: Env) -> None:
    """A limit update cuts elastic below the request it holds: the pool (2) is over-committed, and its one free slot
    is what gold's limit leaves unused. plain, within its own limit, waits for it (low priority: kept), gold takes
    it at once, and plain is admitted when the elastic request ends (docs/semantics.md#slots-kept-for-protected-limits)."""
    holder = await holding(env, "elastic", 0.8)
    zero = {name: (0, lim[1], lim[2], lim[3]) for name, lim in LIMITS.items()}
    env.apply({**zero, "gold": (1, 1000.0, 1e9, 500.0), "plain": (1, 1000.0, 1e9, 50.0)}, pool_concurrency=2)
    plain = env.start("plain", "plain")
    await until(lambda: len(env.pool.queue) == 1)
    status, _, took_s = await env.call("gold", "gold")
    assert status == 200 and took_s < 0.5 and not holder.done()  # gold's slot, while elastic still runs
    assert (await plain)[0] == 200 and (await holder)[0] == 200
    decided = await env.decided()
    (start,) = [d for d in decided if d["waits"]]
    assert start["entitlement"] == "plain" and start["outcome"] == "low_priority"
    served = [b["messages"][0]["content"] for b in env.backend.bodies]
    assert served.index("gold") < served.index("plain")


async def test_a_higher_priority_waiter_gets_the_freed_slot_before_an_earlier_lower_one(env: Env) -> None:
    env.apply(LIMITS, pool_concurrency=1)  # one slot in the pool: whoever holds it sets the floor
    holder = await holding(env, "hold", 0.4)  # priority 900
    lo = env.start("lo", "lo")  # priority 1, arrives first
    await until(lambda: len(env.pool.queue) == 1)
    hi = env.start("hi", "hi")  # priority 400, arrives second
    await until(lambda: len(env.pool.queue) == 2)
    env.backend.delay_s = 0.3  # what each of them holds the slot for
    results = dict(zip(("holder", "lo", "hi"), await asyncio.gather(holder, lo, hi)))
    assert all(status == 200 for status, _, _ in results.values())
    served = [b["messages"][0]["content"] for b in env.backend.bodies]
    assert served == ["holder", "hi", "lo"]  # the freed slot went to hi although lo had waited longer
    queued = {d["request_id"]: d["queued_ms"] for d in await env.decided() if d["entitlement"] in ("hi", "lo")}
    assert len(queued) == 2 and max(queued.values()) > min(queued.values()) >= 1


async def test_a_client_that_leaves_while_waiting_leaves_the_line(env: Env) -> None:
    holder = await holding(env, "elastic", 0.8)
    gone = asyncio.create_task(env.session.post(
        env.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEYS['elastic']}"},
        json={"model": "fake-model", "messages": [{"role": "user", "content": "gone"}]},
        timeout=aiohttp.ClientTimeout(total=0.3)))
    await until(lambda: len(env.pool.queue) == 1)
    with pytest.raises(asyncio.TimeoutError):
        await gone  # the client gives up and closes its connection
    await until(lambda: len(env.pool.queue) == 0)
    metrics = await env.metrics()
    assert sample(metrics, "tokenpools_proxy_waiters") == 0
    assert sample(metrics, "tokenpools_proxy_queue_outcomes_total", outcome="withdrawn") == 1
    assert sample(metrics, "tokenpools_proxy_wait_seconds_count", outcome="withdrawn") == 1
    assert (await holder)[0] == 200
    await until(lambda: env.pool.controller.in_flight == 0)  # no ticket was left behind
    assert env.pool.queue.room.used == 0 and env.backend.started == 1  # the one that left never reached it
    left = next(d for d in await env.decided() if d["outcome"] != "admitted" and not d["waits"])
    assert left["outcome"] == "concurrency" and left["queued_ms"] > 0  # its demand is still reported
    assert (await env.call("elastic"))[0] == 200  # and the line works on


async def test_a_client_gone_just_as_its_waiter_is_admitted_gives_its_admission_back(env: Env) -> None:
    """The queue admits a waiter and its client goes away before its handler runs again: the admission cannot be
    withdrawn, so it is recorded and settled at once as a client abort that used nothing."""
    holder = await holding(env, "elastic", 1.0)
    before = asyncio.all_tasks()
    waiter = env.start("elastic", "late")
    await until(lambda: len(env.pool.queue) == 1)
    (serving,) = [t for t in asyncio.all_tasks() - before if t.get_coro().__qualname__ == "Connection._serve"]
    env.apply({**LIMITS, "elastic": (2, 1000.0, 1e9, 50.0)})  # the waiter is admitted here...
    serving.cancel()  # ... and its connection is lost before its handler resumes (what connection_lost does)
    with pytest.raises(aiohttp.ClientError):
        await waiter
    await until(lambda: env.pool.controller.in_flight_of("elastic") == 1)  # the holder's only
    assert (await holder)[0] == 200
    assert env.pool.controller.in_flight == 0 and env.pool.queue.room.used == 0 and env.backend.started == 1
    late = next(d for d in await env.decided() if d["queued_ms"] > 0)
    assert late["outcome"] == "admitted"
    done = next(c for c in await env.completed() if c["request_id"] == late["request_id"])
    assert (done["status"], done["prompt_tokens"], done["completion_tokens"]) == ("client_abort", 0, 0)


async def test_a_limit_update_that_raises_the_concurrency_admits_a_waiter_at_once(env: Env) -> None:
    holder = await holding(env, "elastic", 2.0)
    waiter = env.start("elastic", "waiter")
    await until(lambda: len(env.pool.queue) == 1)
    await asyncio.sleep(0.1)
    env.apply({**LIMITS, "elastic": (2, 1000.0, 1e9, 50.0)})
    status, _, took_s = await waiter
    assert status == 200 and took_s < 1.0 and not holder.done()  # long before the holder's release
    (mine,) = [d for d in await env.decided() if d["queued_ms"] > 0]
    assert 100 <= mine["queued_ms"] < 1000
    assert (await holder)[0] == 200


async def test_a_waiter_admitted_when_its_bucket_refills_evicts_preemptible_work_as_on_arrival(env: Env) -> None:
    """No release, no update: the pool's timer wakes the queue when gold's bucket holds its cost, and gold, admitted
    into a full pool, evicts the preemptible request exactly as an arrival would."""
    env.apply(LIMITS, pool_concurrency=2)
    first = await holding(env, "gold", 2.0)  # ~40 tokens of gold's 1000-token bucket (100 tokens/s × 10 s)
    pre = await holding(env, "pre", 2.0)  # the pool is full: gold's first, and a preemptible request
    bucket = env.pool.controller.bucket_tokens_of("gold", env.proxy.clock.now_s())
    # n_in of "waiter" is estimated at 9 tokens: the request costs the bucket + 19, ~190 ms of refill
    status, _, took_s = await env.call("gold", "waiter", max_tokens=int(bucket) + 10)
    assert status == 200 and 0.1 < took_s < 1.0
    pre_status, pre_body, _ = await pre
    assert pre_status == 503 and pre_body["error"]["code"] == "evicted"
    assert env.proxy.metrics.evictions[("pool-a", "pre")] == 1
    (mine,) = [d for d in await env.decided() if d["entitlement"] == "gold" and d["queued_ms"] > 0]
    assert mine["entitlement"] == "gold" and mine["outcome"] == "admitted" and 100 <= mine["queued_ms"] < 1000
    assert (await first)[0] == 200


@pytest.mark.parametrize("off", [{"max_waiters": 0}, {"policy": {"queue_slo_fraction": 0}}],
                         ids=["max_waiters=0", "queue_slo_fraction=0"])
async def test_with_waiting_off_a_refusal_is_immediate_as_before(tmp_path: Path, off: dict[str, Any]) -> None:
    async with proxy_env(tmp_path, **off) as env:
        holder = await holding(env, "plain", 0.5)  # plain waits by the policy's fraction of its SLO (2.5 s) if on
        status, body, took_s = await env.call("plain", "refused")
        assert status == 429 and body["error"]["code"] == "concurrency" and took_s < 0.3
        (refusal,) = [d for d in await env.decided() if d["outcome"] == "concurrency"]
        assert refusal["queued_ms"] == 0
        metrics = await env.metrics()
        assert all(sample(metrics, "tokenpools_proxy_queue_outcomes_total", outcome=o.value) == 0 for o in WaitOutcome)
        assert (await holder)[0] == 200


async def test_waiters_share_the_proxy_room(tmp_path: Path) -> None:
    """``proxy.max_waiters`` bounds the waiters of the whole proxy: past it a waitable refusal is a 429 at once."""
    async with proxy_env(tmp_path, max_waiters=1) as env:
        holders = [await holding(env, name, 0.6) for name in ("elastic", "plain")]
        first = env.start("elastic", "waits")
        await until(lambda: len(env.pool.queue) == 1)
        status, body, took_s = await env.call("plain", "no room")
        assert status == 429 and body["error"]["code"] == "concurrency" and took_s < 0.3
        assert (await first)[0] == 200
        assert env.pool.queue.outcomes[WaitOutcome.QUEUE_FULL] == 1
        for task in holders:
            assert (await task)[0] == 200

