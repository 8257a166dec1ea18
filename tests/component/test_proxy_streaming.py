"""Streams pass through chunk by chunk; usage is requested and hidden; client aborts and evictions close the
backend connection; the backend's own refusals and failures are passed through and labelled as the backend's."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import orjson
import pytest
from openai import AsyncOpenAI

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.app import Proxy, build_app
from tokenpools.topics.codec import encode
from tokenpools_dev.proxy.doubles import FakeBackend, ProducerHub, limit_update, offline_options, proxy_config, running

pytestmark = pytest.mark.component

POOL = PoolSpec("pool-a", "fake-model", Capacity(10_000, 1e9, 8), kv_bytes_per_token=1000, default_max_tokens=32)
ENTITLEMENTS = [
    EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(1000, 2e8, 2)),
    EntitlementSpec("pre", "pool-a", ServiceClass.PREEMPTIBLE, 30000),
]
KEYS = {"gold": "sk-gold", "pre": "sk-pre"}
LIMITS = {"gold": (4, 5000.0, 1e8, 500.0), "pre": (4, 5000.0, 1e8, 0.1)}


@dataclasses.dataclass
class Env:
    url: str
    backend: FakeBackend
    hub: ProducerHub
    proxy: Proxy
    session: aiohttp.ClientSession

    async def post(self, key: str, body: dict[str, object], path: str = "/v1/chat/completions") -> aiohttp.ClientResponse:
        return await self.session.post(self.url + path, json=body, headers={"Authorization": f"Bearer {key}"})

    async def completions(self) -> list[dict[str, object]]:
        for _ in range(200):
            assert self.proxy.events is not None
            if not self.proxy.events.queue_depth and not self.proxy.events.in_flight:
                break
            await asyncio.sleep(0.01)
        return self.hub.of("completions")


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    backend = FakeBackend()
    hub = ProducerHub()
    async with running(backend.app()) as backend_url:
        config = proxy_config({"pool-a": (backend_url,)}, [POOL], ENTITLEMENTS, KEYS)
        app = build_app(config, offline_options(tmp_path), producer_factory=hub.factory)
        async with running(app) as url, aiohttp.ClientSession() as session:
            proxy = app.proxy
            assert proxy.limits is not None
            proxy.limits.handle(encode(limit_update("pool-a", 1, proxy.clock.wall_ms(), LIMITS, 2)))
            yield Env(url, backend, hub, proxy, session)


def chat(**kw: object) -> dict[str, object]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], **kw}


def events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e]


async def test_chunks_arrive_as_the_backend_sends_them(env: Env) -> None:
    env.backend.chunks, env.backend.chunk_delay_s = 5, 0.2
    t0 = time.monotonic()
    arrivals = []
    async with await env.post("sk-gold", chat(stream=True)) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        async for data in r.content.iter_any():
            arrivals.append((time.monotonic() - t0, data))
    first_content = next(t for t, d in arrivals if b"tok" in d)
    # the backend spreads 5 chunks over >= 0.8 s: a buffering proxy would deliver them all at the end
    assert arrivals[-1][0] >= 0.75 and first_content < arrivals[-1][0] - 0.5, "the first chunk was held back"
    assert len([t for t, d in arrivals if b"tok" in d]) >= 3, "chunks were coalesced"
    body = b"".join(d for _, d in arrivals)
    assert body.endswith(b"data: [DONE]\n\n") and len([e for e in events(body) if b"tok" in e]) == 5
    (done,) = await env.completions()
    assert done["ttft_s"] is not None and done["ttft_s"] < done["e2e_s"] - 0.5 and done["e2e_s"] >= 0.75


async def test_usage_is_requested_and_hidden_unless_the_client_asked(env: Env) -> None:
    async with await env.post("sk-gold", chat(stream=True)) as r:
        hidden = await r.read()
    assert env.backend.bodies[-1]["stream_options"] == {"include_usage": True}
    assert b'"usage"' not in hidden
    async with await env.post("sk-gold", chat(stream=True, stream_options={"include_usage": True})) as r:
        shown = await r.read()
    usage = [orjson.loads(e[6:]) for e in events(shown) if b'"usage"' in e]
    assert usage and usage[-1]["usage"]["completion_tokens"] == 4 and usage[-1]["choices"] == []
    env.backend.usage_on_last_content_chunk = True  # some servers put usage on the last content chunk
    async with await env.post("sk-gold", chat(stream=True)) as r:
        rider = await r.read()
    assert b'"usage"' not in rider and rider.count(b"tok") == 4
    done = await env.completions()
    assert all((c["prompt_tokens"], c["completion_tokens"]) == (10, 4) for c in done)


async def test_the_openai_client_streams_through(env: Env) -> None:
    async with AsyncOpenAI(base_url=env.url + "/v1", api_key="sk-gold", max_retries=0) as client:
        stream = await client.completions.create(model="fake-model", prompt="hi", max_tokens=3, stream=True)
        texts = [c.choices[0].text async for c in stream]
    assert texts == ["tok "] * 3


async def test_a_client_abort_closes_the_backend_connection(env: Env) -> None:
    env.backend.chunks, env.backend.chunk_delay_s = 50, 0.05
    r = await env.post("sk-gold", chat(stream=True, max_tokens=50))
    await r.content.readany()
    r.close()  # the client goes away mid-stream
    for _ in range(100):
        if env.backend.aborted:
            break
        await asyncio.sleep(0.02)
    assert env.backend.aborted == 1 and env.backend.finished == 0
    (done,) = await env.completions()
    assert done["status"] == "client_abort"
    assert env.proxy.pools["pool-a"].controller.in_flight == 0


async def test_preemptible_requests_are_evicted_for_protected_work(env: Env) -> None:
    env.backend.chunks, env.backend.chunk_delay_s = 100, 0.05
    streaming = await env.post("sk-pre", chat(stream=True, max_tokens=100))
    await streaming.content.readany()
    env.backend.delay_s = 5.0  # the second preemptible request waits for its (non-streamed) answer
    waiting = asyncio.create_task(env.post("sk-pre", chat()))
    await asyncio.sleep(0.2)
    # the pool (2 slots) is full: each protected request takes the newest preemptible one's slot
    env.backend.delay_s, env.backend.chunks = 0.3, 2
    gold = [asyncio.create_task(env.post("sk-gold", chat()))]
    await asyncio.sleep(0.1)
    gold.append(asyncio.create_task(env.post("sk-gold", chat())))
    async with await waiting as r:
        assert r.status == 503 and (await r.json())["error"]["code"] == "evicted"
        assert r.headers["Retry-After"] == "1"
        evicted_id = r.headers["X-Request-Id"]
    rest = await streaming.content.read()
    last = events(rest)[-1]
    assert last.startswith(b"data: ") and orjson.loads(last[6:])["error"]["code"] == "evicted"
    streaming.close()
    for task in gold:
        async with await task as r:
            assert r.status == 200
    assert env.backend.aborted == 2
    completed = await env.completions()
    done = sorted(f"{c['entitlement']}:{c['status']}" for c in completed)
    assert done == ["gold:ok", "gold:ok", "pre:evicted", "pre:evicted"]
    assert evicted_id in {c["request_id"] for c in completed if c["status"] == "evicted"}
    assert env.proxy.metrics.evictions[("pool-a", "pre")] == 2
    assert env.proxy.pools["pool-a"].controller.in_flight == 0


async def test_the_openai_client_sees_an_error_when_its_stream_is_evicted(env: Env) -> None:
    env.backend.chunks, env.backend.chunk_delay_s = 100, 0.05
    hold = await env.post("sk-pre", chat(stream=True, max_tokens=100))  # the older one keeps its slot
    async with AsyncOpenAI(base_url=env.url + "/v1", api_key="sk-pre", max_retries=0) as client:
        stream = await client.chat.completions.create(**chat(stream=True, max_tokens=100))  # type: ignore[call-overload]
        got = []

        async def read() -> None:
            async for chunk in stream:
                got.append(chunk)

        reader = asyncio.create_task(read())
        for _ in range(500):  # until the stream flows (both preemptible requests hold the pool's two slots)
            if got:
                break
            await asyncio.sleep(0.01)
        assert env.proxy.pools["pool-a"].controller.in_flight == 2
        env.backend.chunks, env.backend.chunk_delay_s = 2, 0.0
        async with await env.post("sk-gold", chat()) as r:
            assert r.status == 200
        with pytest.raises(openai.APIError, match="evicted"):
            await reader
    hold.close()
    assert got, "some chunks came through before the eviction"


async def test_a_stream_the_backend_failed_stays_its_failure_when_the_client_then_leaves(env: Env) -> None:
    """The openai client closes a stream at its error event: a backend error that ends the stream is the backend's,
    whatever the client does next (the proxy may still be passing the stream's last bytes)."""
    env.backend.chunks, env.backend.fail_after, env.backend.chunk_delay_s = 10, 3, 0.3
    async with AsyncOpenAI(base_url=env.url + "/v1", api_key="sk-gold", max_retries=0) as client:
        stream = await client.chat.completions.create(**chat(stream=True, max_tokens=10))  # type: ignore[call-overload]
        got = []
        with pytest.raises(openai.APIError, match="EngineCore"):
            async for chunk in stream:
                got.append(chunk)
    assert len(got) == 3
    for _ in range(200):  # the proxy ends the request when the client has gone or the backend's stream has ended
        if not env.proxy.pools["pool-a"].controller.in_flight:
            break
        await asyncio.sleep(0.01)
    (done,) = await env.completions()
    assert (done["status"], done["completion_tokens"]) == ("backend_error", 3)  # no usage: a token a chunk
    assert env.proxy.metrics.backend_errors[("pool-a", "stream")] == 1


@pytest.mark.parametrize("status", [429, 503])
async def test_backend_refusals_pass_through_and_are_not_counted_as_ours(env: Env, status: int) -> None:
    env.backend.status = status
    async with await env.post("sk-gold", chat()) as r:
        assert r.status == status
        assert r.headers["X-TokenPools-Refused-By"] == "backend"
        assert (await r.json())["error"]["message"] == f"backend says {status}"
    (done,) = await env.completions()
    assert done["status"] == "backend_refused" and done["http_status"] == status
    decided = env.hub.of("requests")
    assert [d["outcome"] for d in decided] == ["admitted"]
    assert env.proxy.metrics.backend_refusals[("pool-a", str(status))] == 1
    assert env.proxy.pools["pool-a"].controller.bucket_tokens_of("gold", env.proxy.clock.now_s()) > 9990


async def test_backend_errors_are_passed_through_or_reported(env: Env) -> None:
    env.backend.status = 400
    async with await env.post("sk-gold", chat(stream=True)) as r:
        assert r.status == 400 and "X-TokenPools-Refused-By" not in r.headers
        ids = [r.headers["X-Request-Id"]]
    env.proxy.handlers.upstream._cycle["pool-a"] = iter(["http://127.0.0.1:9"] * 3)  # type: ignore[union-attr]
    async with await env.post("sk-gold", chat()) as r:
        assert r.status == 502
        assert (await r.json())["error"]["code"] == "backend_unavailable"
        ids.append(r.headers["X-Request-Id"])  # the proxy's own answer names the request its records name too
    completed = await env.completions()
    assert [c["status"] for c in completed] == ["backend_error", "backend_error"]
    assert [c["request_id"] for c in completed] == ids
    assert env.proxy.metrics.backend_errors[("pool-a", "connect")] == 1
