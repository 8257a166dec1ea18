"""Live specs at a real proxy app (docs/tenancy.md): spec records applied through the one follower, and --config
edits through the file watch, change who is admitted at the next request; one key reaches its tenant's pools by
model and nothing else; in-flight requests of a removed entitlement settle; bad input is refused and loses nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tokenpools.config import hash_api_key, load_config, load_settings
from tokenpools.core.classes import ServiceClass
from tokenpools.proxy.app import Proxy, ProxyApp, build_app
from tokenpools.proxy.main import proxy_config
from tokenpools.proxy.inputs.spec_sources import ConfigWatcher, SpecsFollower
from tokenpools.runtime.specs import Catalogue, SpecOutcome
from tokenpools.topics.codec import encode
from tokenpools_dev import builders
from tokenpools_dev.proxy.doubles import FakeBackend, offline_options, running

pytestmark = pytest.mark.component

POOL = """apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {{name: {name}}}
spec:
  model: {model}
  backendRef: {{name: b}}
  perReplica: {{tokensPerSecond: 10000, kvCacheGiB: 1, concurrency: 8}}
  kvBytesPerToken: 1000
  endpoints: ["{url}"]
"""
ENTITLEMENT = """apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: {name}}}
spec:
  tenantId: {tenant}
  poolRef: {{name: {pool}}}
  qos: {{serviceClass: {cls}, sloTargetMs: 1000}}
  {resources}
  apiKeys: [{keys}]
