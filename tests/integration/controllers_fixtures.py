"""Helpers for the controller's Kubernetes integration tests (test_controllers_kube.py): deploy/ applied the way
`kubectl apply --server-side` would, object builders, polling, Kafka topic helpers, an in-process controller.

Import what you use (pytest puts this directory on sys.path: it has no __init__.py). No fixtures live here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiokafka import ConsumerRecord, TopicPartition
from aiokafka.admin import NewTopic
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.utils import create_from_dict

from tokenpools.config import hash_api_key, load_settings
from tokenpools.controllers.app import Controller, ControllerOptions, build_controller
from tokenpools.controllers.kube import KubeMode
from tokenpools.controllers.supervisor import LoopStatus, run_loops
from tokenpools.runtime.backoff import Backoff
from tokenpools.topics.declarations import Topics, topics_for
from tokenpools_dev.builders import entitlement_doc, pool_doc
from tokenpools_dev.devstack.kube import KubeAPIServer
from tokenpools_dev.kafka import local_kafka

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NS = "tokenpools"
SA = "tokenpools-controller"
GROUP, VERSION = "tokenpools.io", "v1alpha1"
PLURAL = {"TokenPool": "tokenpools", "TokenEntitlement": "tokenentitlements"}

SMALL_PARTITIONS = 4
"""Partitions of the pool-keyed topics in the proxy's and controllers' tests, not the product's 32: a cold local
broker answers offset requests for a just-created 32-partition topic only after several seconds
(NotLeaderForPartition; ~8 s against ~1.7 s with 4, measured), longer than these tests wait for a loop to be
positioned, and they test no partitioning (the agents' tests choose their own count, 2; they pass at 32 too)."""


# ---- cluster set-up ----------------------------------------------------------------------------------------------

def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


async def admin_client(server: KubeAPIServer) -> ApiClient:
    return await config.new_client_from_config(config_file=str(server.kubeconfig_path), persist_config=False)


async def apply(api: ApiClient, *paths: Path) -> None:
    """What `kubectl apply --server-side -f` does, for the kinds deploy/ holds."""
    for path in paths:
        for doc in docs(path):
            if doc["kind"] in PLURAL:
                await client.CustomObjectsApi(api).create_namespaced_custom_object(
                    GROUP, VERSION, doc["metadata"].get("namespace", NS), PLURAL[doc["kind"]], doc)
            else:
                for applied in await create_from_dict(api, doc, apply=True):
                    assert applied.kind != "Status", f"{path}: {applied.message}"  # apply returns failures


async def wait_established(api: ApiClient, name: str) -> None:
    ext = client.ApiextensionsV1Api(api)
    await eventually(lambda: _established(ext, name), 20, f"CRD {name} Established")
    await asyncio.sleep(0.5)  # the REST endpoint follows Established by a moment


async def _established(ext: client.ApiextensionsV1Api, name: str) -> bool:
    crd = await ext.read_custom_resource_definition(name)
    return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))


async def delete_all(api: ApiClient) -> None:
    """Pools, entitlements and their Events: the apiserver lives for the session, a test (or its rerun) starts clean."""
    objs = client.CustomObjectsApi(api)
    for plural in PLURAL.values():
        await objs.delete_collection_namespaced_custom_object(GROUP, VERSION, NS, plural)
    await client.CoreV1Api(api).delete_collection_namespaced_event(NS)


# ---- helpers --------------------------------------------------------------------------------------------------

async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while True:
        if await check():
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        await asyncio.sleep(0.1)


def pool(name: str, max_replicas: int = 1, backend: dict[str, str] | None = None, min_replicas: int = 1) -> dict[str, Any]:
    return pool_doc(name, model="fake-model", backend=backend, min_replicas=min_replicas, max_replicas=max_replicas)


def ent(name: str, pool_name: str, slots: int = 6, cls: str = "guaranteed", **spec: Any) -> dict[str, Any]:
    """An entitlement whose API key is ``sk-NAME``."""
    return entitlement_doc(name, pool_name, slots=slots, service_class=cls,
                           **{"apiKeys": [{"sha256": hash_api_key(f"sk-{name}")}], **spec})


