"""Fixtures and helpers for the proxy's integration tests (real Kafka, real llm-d-inference-sim).

Import what you use into the test module (``from proxy_fixtures import ...``). Every test gets its own topic
prefix (all topics of ``topics_for(prefix)`` created up front), so tests never see each other's records on the
session broker. The proxy runs in-process (``start_proxy``) so a test can look inside it; ``test_proxy_cli`` runs
the real ``tokenpools proxy`` command instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.admin import NewTopic
from backend_fixtures import inference_sim_binary  # noqa: F401  (fixture import)
from controllers_fixtures import SMALL_PARTITIONS

from tokenpools.config import apply_overrides, hash_api_key, load_config_text, load_settings
from tokenpools.proxy.app import Proxy, build_app, listening
from tokenpools.proxy.main import proxy_config
from tokenpools.proxy.options import ProxyOptions
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.topics.codec import encode
from tokenpools.topics.declarations import Topics, topics_for
from tokenpools.topics.records import Record
from tokenpools_dev.devstack.inference_sim import InferenceSim
from tokenpools_dev.kafka import local_kafka
from tokenpools_dev.proxy.doubles import unpack

KV_PER_TOKEN = 147_456  # Qwen3-8B geometry used by the configs below
KEYS = {name: f"sk-it-{name}" for name in ("gold", "kvtight", "spot", "pre", "big")}

CONFIG = """
apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {{name: sim-pool}}
spec:
  model: fake-model
  backendRef: {{apiVersion: apps/v1, kind: Deployment, name: sim}}
  scaling: {{minReplicas: 1, maxReplicas: 1}}
  perReplica: {{tokensPerSecond: 4000, kvCacheGiB: 8, concurrency: 6}}
  kvGeometry: {{layers: 36, kvHeads: 8, headDim: 128, bytesPerElement: 2}}
  defaults: {{maxTokens: 16}}
  tokenBucketWindowSeconds: 10
  endpoints: [{endpoints}]
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: gold}}
spec:
  tenantId: tenant-gold
  poolRef: {{name: sim-pool}}
  qos: {{serviceClass: guaranteed, sloTargetMs: 1000}}
  resources: {{tokensPerSecond: 1000, kvCacheGiB: 2, concurrency: 2}}
  apiKeys: [{{sha256: {gold}}}]
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: kvtight}}
spec:
  tenantId: tenant-kv
  poolRef: {{name: sim-pool}}
  qos: {{serviceClass: guaranteed, sloTargetMs: 1000}}
  resources: {{tokensPerSecond: 1000, kvCacheGiB: 2, concurrency: 2}}
  apiKeys: [{{sha256: {kvtight}}}]
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: spot}}
spec:
  tenantId: tenant-spot
  poolRef: {{name: sim-pool}}
  qos: {{serviceClass: spot, sloTargetMs: 30000}}
  apiKeys: [{{sha256: {spot}}}]
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: pre}}
spec:
  tenantId: tenant-pre
  poolRef: {{name: sim-pool}}
  qos: {{serviceClass: preemptible, sloTargetMs: 30000}}
  apiKeys: [{{sha256: {pre}}}]
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: big}}
spec:
  tenantId: tenant-big
  poolRef: {{name: sim-pool}}
  qos: {{serviceClass: guaranteed, sloTargetMs: 1000}}
  resources: {{tokensPerSecond: 1000, kvCacheGiB: 1, concurrency: 5}}
  apiKeys: [{{sha256: {big}}}]
"""


def config_text(endpoints: list[str]) -> str:
    """gold and kvtight fit; big's 5 slots do not fit after them (6 per pool): capacity admission makes it Degraded."""
    return CONFIG.format(endpoints=", ".join(f'"{e}"' for e in endpoints),
                         **{name: hash_api_key(key) for name, key in KEYS.items()})


