"""The controller against a real kube-apiserver + etcd (scripts/install-kube-apiserver.sh, tokenpools.devstack.kube)
and the real Kafka broker, running under the ServiceAccount token of deploy/rbac/controller.yaml.

Pinned:
- deploy/ applies (server-side apply: namespace, both CRDs, RBAC) and the CRD schema refuses invalid resources (422);
- the controller binds and degrades entitlements as capacity dictates, and status (state, conditions,
  observedGeneration) and Events show it; more max replicas bind what did not fit; an expiry turns Expired by itself;
  what the schema cannot refuse (a duplicate API key, a missing pool) is reported in status; it keeps running;
- scale commands change spec.replicas of a Deployment (and of a custom resource with /scale) within min/max, never
  below the Bound baselines' floor, scale-down only after the stabilisation window, with an Event per change;
- the ServiceAccount may do exactly that: a verb it must not have is refused with 403;
- ``tokenpools controller --kubeconfig SA`` as a process does the same and stops cleanly on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiokafka import AIOKafkaProducer
from controllers_fixtures import (
    DEPLOY,
    GROUP,
    NS,
    SA,
    VERSION,
    admin_client,
    apply,
    conditions,
    create,
    delete_all,
    deployment,
    ent,
    equal,
    eventually,
    fresh_topics,
    get,
    in_order,
    last_per_key,
    pool,
    replicas_of,
    start_controller,
    state_is,
    tail,
    true,
    wait_established,
)
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from test_kube_apiserver import kube_apiserver  # noqa: F401  (session fixture: one apiserver per session)

from tokenpools.config import hash_api_key
from tokenpools.controllers.supervisor import LoopState
from tokenpools.devstack.kube import KubeAPIServer
from tokenpools.topics.codec import encode
from tokenpools.topics.records import ScaleCommand

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


@pytest.fixture(scope="module")
def cluster(kube_apiserver: KubeAPIServer) -> Iterator[Path]:  # noqa: F811
    """deploy/ applied once per module; yields a kubeconfig holding the controller ServiceAccount's token."""
    async def setup() -> Path:
        async with await admin_client(kube_apiserver) as api:
            await apply(api, DEPLOY / "namespace.yaml", DEPLOY / "crds/tokenpools.io_tokenpools.yaml",
                        DEPLOY / "crds/tokenpools.io_tokenentitlements.yaml", DEPLOY / "rbac/controller.yaml")
            for crd in ("tokenpools.tokenpools.io", "tokenentitlements.tokenpools.io"):
                await wait_established(api, crd)
        return await kube_apiserver.write_service_account_kubeconfig(NS, SA)

    t0 = time.monotonic()
    path = asyncio.run(setup())
    print(f"deploy/ applied and SA token minted in {time.monotonic() - t0:.1f}s")
    yield path


@pytest.fixture
async def admin(kube_apiserver: KubeAPIServer, cluster: Path) -> AsyncIterator[ApiClient]:  # noqa: F811
    async with await admin_client(kube_apiserver) as api:
        await delete_all(api)
        yield api
        await delete_all(api)


# ---- tests ------------------------------------------------------------------------------------------------------

