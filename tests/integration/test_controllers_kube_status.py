"""The controller's entitlement loop against a real kube-apiserver: what the CRD schema refuses, and status.

Pinned:
- deploy/ applies (server-side apply: namespace, both CRDs, RBAC) and the CRD schema refuses invalid resources (422);
- the controller binds and degrades entitlements as capacity dictates, and status (state, conditions,
  observedGeneration) and Events show it; more max replicas bind what did not fit; an expiry turns Expired by itself;
  what the schema cannot refuse (a duplicate API key, a missing pool, a budget's unknown time zone) is reported in
  status; it keeps running.

The cluster is the session's kube-apiserver + etcd (``kube_apiserver`` in conftest.py,
scripts/install-kube-apiserver.sh) with deploy/ applied once (``controllers_cluster``), and the session's real
Kafka broker; the controller runs under the ServiceAccount token of deploy/base/rbac/controller.yaml.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from controllers_fixtures import (
    DEPLOY,
    GROUP,
    NS,
    VERSION,
    apply,
    conditions,
    create,
    ent,
    eventually,
    fresh_topics,
    get,
    in_order,
    last_per_key,
    pool,
    start_controller,
    state_is,
)
from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from tokenpools.config import hash_api_key
from tokenpools.controllers.supervisor import LoopState

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


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
        ("an unknown budget period", ent("bad-l", "p", budgets=[{"name": "b", "period": "year", "amount": 5}]),
         'Unsupported value: "year"'),
        ("a budget of 0", ent("bad-m", "p", budgets=[{"name": "b", "period": "day", "amount": 0}]), "amount"),
        ("rollover on a never budget", ent("bad-n", "p", budgets=[{"name": "b", "period": "never", "amount": 5,
                                                                    "rollover": {"max": 1}}]),
         "no next period to roll over into"),
        ("budget weights all 0", ent("bad-o", "p", budgets=[{"name": "b", "period": "day", "amount": 5, "weights": {
            "prompt": 0, "cachedPrompt": 0, "completion": 0}}]), "at least one weight must be > 0"),
        ("two budgets of one name", ent("bad-p", "p", budgets=[{"name": "b", "period": "day", "amount": 5},
                                                              {"name": "b", "period": "week", "amount": 9}]),
         "Duplicate value"),
        ("an alert threshold above 10", ent("bad-q", "p", budgets=[{"name": "b", "period": "day", "amount": 5,
                                                                     "alertThresholds": [0.5, 11]}]), "alertThresholds"),
        ("an unknown budget scope", ent("bad-r", "p", budgets=[{"name": "b", "period": "day", "amount": 5,
                                                                "scope": "team"}]), 'Unsupported value: "team"'),
        ("rollover on a tenant budget", ent("bad-s", "p", budgets=[{"name": "b", "period": "day", "amount": 5,
                                                                     "scope": "tenant", "rollover": {"max": 1}}]),
         "a tenant budget has no rollover"),
    ]


async def test_deploy_applies_and_the_crd_schema_refuses_invalid_resources(kube_admin: ApiClient) -> None:
    ext = client.ApiextensionsV1Api(kube_admin)
    for name in ("tokenpools.tokenpools.io", "tokenentitlements.tokenpools.io"):
        crd = await ext.read_custom_resource_definition(name)
        assert crd.spec.versions[0].subresources.status is not None
        assert crd.status.accepted_names.short_names
    await apply(kube_admin, DEPLOY / "examples/exp1.yaml")  # the paper's Exp 1 objects are valid as written
    assert (await get(kube_admin, "TokenEntitlement", "guaranteed-a"))["spec"]["qos"]["serviceClass"] == "guaranteed"
    refused = []
    for what, body, fragment in _invalid_bodies():
        with pytest.raises(ApiException) as exc:
            await create(kube_admin, body)
        message = orjson.loads(exc.value.body or b"{}")["message"]
        assert exc.value.status == 422 and fragment in message, (what, message)
        refused.append(what)
    print(f"refused by the schema: {', '.join(refused)}")

    # a budget as docs/budgets.md writes it is accepted; the server fills in the defaults the loader would
    budgeted = ent("budgeted", "p", cls="spot", budgets=[
        {"name": "monthly", "period": "month", "timeZone": "Europe/Berlin", "amount": 50_000_000,
         "weights": {"cachedPrompt": 0.1, "completion": 4.0}, "rollover": {"max": 10_000_000},
         "alertThresholds": [0.8, 1.0]},
        {"name": "daily", "period": "day", "amount": 1_000_000}])
    created = await create(kube_admin, budgeted)
    try:
        monthly, daily = created["spec"]["budgets"]
        assert monthly["weights"] == {"prompt": 1.0, "cachedPrompt": 0.1, "completion": 4.0}
        assert daily["timeZone"] == "UTC" and "weights" not in daily and daily["scope"] == "entitlement"
    finally:
        await client.CustomObjectsApi(kube_admin).delete_namespaced_custom_object(
            GROUP, VERSION, NS, "tokenentitlements", "budgeted")


async def test_controller_binds_and_degrades_as_capacity_dictates_and_status_shows_it(
        kube_admin: ApiClient, controllers_cluster: Path, kafka_bootstrap: str) -> None:
    topics = await fresh_topics(kafka_bootstrap)
    await create(kube_admin, pool("gpu", max_replicas=1))  # 16 slots at max replicas
    for name in ("ent-a", "ent-b"):
        await create(kube_admin, ent(name, "gpu", slots=6))
    await create(kube_admin, ent("ent-spot", "gpu", cls="spot"))
    async with start_controller(controllers_cluster, kafka_bootstrap, topics) as running:
        for name in ("ent-a", "ent-b", "ent-spot"):
            await eventually(lambda n=name: state_is(kube_admin, n, "Bound"), 15, f"{name} Bound")  # type: ignore[misc]
        a = await get(kube_admin, "TokenEntitlement", "ent-a")
        assert a["status"]["observedGeneration"] == a["metadata"]["generation"] == 1
        assert {t: c["status"] for t, c in conditions(a).items()} == {
            "Ready": "True", "CapacityAvailable": "True", "SpecValid": "True"}

        # 6 + 6 + 6 > 16 slots: the newest guaranteed baseline does not fit
        await create(kube_admin, ent("ent-c", "gpu", slots=6))
        await eventually(lambda: state_is(kube_admin, "ent-c", "Degraded"), 10, "ent-c Degraded")
        c = await get(kube_admin, "TokenEntitlement", "ent-c")
        assert c["status"]["reason"] == "InsufficientCapacity" and "18 sequences promised" in c["status"]["message"]
        assert conditions(c)["Ready"]["status"] == "False" and conditions(c)["CapacityAvailable"]["status"] == "False"
        gpu = await get(kube_admin, "TokenPool", "gpu")
        assert (gpu["status"]["boundEntitlements"], gpu["status"]["degradedEntitlements"]) == (3, 1)
        assert conditions(gpu)["CapacityAvailable"]["status"] == "False"

        # a second replica at max: it fits now (the pool's generation moves, and its status follows)
        await client.CustomObjectsApi(kube_admin).patch_namespaced_custom_object(
            GROUP, VERSION, NS, "tokenpools", "gpu", [{"op": "replace", "path": "/spec/scaling/maxReplicas", "value": 2}])
        await eventually(lambda: state_is(kube_admin, "ent-c", "Bound"), 10, "ent-c Bound after maxReplicas 2")
        gpu = await get(kube_admin, "TokenPool", "gpu")
        assert gpu["metadata"]["generation"] == 2 and gpu["status"]["observedGeneration"] == 2
        assert gpu["status"]["protectedFloorReplicas"] == 2 and gpu["status"]["promised"]["concurrency"] == 18

        # expiry needs no edit; what the schema cannot refuse is reported in status
        soon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3))
        await create(kube_admin, ent("ent-short", "gpu", slots=1, expiresAt=soon))
        dup = ent("ent-dup", "gpu", slots=1)
        dup["spec"]["apiKeys"] = [{"sha256": hash_api_key("sk-ent-a")}]  # ent-a's key
        await create(kube_admin, dup)
        await create(kube_admin, ent("ent-orphan", "no-such-pool", slots=1))
        await create(kube_admin, ent("ent-zone", "gpu", cls="spot", budgets=[
            {"name": "daily", "period": "day", "timeZone": "Mars/Olympus", "amount": 1000}]))
        await eventually(lambda: state_is(kube_admin, "ent-short", "Bound"), 10, "ent-short Bound")
        await eventually(lambda: state_is(kube_admin, "ent-dup", "Pending"), 10, "ent-dup reported")
        dup_status = (await get(kube_admin, "TokenEntitlement", "ent-dup"))["status"]
        assert dup_status["reason"] == "InvalidSpec" and "already used by TokenEntitlement 'ent-a'" in dup_status["message"]
        assert conditions(await get(kube_admin, "TokenEntitlement", "ent-dup"))["SpecValid"]["status"] == "False"
        await eventually(lambda: state_is(kube_admin, "ent-orphan", "Pending"), 10, "ent-orphan reported")
        assert (await get(kube_admin, "TokenEntitlement", "ent-orphan"))["status"]["reason"] == "PoolNotFound"
        await eventually(lambda: state_is(kube_admin, "ent-zone", "Pending"), 10, "ent-zone reported")
        zone_status = (await get(kube_admin, "TokenEntitlement", "ent-zone"))["status"]
        assert zone_status["reason"] == "InvalidSpec" and "spec.budgets[0].timeZone" in zone_status["message"]
        took = await eventually(lambda: state_is(kube_admin, "ent-short", "Expired"), 10, "ent-short Expired")
        print(f"Expired {took:.1f}s after Bound was seen")

        # still running: a deletion frees capacity and the pool's status follows
        await client.CustomObjectsApi(kube_admin).delete_namespaced_custom_object(GROUP, VERSION, NS, "tokenentitlements", "ent-b")

        async def two_guaranteed_left() -> bool:
            return (await get(kube_admin, "TokenPool", "gpu")).get("status", {}).get("promised", {}).get("concurrency") == 12

        await eventually(two_guaranteed_left, 10, "pool status after deleting ent-b")

        async def tombstone() -> bool:  # published after the status write: wait for it before stopping
            specs = await last_per_key(kafka_bootstrap, topics.specs.name)
            return "TokenEntitlement/ent-b" in specs and specs["TokenEntitlement/ent-b"] is None

        await eventually(tombstone, 15, "the tombstone of ent-b on the specs topic")
        assert all(s.state is not LoopState.FAILED for s in running.statuses.values()), running.statuses
        assert running.statuses["entitlements"].restarts == 0

    events = await client.CoreV1Api(kube_admin).list_namespaced_event(NS, field_selector="involvedObject.name=ent-c")
    transitions = [(e.reason, e.type, e.count, e.message) for e in in_order(events.items)]
    assert len(transitions) == 2, transitions
    degraded, bound = in_order(events.items)  # exactly one event per transition (Degraded, then Bound)
    assert (degraded.reason, degraded.type, bound.reason, bound.type) == ("Degraded", "Warning", "Bound", "Normal")
    assert degraded.reporting_component == "tokenpools-controller" and "18 sequences promised" in degraded.message

    specs = await last_per_key(kafka_bootstrap, topics.specs.name)
    assert specs["TokenPool/gpu"]["spec"]["scaling"]["maxReplicas"] == 2  # type: ignore[index]
    assert specs["TokenEntitlement/ent-c"]["state"] == "Bound"  # type: ignore[index]
    assert specs["TokenEntitlement/ent-short"]["state"] == "Expired"  # type: ignore[index]
    assert specs["TokenEntitlement/ent-b"] is None, "a deletion ends in a tombstone"
    assert "TokenEntitlement/ent-dup" not in specs and "TokenEntitlement/ent-orphan" not in specs
    assert "TokenEntitlement/ent-zone" not in specs