async def create(api: ApiClient, body: dict[str, Any]) -> dict[str, Any]:
    created: dict[str, Any] = await client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL[body["kind"]], body)
    return created


async def get(api: ApiClient, kind: str, name: str) -> dict[str, Any]:
    got: dict[str, Any] = await client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL[kind], name)
    return got


async def state_is(api: ApiClient, name: str, state: str) -> bool:
    return (await get(api, "TokenEntitlement", name)).get("status", {}).get("state") == state


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in obj.get("status", {}).get("conditions", [])}


async def create_topics(bootstrap: str, topics: Topics) -> None:
    """Every topic of ``topics``, with its declared partitions and configs."""
    admin = local_kafka(bootstrap).admin("test-admin")
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t.name, t.partitions, 1, topic_configs=t.config()) for t in topics.all()])
    finally:
        await admin.close()


async def fresh_topics(bootstrap: str) -> Topics:
    topics = topics_for(f"it-kube-{uuid.uuid4().hex[:8]}.", partitions=SMALL_PARTITIONS)
    await create_topics(bootstrap, topics)
    return topics


async def read_to_end(bootstrap: str, topic: str) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of ``topic`` up to its end offsets now, without a group, in offset order per partition."""
    consumer = local_kafka(bootstrap).consumer("test-reader", group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()  # noqa: SLF001 — consumer.topics() does not refresh it
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        end = await consumer.end_offsets(parts)
        out: list[ConsumerRecord[bytes, bytes]] = []
        while [tp for tp in parts if await consumer.position(tp) < end[tp]]:
            for ms in (await consumer.getmany(timeout_ms=500)).values():
                out += ms
        return out
    finally:
        await consumer.stop()


async def last_per_key(bootstrap: str, topic: str) -> dict[str, dict[str, Any] | None]:
    """The latest value of every key on ``topic`` (None for a tombstone)."""
    return {m.key.decode(): None if m.value is None else orjson.loads(m.value)
            for m in await read_to_end(bootstrap, topic)}


class Running:
    """An in-process controller (``build_controller``) with its loops supervised in a task."""

    def __init__(self, controller: Controller, task: asyncio.Task[dict[str, LoopStatus]],
                 statuses: dict[str, LoopStatus]) -> None:
        self.controller, self.task, self.statuses = controller, task, statuses


@contextlib.asynccontextmanager
async def start_controller(sa_kubeconfig: Path, bootstrap: str, topics: Topics, *extra: str,
                           dry_run: bool = False) -> AsyncIterator[Running]:
    settings = load_settings({}, [f"kafka.bootstrap_servers={bootstrap}", f"kafka.topic_prefix={topics.specs.name[:-5]}",
                                  "prometheus.url=http://127.0.0.1:9", *extra])  # no Prometheus: that loop backs off alone
    options = ControllerOptions.from_settings(settings, Path("unused.yaml"), KubeMode.KUBECONFIG,
                                              kubeconfig=sa_kubeconfig, namespace=NS, dry_run=dry_run, resync_s=5.0)
    async with build_controller(options, settings) as controller:
        statuses: dict[str, LoopStatus] = {}
        task = asyncio.create_task(run_loops(controller.loops, Backoff(0.2, 2.0), statuses=statuses))
        try:
            yield Running(controller, task, statuses)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def replicas_of(api: ApiClient, name: str) -> int:
    return int((await client.AppsV1Api(api).read_namespaced_deployment_scale(name, NS)).spec.replicas)


async def deployment(api: ApiClient, name: str, replicas: int) -> None:
    labels = {"app": name}
    await client.AppsV1Api(api).create_namespaced_deployment(NS, client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(replicas=replicas, selector=client.V1LabelSelector(match_labels=labels),
                                     template=client.V1PodTemplateSpec(
                                         metadata=client.V1ObjectMeta(labels=labels),
                                         spec=client.V1PodSpec(containers=[
                                             client.V1Container(name="vllm", image="x.invalid/sim:1")])))))


def in_order(events: list[Any]) -> list[Any]:
    """Creation order (timestamps have whole seconds; etcd's resourceVersion increases with every write)."""
    return sorted(events, key=lambda e: int(e.metadata.resource_version))


async def true(value: bool) -> bool:
    return value


async def equal(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""