# ---- Kafka ---------------------------------------------------------------------------------------------------
async def create_topics(bootstrap: str, topics: Topics) -> None:
    admin = local_kafka(bootstrap).admin("test-admin")
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t.name, num_partitions=t.partitions, replication_factor=1,
                                            topic_configs=t.config()) for t in topics.all()])
    finally:
        await admin.close()


@pytest.fixture
async def topics(kafka_bootstrap: str) -> Topics:
    """All topics under a fresh prefix."""
    declared = topics_for(f"it-{uuid.uuid4().hex[:8]}.", partitions=SMALL_PARTITIONS)
    await create_topics(kafka_bootstrap, declared)
    return declared


async def read_topic(bootstrap: str, topic: str, *, expect: int | None = None, timeout_s: float = 30.0,
                     settle_s: float = 1.0) -> list[dict[str, Any]]:
    """Every event on ``topic`` from the beginning (packed records unpacked): until ``expect`` are there (then ``settle_s`` more, to catch
    duplicates), or until nothing new arrives for ``settle_s``."""
    consumer = local_kafka(bootstrap).consumer("test-reader", group_id=None, enable_auto_commit=False,
                                               auto_offset_reset="earliest")  # no group: every partition, from the start
    consumer.subscribe([topic])
    await consumer.start()
    try:
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200)
            got = unpack([orjson.loads(m.value) for ms in batch.values() for m in ms if m.value is not None])
            out += got
            if got:
                quiet_since = time.monotonic()
            enough = expect is None or len(out) >= expect
            if enough and time.monotonic() - quiet_since >= settle_s:
                break
        return out
    finally:
        await consumer.stop()


async def produce(bootstrap: str, topic: str, key: str, record: Record) -> None:
    producer = local_kafka(bootstrap).producer("test-producer", acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, encode(record), key=key.encode())
    finally:
        await producer.stop()


# ---- the backend and the proxy -------------------------------------------------------------------------------
@pytest.fixture
def start_sim(inference_sim_binary: Path) -> Iterator[Callable[..., InferenceSim]]:  # noqa: F811
    sims: list[InferenceSim] = []

    def start(**kw: Any) -> InferenceSim:
        sim = InferenceSim(binary=inference_sim_binary, **kw).start()
        sims.append(sim)
        return sim

    yield start
    for sim in sims:
        sim.close()


@dataclass
class RunningProxy:
    url: str
    proxy: Proxy

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    async def wait_version(self, pool: str, version: int, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.proxy.pools[pool].in_force.version != version:
            assert time.monotonic() < deadline, f"limit update v{version} never applied"
            await asyncio.sleep(0.05)

    async def drained(self, timeout_s: float = 60.0) -> None:
        """Until every event has left the proxy (queue, in flight, spool)."""
        events = self.proxy.events
        assert events is not None
        deadline = time.monotonic() + timeout_s
        while events.undelivered():
            assert time.monotonic() < deadline, f"events stuck: {events.counts}, last error: {events.last_error}"
            await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def start_proxy(endpoints: list[str], bootstrap: str, topics: Topics, spool_dir: Path,
                      settings_items: tuple[str, ...] = (), **options: Any) -> AsyncIterator[RunningProxy]:
    """An in-process proxy built as ``tokenpools proxy`` builds it: settings (``settings_items`` as `--set` items;
    ``options``, fields of the ``proxy`` group, as flags), then the options derived from them, then the Kafka
    clients."""
    loaded = load_config_text(config_text(endpoints), "integration.yaml")
    prefix = topics.requests.name[: -len("requests")]
    settings = apply_overrides(load_settings(loaded.settings_values),
                               [f"kafka.bootstrap_servers={bootstrap}", f"kafka.topic_prefix={prefix}", *settings_items])
    opts = ProxyOptions.from_settings(settings, options.pop("proxy_id", "it-proxy"), spool_dir=spool_dir, **options)
    app = build_app(proxy_config(loaded, settings, time.time()), opts, kafka=KafkaClients(settings.kafka))
    async with listening(app, "127.0.0.1", 0) as url:
        yield RunningProxy(url, app.proxy)