def _invalid_bodies() -> list[tuple[str, dict[str, Any], str]]:
    """(what, body, a fragment of the API server's message)."""
    def broken(body: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
        node = body["spec"]
        for part in path[:-1]:
            node = node[part]
        if value is KeyError:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return body

    return [
        ("concurrency below 1", broken(pool("bad-a"), ["perReplica", "concurrency"], 0), "spec.perReplica.concurrency"),
        ("maxReplicas < minReplicas", broken(pool("bad-b", max_replicas=2), ["scaling", "minReplicas"], 3),
         "maxReplicas must be >= minReplicas"),
        ("kvGeometry and kvBytesPerToken", broken(pool("bad-c"), ["kvBytesPerToken"], 147456),
         "give exactly one of kvGeometry or kvBytesPerToken"),
        ("a string for a number", broken(pool("bad-d"), ["perReplica", "tokensPerSecond"], "480"), "tokensPerSecond"),
        ("unknown service class", broken(ent("bad-e", "p"), ["qos", "serviceClass"], "gold"), "Unsupported value: \"gold\""),
        ("guaranteed without resources", broken(ent("bad-f", "p"), ["resources"], KeyError),
         "need resources (their baseline)"),
        ("spot with a baseline", broken(ent("bad-g", "p", cls="spot"), ["resources"],
                                        {"tokensPerSecond": 10, "kvCacheGiB": 1, "concurrency": 1}), "have no baseline"),
        ("a key that is not a digest", broken(ent("bad-h", "p"), ["apiKeys"], [{"sha256": "sk-in-clear"}]), "sha256"),
        ("digest and secretRef", broken(ent("bad-i", "p"), ["apiKeys"],
                                        [{"sha256": "a" * 64, "secretRef": {"name": "s", "key": "k"}}]),
         "give exactly one of sha256 or secretRef"),
        ("expiresAt not a time", broken(ent("bad-j", "p"), ["expiresAt"], "tomorrow"), "expiresAt"),
        ("missing poolRef", broken(ent("bad-k", "p"), ["poolRef"], KeyError), "poolRef"),
    ]


async def test_deploy_applies_and_the_crd_schema_refuses_invalid_resources(admin: ApiClient) -> None:
    ext = client.ApiextensionsV1Api(admin)
    for name in ("tokenpools.tokenpools.io", "tokenentitlements.tokenpools.io"):
        crd = await ext.read_custom_resource_definition(name)
        assert crd.spec.versions[0].subresources.status is not None
        assert crd.status.accepted_names.short_names
    await apply(admin, DEPLOY / "examples/exp1.yaml")  # the paper's Exp 1 objects are valid as written
    assert (await get(admin, "TokenEntitlement", "guaranteed-a"))["spec"]["qos"]["serviceClass"] == "guaranteed"
    refused = []
    for what, body, fragment in _invalid_bodies():
        with pytest.raises(ApiException) as exc:
            await create(admin, body)
        message = orjson.loads(exc.value.body or b"{}")["message"]
        assert exc.value.status == 422 and fragment in message, (what, message)
        refused.append(what)
    print(f"refused by the schema: {', '.join(refused)}")


async def test_controller_binds_and_degrades_as_capacity_dictates_and_status_shows_it(
        admin: ApiClient, cluster: Path, kafka_bootstrap: str) -> None:
    topics = await fresh_topics(kafka_bootstrap)
    await create(admin, pool("gpu", max_replicas=1))  # 16 slots at max replicas
    for name in ("ent-a", "ent-b"):
        await create(admin, ent(name, "gpu", slots=6))
    await create(admin, ent("ent-spot", "gpu", cls="spot"))
    async with start_controller(cluster, kafka_bootstrap, topics) as running:
        for name in ("ent-a", "ent-b", "ent-spot"):
            await eventually(lambda n=name: state_is(admin, n, "Bound"), 15, f"{name} Bound")  # type: ignore[misc]
        a = await get(admin, "TokenEntitlement", "ent-a")
        assert a["status"]["observedGeneration"] == a["metadata"]["generation"] == 1
        assert {t: c["status"] for t, c in conditions(a).items()} == {
            "Ready": "True", "CapacityAvailable": "True", "SpecValid": "True"}

        # 6 + 6 + 6 > 16 slots: the newest guaranteed baseline does not fit
        await create(admin, ent("ent-c", "gpu", slots=6))
        await eventually(lambda: state_is(admin, "ent-c", "Degraded"), 10, "ent-c Degraded")
        c = await get(admin, "TokenEntitlement", "ent-c")
        assert c["status"]["reason"] == "InsufficientCapacity" and "18 sequences promised" in c["status"]["message"]
        assert conditions(c)["Ready"]["status"] == "False" and conditions(c)["CapacityAvailable"]["status"] == "False"
        gpu = await get(admin, "TokenPool", "gpu")
        assert (gpu["status"]["boundEntitlements"], gpu["status"]["degradedEntitlements"]) == (3, 1)
        assert conditions(gpu)["CapacityAvailable"]["status"] == "False"

        # a second replica at max: it fits now (the pool's generation moves, and its status follows)
        await client.CustomObjectsApi(admin).patch_namespaced_custom_object(
            GROUP, VERSION, NS, "tokenpools", "gpu", [{"op": "replace", "path": "/spec/scaling/maxReplicas", "value": 2}])
        await eventually(lambda: state_is(admin, "ent-c", "Bound"), 10, "ent-c Bound after maxReplicas 2")
        gpu = await get(admin, "TokenPool", "gpu")
        assert gpu["metadata"]["generation"] == 2 and gpu["status"]["observedGeneration"] == 2
        assert gpu["status"]["protectedFloorReplicas"] == 2 and gpu["status"]["promised"]["concurrency"] == 18

        # expiry needs no edit; what the schema cannot refuse is reported in status
        soon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3))
        await create(admin, ent("ent-short", "gpu", slots=1, expiresAt=soon))
        dup = ent("ent-dup", "gpu", slots=1)
        dup["spec"]["apiKeys"] = [{"sha256": hash_api_key("sk-ent-a")}]  # ent-a's key
        await create(admin, dup)
        await create(admin, ent("ent-orphan", "no-such-pool", slots=1))
        await eventually(lambda: state_is(admin, "ent-short", "Bound"), 10, "ent-short Bound")
        await eventually(lambda: state_is(admin, "ent-dup", "Pending"), 10, "ent-dup reported")
        dup_status = (await get(admin, "TokenEntitlement", "ent-dup"))["status"]
        assert dup_status["reason"] == "InvalidSpec" and "already used by TokenEntitlement 'ent-a'" in dup_status["message"]
        assert conditions(await get(admin, "TokenEntitlement", "ent-dup"))["SpecValid"]["status"] == "False"
        await eventually(lambda: state_is(admin, "ent-orphan", "Pending"), 10, "ent-orphan reported")
        assert (await get(admin, "TokenEntitlement", "ent-orphan"))["status"]["reason"] == "PoolNotFound"
        took = await eventually(lambda: state_is(admin, "ent-short", "Expired"), 10, "ent-short Expired")
        print(f"Expired {took:.1f}s after Bound was seen")

        # still running: a deletion frees capacity and the pool's status follows
        await client.CustomObjectsApi(admin).delete_namespaced_custom_object(GROUP, VERSION, NS, "tokenentitlements", "ent-b")

        async def two_guaranteed_left() -> bool:
            return (await get(admin, "TokenPool", "gpu")).get("status", {}).get("promised", {}).get("concurrency") == 12

        await eventually(two_guaranteed_left, 10, "pool status after deleting ent-b")
        assert all(s.state is not LoopState.FAILED for s in running.statuses.values()), running.statuses
        assert running.statuses["entitlements"].restarts == 0

    events = await client.CoreV1Api(admin).list_namespaced_event(NS, field_selector="involvedObject.name=ent-c")
    degraded, bound = in_order(events.items)
    assert (degraded.reason, degraded.type, bound.reason, bound.type) == ("Degraded", "Warning", "Bound", "Normal")
    assert degraded.reporting_component == "tokenpools-controller" and "18 sequences promised" in degraded.message

    specs = await last_per_key(kafka_bootstrap, topics.specs.name)
    assert specs["TokenPool/gpu"]["spec"]["scaling"]["maxReplicas"] == 2  # type: ignore[index]
    assert specs["TokenEntitlement/ent-c"]["state"] == "Bound"  # type: ignore[index]
    assert specs["TokenEntitlement/ent-short"]["state"] == "Expired"  # type: ignore[index]
    assert specs["TokenEntitlement/ent-b"] is None, "a deletion ends in a tombstone"
    assert "TokenEntitlement/ent-dup" not in specs and "TokenEntitlement/ent-orphan" not in specs