"""
RESOURCES = "resources: {tokensPerSecond: 1000, kvCacheGiB: 0.01, concurrency: 2}"


def pool_doc(name: str, model: str, url: str) -> str:
    return POOL.format(name=name, model=model, url=url)


def ent_doc(name: str, pool: str, *keys: str, tenant: str = "", cls: str = "guaranteed") -> str:
    return ENTITLEMENT.format(name=name, tenant=tenant or f"t-{name}", pool=pool, cls=cls,
                              resources=RESOURCES if cls != "spot" else "",
                              keys=", ".join(f"{{sha256: {hash_api_key(k)}}}" for k in keys))


def ent_spec(pool: str, *keys: str, tenant: str, cls: str = "guaranteed", **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"tenantId": tenant, "poolRef": {"name": pool},
                            "qos": {"serviceClass": cls, "sloTargetMs": 1000},
                            "apiKeys": [{"sha256": hash_api_key(k)} for k in keys], **extra}
    if cls != "spot":
        spec["resources"] = {"tokensPerSecond": 1000, "kvCacheGiB": 0.01, "concurrency": 2}
    return spec


def record(name: str, spec: dict[str, Any] | None, *, state: str | None = None, generation: int = 0,
           deleted: bool = False) -> bytes:
    pool = (spec or {}).get("poolRef", {}).get("name", "")
    return encode(builders.spec_record("TokenEntitlement", name, spec, pool=pool, generation=generation, state=state,
                                          deleted=deleted))


@dataclasses.dataclass
class Env:
    url: str
    app: ProxyApp
    backends: dict[str, FakeBackend]
    path: Path
    follower: SpecsFollower
    session: aiohttp.ClientSession
    offset: int = 0

    @property
    def proxy(self) -> Proxy:
        return self.app.proxy

    def feed(self, value: bytes | None, key: str) -> SpecOutcome:
        self.offset += 1
        outcome = self.follower.handle(value, "tokenpools.specs", 0, self.offset, key.encode())
        self.follower.put_in_force()  # what the loop does after the consumer's batch
        return outcome

    async def chat(self, key: str, model: str = "model-a", **kw: Any) -> tuple[int, dict[str, Any]]:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **kw}
        async with self.session.post(self.url + "/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {key}"}) as r:
            return r.status, orjson.loads(await r.read())

    async def get(self, path: str, key: str) -> tuple[int, dict[str, Any]]:
        async with self.session.get(self.url + path, headers={"Authorization": f"Bearer {key}"}) as r:
            return r.status, orjson.loads(await r.read())


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    backends = {"pool-a": FakeBackend(model="model-a"), "pool-b": FakeBackend(model="model-b")}
    async with running(backends["pool-a"].app()) as url_a, running(backends["pool-b"].app()) as url_b:
        text = "---\n".join([
            pool_doc("pool-a", "model-a", url_a), pool_doc("pool-b", "model-b", url_b),
            ent_doc("alice-a", "pool-a", "sk-alice", tenant="alice"),
            ent_doc("alice-b", "pool-b", "sk-alice", tenant="alice"),
            ent_doc("bob-b", "pool-b", "sk-bob", tenant="bob", cls="spot"),
        ])
        path = tmp_path / "specs.yaml"
        path.write_text(text)
        loaded = load_config(path)
        settings = load_settings({}, [])
        app = build_app(proxy_config(loaded, settings, 0.0), offline_options(tmp_path, config_poll_interval_s=0.05),
                        watch=path)
        async with running(app) as url, aiohttp.ClientSession() as session:
            assert app.proxy.specs is not None
            follower = SpecsFollower(Catalogue.from_loaded(loaded), app.proxy.specs, app.proxy.events, "dead",
                                     "test/specs", app.proxy.clock)
            yield Env(url, app, backends, path, follower, session)


async def test_one_key_reaches_its_tenant_pools_by_model_and_lists_only_its_models(env: Env) -> None:
    assert (await env.chat("sk-alice", "model-a"))[0] == 200
    assert (await env.chat("sk-alice", "model-b"))[0] == 200
    assert (len(env.backends["pool-a"].bodies), len(env.backends["pool-b"].bodies)) == (1, 1)
    status, body = await env.chat("sk-bob", "model-a")  # bob's tenant has no entitlement on model-a's pool
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert "model-b" in body["error"]["message"] and "alice" not in body["error"]["message"]
    assert len(env.backends["pool-a"].bodies) == 1  # never reached
    assert (await env.chat("sk-alice", "model-z"))[1]["error"]["code"] == "model_not_found"
    _, models = await env.get("/v1/models", "sk-alice")
    assert [m["id"] for m in models["data"]] == ["model-a", "model-b"]
    _, models = await env.get("/v1/models", "sk-bob")
    assert [m["id"] for m in models["data"]] == ["model-b"]
    _, limits = await env.get("/v1/tokenpools/limits", "sk-alice")
    assert sorted(e["entitlement"] for e in limits["entitlements"]) == ["alice-a", "alice-b"]
    assert (await env.get("/v1/models", "sk-nobody"))[0] == 401


async def test_records_add_change_expire_rotate_and_remove_entitlements_at_the_next_request(env: Env) -> None:
    assert (await env.chat("sk-carol"))[0] == 401
    assert env.feed(record("carol", ent_spec("pool-a", "sk-carol", tenant="carol", cls="spot"), generation=1),
                    "TokenEntitlement/carol") is SpecOutcome.APPLIED
    assert (await env.chat("sk-carol"))[0] == 200
    version = env.proxy.metrics.spec_version
    assert version >= 1 and (await env.get("/healthz", "x"))[1]["specs_version"] == version
    runtime = env.proxy.pools["pool-a"]

    # a class change decides from the next request: the spec and its static priority change at once
    spot_priority = runtime.controller.limits_of("carol").priority
    env.feed(record("carol", ent_spec("pool-a", "sk-carol", tenant="carol"), generation=2), "TokenEntitlement/carol")
    assert runtime.entitlements["carol"].service_class is ServiceClass.GUARANTEED
    assert runtime.controller.limits_of("carol").priority > spot_priority
    assert (await env.chat("sk-carol"))[0] == 200

    # a stale record (older generation) never wins
    assert env.feed(record("carol", ent_spec("pool-a", "sk-carol", tenant="carol", cls="spot"), generation=1),
                    "TokenEntitlement/carol") is SpecOutcome.REFUSED
    assert runtime.entitlements["carol"].service_class is ServiceClass.GUARANTEED

    # the controller says Expired: 403 with the state
    env.feed(record("carol", ent_spec("pool-a", "sk-carol", tenant="carol"), state="Expired", generation=2),
             "TokenEntitlement/carol")
    status, body = await env.chat("sk-carol")
    assert status == 403 and body["error"]["code"] == "not_bound" and "Expired" in body["error"]["message"]

    # key rotation: the old key 401, the new one 200
    env.feed(record("carol", ent_spec("pool-a", "sk-carol-2", tenant="carol"), generation=3), "TokenEntitlement/carol")
    assert (await env.chat("sk-carol"))[0] == 401
    assert (await env.chat("sk-carol-2"))[0] == 200

    # removed (deleted record, then its tombstone): 401
    env.feed(record("carol", None, deleted=True), "TokenEntitlement/carol")
    env.feed(None, "TokenEntitlement/carol")
    assert (await env.chat("sk-carol-2"))[0] == 401
    assert "carol" not in runtime.controller.entitlement_names()


async def test_a_malformed_or_invalid_record_is_dead_lettered_and_the_last_good_specs_serve(env: Env) -> None:
    version = env.proxy.metrics.spec_version
    assert env.feed(b"{not json", "TokenEntitlement/x") is SpecOutcome.UNDECODABLE
    assert env.feed(record("x", ent_spec("no-such-pool", "sk-x", tenant="x")), "TokenEntitlement/x") \
        is SpecOutcome.REFUSED
    # one key in two entitlements of one pool: the validator's rule, on a record
    assert env.feed(record("alice-a2", ent_spec("pool-a", "sk-alice", tenant="alice")),
                    "TokenEntitlement/alice-a2") is SpecOutcome.REFUSED
    assert sum(env.follower.dead_letters.counts.values()) == 3
    assert env.proxy.metrics.spec_refused["topic"] == 3
    assert env.proxy.metrics.spec_version == version
    assert (await env.chat("sk-alice"))[0] == 200
    assert b"tokenpools_proxy_spec_refused_total" in env.proxy.metrics.render()


async def test_a_request_in_flight_when_its_entitlement_is_removed_finishes_and_settles(env: Env) -> None:
    env.backends["pool-a"].delay_s = 0.5
    request = asyncio.create_task(env.chat("sk-alice", "model-a"))
    runtime = env.proxy.pools["pool-a"]
    for _ in range(100):
        if runtime.controller.in_flight:
            break
        await asyncio.sleep(0.01)
    assert runtime.controller.in_flight == 1
    env.feed(record("alice-a", None, deleted=True), "TokenEntitlement/alice-a")
    assert (await env.chat("sk-alice", "model-a"))[1]["error"]["code"] == "model_not_found"  # alice keeps model-b
    status, _ = await request
    assert status == 200
    assert runtime.controller.in_flight == 0  # settled into its detached ledger
    assert env.proxy.metrics.completions[("pool-a", "alice-a", "ok")] == 1


async def test_a_new_pool_is_served_and_a_removed_one_stops_admitting(env: Env) -> None:
    backend = FakeBackend(model="model-c")
    async with running(backend.app()) as url_c:
        pool_c = {"model": "model-c", "backendRef": {"name": "b"}, "endpoints": [url_c], "kvBytesPerToken": 1000,
                  "perReplica": {"tokensPerSecond": 10000, "kvCacheGiB": 1, "concurrency": 8}}
        env.feed(encode(builders.spec_record("TokenPool", "pool-c", pool_c)),
                 "TokenPool/pool-c")
        env.feed(record("dave", ent_spec("pool-c", "sk-dave", tenant="dave", cls="spot")), "TokenEntitlement/dave")
        assert (await env.chat("sk-dave", "model-c"))[0] == 200 and len(backend.bodies) == 1
        assert "pool-c" in env.proxy.pools
        env.feed(record("dave", None, deleted=True), "TokenEntitlement/dave")
        env.feed(encode(builders.spec_record("TokenPool", "pool-c", deleted=True, t_ms=2)),
                 "TokenPool/pool-c")
        assert "pool-c" not in env.proxy.pools
        assert (await env.chat("sk-dave", "model-c"))[0] == 401


async def test_a_pool_without_endpoints_keeps_this_proxys_or_is_not_served_here(env: Env) -> None:
    bare = {"model": "model-a", "backendRef": {"name": "b"}, "kvBytesPerToken": 1000,
            "perReplica": {"tokensPerSecond": 10000, "kvCacheGiB": 1, "concurrency": 8}}
    env.feed(encode(builders.spec_record("TokenPool", "pool-a", bare)), "TokenPool/pool-a")
    assert (await env.chat("sk-alice", "model-a"))[0] == 200  # the backend this proxy knew
    assert len(env.backends["pool-a"].bodies) == 1
    env.feed(encode(builders.spec_record("TokenPool", "pool-x", {**bare, "model": "model-x"})), "TokenPool/pool-x")
    env.feed(record("frank", ent_spec("pool-x", "sk-frank", tenant="frank", cls="spot")), "TokenEntitlement/frank")
    env.feed(record("gina", ent_spec("pool-a", "sk-gina", tenant="gina", cls="spot")), "TokenEntitlement/gina")
    assert "pool-x" not in env.proxy.pools
    assert (await env.chat("sk-frank", "model-x"))[0] == 401  # not served here
    assert (await env.chat("sk-gina", "model-a"))[0] == 200  # the rest of the change is


async def test_file_edits_apply_live_and_an_invalid_edit_keeps_the_last_good_version(
        env: Env, caplog: pytest.LogCaptureFixture) -> None:
    assert env.proxy.watcher is not None
    good = env.path.read_text()
    env.path.write_text(good + "---\n" + ent_doc("erin", "pool-a", "sk-erin", cls="spot"))
    for _ in range(100):  # the watch task polls every 50 ms
        if (await env.chat("sk-erin"))[0] == 200:
            break
        await asyncio.sleep(0.02)
    assert (await env.chat("sk-erin"))[0] == 200
    version = env.proxy.metrics.spec_version

    env.path.write_text(good + "---\n" + ent_doc("erin", "no-such-pool", "sk-erin", cls="spot"))
    await eventually(lambda: env.proxy.metrics.spec_refused["file"] == 1)
    assert any("edit refused" in r.message and "no TokenPool named 'no-such-pool'" in r.message
               for r in caplog.records)
    assert env.proxy.metrics.spec_version == version
    assert (await env.chat("sk-erin"))[0] == 200  # the last good version serves
    await asyncio.sleep(0.2)
    assert env.proxy.metrics.spec_refused["file"] == 1  # the same bad content is not refused (or logged) again

    env.path.write_text(good)  # erin removed
    await eventually(lambda: env.proxy.metrics.spec_version == version + 1)
    assert (await env.chat("sk-erin"))[0] == 401


async def eventually(condition: Any, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    assert condition()
