"""The proxy's request path against an in-process backend: auth, every refusal reason, defaults, settlement, events.

Limits are put in force the way production does it — a LimitUpdate handed to the proxy's limits applier — so
each scenario states the limits that deserve its outcome. Waiting is off here (``policy.queue_slo_fraction`` 0):
these scenarios are about the refusals themselves, on arrival; test_proxy_queue.py has the requests that wait.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import orjson
import pytest
from openai import AsyncOpenAI

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState, ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.app import Proxy, build_app
from tokenpools.replay.load import Arrival, RetryPolicy
from tokenpools.topics.codec import encode
from tokenpools_dev.proxy.doubles import (
    FakeBackend, ProducerHub, limit_update, offline_options, proxy_config, running, unpack)
from tokenpools_dev.loadgen.client import LoadGenerator, LoadOptions

pytestmark = pytest.mark.component

KV = 1000  # bytes per token in this pool: small numbers keep the KV arithmetic readable
POOL = PoolSpec("pool-a", "fake-model", Capacity(10_000, 10_000_000, 8), kv_bytes_per_token=KV,
                default_max_tokens=32, token_bucket_window_s=10)
ENTITLEMENTS = [
    EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(1000, 2_000_000, 2)),
    EntitlementSpec("elastic", "pool-a", ServiceClass.ELASTIC, 5000, Capacity(1000, 2_000_000, 2)),
    EntitlementSpec("spot", "pool-a", ServiceClass.SPOT, 30000),
    EntitlementSpec("waiting", "pool-a", ServiceClass.ELASTIC, 5000, Capacity(100, 1000, 1),
                    state=EntitlementState.PENDING),
    EntitlementSpec("old", "pool-a", ServiceClass.SPOT, 30000, expires_at_s=1.0),
]
KEYS = {e.name: f"sk-{e.name}" for e in ENTITLEMENTS}
# (concurrency, tokens/s, KV bytes, priority)
LIMITS = {"gold": (2, 1000.0, 2e6, 500.0), "elastic": (1, 1000.0, 2e6, 50.0), "spot": (4, 1000.0, 2e6, 1.0),
          "waiting": (1, 100.0, 1e6, 1.0), "old": (1, 100.0, 1e6, 1.0)}


@dataclasses.dataclass
class Env:
    url: str
    backend: FakeBackend
    hub: ProducerHub
    proxy: Proxy
    version: int = 0
    clients: list[AsyncOpenAI] = dataclasses.field(default_factory=list)

    def client(self, entitlement: str | None, key: str | None = None) -> AsyncOpenAI:
        client = AsyncOpenAI(base_url=self.url + "/v1", api_key=key or KEYS.get(entitlement or "", "sk-none"),
                             max_retries=0)
        self.clients.append(client)
        return client

    def apply(self, limits: dict[str, tuple[int, float, float, float]], pool_concurrency: int = 8) -> None:
        self.version += 1
        assert self.proxy.limits is not None
        update = limit_update("pool-a", self.version, self.proxy.clock.wall_ms(), limits, pool_concurrency)
        assert self.proxy.limits.handle(encode(update)) == "applied"

    def bucket(self, name: str) -> float:
        return self.proxy.pools["pool-a"].controller.bucket_tokens_of(name, self.proxy.clock.now_s())


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    backend = FakeBackend()
    hub = ProducerHub()
    async with running(backend.app()) as backend_url:
        config = proxy_config({"pool-a": (backend_url,)}, [POOL], ENTITLEMENTS, KEYS)
        app = build_app(config, offline_options(tmp_path, policy={"queue_slo_fraction": 0}),
                        producer_factory=hub.factory)
        async with running(app) as url:
            e = Env(url, backend, hub, app.proxy)
            e.apply(LIMITS)
            try:
                yield e
            finally:
                for client in e.clients:
                    await client.close()


def chat(content: str = "hello", **kw: object) -> dict[str, object]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": content}], **kw}


async def settle_events(env: Env) -> None:
    for _ in range(100):
        events = env.proxy.events
        assert events is not None
        if not events.queue_depth and not events.in_flight:
            return
        await asyncio.sleep(0.01)


async def test_admitted_requests_return_what_the_backend_returned(env: Env) -> None:
    client = env.client("gold")
    r = await client.chat.completions.create(**chat())  # type: ignore[call-overload]
    assert r.choices[0].message.content == "tok " * 4
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (10, 4)
    c = await client.completions.create(model="fake-model", prompt="hi", max_tokens=3)
    assert c.choices[0].text == "tok " * 3
    models = await client.models.list()
    assert [m.id for m in models.data] == ["fake-model"]


async def test_max_tokens_defaults_to_the_pool_and_client_values_are_kept(env: Env) -> None:
    client = env.client("gold")
    await client.chat.completions.create(**chat())  # type: ignore[call-overload]
    await client.chat.completions.create(**chat(max_tokens=5))  # type: ignore[call-overload]
    await client.chat.completions.create(**chat(max_completion_tokens=6))  # type: ignore[call-overload]
    assert env.backend.bodies[0]["max_tokens"] == POOL.default_max_tokens
    assert env.backend.bodies[1]["max_tokens"] == 5
    assert env.backend.bodies[2]["max_completion_tokens"] == 6 and "max_tokens" not in env.backend.bodies[2]


async def test_unknown_missing_or_malformed_keys_get_401(env: Env) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        await env.client(None, key="sk-stolen").chat.completions.create(**chat())  # type: ignore[call-overload]
    assert caught.value.status_code == 401
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "unknown_key" and body["param"] is None
    async with aiohttp.ClientSession() as s:
        for headers in ({}, {"Authorization": "Basic c2stZ29sZA=="}, {"Authorization": "Bearer "}):
            async with s.post(env.url + "/v1/chat/completions", json=chat(), headers=headers) as r:
                assert r.status == 401
                assert (await r.json())["error"]["type"] == "authentication_error"
    assert env.backend.started == 0


async def test_entitlements_not_bound_get_403_with_their_state(env: Env) -> None:
    for name, state in (("waiting", "Pending"), ("old", "Expired")):
        with pytest.raises(openai.PermissionDeniedError) as caught:
            await env.client(name).chat.completions.create(**chat())  # type: ignore[call-overload]
        assert caught.value.status_code == 403
        assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "not_bound"
        assert state in caught.value.message
    assert env.backend.started == 0


async def test_the_key_alone_picks_the_entitlement(env: Env) -> None:
    async with aiohttp.ClientSession() as s:
        body = chat(user="gold", entitlement="gold")
        headers = {"Authorization": "Bearer sk-spot", "X-Entitlement": "gold", "OpenAI-Organization": "gold"}
        async with s.post(env.url + "/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200
    await settle_events(env)
    decided = env.hub.of("requests")
    assert [d["entitlement"] for d in decided] == ["spot"]


async def refused(client: AsyncOpenAI, **body: object) -> openai.RateLimitError:
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(**chat(**body))  # type: ignore[call-overload]
    return caught.value


async def test_concurrency_refusal_when_the_entitlement_is_at_its_limit(env: Env) -> None:
    env.backend.delay_s = 0.5
    client = env.client("elastic")  # concurrency limit 1
    slow = asyncio.create_task(client.chat.completions.create(**chat()))  # type: ignore[call-overload]
    await asyncio.sleep(0.1)
    error = await refused(client)
    assert isinstance(error.body, dict) and error.body["code"] == "concurrency"
    assert error.response.headers["Retry-After"] == "1"
    assert 50 <= int(error.response.headers["retry-after-ms"]) <= 1000  # the sub-second estimate, within its bounds
    assert error.response.headers["X-TokenPools-Refused-By"] == "proxy"
    await slow
    await client.chat.completions.create(**chat())  # type: ignore[call-overload]  # the slot is free again


async def test_token_budget_refusal_names_the_reason_and_a_retry_after(env: Env) -> None:
    env.apply({**LIMITS, "elastic": (4, 10.0, 2e6, 50.0)})  # 10 tokens/s × 10 s window = a 100-token bucket
    client = env.client("elastic")
    error = await refused(client, max_tokens=1000)  # never fits: bigger than the bucket
    assert isinstance(error.body, dict) and error.body["code"] == "token_budget"
    assert int(error.response.headers["Retry-After"]) >= 1
    assert error.response.headers["retry-after-ms"] == "10000"  # never fits: the bucket's window, as before
    await client.chat.completions.create(**chat(max_tokens=80))  # type: ignore[call-overload]  # fits ...
    error = await refused(client, max_tokens=80)  # ... once: the bucket now holds about 100 - 82 - 10 + 4 + refills
    assert isinstance(error.body, dict) and error.body["code"] == "token_budget"
    assert int(error.response.headers["Retry-After"]) >= 1
    wait_ms = int(error.response.headers["retry-after-ms"])  # the refill of what is short, at 10 tokens/s
    assert int(error.response.headers["Retry-After"]) == max(1, math.ceil(wait_ms / 1000)) and 0 < wait_ms < 10_000


async def test_kv_refusal_when_the_request_would_exceed_the_kv_limit(env: Env) -> None:
    env.apply({**LIMITS, "elastic": (4, 1000.0, 50 * KV, 50.0)})  # room for 50 tokens of KV
    client = env.client("elastic")
    error = await refused(client, max_tokens=60)
    assert isinstance(error.body, dict) and error.body["code"] == "kv_cache"
    await client.chat.completions.create(**chat(max_tokens=10))  # type: ignore[call-overload]


async def test_low_priority_refusal_under_contention(env: Env) -> None:
    env.apply(LIMITS, pool_concurrency=2)
    env.backend.delay_s = 0.5
    gold = env.client("gold")
    held = [asyncio.create_task(gold.chat.completions.create(**chat())) for _ in range(2)]  # type: ignore[call-overload]
    await asyncio.sleep(0.1)
    error = await refused(env.client("spot"))  # pool full, spot's priority 1 is not above gold's 500
    assert isinstance(error.body, dict) and error.body["code"] == "low_priority"
    await asyncio.gather(*held)


async def test_usage_settles_the_bucket(env: Env) -> None:
    env.apply({**LIMITS, "elastic": (4, 10.0, 2e6, 50.0)})  # a 100-token bucket refilling at 10 tokens/s
    assert env.bucket("elastic") == pytest.approx(100, abs=0.5)
    env.backend.prompt_tokens, env.backend.chunks = 7, 3
    client = env.client("elastic")
    for stream in (False, True):
        before, started_s = env.bucket("elastic"), env.proxy.clock.now_s()
        if stream:
            s = await client.chat.completions.create(**chat(max_tokens=50), stream=True)  # type: ignore[call-overload]
            async for _ in s:
                pass
        else:
            await client.chat.completions.create(**chat(max_tokens=50))  # type: ignore[call-overload]
        # reserved n_in estimate + 50; settled with the backend's real 7 + 3, plus the refill of 10 tokens/s while
        # it ran (however long a busy machine made that), never above the depth
        refill = 10.0 * (env.proxy.clock.now_s() - started_s)
        assert before - 10 - 0.5 <= env.bucket("elastic") <= min(100.0, before - 10 + refill) + 0.5
    assert env.proxy.pools["pool-a"].controller.in_flight_of("elastic") == 0
    assert env.proxy.pools["pool-a"].controller.kv_reserved_of("elastic") == 0


async def test_events_describe_each_decision_and_completion(env: Env) -> None:
    client = env.client("gold")
    await client.chat.completions.create(**chat("a b c d e f g h"))  # type: ignore[call-overload]
    s = await client.chat.completions.create(**chat(), stream=True)  # type: ignore[call-overload]
    async for _ in s:
        pass
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(**chat(max_tokens=100_000))  # type: ignore[call-overload]
    await settle_events(env)
    decided = env.hub.of("requests")
    completed = env.hub.of("completions")
    assert [d["outcome"] for d in decided] == ["admitted", "admitted", "token_budget"]
    first = decided[0]
    assert first["pool"] == "pool-a" and first["entitlement"] == "gold" and first["proxy_id"] == "proxy-0"
    assert first["max_tokens"] == 32 and first["cost_tokens"] == first["prompt_tokens_est"] + 32
    assert first["kv_bytes"] == first["cost_tokens"] * KV and first["priority"] == 500.0
    assert decided[1]["stream"] is True and decided[2]["retry_after_s"] >= 1
    assert [d["retry_after_ms"] > 0 for d in decided] == [False, False, True]
    assert decided[2]["retry_after_s"] == max(1, math.ceil(decided[2]["retry_after_ms"] / 1000))
    assert [c["request_id"] for c in completed] == [d["request_id"] for d in decided[:2]]
    for c in completed:
        assert c["status"] == "ok" and c["http_status"] == 200
        assert (c["prompt_tokens"], c["completion_tokens"]) == (10, 4)
        assert c["e2e_s"] >= 0 and c["backend"].startswith("http://127.0.0.1:")
    assert completed[0]["ttft_s"] is None and completed[1]["ttft_s"] is not None
    assert completed[1]["ttft_s"] <= completed[1]["e2e_s"]
    # the identity that survives a re-send (core.resends): the process's start and the entitlement's numbering
    assert [c["sequence"] for c in completed] == [1, 2]
    assert {c["proxy_start_ms"] for c in completed} == {int(first["request_id"].split("-")[-2], 16)}
    # decisions carry one too, numbered apart from the completions (the token_budget refusal is the third)
    assert [d["sequence"] for d in decided] == [1, 2, 3]
    assert {d["proxy_start_ms"] for d in decided} == {completed[0]["proxy_start_ms"]}
    keys = {k for t, k, _ in env.hub.records if t.endswith("requests")}
    assert keys == {b"pool-a"}
    records = [orjson.loads(v) for _, _, v in env.hub.records]
    assert {r["record_type"] for r in unpack(records)} >= {"request_decided", "request_completed", "proxy_heartbeat"}
    envelopes = [r for r in records if r["record_type"] == "event_batch"]  # event topics carry watermarks
    assert envelopes and all(r["proxy_id"] == "proxy-0" and r["watermark_ms"] > 0 for r in envelopes)


async def test_the_load_generator_retries_after_retry_after_ms_not_a_whole_second(env: Env) -> None:
    """A token-budget refusal a few hundred ms short: the load generator waits the proxy's retry-after-ms (plus its
    jitter), not Retry-After's whole second, is admitted on that retry, and records what it waited. It numbers its
    attempts as the openai client does (x-stainless-retry-count), so the proxy links the retry to the refusal."""
    env.apply({**LIMITS, "elastic": (4, 1000.0, 2e7, 50.0)})  # a 10,000-token bucket refilling at 1,000/s
    # "big" holds its reservation while "next" is decided: it completes only after 1.5 s (its completion refunds
    # almost all of it; a fast backend once settled it before "next" arrived on a busy machine, and "next" passed)
    env.backend.delay_s = 1.5
    pool = env.proxy.pools["pool-a"]  # and the bucket starts full (the static limits' may have been shallower)
    pool.controller.set_bucket_tokens("elastic", 10_000.0, env.proxy.clock.now_s())
    options = LoadOptions(model="fake-model", keys={"elastic": KEYS["elastic"]}, retry=RetryPolicy(3, 0.05))
    load = LoadGenerator([env.url], options)
    try:
        # "next" must reach the proxy after "big" (0.4 s later: on a loaded machine the generator once sent "big"
        # 0.2 s late, after "next", which then took the tokens) and still be short (by ~470 tokens when it comes on
        # time, so it may be ~0.47 s late); the refill it waits for is well under Retry-After's second
        result = await load.run([Arrival(0.0, "elastic", "big", 8, 9950, 4),  # leaves ~40 tokens
                                 Arrival(0.4, "elastic", "next", 8, 900, 4)], origin_s=time.time() + 0.05)
    finally:
        await load.close()
        gc.unfreeze()  # run() froze what existed then; give it back to this process's collector
    assert load.failures == 0
    attempts = sorted((a for a in result.attempts if a.request_id == "next"), key=lambda a: a.attempt)
    refused, retry = attempts[0], attempts[-1]
    assert refused.outcome == "token_budget" and refused.retry_after_s == 1, result.attempts
    assert 0 < refused.retry_after_ms < 1000  # the refill of ~300 tokens at 1,000/s, less what the proxy refunds
    assert refused.retry_after_ms / 1000 <= refused.retry_wait_s < refused.retry_after_ms / 1000 + 0.05
    assert retry.outcome == "admitted" and len(attempts) == 2
    # from the refusal's answer to the retry it slept at least as recorded (the event loop's lag on a loaded machine
    # adds to it: ~90 ms seen at a load of 9 on 2 cores, and up to 0.7 s between sending and answering, so nothing
    # here is timed against the wall clock): what matters is that the wait is the ms, short of Retry-After's second
    assert refused.retry_wait_s - 0.005 <= retry.t_s - refused.answered_s
    assert refused.retry_wait_s < 1.0
    await settle_events(env)
    decided = {e["request_id"]: e for e in unpack(env.hub.of("requests")) if e["record_type"] == "request_decided"}
    first, second = decided[refused.proxy_request_id], decided[retry.proxy_request_id]
    assert (first["attempt"], first["retry_link"], "first_request_id" in first) == (0, "idempotency_key", False)
    assert (second["attempt"], second["first_request_id"], second["retry_link"]) == (
        1, refused.proxy_request_id, "idempotency_key")