async def test_scale_commands_change_replicas_within_bounds_above_the_floor_after_stabilisation(
        admin: ApiClient, cluster: Path, kafka_bootstrap: str) -> None:
    topics = await fresh_topics(kafka_bootstrap)
    backend = f"sim-{uuid.uuid4().hex[:6]}"
    await deployment(admin, backend, replicas=1)
    await create(admin, pool("scaled", max_replicas=4, backend={"name": backend}))
    await create(admin, ent("floor-20", "scaled", slots=20))  # a Bound baseline of 20 slots needs 2 replicas of 16
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    version = [0]

    async def command(desired: int, floor: int = 0) -> None:
        version[0] += 1
        c = ScaleCommand(pool="scaled", version=version[0], t_ms=int(time.time() * 1000), desired_replicas=desired,
                         current_replicas=0, floor_replicas=floor, reason="test demand")
        await producer.send_and_wait(topics.scale.name, encode(c), key=b"scaled")

    window_s, cooldown_s = 3.0, 0.5
    try:
        async with start_controller(cluster, kafka_bootstrap, topics, f"scaling.scale_down_stabilization_s={window_s}",
                                    f"scaling.cooldown_s={cooldown_s}") as running:
            await eventually(lambda: true(running.controller.scaler_loop.ready
                                          and "scaled" in running.controller.inventory.pools),
                             15, "scaler positioned, pool known")
            await command(3)
            await eventually(lambda: equal(replicas_of(admin, backend), 3), 10, "scaled up to 3 at once")
            await asyncio.sleep(cooldown_s)
            await command(9)
            await eventually(lambda: equal(replicas_of(admin, backend), 4), 10, "clamped to maxReplicas 4")
            t_down = time.monotonic()
            while await replicas_of(admin, backend) == 4:  # the agents re-send the wish every tick
                await command(1)
                assert time.monotonic() - t_down < window_s + 10, "never scaled down"
                await asyncio.sleep(0.3)
            held_s = time.monotonic() - t_down
            assert held_s >= window_s - 0.3, f"scaled down after {held_s:.1f}s, inside the {window_s}s window"
            assert await replicas_of(admin, backend) == 2, "not below the floor of the Bound baseline"
            await asyncio.sleep(1.0)
            await command(1)
            await asyncio.sleep(1.0)
            assert await replicas_of(admin, backend) == 2
            decisions = [d.outcome.value for d in running.controller.scaler.decisions]
            assert {"scaled_up", "scaled_down", "held_stabilization"} <= set(decisions)
            print(f"held {held_s:.1f}s for the {window_s}s window; decisions: {decisions}")
    finally:
        await producer.stop()
    events = await client.CoreV1Api(admin).list_namespaced_event(NS, field_selector=f"involvedObject.name={backend}")
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
        admin: ApiClient, cluster: Path, kafka_bootstrap: str) -> None:
    with contextlib.suppress(ApiException):
        await client.ApiextensionsV1Api(admin).create_custom_resource_definition(DYNAMO_CRD)  # type: ignore[arg-type]
    await wait_established(admin, "dynamographdeployments.nvidia.com")
    with contextlib.suppress(AssertionError):  # already applied by an earlier run of this module in the session
        await apply(admin, DEPLOY / "rbac/scale-custom-backend.yaml")
    objs = client.CustomObjectsApi(admin)
    name = f"graph-{uuid.uuid4().hex[:6]}"
    await objs.create_namespaced_custom_object("nvidia.com", "v1alpha1", NS, "dynamographdeployments", {
        "apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment", "metadata": {"name": name},
        "spec": {"replicas": 1}})
    await create(admin, pool("dynamo", max_replicas=3,
                             backend={"apiVersion": "nvidia.com/v1alpha1", "kind": "DynamoGraphDeployment", "name": name}))
    await create(admin, ent("dyn-a", "dynamo", slots=4))

    async def replicas() -> int:
        scale = await objs.get_namespaced_custom_object_scale("nvidia.com", "v1alpha1", NS, "dynamographdeployments", name)
        return int(scale["spec"]["replicas"])

    topics = await fresh_topics(kafka_bootstrap)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        async def command(version: int, desired: int) -> None:
            c = ScaleCommand(pool="dynamo", version=version, t_ms=int(time.time() * 1000), desired_replicas=desired,
                             current_replicas=1, floor_replicas=1, reason="test")
            await producer.send_and_wait(topics.scale.name, encode(c), key=b"dynamo")

        async with start_controller(cluster, kafka_bootstrap, topics, dry_run=True) as running:
            await eventually(lambda: true(running.controller.scaler_loop.ready
                                          and "dynamo" in running.controller.inventory.pools),
                             15, "dry-run scaler ready")
            await command(1, 3)
            await eventually(lambda: true(bool(running.controller.scaler.decisions)), 10, "dry-run decision")
            assert running.controller.scaler.decisions[-1].outcome.value == "scaled_up"
            await asyncio.sleep(0.5)
            assert await replicas() == 1, "--dry-run patched the scale"
            assert "status" not in await get(admin, "TokenEntitlement", "dyn-a"), "--dry-run wrote status"
        async with start_controller(cluster, kafka_bootstrap, topics) as running:
            await eventually(lambda: true(running.controller.scaler_loop.ready), 15, "scaler ready")
            await command(2, 3)
            await eventually(lambda: equal(replicas(), 3), 10, "DynamoGraphDeployment scaled through /scale")
            await eventually(lambda: state_is(admin, "dyn-a", "Bound"), 10, "status written without --dry-run")
    finally:
        await producer.stop()


