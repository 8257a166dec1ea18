"""A proxy that follows the specs topic is ready only once it has read the topic to its end (issue 31): before, its
/readyz answers 503 and a key it does not know gets a 503 ``specs_not_loaded`` (the key may be in a record not read
yet) instead of a 401; after, it serves what the topic held. Its config may then be settings only."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tokenpools.config import SpecsSource, hash_api_key, load_config, load_settings
from tokenpools.proxy.app import ProxyApp, build_app
from tokenpools.proxy.inputs.limits_consumer import read_to_end
from tokenpools.proxy.main import proxy_config
from tokenpools.runtime.specs import Catalogue
from tokenpools.topics.codec import encode
from tokenpools_dev import builders
from tokenpools_dev.proxy.doubles import FakeBackend, ProducerHub, offline_options, running

pytestmark = pytest.mark.component

SETTINGS_ONLY = "apiVersion: tokenpools.io/v1alpha1\nkind: TokenPoolsSettings\nmetadata: {name: s}\nspec: {}\n"


@dataclasses.dataclass(frozen=True)
class TP:
    topic: str
    partition: int


@dataclasses.dataclass(frozen=True)
class Message:
    key: bytes
    value: bytes
    offset: int


class FakeTopicConsumer:
    """One partition holding ``records``; nothing is fetched until ``open`` is set (a slow first fetch)."""

    def __init__(self, records: list[tuple[bytes, bytes]], open_: asyncio.Event) -> None:
        self.records, self.open, self.next = records, open_, 0
        self.tp = TP("", 0)

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def subscribe(self, topics: list[str]) -> None:
        self.tp = TP(topics[0], 0)

    def assignment(self) -> set[TP]:
        return {self.tp}

    async def end_offsets(self, tps: list[TP]) -> dict[TP, int]:
        return {tp: len(self.records) for tp in tps}

    async def position(self, tp: TP) -> int:
        return self.next

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TP, list[Message]]:
        if not self.open.is_set() or self.next >= len(self.records):
            await asyncio.sleep(0.01)
            return {}
        batch = [Message(k, v, i) for i, (k, v) in enumerate(self.records) if i >= self.next][:max_records]
        self.next += len(batch)
        return {self.tp: batch}


def spec_records(url: str) -> list[tuple[bytes, bytes]]:
    pool = {"model": "model-a", "backendRef": {"name": "b"}, "endpoints": [url], "kvBytesPerToken": 1000,
            "perReplica": {"tokensPerSecond": 10000, "kvCacheGiB": 1, "concurrency": 8}}
    entitlement = {"tenantId": "alice", "poolRef": {"name": "pool-a"}, "qos": {"serviceClass": "spot",
                   "sloTargetMs": 1000}, "apiKeys": [{"sha256": hash_api_key("sk-alice")}]}
    return [(b"TokenPool/pool-a", encode(builders.spec_record("TokenPool", "pool-a", pool))),
            (b"TokenEntitlement/alice-a", encode(builders.spec_record("TokenEntitlement", "alice-a", entitlement,
                                                                       pool="pool-a")))]


@dataclasses.dataclass
class Env:
    url: str
    app: ProxyApp
    open: asyncio.Event
    session: aiohttp.ClientSession

    async def get(self, path: str) -> tuple[int, dict[str, Any]]:
        async with self.session.get(self.url + path) as r:
            return r.status, orjson.loads(await r.read())

    async def chat(self, key: str) -> tuple[int, dict[str, str], dict[str, Any]]:
        body = {"model": "model-a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        async with self.session.post(self.url + "/v1/chat/completions", json=body,
                                     headers={"Authorization": f"Bearer {key}"}) as r:
            return r.status, dict(r.headers), orjson.loads(await r.read())


async def environment(tmp_path: Path, records: Any) -> AsyncIterator[Env]:
    backend = FakeBackend(model="model-a")
    async with running(backend.app()) as backend_url:
        path = tmp_path / "settings.yaml"
        path.write_text(SETTINGS_ONLY)
        loaded = load_config(path, SpecsSource.TOPIC)
        open_ = asyncio.Event()
        topic = records(backend_url)
        app = build_app(proxy_config(loaded, load_settings({}, []), 0.0),
                        offline_options(tmp_path, kafka_enabled=True), producer_factory=ProducerHub().factory,
                        consumer_factory=lambda: FakeTopicConsumer([], asyncio.Event()),
                        catalogue=Catalogue.from_loaded(loaded),
                        specs_consumer_factory=lambda: FakeTopicConsumer(topic, open_))
        async with running(app) as url, aiohttp.ClientSession() as session:
            yield Env(url, app, open_, session)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async for e in environment(tmp_path, spec_records):
        yield e


@pytest.fixture
async def empty(tmp_path: Path) -> AsyncIterator[Env]:
    async for e in environment(tmp_path, lambda url: []):
        yield e


async def eventually(condition: Any, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_not_ready_until_the_specs_topic_is_read_then_serves_what_it_held(env: Env) -> None:
    status, body = await env.get("/readyz")
    assert (status, body["status"]) == (503, "not ready") and "specs" in body["reason"]
    status, body = await env.get("/healthz")  # liveness: the process runs
    assert status == 200 and body["specs_loaded"] is False and body["pools"] == {}
    status, headers, body = await env.chat("sk-alice")
    assert (status, body["error"]["code"], headers["Retry-After"]) == (503, "specs_not_loaded", "1")
    assert env.app.proxy.metrics.specs_not_loaded == 1
    assert b"tokenpools_proxy_specs_not_loaded_total 1.0" in env.app.proxy.metrics.render()

    env.open.set()

    async def ready() -> bool:
        return (await env.get("/readyz"))[0] == 200

    await eventually(ready)
    status, body = await env.get("/readyz")
    assert body["status"] == "ready" and body["pools"] == 1
    assert (await env.chat("sk-alice"))[0] == 200
    status, _, body = await env.chat("sk-nobody")  # read to its end: an unknown key is unknown
    assert (status, body["error"]["code"]) == (401, "unknown_key")
    assert (await env.get("/healthz"))[1]["specs_loaded"] is True


async def test_an_empty_specs_topic_is_read_at_once_and_no_pool_is_served(empty: Env) -> None:
    empty.open.set()

    async def ready() -> bool:
        return (await empty.get("/readyz"))[0] == 200

    await eventually(ready)
    assert empty.app.proxy.pools == {}
    status, _, body = await empty.chat("sk-alice")
    assert (status, body["error"]["code"]) == (401, "unknown_key")


async def test_a_proxy_without_the_specs_topic_is_ready_from_its_file(tmp_path: Path) -> None:
    loaded = load_config(Path(__file__).resolve().parents[2] / "examples" / "exp1.yaml")
    app = build_app(proxy_config(loaded, load_settings({}, []), 0.0), offline_options(tmp_path))
    async with running(app) as url, aiohttp.ClientSession() as session:
        async with session.get(url + "/readyz") as r:
            assert r.status == 200


@pytest.mark.parametrize(("positions", "ends", "read"), [
    ({}, {}, False),  # no partition assigned yet
    ({0: 0}, {0: 0}, True),  # an empty partition
    ({0: 2, 1: 4}, {0: 2, 1: 5}, False),
    ({0: 2, 1: 6}, {0: 2, 1: 5}, True),  # records written since the ends were asked
    ({}, {0: 3}, False),  # no position yet
])
def test_read_to_end(positions: dict[int, int], ends: dict[int, int], read: bool) -> None:
    assert read_to_end(positions, ends) is read
