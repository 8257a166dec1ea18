"""The loopback kube-apiserver (tokenpools_dev.devstack.kube) serves the API semantics the autoscaler needs.

Proved against a real kube-apiserver + etcd (no controllers): the Deployment /scale subresource, a CRD
with a status subresource, and RBAC — a ServiceAccount whose Role allows only get/patch on
deployments/scale can scale but is refused (403) on delete. Needs the binaries from
scripts/install-etcd.sh and scripts/install-kube-apiserver.sh.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from tokenpools_dev.devstack.kube import KubeAPIServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

CRD_GROUP = "test.tokenpools.io"
CRD_PLURAL = "widgets"


async def _client(kubeconfig: Path) -> ApiClient:
    return await config.new_client_from_config(config_file=str(kubeconfig), persist_config=False)


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def _namespace_with_deployment(api: ApiClient, replicas: int = 1) -> tuple[str, str]:
    ns, name = _unique("tp-it"), "model-server"
    await client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    labels = {"app": name}
    deployment = client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(name="sim", image="example.invalid/sim:1")]),
            ),
        ),
    )
    await client.AppsV1Api(api).create_namespaced_deployment(ns, deployment)
    return ns, name


async def test_scale_subresource_patch_changes_spec_replicas(kube_apiserver: KubeAPIServer) -> None:
    async with await _client(kube_apiserver.kubeconfig_path) as api:
        apps = client.AppsV1Api(api)
        ns, name = await _namespace_with_deployment(api, replicas=1)

        patched = await apps.patch_namespaced_deployment_scale(name, ns, {"spec": {"replicas": 3}})
        assert patched.spec.replicas == 3

        scale = await apps.read_namespaced_deployment_scale(name, ns)
        deployment = await apps.read_namespaced_deployment(name, ns)
        assert scale.spec.replicas == 3
        assert deployment.spec.replicas == 3
        # No controller-manager: nothing reconciles, so observed replicas never appear.
        assert not deployment.status.replicas


async def _wait_crd_established(ext: client.ApiextensionsV1Api, name: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        crd = await ext.read_custom_resource_definition(name)
        conds = {c.type: c.status for c in (crd.status.conditions or [])} if crd.status else {}
        if conds.get("Established") == "True":
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"CRD {name} not Established: {conds}")
        await asyncio.sleep(0.1)


async def _create_custom_object_when_served(
    objs: client.CustomObjectsApi, ns: str, body: dict[str, Any], timeout: float = 20.0
) -> dict[str, Any]:
    """Established can precede the new REST endpoint by a moment (404): retry briefly."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            created: dict[str, Any] = await objs.create_namespaced_custom_object(CRD_GROUP, "v1", ns, CRD_PLURAL, body)
            return created
        except ApiException as exc:
            if exc.status != 404 or asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_crd_with_status_subresource(kube_apiserver: KubeAPIServer) -> None:
    crd: Any = {  # a plain dict body: the client serialises it as-is
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{CRD_PLURAL}.{CRD_GROUP}"},
        "spec": {
            "group": CRD_GROUP,
            "scope": "Namespaced",
            "names": {"plural": CRD_PLURAL, "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                                "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}},
                            },
                        }
                    },
                }
            ],
        },
    }
    async with await _client(kube_apiserver.kubeconfig_path) as api:
        ext = client.ApiextensionsV1Api(api)
        objs = client.CustomObjectsApi(api)
        await ext.create_custom_resource_definition(crd)
        await _wait_crd_established(ext, crd["metadata"]["name"])

        ns = _unique("tp-crd")
        await client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        body = {
            "apiVersion": f"{CRD_GROUP}/v1",
            "kind": "Widget",
            "metadata": {"name": "w1"},
            "spec": {"size": 2},
            "status": {"ready": True},
        }
        created = await _create_custom_object_when_served(objs, ns, body)
        assert created["spec"] == {"size": 2}
        assert "status" not in created, "with a status subresource, the main endpoint drops status"

        # CustomObjectsApi sends PATCH bodies as JSON Patch (a dict body is rejected with 400, unlike the
        # typed APIs, which send a dict as strategic merge); CRDs have no strategic merge anyway.
        await objs.patch_namespaced_custom_object_status(
            CRD_GROUP, "v1", ns, CRD_PLURAL, "w1", [{"op": "add", "path": "/status", "value": {"ready": True}}]
        )
        got = await objs.get_namespaced_custom_object(CRD_GROUP, "v1", ns, CRD_PLURAL, "w1")
        assert got["status"] == {"ready": True}
        assert got["spec"] == {"size": 2}


async def test_service_account_rbac_allows_scale_but_not_delete(kube_apiserver: KubeAPIServer) -> None:
    sa = "autoscaler"
    async with await _client(kube_apiserver.kubeconfig_path) as admin:
        ns, name = await _namespace_with_deployment(admin, replicas=1)
        await client.CoreV1Api(admin).create_namespaced_service_account(
            ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=sa))
        )
        rbac = client.RbacAuthorizationV1Api(admin)
        await rbac.create_namespaced_role(
            ns,
            client.V1Role(
                metadata=client.V1ObjectMeta(name="scale-only"),
                rules=[client.V1PolicyRule(api_groups=["apps"], resources=["deployments/scale"], verbs=["get", "patch"])],
            ),
        )
        await rbac.create_namespaced_role_binding(
            ns,
            client.V1RoleBinding(
                metadata=client.V1ObjectMeta(name="autoscaler-scale-only"),
                role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="scale-only"),
                subjects=[client.RbacV1Subject(kind="ServiceAccount", name=sa, namespace=ns)],
            ),
        )

    sa_kubeconfig = await kube_apiserver.write_service_account_kubeconfig(ns, sa)
    async with await _client(sa_kubeconfig) as api:
        review = await client.AuthenticationV1Api(api).create_self_subject_review(
            client.V1SelfSubjectReview(metadata=client.V1ObjectMeta())
        )
        assert review.status.user_info.username == f"system:serviceaccount:{ns}:{sa}"

        apps = client.AppsV1Api(api)
        patched = await apps.patch_namespaced_deployment_scale(name, ns, {"spec": {"replicas": 4}})
        assert patched.spec.replicas == 4
        assert (await apps.read_namespaced_deployment_scale(name, ns)).spec.replicas == 4

        with pytest.raises(ApiException) as refused:
            await apps.delete_namespaced_deployment(name, ns)
        assert refused.value.status == 403
        with pytest.raises(ApiException) as refused_read:
            await apps.read_namespaced_deployment(name, ns)
        assert refused_read.value.status == 403

    async with await _client(kube_apiserver.kubeconfig_path) as admin:
        still_there = await client.AppsV1Api(admin).read_namespaced_deployment(name, ns)
        assert still_there.spec.replicas == 4
