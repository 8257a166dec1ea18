"""Shadow mode at a real proxy app (docs/shadow.md): an entitlement in shadow is served where enforce would refuse
it, the proxy counts the would-refuse by reason and says it in the decided event (an admission for the agents), and
rolling it to enforce by editing the watched --config file refuses the next request."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tokenpools.config import hash_api_key, load_config, load_settings
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.proxy.app import ProxyApp, build_app
from tokenpools.proxy.main import proxy_config
from tokenpools.topics.records import RequestDecided
from tokenpools_dev.proxy.doubles import FakeBackend, ProducerHub, offline_options, running, unpack

pytestmark = pytest.mark.component

POOL = """apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {{name: pool-a}}
spec:
  model: model-a
  backendRef: {{name: b}}
  perReplica: {{tokensPerSecond: 10000, kvCacheGiB: 1, concurrency: 8}}
  kvBytesPerToken: 1000
  endpoints: ["{url}"]
  {enforcement}
"""
ENTITLEMENT = """apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: {name}}}
spec:
  tenantId: t-{name}
  poolRef: {{name: pool-a}}
  qos: {{serviceClass: guaranteed, sloTargetMs: 1000}}
  resources: {{tokensPerSecond: 1, kvCacheGiB: 0.01, concurrency: 2}}
  apiKeys: [{{sha256: {digest}}}]
  {enforcement}
"""
# a bucket of 1 token/s × 10 s: a request of max_tokens 40 never fits it (a token-budget refusal under enforce)


def specs(url: str, pool: str = "", **entitlements: str) -> str:
    return "---\n".join([POOL.format(url=url, enforcement=f"enforcement: {pool}" if pool else "")] + [
        ENTITLEMENT.format(name=name, digest=hash_api_key(f"sk-{name}"),
                           enforcement=f"enforcement: {mode}" if mode else "")
        for name, mode in entitlements.items()])


@dataclasses.dataclass
class Env:
    url: str
    backend_url: str
    app: ProxyApp
    backend: FakeBackend
    hub: ProducerHub
    path: Path
    session: aiohttp.ClientSession

    async def chat(self, name: str) -> aiohttp.ClientResponse:
        body = {"model": "model-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40}
        async with self.session.post(self.url + "/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer sk-{name}"}) as r:
            await r.read()
            return r

    async def decided(self, rid: str) -> RequestDecided:
        for _ in range(250):
            for value in unpack(self.hub.of("requests")):
                if value.get("request_id") == rid and value.get("record_type") == "request_decided":
                    return RequestDecided.model_validate(value)
            await asyncio.sleep(0.02)
        raise AssertionError(f"no decided event for {rid}")


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    backend = FakeBackend(model="model-a")
    hub = ProducerHub()
    async with running(backend.app()) as backend_url:
        path = tmp_path / "specs.yaml"
        path.write_text(specs(backend_url, alice="shadow", bob=""))
        app = build_app(proxy_config(load_config(path), load_settings({}, []), 0.0),
                        offline_options(tmp_path, config_poll_interval_s=0.05, policy={"queue_slo_fraction": 0}),
                        producer_factory=hub.factory, watch=path)
        async with running(app) as url, aiohttp.ClientSession() as session:
            yield Env(url, backend_url, app, backend, hub, path, session)


async def test_shadow_serves_counts_and_records_what_enforce_would_refuse(env: Env) -> None:
    r = await env.chat("alice")
    assert r.status == 200 and r.headers["X-TokenPools-Would-Refuse"] == "token_budget"
    assert len(env.backend.bodies) == 1
    metrics = env.app.proxy.metrics
    assert metrics.would_refuse[("pool-a", "alice", "token_budget")] == 1
    assert metrics.decisions[("pool-a", "alice", "admitted")] == 1
    event = await env.decided(r.headers["X-Request-Id"])
    assert event.outcome is AdmissionOutcome.ADMITTED and event.would_refuse is AdmissionOutcome.REFUSED_TOKEN_BUDGET
    assert event.cost_tokens > 10  # what it reserved: its bucket is now below zero
    assert env.app.proxy.pools["pool-a"].controller.bucket_tokens_of("alice", env.app.proxy.clock.now_s()) < 0
    async with env.session.get(env.url + "/metrics") as m:
        text = await m.text()
    assert 'tokenpools_proxy_would_refuse_total{entitlement="alice",pool="pool-a",reason="token_budget"} 1.0' in text

    r = await env.chat("bob")  # enforce (the pool's default): the same request is refused, and no would_refuse
    assert r.status == 429 and "X-TokenPools-Would-Refuse" not in r.headers
    event = await env.decided(r.headers["X-Request-Id"])
    assert event.outcome is AdmissionOutcome.REFUSED_TOKEN_BUDGET and event.would_refuse is None
    raw = next(v for t, _, v in env.hub.records if t.endswith("requests") and b'"bob"' in v)
    assert b"would_refuse" not in raw  # absent, not null: what a consumer older than the field reads
    assert len(env.backend.bodies) == 1


async def test_rolling_shadow_to_enforce_by_a_spec_edit_refuses_the_next_request(env: Env) -> None:
    assert (await env.chat("alice")).status == 200
    env.path.write_text(specs(env.backend_url, alice="enforce", bob=""))
    for _ in range(250):  # the watch polls every 50 ms
        r = await env.chat("alice")
        if r.status != 200:
            break
        await asyncio.sleep(0.02)
    assert r.status == 429 and "X-TokenPools-Would-Refuse" not in r.headers
    assert (await env.decided(r.headers["X-Request-Id"])).outcome is AdmissionOutcome.REFUSED_TOKEN_BUDGET


async def test_a_pool_in_shadow_shadows_its_entitlements_unless_one_says_enforce(env: Env) -> None:
    version = env.app.proxy.metrics.spec_version
    env.path.write_text(specs(env.backend_url, pool="shadow", alice="", bob="enforce"))
    for _ in range(250):  # the watch polls every 50 ms
        if env.app.proxy.metrics.spec_version > version:
            break
        await asyncio.sleep(0.02)
    r = await env.chat("alice")  # no mode of its own: the pool's
    assert r.status == 200 and r.headers["X-TokenPools-Would-Refuse"] == "token_budget"
    assert (await env.chat("bob")).status == 429
    env.path.write_text(specs(env.backend_url, pool="shadow", alice="", bob=""))
    for _ in range(250):
        r = await env.chat("bob")
        if r.status == 200:
            break
        await asyncio.sleep(0.02)
    assert r.status == 200 and r.headers["X-TokenPools-Would-Refuse"] == "token_budget"
