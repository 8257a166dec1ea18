"""What the controller may do in a real kube-apiserver, and the controller as a process.

Pinned:
- the ServiceAccount of deploy/base/rbac/controller.yaml may do exactly what the controller does: each of 12 verbs it
  must not have is refused with 403;
- ``tokenpools controller --kubeconfig SA`` as a process writes status, publishes the specs topic and stops cleanly
  on SIGTERM.

The cluster is the session's kube-apiserver + etcd (``kube_apiserver`` in conftest.py,
scripts/install-kube-apiserver.sh) with deploy/ applied once (``controllers_cluster``), and the session's real
Kafka broker; the controller runs under the ServiceAccount token of deploy/base/rbac/controller.yaml.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from controllers_fixtures import (
    GROUP,
    NS,
    SA,
    VERSION,
    create,
    deployment,
    ent,
    eventually,
    fresh_topics,
    last_per_key,
    pool,
    state_is,
    tail,
)
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


async def test_the_service_account_is_refused_what_the_controller_must_not_do(kube_admin: ApiClient, controllers_cluster: Path) -> None:
    await deployment(kube_admin, "rbac-target", replicas=1)
    await create(kube_admin, pool("rbac-pool"))
    await create(kube_admin, ent("rbac-ent", "rbac-pool"))
    await client.CoreV1Api(kube_admin).create_namespaced_secret(NS, client.V1Secret(
        metadata=client.V1ObjectMeta(name=f"keys-{uuid.uuid4().hex[:6]}"), string_data={"api-key": "sk-secret"}))
    async with await config.new_client_from_config(config_file=str(controllers_cluster), persist_config=False) as sa:
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
    assert (await client.AppsV1Api(kube_admin).read_namespaced_deployment("rbac-target", NS)).spec.replicas == 2
    print(f"403 for: {', '.join(refused)}")


async def test_the_controller_command_runs_under_the_service_account_and_stops_on_sigterm(
        kube_admin: ApiClient, controllers_cluster: Path, kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = await fresh_topics(kafka_bootstrap)
    settings = tmp_path / "controller.yaml"
    settings.write_text(yaml.safe_dump({"apiVersion": f"{GROUP}/{VERSION}", "kind": "TokenPoolsSettings", "spec": {
        "kafka": {"bootstrap_servers": kafka_bootstrap, "topic_prefix": topics.specs.name[:-5]},
        "prometheus": {"url": "http://127.0.0.1:9"}, "kubernetes": {"namespace": NS}}}))
    await create(kube_admin, pool("cli-pool"))
    await create(kube_admin, ent("cli-ent", "cli-pool"))
    tokenpools = Path(sys.executable).parent / "tokenpools"
    log = tmp_path / "controller.log"
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen([str(tokenpools), "controller", "--config", str(settings), "--kubeconfig", str(controllers_cluster),
                                 "--resync-s", "5"], stdout=out, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        await eventually(lambda: state_is(kube_admin, "cli-ent", "Bound"), 30, f"status by the process:\n{tail(log)}")
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
