"""The kube path end to end, on the real kube-apiserver and broker: TokenEntitlement created, patched, rotated and
deleted → the controller → the specs topic → a real proxy (docs/tenancy.md). A malformed record on the specs topic
is dead-lettered and the proxy keeps serving its last good specs. A proxy started from settings only (deploy/'s
ConfigMap, issue 31) becomes ready once it has read the topic and admits the custom resources' keys from then on.

Pinned (measured and printed: create → admitted):
- a created entitlement's key is admitted within 2 s of the create;
- a class patch decides from the next request; a key rotation (the digest patched) makes the old key 401 and the
  new one 200; a delete makes the key 401 within 2 s;
- settings only: a pool and an entitlement created → admitted within 2 s; a proxy started after them admits the key
  at its first request once /readyz says ready (never a 401 for a key the topic holds).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from controllers_fixtures import NS, create, ent, fresh_topics, pool, start_controller
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tokenpools.config import SpecsSource, apply_overrides, hash_api_key, load_config_text, load_settings
from tokenpools.core.classes import ServiceClass
from tokenpools.proxy.app import build_app, listening
from tokenpools.proxy.main import proxy_config
from tokenpools.proxy.options import ProxyOptions
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.runtime.specs import Catalogue
from tokenpools_dev.kafka import local_kafka
from tokenpools_dev.proxy.doubles import FakeBackend, running

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def _patch(api: ApiClient, name: str, *ops: tuple[str, str, Any]) -> None:
    await client.CustomObjectsApi(api).patch_namespaced_custom_object(
        "tokenpools.io", "v1alpha1", NS, "tokenentitlements", name,
        [{"op": op, "path": path, "value": value} for op, path, value in ops])


async def _until(check: Any, timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not await check():
        assert time.monotonic() - t0 < timeout_s, f"not within {timeout_s} s: {what}"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


async def test_entitlements_created_patched_rotated_and_deleted_reach_the_proxy_live(
        kube_admin: ApiClient, controllers_cluster: Path, kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = await fresh_topics(kafka_bootstrap)
    tag = uuid.uuid4().hex[:6]
    pool_name, name = f"pool-{tag}", f"live-{tag}"
    backend = FakeBackend()
    async with running(backend.app()) as backend_url:
        body = pool(pool_name)
        body["spec"]["endpoints"] = [backend_url]
        await create(kube_admin, body)
        # the proxy starts from a file with the pool alone, then follows the specs topic
        text = orjson.dumps({**body, "metadata": {"name": pool_name}}).decode()
        loaded = load_config_text(text, "live.yaml")
        prefix = topics.specs.name[: -len("specs")]
        settings = apply_overrides(load_settings({}), [f"kafka.bootstrap_servers={kafka_bootstrap}",
                                                       f"kafka.topic_prefix={prefix}"])
        opts = ProxyOptions.from_settings(settings, f"live-{tag}", spool_dir=tmp_path)
        app = build_app(proxy_config(loaded, settings, time.time()), opts, kafka=KafkaClients(settings.kafka),
                        catalogue=Catalogue.from_loaded(loaded))
        async with start_controller(controllers_cluster, kafka_bootstrap, topics), \
                listening(app, "127.0.0.1", 0) as url, aiohttp.ClientSession() as session:

            async def status(key: str) -> int:
                async with session.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                        json={"model": "fake-model", "max_tokens": 4,
                                              "messages": [{"role": "user", "content": "hi"}]}) as r:
                    await r.read()
                    return r.status

            async def is_(key: str, expected: int) -> bool:
                return await status(key) == expected

            await _until(lambda: is_(f"sk-{name}", 401), 10, "an unknown key refused")
            t0 = time.monotonic()
            await create(kube_admin, ent(name, pool_name, cls="spot"))
            await _until(lambda: is_(f"sk-{name}", 200), 10, "the new key admitted")
            admitted_s = time.monotonic() - t0
            print(f"create → admitted: {admitted_s:.2f} s")
            assert admitted_s < 2.0

            runtime = app.proxy.pools[pool_name]
            await _patch(kube_admin, name, ("replace", "/spec/qos/serviceClass", "elastic"),
                         ("add", "/spec/resources", {"tokensPerSecond": 60, "kvCacheGiB": 1, "concurrency": 2}))

            async def elastic() -> bool:
                spec = runtime.entitlements.get(name)
                return spec is not None and spec.service_class is ServiceClass.ELASTIC

            await _until(elastic, 10, "the class patch in force")
            assert await status(f"sk-{name}") == 200  # the next decision, as elastic

            await _patch(kube_admin, name, ("replace", "/spec/apiKeys", [{"sha256": hash_api_key(f"sk-{name}-2")}]))
            await _until(lambda: is_(f"sk-{name}", 401), 10, "the old key refused after rotation")
            assert await status(f"sk-{name}-2") == 200

            # a malformed record on the specs topic: dead-lettered, the proxy keeps serving
            producer = local_kafka(kafka_bootstrap).producer("test-producer", acks="all")
            await producer.start()
            try:
                await producer.send_and_wait(topics.specs.name, b"{not a spec", key=b"TokenEntitlement/bad")
            finally:
                await producer.stop()
            assert app.proxy.follower is not None

            async def dead_lettered() -> bool:
                return sum(app.proxy.follower.dead_letters.counts.values()) >= 1  # type: ignore[union-attr]

            await _until(dead_lettered, 10, "the malformed record dead-lettered")
            assert await status(f"sk-{name}-2") == 200

            t0 = time.monotonic()
            await client.CustomObjectsApi(kube_admin).delete_namespaced_custom_object(
                "tokenpools.io", "v1alpha1", NS, "tokenentitlements", name)
            await _until(lambda: is_(f"sk-{name}-2", 401), 10, "the deleted entitlement's key refused")
            deleted_s = time.monotonic() - t0
            print(f"delete → refused: {deleted_s:.2f} s")
            assert deleted_s < 2.0


SETTINGS_ONLY = "apiVersion: tokenpools.io/v1alpha1\nkind: TokenPoolsSettings\nmetadata: {name: s}\nspec: {}\n"


async def test_a_proxy_from_settings_only_is_ready_once_it_has_read_the_specs_topic_and_admits_its_keys(
        kube_admin: ApiClient, controllers_cluster: Path, kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = await fresh_topics(kafka_bootstrap)
    tag = uuid.uuid4().hex[:6]
    pool_name, name = f"pool-{tag}", f"cm-{tag}"
    prefix = topics.specs.name[: -len("specs")]
    loaded = load_config_text(SETTINGS_ONLY, "settings.yaml", SpecsSource.TOPIC)  # what deploy/'s ConfigMap holds
    settings = apply_overrides(load_settings(loaded.settings_values), [f"kafka.bootstrap_servers={kafka_bootstrap}",
                                                                       f"kafka.topic_prefix={prefix}"])

    def settings_only_proxy(proxy_id: str) -> Any:
        opts = ProxyOptions.from_settings(settings, proxy_id, spool_dir=tmp_path / proxy_id)
        return build_app(proxy_config(loaded, settings, time.time()), opts, kafka=KafkaClients(settings.kafka),
                         catalogue=Catalogue.from_loaded(loaded))

    backend = FakeBackend()
    first = settings_only_proxy(f"first-{tag}")
    async with running(backend.app()) as backend_url, start_controller(controllers_cluster, kafka_bootstrap, topics), \
            listening(first, "127.0.0.1", 0) as url, aiohttp.ClientSession() as session:

        async def status(base: str, path: str = "/v1/chat/completions", key: str = f"sk-{name}") -> int:
            if path == "/readyz":
                async with session.get(base + path) as r:
                    await r.read()
                    return r.status
            async with session.post(base + path, headers={"Authorization": f"Bearer {key}"},
                                    json={"model": "fake-model", "max_tokens": 4,
                                          "messages": [{"role": "user", "content": "hi"}]}) as r:
                await r.read()
                return r.status

        async def is_(expected: int, base: str, path: str = "/v1/chat/completions") -> bool:
            return await status(base, path) == expected

        # an empty topic is read at once: ready, with no pools, and an unknown key is unknown
        ready_s = await _until(lambda: is_(200, url, "/readyz"), 30, "the first proxy ready")
        print(f"settings only, empty topic → ready: {ready_s:.2f} s")
        assert first.proxy.pools == {} and await status(url) == 401
        body = pool(pool_name)
        body["spec"]["endpoints"] = [backend_url]  # a proxy has no other place to learn them
        t0 = time.monotonic()
        await create(kube_admin, body)
        await create(kube_admin, ent(name, pool_name, cls="spot"))
        await _until(lambda: is_(200, url), 10, "the new pool and key admitted")
        admitted_s = time.monotonic() - t0
        print(f"settings only: create pool + entitlement → admitted: {admitted_s:.2f} s")
        assert admitted_s < 2.0 and list(first.proxy.pools) == [pool_name]

        # a proxy started now: not a single 401 for the key the topic holds, from the moment it says it is ready
        second = settings_only_proxy(f"second-{tag}")
        async with listening(second, "127.0.0.1", 0) as url2:
            answers: list[int] = []

            async def ready_asking() -> bool:  # before ready: 503 (retry) or already 200, never 401
                answers.append(await status(url2))
                return await is_(200, url2, "/readyz")

            await _until(ready_asking, 30, "the second proxy ready")
            assert await status(url2) == 200
        assert set(answers) <= {503, 200}, answers