async def test_the_service_account_is_refused_what_the_controller_must_not_do(admin: ApiClient, cluster: Path) -> None:
    await deployment(admin, "rbac-target", replicas=1)
    await create(admin, pool("rbac-pool"))
    await create(admin, ent("rbac-ent", "rbac-pool"))
    await client.CoreV1Api(admin).create_namespaced_secret(NS, client.V1Secret(
        metadata=client.V1ObjectMeta(name=f"keys-{uuid.uuid4().hex[:6]}"), string_data={"api-key": "sk-secret"}))
    async with await config.new_client_from_config(config_file=str(cluster), persist_config=False) as sa:
        review = await client.AuthenticationV1Api(sa).create_self_subject_review(
            client.V1SelfSubjectReview(metadata=client.V1ObjectMeta()))
        assert review.status.user_info.username == f"system:serviceaccount:{NS}:{SA}"
        objs, apps, core = client.CustomObjectsApi(sa), client.AppsV1Api(sa), client.CoreV1Api(sa)
        # what it does: allowed
        assert (await objs.list_namespaced_custom_object(GROUP, VERSION, NS, "tokenentitlements"))["items"]
        await objs.patch_namespaced_custom_object_status(GROUP, VERSION, NS, "tokenentitlements", "rbac-ent",
                                                         [{"op": "add", "path": "/status", "value": {"state": "Pending"}}])
        assert (await apps.read_namespaced_deployment_scale("rbac-target", NS)).spec.replicas == 1
        await apps.patch_namespaced_deployment_scale("rbac-target", NS, {"spec": {"replicas": 2}})
        # what it must not do: 403
        refused = {
            "get a TokenEntitlement": objs.get_namespaced_custom_object(GROUP, VERSION, NS, "tokenentitlements", "rbac-ent"),
            "edit a TokenEntitlement's spec": objs.patch_namespaced_custom_object(
                GROUP, VERSION, NS, "tokenentitlements", "rbac-ent",
                [{"op": "replace", "path": "/spec/qos/sloTargetMs", "value": 1}]),
            "delete a TokenEntitlement": objs.delete_namespaced_custom_object(
                GROUP, VERSION, NS, "tokenentitlements", "rbac-ent"),
            "create a TokenPool": objs.create_namespaced_custom_object(GROUP, VERSION, NS, "tokenpools", pool("sneaky")),
            "read a Deployment": apps.read_namespaced_deployment("rbac-target", NS),
            "change a Deployment's template": apps.patch_namespaced_deployment(
                "rbac-target", NS, {"spec": {"template": {"metadata": {"labels": {"x": "y"}}}}}),
            "delete a Deployment": apps.delete_namespaced_deployment("rbac-target", NS),
            "list Secrets": core.list_namespaced_secret(NS),
            "list Pods": core.list_namespaced_pod(NS),
            "scale in another namespace": apps.patch_namespaced_deployment_scale(
                "rbac-target", "default", {"spec": {"replicas": 1}}),
            "list TokenPools cluster-wide": objs.list_cluster_custom_object(GROUP, VERSION, "tokenpools"),
            "delete an Event": core.delete_collection_namespaced_event(NS),
        }
        for what, call in refused.items():
            with pytest.raises(ApiException) as exc:
                await call
            assert exc.value.status == 403, (what, exc.value.status)
    assert (await client.AppsV1Api(admin).read_namespaced_deployment("rbac-target", NS)).spec.replicas == 2
    print(f"403 for: {', '.join(refused)}")


