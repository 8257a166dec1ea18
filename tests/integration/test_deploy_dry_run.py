"""`kubectl apply -k` of deploy/, deploy/secured/ and deploy/operators/ (three overlays of deploy/base/), as a
server-side dry run against the real kube-apiserver.

Rendered by the real ``kustomize`` (the API ``kubectl apply -k`` embeds; ``scripts/install-kustomize.sh``), so a
kustomization kubectl would refuse fails here too. Every rendered object is then server-side applied
(``PATCH application/apply-patch+yaml``) with ``dryRun=All`` and strict field validation (what ``kubectl apply``
asks for): schema, defaulting and admission run, nothing is stored. Two kinds are applied for real first, because
the dry run of the rest needs them to exist: the CRDs (then waited Established: their custom resources need the
REST endpoint) and the Namespace (the server refuses a namespaced object, even in a dry run, in a namespace that
does not exist). deploy/operators/ also needs the CRDs of the operators it is written for, Strimzi's (Kafka,
KafkaNodePool, KafkaTopic, KafkaUser) and the Prometheus Operator's (Prometheus, ServiceMonitor, PodMonitor,
PrometheusRule): scripts/install-operator-crds.sh fetches them, pinned, into the cache, and they are applied the
same way, so each custom resource is checked against its operator's own schema. Any refusal fails the test naming the object and the
server's message. The apiserver is the session's: real applies are idempotent with the other tests' (the same
documents, a field manager of our own).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from controllers_fixtures import DEPLOY, admin_client, wait_established
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from tokenpools_dev.devstack.kube import KubeAPIServer
from tokenpools_dev.devstack.process import cache_dir

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

DEFAULT_KUSTOMIZE_VERSION = "5.8.0"  # scripts/install-kustomize.sh's default
DEFAULT_PROMETHEUS_OPERATOR_VERSION = "v0.85.0"  # scripts/install-operator-crds.sh's default
FIELD_MANAGER = "tokenpools-deploy-dry-run"
RENDER_TIMEOUT_S = 60.0


def find_kustomize() -> Path:
    """``$TOKENPOOLS_KUSTOMIZE``, else the cached build of ``$KUSTOMIZE_VERSION`` (scripts/install-kustomize.sh)."""
    if env := os.environ.get("TOKENPOOLS_KUSTOMIZE"):
        return Path(env)
    version = os.environ.get("KUSTOMIZE_VERSION", DEFAULT_KUSTOMIZE_VERSION)
    binary = cache_dir() / "kustomize" / f"v{version}" / "kustomize"
    if binary.is_file() and (binary.parent / ".built-ok").is_file():
        return binary
    pytest.fail(f"kustomize not built at {binary}: run scripts/install-kustomize.sh", pytrace=False)


def operator_crds() -> list[dict[str, Any]]:
    """The CRDs of Strimzi (the version of tools/strimzi/pom.xml) and of the Prometheus Operator
    (``$PROMETHEUS_OPERATOR_VERSION``), as scripts/install-operator-crds.sh left them in the cache."""
    pom = (DEPLOY.parent / "tools/strimzi/pom.xml").read_text()
    strimzi = re.search(r"<strimzi\.version>([^<]+)</strimzi\.version>", pom)
    assert strimzi, "no <strimzi.version> in tools/strimzi/pom.xml"
    operator = os.environ.get("PROMETHEUS_OPERATOR_VERSION", DEFAULT_PROMETHEUS_OPERATOR_VERSION)
    crds = []
    for name in (f"strimzi-{strimzi.group(1)}", f"prometheus-operator-{operator}"):
        folder = cache_dir() / "operator-crds" / name
        if not (folder / ".complete").is_file():
            pytest.fail(f"no CRDs in {folder}: run scripts/install-operator-crds.sh", pytrace=False)
        crds += [d for f in sorted(folder.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    return crds


def render(kustomization_dir: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl apply -k DIR`` would send, in kustomize's order."""
    done = subprocess.run([str(find_kustomize()), "build", str(kustomization_dir)],
                          capture_output=True, text=True, timeout=RENDER_TIMEOUT_S, check=False)
    if done.returncode != 0:
        pytest.fail(f"kustomize build {kustomization_dir.relative_to(DEPLOY.parent)}: {done.stderr.strip()}",
                    pytrace=False)
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def name_of(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    where = f"{meta['namespace']}/" if meta.get("namespace") else ""
    return f"{obj['kind']} {where}{meta['name']}"


async def _get(api: ApiClient, path: str) -> Any:
    return await api.call_api(path, "GET", response_types_map={200: "object"}, auth_settings=["BearerToken"],
                              _return_http_data_only=True)


async def resource_paths(api: ApiClient, objs: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[str, bool]]:
    """(apiVersion, kind) → (plural, namespaced), from the server's discovery, for the objects' group versions."""
    found: dict[tuple[str, str], tuple[str, bool]] = {}
    for api_version in sorted({o["apiVersion"] for o in objs}):
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        for res in (await _get(api, base))["resources"]:
            if "/" not in res["name"]:  # not a subresource
                found[(api_version, res["kind"])] = (res["name"], res["namespaced"])
    return found


def object_path(obj: dict[str, Any], plural: str, namespaced: bool) -> str:
    base = "/api/v1" if obj["apiVersion"] == "v1" else f"/apis/{obj['apiVersion']}"
    ns = f"/namespaces/{obj['metadata']['namespace']}" if namespaced else ""
    return f"{base}{ns}/{plural}/{obj['metadata']['name']}"


async def server_side_apply(api: ApiClient, obj: dict[str, Any], path: str, dry_run: bool) -> str | None:
    """``kubectl apply --server-side --force-conflicts [--dry-run=server]`` of one object; the refusal, or None."""
    query = [("fieldManager", FIELD_MANAGER), ("force", "true"), ("fieldValidation", "Strict")] \
        + ([("dryRun", "All")] if dry_run else [])
    try:
        await api.call_api(path, "PATCH", query_params=query, body=obj,
                           header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
                           response_types_map={200: "object", 201: "object"}, auth_settings=["BearerToken"],
                           _return_http_data_only=True)
    except ApiException as e:
        try:
            message = json.loads(e.body or "{}")["message"]
        except (ValueError, KeyError, TypeError):
            message = str(e.body)
        return f"{name_of(obj)}: {e.status} {message}"
    return None


OPERATOR_KINDS = {"Kafka", "KafkaNodePool", "KafkaTopic", "KafkaUser", "Prometheus", "ServiceMonitor", "PodMonitor",
                  "PrometheusRule"}


@pytest.mark.parametrize("kustomization", [
    "deploy",  # the base as it is: a plaintext Kafka
    "deploy/secured",  # the same base over SASL_SSL: Secrets the Deployments and the Job reference need not exist
    "deploy/operators",  # the base with Strimzi's Kafka, topics and users, and the Prometheus Operator's monitors
])
async def test_apply_k_is_accepted_by_the_server(kube_apiserver: KubeAPIServer, kustomization: str) -> None:
    objs = render(DEPLOY.parent / kustomization)
    with_operators = kustomization == "deploy/operators"
    if with_operators:
        assert {o["kind"] for o in objs} >= OPERATOR_KINDS
        assert not {"Job"} & {o["kind"] for o in objs}, "the topic and user operators replace the topics Job"
    crds = [o for o in objs if o["kind"] == "CustomResourceDefinition"] + (operator_crds() if with_operators else [])
    namespaces = [o for o in objs if o["kind"] == "Namespace"]
    rest = [o for o in objs if o["kind"] not in ("CustomResourceDefinition", "Namespace")]
    assert {o["kind"] for o in objs} >= {"CustomResourceDefinition", "Namespace", "Deployment", "ConfigMap"}

    async with await admin_client(kube_apiserver) as api:
        paths = await resource_paths(api, crds + namespaces)
        for obj in crds + namespaces:  # for real: the rest's dry run needs them
            refused = await server_side_apply(api, obj, object_path(obj, *paths[(obj["apiVersion"], obj["kind"])]),
                                              dry_run=False)
            assert refused is None, refused
        await asyncio.gather(*(wait_established(api, crd["metadata"]["name"]) for crd in crds))

        paths = await resource_paths(api, rest)  # discovery again: the CRDs' kinds are served now
        missing = sorted({name_of(o) for o in rest if (o["apiVersion"], o["kind"]) not in paths})
        assert not missing, f"kinds the server does not serve: {missing}"
        refusals = [r for o in rest
                    if (r := await server_side_apply(api, o, object_path(o, *paths[(o["apiVersion"], o["kind"])]),
                                                     dry_run=True))]
    assert not refusals, "the server refused:\n" + "\n".join(refusals)
