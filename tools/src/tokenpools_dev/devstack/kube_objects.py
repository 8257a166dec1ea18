"""What the local stack puts into its kube-apiserver, and how it reads a backend's desired size back.

- The TokenPool/TokenEntitlement CRDs: ``deploy/base/crds/*.yaml`` when the repository has them, else a minimal
  schema-less pair (``x-kubernetes-preserve-unknown-fields``, with a status subresource) — the controller
  validates the documents itself with ``tokenpools.config``;
- the namespace, one Deployment per pool (its ``backendRef``; nothing schedules its Pods: no controller-manager runs,
  the stack itself plays kubelet by running one simulator per ``spec.replicas``), and the config's custom resources.

A tiny synchronous REST client (urllib, the admin bearer token, the apiserver's self-signed certificate) is enough
here and keeps the stack's reconcile thread free of an event loop.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

GROUP, VERSION = "tokenpools.io", "v1alpha1"
PLURALS = {"TokenPool": "tokenpools", "TokenEntitlement": "tokenentitlements"}
CRD_DIR = Path(__file__).resolve().parents[4] / "deploy" / "base" / "crds"  # the checkout's (4 folders up from here)
POOL_LABEL = "tokenpools.io/pool"


class KubeRequestError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class KubeRest:
    def __init__(self, server_url: str, token: str, timeout_s: float = 10.0) -> None:
        self.server_url, self.token, self.timeout_s = server_url.rstrip("/"), token, timeout_s
        self._ctx = ssl.create_default_context()
        self._ctx.check_hostname = False
        self._ctx.verify_mode = ssl.CERT_NONE

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server_url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": content_type, "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self._ctx) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise KubeRequestError(e.code, e.read().decode(errors="replace")[:500]) from None
        return json.loads(raw) if raw else {}

    def create(self, path: str, body: Mapping[str, Any]) -> None:
        """POST, and an existing object is left as it is (409)."""
        try:
            self.request("POST", path, dict(body))
        except KubeRequestError as e:
            if e.status != 409:
                raise


def minimal_crds() -> list[dict[str, Any]]:
    crds = []
    for kind, plural in PLURALS.items():
        crds.append({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{GROUP}"},
            "spec": {"group": GROUP, "scope": "Namespaced",
                     "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
                     "versions": [{"name": VERSION, "served": True, "storage": True, "subresources": {"status": {}},
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                                                  "x-kubernetes-preserve-unknown-fields": True}}}]},
        })
    return crds


def crd_documents(crd_dir: Path = CRD_DIR) -> list[dict[str, Any]]:
    """The repository's CRDs if it ships them, else ``minimal_crds()``."""
    found = []
    for path in sorted(crd_dir.glob("*.yaml")) if crd_dir.is_dir() else []:
        found += [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)
                  and d.get("kind") == "CustomResourceDefinition"]
    return found or minimal_crds()


def deployment(name: str, namespace: str, pool: str, replicas: int, model: str) -> dict[str, Any]:
    labels = {POOL_LABEL: pool, "app.kubernetes.io/part-of": "tokenpools"}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {POOL_LABEL: pool}},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "vllm", "image": "ghcr.io/llm-d/llm-d-inference-sim:v0.10.2",
                                                       "args": [f"--model={model}", "--force-dummy-tokenizer"]}]}}},
    }


def apply_crds(api: KubeRest, crds: Iterable[Mapping[str, Any]], timeout_s: float = 30.0) -> None:
    names = []
    for crd in crds:
        api.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
        names.append(crd["metadata"]["name"])
    deadline = time.monotonic() + timeout_s
    for name in names:
        while True:
            got = api.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            conditions = (got.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout_s:.0f} s")
            time.sleep(0.1)
    # discovery of the new group lags the Established condition a little
    while time.monotonic() < deadline:
        try:
            api.request("GET", f"/apis/{GROUP}/{VERSION}")
            return
        except KubeRequestError:
            time.sleep(0.1)


def apply_namespace(api: KubeRest, namespace: str) -> None:
    api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})


def apply_custom_resources(api: KubeRest, documents: Iterable[Mapping[str, Any]], namespace: str) -> int:
    """The config's TokenPool/TokenEntitlement documents as custom resources in ``namespace``."""
    n = 0
    for doc in documents:
        plural = PLURALS.get(str(doc.get("kind")))
        if plural is None:
            continue
        body = {k: v for k, v in doc.items() if k != "status"}
        body["metadata"] = {**(doc.get("metadata") or {}), "namespace": namespace}
        api.create(f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}", body)
        n += 1
    return n


def scale_path(namespace: str, name: str) -> str:
    return f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}/scale"


def desired_replicas(api: KubeRest, namespace: str, name: str) -> int:
    """``spec.replicas`` of the Deployment's scale subresource (what the scaler last set)."""
    return int((api.request("GET", scale_path(namespace, name)).get("spec") or {}).get("replicas") or 0)


def report_ready(api: KubeRest, namespace: str, name: str, ready: int) -> None:
    """Write the Deployment's status as a kubelet + controller-manager would (replicas, readyReplicas)."""
    patch = {"status": {"replicas": ready, "readyReplicas": ready, "availableReplicas": ready,
                        "updatedReplicas": ready}}
    api.request("PATCH", f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}/status", patch,
                content_type="application/merge-patch+json")
