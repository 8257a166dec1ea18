"""The engine's ``priority`` in the forwarded body: written from the class and w_e when the pool has
``enginePriority`` on, whatever the client sent; removed when it is off, so a backend that rejects the field (vLLM
without ``--scheduling-policy priority``) serves the request. On every admitted endpoint, streamed or not."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import DEFAULT_CLASS_WEIGHTS, ServiceClass
from tokenpools.core.engine_priority import engine_priority
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.topics.codec import encode
from tokenpools.proxy.app import build_app
from tokenpools_dev.proxy.doubles import FakeBackend, ProducerHub, limit_update, offline_options, proxy_config, running

pytestmark = pytest.mark.component

ENTITLEMENTS = [
    EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(1000, 2e8, 2)),
    EntitlementSpec("team", "pool-a", ServiceClass.ELASTIC, 5000, Capacity(1000, 2e8, 2)),
    EntitlementSpec("pre", "pool-a", ServiceClass.PREEMPTIBLE, 30000),
]
KEYS = {"gold": "sk-gold", "team": "sk-team", "pre": "sk-pre"}
W_E = {"gold": 812.5, "team": 31.25, "pre": 0.1}  # the priorities the limits carry (w_e)
LIMITS = {name: (4, 5000.0, 1e8, w) for name, w in W_E.items()}
CLASS = {e.name: e.service_class for e in ENTITLEMENTS}
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"prompt": "hi"},
    "/v1/embeddings": {"input": "hi"},
    "/v1/responses": {"input": "hi"},
}
STREAMS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")


@dataclasses.dataclass
class Env:
    url: str
    backend: FakeBackend
    session: aiohttp.ClientSession

    async def post(self, key: str, path: str, **extra: Any) -> tuple[int, bytes]:
        body = {"model": "fake-model", **BODIES[path], **extra}
        async with self.session.post(self.url + path, json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            return r.status, await r.read()


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, *, on: bool, reject: bool) -> AsyncIterator[Env]:
    """The proxy before a backend that records bodies (``reject``: and answers 400 to any carrying ``priority``),
    its pool with ``enginePriority`` ``on`` or off."""
    pool = PoolSpec("pool-a", "fake-model", Capacity(10_000, 1e9, 8), kv_bytes_per_token=1000, default_max_tokens=8,
                    engine_priority=on)
    backend = FakeBackend(reject_priority=reject)
    async with running(backend.app()) as backend_url:
        config = proxy_config({"pool-a": (backend_url,)}, [pool], ENTITLEMENTS, KEYS)
        app = build_app(config, offline_options(tmp_path), producer_factory=ProducerHub().factory)
        async with running(app) as url, aiohttp.ClientSession() as session:
            assert app.proxy.limits is not None
            assert app.proxy.limits.handle(encode(limit_update("pool-a", 1, app.proxy.clock.wall_ms(), LIMITS, 8))) \
                == "applied"
            yield Env(url, backend, session)


def expected(name: str) -> int:
    return engine_priority(CLASS[name], W_E[name], DEFAULT_CLASS_WEIGHTS)


def test_the_classes_here_land_in_their_bands_in_order() -> None:
    assert (expected("gold"), expected("team"), expected("pre")) == (152, 263, 450)


@pytest.mark.parametrize("path", list(BODIES))
async def test_on_the_body_carries_the_mapped_priority_whatever_the_client_sent(tmp_path: Path, path: str) -> None:
    async with serving(tmp_path, on=True, reject=False) as env:
        for name in KEYS:
            for client_priority in ({}, {"priority": -1000}, {"priority": "high"}):
                status, raw = await env.post(KEYS[name], path, **client_priority)
                assert status == 200, raw
                assert env.backend.bodies[-1]["priority"] == expected(name)
        if path in STREAMS:
            status, raw = await env.post("sk-pre", path, stream=True, priority=0)
            assert status == 200 and env.backend.bodies[-1]["priority"] == expected("pre")


@pytest.mark.parametrize("path", list(BODIES))
async def test_off_a_clients_priority_never_reaches_the_backend(tmp_path: Path, path: str) -> None:
    async with serving(tmp_path, on=False, reject=False) as env:
        for extra in ({}, {"priority": -1000}, {"priority": 7}):
            status, raw = await env.post("sk-pre", path, **extra)
            assert status == 200, raw
            assert "priority" not in env.backend.bodies[-1]
        if path in STREAMS:
            status, _ = await env.post("sk-pre", path, stream=True, priority=-5)
            assert status == 200 and "priority" not in env.backend.bodies[-1]


@pytest.mark.parametrize("path", list(BODIES))
async def test_a_backend_that_rejects_the_field_serves_a_pool_with_it_off(tmp_path: Path, path: str) -> None:
    async with serving(tmp_path, on=False, reject=True) as env:
        status, raw = await env.post("sk-gold", path, priority=3)
        assert status == 200, raw
        assert "priority" not in env.backend.bodies[-1]


async def test_a_backend_that_rejects_the_field_answers_400_when_the_pool_turns_it_on(tmp_path: Path) -> None:
    """What ``enginePriority: true`` in front of vLLM without priority scheduling looks like: the backend's own 400,
    passed through (the fix is the pool's switch, not the proxy's guess)."""
    async with serving(tmp_path, on=True, reject=True) as env:
        status, raw = await env.post("sk-gold", "/v1/chat/completions")
        assert status == 400 and b"Priority scheduling is not enabled" in raw
        assert orjson.loads(raw)["error"]["type"] == "BadRequestError"