async def test_the_controller_command_runs_under_the_service_account_and_stops_on_sigterm(
        admin: ApiClient, cluster: Path, kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = await fresh_topics(kafka_bootstrap)
    settings = tmp_path / "controller.yaml"
    settings.write_text(yaml.safe_dump({"apiVersion": f"{GROUP}/{VERSION}", "kind": "TokenPoolsSettings", "spec": {
        "kafka": {"bootstrap_servers": kafka_bootstrap, "topic_prefix": topics.specs.name[:-5]},
        "prometheus": {"url": "http://127.0.0.1:9"}, "kubernetes": {"namespace": NS}}}))
    await create(admin, pool("cli-pool"))
    await create(admin, ent("cli-ent", "cli-pool"))
    tokenpools = Path(sys.executable).parent / "tokenpools"
    log = tmp_path / "controller.log"
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen([str(tokenpools), "controller", "--config", str(settings), "--kubeconfig", str(cluster),
                                 "--resync-s", "5"], stdout=out, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        await eventually(lambda: state_is(admin, "cli-ent", "Bound"), 30, f"status by the process:\n{tail(log)}")
        print(f"`tokenpools controller` wrote status {time.monotonic() - t0:.1f}s after start")

        async def published() -> bool:  # status first, then the specs topic
            record = (await last_per_key(kafka_bootstrap, topics.specs.name)).get("TokenEntitlement/cli-ent")
            return record is not None and record["state"] == "Bound"

        await eventually(published, 15, "cli-ent Bound on the specs topic")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 15) == 0, tail(log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "controller running: Kubernetes namespace tokenpools" in text and "controller stopping" in text, text


