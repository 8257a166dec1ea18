"""Bad input gets a clear 4xx in OpenAI's error shape, reaches neither admission nor the backend, and the proxy
keeps serving."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.app import Proxy, build_app
from tokenpools_dev.proxy.doubles import FakeBackend, ProducerHub, offline_options, proxy_config, running

pytestmark = pytest.mark.component

CAP = 4096
POOL = PoolSpec("pool-a", "fake-model", Capacity(10_000, 1e12, 8))
GOLD = EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(1000, 1e11, 2))
AUTH = {"Authorization": "Bearer sk-gold"}


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[str, FakeBackend, Proxy, aiohttp.ClientSession]]:
    backend = FakeBackend()
    async with running(backend.app()) as backend_url:
        config = proxy_config({"pool-a": (backend_url,)}, [POOL], [GOLD], {"gold": "sk-gold"})
        options = offline_options(tmp_path, max_body_bytes=CAP)
        app = build_app(config, options, producer_factory=ProducerHub().factory)
        async with running(app) as url, aiohttp.ClientSession() as session:
            yield url, backend, app.proxy, session


CASES = [
    ("/v1/chat/completions", b"{not json", 400, "invalid_json", None),
    ("/v1/chat/completions", b"", 400, "invalid_json", None),
    ("/v1/chat/completions", b"[1, 2]", 400, "invalid_type", None),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}]}', 400, "missing_field", "model"),
    ("/v1/chat/completions", b'{"model": "fake-model"}', 400, "missing_field", "messages"),
    ("/v1/chat/completions", b'{"model": 7, "messages": []}', 400, "invalid_type", "model"),
    ("/v1/chat/completions", b'{"model": "fake-model", "messages": "hi"}', 400, "invalid_type", "messages"),
    ("/v1/chat/completions", b'{"model": "fake-model", "messages": [{"content": "x"}]}', 400, "invalid_type",
     "messages[0]"),
    ("/v1/chat/completions", b'{"model": "fake-model", "messages": [{"role": "user", "content": 5}]}', 400,
     "invalid_type", "messages[0].content"),
    ("/v1/chat/completions", b'{"model": "fake-model", "messages": [{"role": "user"}], "max_tokens": "10"}', 400,
     "invalid_type", "max_tokens"),
    ("/v1/chat/completions", b'{"model": "fake-model", "messages": [{"role": "user"}], "max_tokens": 0}', 400,
     "invalid_value", "max_tokens"),
    ("/v1/chat/completions", b'{"model": "fake-model", "messages": [{"role": "user"}], "max_tokens": true}', 400,
     "invalid_type", "max_tokens"),
    ("/v1/chat/completions", b'{"model": "fake-model", "messages": [{"role": "user"}], "stream": "yes"}', 400,
     "invalid_type", "stream"),
    ("/v1/chat/completions", b'{"model": "fake-model", "messages": [{"role": "user"}], "stream_options": 1}', 400,
     "invalid_type", "stream_options"),
    ("/v1/chat/completions", b'{"model": "fake-model", "messages": [{"role": "user"}], "n": -1}', 400,
     "invalid_value", "n"),
    ("/v1/chat/completions", b'{"model": "other-model", "messages": [{"role": "user"}]}', 404, "model_not_found",
     "model"),
    ("/v1/completions", b'{"model": "fake-model"}', 400, "missing_field", "prompt"),
    ("/v1/completions", b'{"model": "fake-model", "prompt": [1, "a"]}', 400, "invalid_type", "prompt"),
    ("/v1/completions", b'{"model": "fake-model", "prompt": {"a": 1}}', 400, "invalid_type", "prompt"),
]


@pytest.mark.parametrize(("path", "body", "status", "code", "param"), CASES)
async def test_bad_bodies_get_a_clear_4xx(env: tuple[str, FakeBackend, Proxy, aiohttp.ClientSession], path: str,
                                          body: bytes, status: int, code: str, param: str | None) -> None:
    url, backend, proxy, session = env
    async with session.post(url + path, data=body, headers={**AUTH, "Content-Type": "application/json"}) as r:
        assert r.status == status
        error = (await r.json())["error"]
    assert error["code"] == code and error["param"] == param and error["type"] == "invalid_request_error"
    assert error["message"]
    assert backend.started == 0 and not proxy.metrics.decisions
    assert proxy.metrics.bad_requests[code] == 1
    async with session.post(url + "/v1/chat/completions", headers=AUTH,
                            json={"model": "fake-model", "messages": [{"role": "user", "content": "ok"}]}) as r:
        assert r.status == 200  # still serving


async def test_huge_bodies_get_413_with_or_without_a_length(
        env: tuple[str, FakeBackend, Proxy, aiohttp.ClientSession]) -> None:
    url, backend, proxy, session = env
    huge = b'{"model": "fake-model", "messages": [{"role": "user", "content": "' + b"x" * (CAP * 4) + b'"}]}'

    async def chunked() -> AsyncIterator[bytes]:
        for i in range(0, len(huge), 1000):
            yield huge[i:i + 1000]

    for data in (huge, chunked()):
        async with session.post(url + "/v1/chat/completions", data=data, headers=AUTH) as r:
            assert r.status == 413
            error = (await r.json())["error"]
            assert error["code"] == "body_too_large" and str(CAP) in error["message"]
    assert backend.started == 0
    async with session.post(url + "/v1/chat/completions", headers=AUTH,
                            json={"model": "fake-model", "messages": [{"role": "user", "content": "ok"}]}) as r:
        assert r.status == 200


async def test_unknown_paths_and_methods(env: tuple[str, FakeBackend, Proxy, aiohttp.ClientSession]) -> None:
    url, _, _, session = env
    async with session.post(url + "/v1/images/generations", headers=AUTH, json={}) as r:
        assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
    async with session.get(url + "/v1/chat/completions", headers=AUTH) as r:
        assert r.status in (404, 405)
    async with session.get(url + "/healthz") as r:
        assert r.status == 200 and (await r.json())["status"] == "ok"
