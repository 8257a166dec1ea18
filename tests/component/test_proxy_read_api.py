"""The read API against a running proxy: a tenant sees its own entitlements and nothing of anyone else's; the
admin view needs the operators' key (held as a digest) and shows every entitlement; it is off without one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tokenpools.config import hash_api_key
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState, ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.app import build_app
from tokenpools.topics.codec import encode
from tokenpools.topics.records import EntitlementLimit
from tokenpools_dev.proxy.doubles import FakeBackend, ProducerHub, limit_update, offline_options, proxy_config, running

pytestmark = pytest.mark.component

POOL = PoolSpec("pool-a", "fake-model", Capacity(10_000, 10_000_000, 8), kv_bytes_per_token=1000,
                default_max_tokens=32, token_bucket_window_s=10)
ENTITLEMENTS = [EntitlementSpec("alpha", "pool-a", ServiceClass.ELASTIC, 5000, Capacity(1000, 2_000_000, 2)),
                EntitlementSpec("beta", "pool-a", ServiceClass.SPOT, 30000),
                EntitlementSpec("later", "pool-a", ServiceClass.SPOT, 30000, state=EntitlementState.PENDING)]
KEYS = {e.name: f"sk-{e.name}" for e in ENTITLEMENTS}
ADMIN_KEY = "sk-operators"


async def _get(url: str, key: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as r:
        return r.status, await r.json()


@pytest.fixture
async def proxy_url(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    backend = FakeBackend()
    backend.delay_s = 0.5
    admin = getattr(request, "param", hash_api_key(ADMIN_KEY))
    async with running(backend.app()) as backend_url:
        config = proxy_config({"pool-a": (backend_url,)}, [POOL], ENTITLEMENTS, KEYS)
        options = offline_options(tmp_path, admin_key_sha256=admin)
        app = build_app(config, options, producer_factory=ProducerHub().factory)
        async with running(app) as url:
            assert app.proxy.limits is not None
            update = limit_update("pool-a", 3, app.proxy.clock.wall_ms(),
                                  {"alpha": (2, 100.0, 2e6, 50.0), "beta": (4, 100.0, 2e6, 5.0)}, 8)
            update = update.model_copy(update={"entitlements": tuple(
                EntitlementLimit.model_validate({**e.model_dump(), "debt": 0.25 if e.name == "alpha" else 0.0})
                for e in update.entitlements)})
            assert app.proxy.limits.handle(encode(update)) == "applied"
            yield url


async def test_a_tenant_sees_its_own_entitlement_and_nothing_else(proxy_url: str) -> None:
    async with aiohttp.ClientSession() as session:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        held = asyncio.create_task(session.post(proxy_url + "/v1/chat/completions", json=body,
                                                headers={"Authorization": f"Bearer {KEYS['alpha']}"}))
        await asyncio.sleep(0.2)  # alpha's request is in flight at the backend
        status, view = await _get(proxy_url + "/v1/tokenpools/limits", KEYS["alpha"])
        (await held).release()
    assert status == 200 and view["object"] == "tokenpools.limits"
    [mine] = view["entitlements"]
    assert (mine["entitlement"], mine["pool"], mine["model"], mine["service_class"], mine["state"]) == (
        "alpha", "pool-a", "fake-model", "elastic", "Bound")
    assert mine["in_flight"] == 1 and mine["limits"]["concurrency"] == 2 and mine["debt"] == 0.25
    assert mine["fleet_limits"] == {"concurrency": 2, "tokens_per_s": 100.0, "kv_bytes": 2e6}
    assert mine["bucket_depth_tokens"] == 1000 and 0 <= mine["bucket_tokens"] <= 1000  # 100 tokens/s x the 10-s window
    assert mine["limits_from"]["source"] == "update" and mine["limits_from"]["version"] == 3
    text = str(view)
    assert "beta" not in text and "sk-" not in text and hash_api_key(KEYS["alpha"]) not in text
    status, pending = await _get(proxy_url + "/v1/tokenpools/limits", KEYS["later"])
    [later] = pending["entitlements"]
    assert status == 200 and later["state"] == "Pending" and later["in_flight"] == 0  # refused 403 until Bound


async def test_without_a_known_key_there_is_nothing_to_see(proxy_url: str) -> None:
    for key in (None, "sk-stranger", ADMIN_KEY):  # the operators' key is no tenant's
        status, body = await _get(proxy_url + "/v1/tokenpools/limits", key)
        assert status == 401 and body["error"]["type"] == "authentication_error"


async def test_the_admin_view_needs_the_operators_key_and_shows_every_entitlement(proxy_url: str) -> None:
    for key in (None, KEYS["alpha"], ADMIN_KEY + "x"):
        status, _ = await _get(proxy_url + "/v1/tokenpools/admin/limits", key)
        assert status == 401
    status, view = await _get(proxy_url + "/v1/tokenpools/admin/limits", ADMIN_KEY)
    assert status == 200 and [e["entitlement"] for e in view["entitlements"]] == ["alpha", "beta", "later"]


@pytest.mark.parametrize("proxy_url", [None], indirect=True)
async def test_the_admin_view_is_off_without_a_configured_key(proxy_url: str) -> None:
    status, body = await _get(proxy_url + "/v1/tokenpools/admin/limits", ADMIN_KEY)
    assert status == 404 and "admin_key_sha256" in body["error"]["message"]
