"""The controller's scaler against a real kube-apiserver: scale commands become ``/scale`` patches.

Pinned:
- scale commands change spec.replicas of a Deployment within min/max, never below the Bound baselines' floor,
  scale-down only after the stabilisation window, with an Event per change;
- any resource with a ``/scale`` subresource (a stand-in for NVIDIA Dynamo's DynamoGraphDeployment) scales the same
  way, and ``--dry-run`` decides but patches nothing and writes no status.

The cluster is the session's kube-apiserver + etcd (``kube_apiserver`` in conftest.py,
scripts/install-kube-apiserver.sh) with deploy/ applied once (``controllers_cluster``), and the session's real
Kafka broker; the controller runs under the ServiceAccount token of deploy/base/rbac/controller.yaml.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from controllers_fixtures import (
    DEPLOY,
    NS,
    apply,
    create,
    deployment,
    ent,
    equal,
    eventually,
    fresh_topics,
    get,
    in_order,
    pool,
    replicas_of,
    start_controller,
    state_is,
    true,
    wait_established,
)
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from tokenpools.topics.codec import encode
from tokenpools.topics.records import ScaleCommand
from tokenpools_dev.kafka import local_kafka

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_scale_commands_change_replicas_within_bounds_above_the_floor_after_stabilisation(
        kube_admin: ApiClient, controllers_cluster: Path, kafka_bootstrap: str) -> None:
    topics = await fresh_topics(kafka_bootstrap)
    backend = f"sim-{uuid.uuid4().hex[:6]}"
    await deployment(kube_admin, backend, replicas=1)
    await create(kube_admin, pool("scaled", max_replicas=4, backend={"name": backend}))
    await create(kube_admin, ent("floor-20", "scaled", slots=20))  # a Bound baseline of 20 slots needs 2 replicas of 16
    producer = local_kafka(kafka_bootstrap).producer("test-producer", acks="all")
    await producer.start()
    version = [0]

    async def command(desired: int, floor: int = 0) -> None:
        version[0] += 1
        c = ScaleCommand(pool="scaled", version=version[0], t_ms=int(time.time() * 1000), desired_replicas=desired,
                         current_replicas=0, floor_replicas=floor, reason="test demand")
        await producer.send_and_wait(topics.scale.name, encode(c), key=b"scaled")

    window_s, cooldown_s = 3.0, 0.5
    try:
        async with start_controller(controllers_cluster, kafka_bootstrap, topics, f"scaling.scale_down_stabilization_s={window_s}",
                                    f"scaling.cooldown_s={cooldown_s}") as running:
            await eventually(lambda: true(running.controller.scaler_loop.ready
                                          and "scaled" in running.controller.inventory.pools),
                             15, "scaler positioned, pool known")
            await command(3)
            await eventually(lambda: equal(replicas_of(kube_admin, backend), 3), 10, "scaled up to 3 at once")
            await asyncio.sleep(cooldown_s)
            await command(9)
            await eventually(lambda: equal(replicas_of(kube_admin, backend), 4), 10, "clamped to maxReplicas 4")
            t_down = time.monotonic()
            while await replicas_of(kube_admin, backend) == 4:  # the agents re-send the wish every tick
                await command(1)
                assert time.monotonic() - t_down < window_s + 10, "never scaled down"
                await asyncio.sleep(0.3)
            held_s = time.monotonic() - t_down
            assert held_s >= window_s - 0.3, f"scaled down after {held_s:.1f}s, inside the {window_s}s window"
            assert await replicas_of(kube_admin, backend) == 2, "not below the floor of the Bound baseline"
            await asyncio.sleep(1.0)
            await command(1)
            await asyncio.sleep(1.0)
            assert await replicas_of(kube_admin, backend) == 2
            decisions = [d.outcome.value for d in running.controller.scaler.decisions]
            assert {"scaled_up", "scaled_down", "held_stabilization"} <= set(decisions)
            print(f"held {held_s:.1f}s for the {window_s}s window; decisions: {decisions}")
    finally:
        await producer.stop()
    events = await client.CoreV1Api(kube_admin).list_namespaced_event(NS, field_selector=f"involvedObject.name={backend}")
    got = [(e.reason, e.involved_object.kind) for e in in_order(events.items)]
    assert got == [("ScaledUp", "Deployment"), ("ScaledUp", "Deployment"), ("ScaledDown", "Deployment")], got
    assert "4 → 2 replicas" in in_order(events.items)[-1].message


DYNAMO_CRD: dict[str, Any] = {  # a stand-in for NVIDIA Dynamo's DynamoGraphDeployment: any kind with /scale
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "dynamographdeployments.nvidia.com"},
    "spec": {"group": "nvidia.com", "scope": "Namespaced",
             "names": {"plural": "dynamographdeployments", "singular": "dynamographdeployment",
                       "kind": "DynamoGraphDeployment", "listKind": "DynamoGraphDeploymentList"},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                           "subresources": {"status": {}, "scale": {"specReplicasPath": ".spec.replicas",
                                                                    "statusReplicasPath": ".status.replicas"}},
                           "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                               "spec": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
                               "status": {"type": "object", "properties": {"replicas": {"type": "integer"}}}}}}}]}}


async def test_any_resource_with_a_scale_subresource_and_dry_run_patches_nothing(
        kube_admin: ApiClient, controllers_cluster: Path, kafka_bootstrap: str) -> None:
    with contextlib.suppress(ApiException):
        await client.ApiextensionsV1Api(kube_admin).create_custom_resource_definition(DYNAMO_CRD)  # type: ignore[arg-type]
    await wait_established(kube_admin, "dynamographdeployments.nvidia.com")
    with contextlib.suppress(AssertionError):  # already applied by an earlier run of this module in the session
        await apply(kube_admin, DEPLOY / "base/rbac/scale-custom-backend.yaml")
    objs = client.CustomObjectsApi(kube_admin)
    name = f"graph-{uuid.uuid4().hex[:6]}"
    await objs.create_namespaced_custom_object("nvidia.com", "v1alpha1", NS, "dynamographdeployments", {
        "apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment", "metadata": {"name": name},
        "spec": {"replicas": 1}})
    await create(kube_admin, pool("dynamo", max_replicas=3,
                             backend={"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment", "name": name}))
    await create(kube_admin, ent("dyn-a", "dynamo", slots=4))

    async def replicas() -> int:
        scale = await objs.get_namespaced_custom_object_scale("nvidia.com", "v1alpha1", NS, "dynamographdeployments", name)
        return int(scale["spec"]["replicas"])

    topics = await fresh_topics(kafka_bootstrap)
    producer = local_kafka(kafka_bootstrap).producer("test-producer", acks="all")
    await producer.start()
    try:
        async def command(version: int, desired: int) -> None:
            c = ScaleCommand(pool="dynamo", version=version, t_ms=int(time.time() * 1000), desired_replicas=desired,
                             current_replicas=1, floor_replicas=1, reason="test")
            await producer.send_and_wait(topics.scale.name, encode(c), key=b"dynamo")

        async with start_controller(controllers_cluster, kafka_bootstrap, topics, dry_run=True) as running:
            await eventually(lambda: true(running.controller.scaler_loop.ready
                                          and "dynamo" in running.controller.inventory.pools),
                             15, "dry-run scaler ready")
            await command(1, 3)
            await eventually(lambda: true(bool(running.controller.scaler.decisions)), 10, "dry-run decision")
            assert running.controller.scaler.decisions[-1].outcome.value == "scaled_up"
            await asyncio.sleep(0.5)
            assert await replicas() == 1, "--dry-run patched the scale"
            assert "status" not in await get(kube_admin, "TokenEntitlement", "dyn-a"), "--dry-run wrote status"
        async with start_controller(controllers_cluster, kafka_bootstrap, topics) as running:
            await eventually(lambda: true(running.controller.scaler_loop.ready), 15, "scaler ready")
            await command(2, 3)
            await eventually(lambda: equal(replicas(), 3), 10, "DynamoGraphDeployment scaled through /scale")
            await eventually(lambda: state_is(kube_admin, "dyn-a", "Bound"), 10, "status written without --dry-run")
    finally:
        await producer.stop()
