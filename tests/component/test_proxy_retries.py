"""Retries at a real proxy app (docs/tuning.md#how-the-proxy-links-attempts): a refused request and its retry, sent
with each marker a client may use, give decided records that number the attempts and link the retry to the first;
an unmarked first attempt's record carries none of the fields (the same bytes as before they existed)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.app import Proxy, build_app
from tokenpools.topics.codec import encode
from tokenpools.topics.records import RequestDecided
from tokenpools_dev.proxy.doubles import (
    FakeBackend, ProducerHub, limit_update, offline_options, proxy_config, running, unpack)

pytestmark = pytest.mark.component

POOL = PoolSpec("pool-a", "fake-model", Capacity(10_000, 10_000_000, 8), kv_bytes_per_token=1000,
                default_max_tokens=32, token_bucket_window_s=10)
ENTITLEMENTS = [EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(1000, 2_000_000, 2)),
                EntitlementSpec("tiny", "pool-a", ServiceClass.ELASTIC, 5000, Capacity(1, 2_000_000, 2))]
KEYS = {e.name: f"sk-{e.name}" for e in ENTITLEMENTS}
# tiny: 1 token/s × 10 s, so a request of max_tokens 40 never fits its bucket (a token-budget refusal)
LIMITS = {"gold": (2, 1000.0, 2e6, 500.0), "tiny": (2, 1.0, 2e6, 50.0)}
RETRY_FIELDS = {"attempt", "first_request_id", "retry_link"}


@dataclasses.dataclass
class Env:
    url: str
    hub: ProducerHub
    proxy: Proxy
    session: aiohttp.ClientSession

    async def chat(self, name: str, headers: dict[str, str] | None = None, content: str = "hi") -> str:
        """One request of ``name``'s key; its request id (the proxy's X-Request-Id)."""
        body = {"model": "fake-model", "messages": [{"role": "user", "content": content}], "max_tokens": 40}
        async with self.session.post(self.url + "/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer sk-{name}", **(headers or {})}) as r:
            await r.read()
            assert r.status == (200 if name == "gold" else 429), r.status
            return r.headers["X-Request-Id"]

    async def decided(self, rid: str) -> dict[str, Any]:
        """The raw decided event of ``rid``, as it went to the topic."""
        for _ in range(250):
            for value in unpack(self.hub.of("requests")):
                if value.get("request_id") == rid and value.get("record_type") == "request_decided":
                    return value
            await asyncio.sleep(0.02)
        raise AssertionError(f"no decided event for {rid}")

    async def retry_fields(self, rid: str) -> dict[str, Any]:
        event = await self.decided(rid)
        return {k: event[k] for k in sorted(RETRY_FIELDS & set(event))}


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    backend = FakeBackend()
    hub = ProducerHub()
    async with running(backend.app()) as backend_url:
        config = proxy_config({"pool-a": (backend_url,)}, [POOL], ENTITLEMENTS, KEYS)
        app = build_app(config, offline_options(tmp_path, policy={"queue_slo_fraction": 0}),
                        producer_factory=hub.factory)
        async with running(app) as url, aiohttp.ClientSession() as session:
            proxy = app.proxy
            assert proxy.limits is not None
            update = limit_update("pool-a", 1, proxy.clock.wall_ms(), LIMITS, 8)
            assert proxy.limits.handle(encode(update)) == "applied"
            yield Env(url, hub, proxy, session)


@pytest.mark.parametrize(("header", "first", "retry", "link"), [
    ("x-stainless-retry-count", "0", "1", "sdk_retry_count"),
    ("Idempotency-Key", "key-1", "key-1", "idempotency_key"),
    ("X-Client-Request-Id", "req-1", "req-1", "client_request_id"),
])
async def test_a_marked_retry_is_linked_to_its_refused_first_attempt(env: Env, header: str, first: str, retry: str,
                                                                     link: str) -> None:
    r0 = await env.chat("tiny", {header: first})
    r1 = await env.chat("tiny", {header: retry})
    assert await env.retry_fields(r0) == {"attempt": 0, "retry_link": link}
    assert await env.retry_fields(r1) == {"attempt": 1, "first_request_id": r0, "retry_link": link}


async def test_an_unmarked_retry_of_a_refusal_is_linked_by_the_heuristic(env: Env) -> None:
    r0 = await env.chat("tiny")
    other = await env.chat("tiny", content="another question")  # another body: another request
    r1 = await env.chat("tiny")
    assert await env.retry_fields(r0) == {} and await env.retry_fields(other) == {}
    assert await env.retry_fields(r1) == {"attempt": 1, "first_request_id": r0, "retry_link": "heuristic"}


async def test_an_unmarked_first_attempt_carries_no_retry_fields(env: Env) -> None:
    admitted, refused = await env.chat("gold"), await env.chat("tiny", content="once")
    again = await env.chat("gold")  # an admitted request repeated is a new request
    for rid in (admitted, refused, again):
        event = await env.decided(rid)
        assert not RETRY_FIELDS & set(event)
        # re-encoded, the record writes none of them either: the bytes a consumer older than the fields reads
        encoded = encode(RequestDecided.model_validate(event))
        assert not any(name.encode() in encoded for name in RETRY_FIELDS)
