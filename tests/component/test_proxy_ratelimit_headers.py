"""OpenAI's ``x-ratelimit-*`` headers on the proxy's answers, read through the ``openai`` client's raw response:
what an admitted request, a stream and a refusal each say about the entitlement's concurrency and token bucket."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
from openai import AsyncOpenAI

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.app import Proxy, build_app
from tokenpools.topics.codec import encode
from tokenpools_dev.proxy.doubles import FakeBackend, ProducerHub, limit_update, offline_options, proxy_config, running

pytestmark = pytest.mark.component

POOL = PoolSpec("pool-a", "fake-model", Capacity(10_000, 10_000_000, 8), kv_bytes_per_token=1000,
                default_max_tokens=32, token_bucket_window_s=10)
ENTITLEMENTS = [EntitlementSpec("team", "pool-a", ServiceClass.ELASTIC, 5000, Capacity(1000, 2_000_000, 2))]
KEYS = {"team": "sk-team"}
RATE = 20.0  # tokens/s: a 200-token bucket (10-s window)
HEADERS = ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
           "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")


@dataclasses.dataclass
class Env:
    client: AsyncOpenAI
    backend: FakeBackend
    proxy: Proxy


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    backend = FakeBackend()
    async with running(backend.app()) as backend_url:
        config = proxy_config({"pool-a": (backend_url,)}, [POOL], ENTITLEMENTS, KEYS)
        app = build_app(config, offline_options(tmp_path, policy={"queue_slo_fraction": 0}),
                        producer_factory=ProducerHub().factory)
        async with running(app) as url:
            assert app.proxy.limits is not None
            update = limit_update("pool-a", 1, app.proxy.clock.wall_ms(), {"team": (2, RATE, 2e6, 50.0)}, 8)
            assert app.proxy.limits.handle(encode(update)) == "applied"
            client = AsyncOpenAI(base_url=url + "/v1", api_key=KEYS["team"], max_retries=0)
            try:
                yield Env(client, backend, app.proxy)
            finally:
                await client.close()


def _chat(**kw: object) -> dict[str, object]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], **kw}


async def test_an_admitted_request_says_what_is_left_after_it(env: Env) -> None:
    raw = await env.client.chat.completions.with_raw_response.create(**_chat(max_tokens=40))  # type: ignore[call-overload]
    h = raw.headers
    assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("2", "1")  # itself in flight
    assert h["x-ratelimit-reset-requests"] == "0s"  # a slot is free
    assert h["x-ratelimit-limit-tokens"] == "200"  # 20 tokens/s x the 10-s window
    remaining = int(h["x-ratelimit-remaining-tokens"])
    assert 0 < remaining <= 200 - 40  # its reservation (prompt + 40) is out of the bucket
    reset = h["x-ratelimit-reset-tokens"]  # the refill of what is missing at 20 tokens/s, OpenAI's format
    assert reset.endswith("s") and 40 / RATE <= float(reset.removesuffix("s")) <= (200 - remaining) / RATE + 0.01
    raw.parse()  # the body is what the backend answered


async def test_a_stream_carries_them_from_its_first_byte(env: Env) -> None:
    raw = await env.client.chat.completions.with_raw_response.create(**_chat(stream=True))  # type: ignore[call-overload]
    assert all(name in raw.headers for name in HEADERS)
    async for _ in raw.parse():
        pass


async def test_a_refusal_carries_them_beside_retry_after(env: Env) -> None:
    env.backend.delay_s = 0.5
    held = [asyncio.create_task(env.client.chat.completions.create(**_chat(max_tokens=4)))  # type: ignore[call-overload]
            for _ in range(2)]
    await asyncio.sleep(0.2)
    with pytest.raises(openai.RateLimitError) as caught:
        await env.client.chat.completions.create(**_chat(max_tokens=4))  # type: ignore[call-overload]
    h = caught.value.response.headers
    assert caught.value.body["code"] == "concurrency"  # type: ignore[index]
    assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("2", "0")
    assert h["x-ratelimit-reset-requests"] not in ("", "0s")  # when a slot frees, as the refusal estimates
    assert h["Retry-After"] == "1" and int(h["retry-after-ms"]) > 0
    await asyncio.gather(*held)


async def test_an_unknown_key_gets_none(env: Env) -> None:
    stranger = AsyncOpenAI(base_url=str(env.client.base_url), api_key="sk-stranger", max_retries=0)
    try:
        with pytest.raises(openai.AuthenticationError) as caught:
            await stranger.chat.completions.create(**_chat())  # type: ignore[call-overload]
    finally:
        await stranger.close()
    assert not any(name in caught.value.response.headers for name in HEADERS)
