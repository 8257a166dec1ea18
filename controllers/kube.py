"""Kubernetes plumbing shared by the loops: client construction, error classification, scale targets, Events.

- Clients: ``--kubeconfig PATH`` (or ``kubernetes.kubeconfig`` in settings), ``--in-cluster`` (the pod's service
  account token and CA), or neither: ``$KUBECONFIG``/``~/.kube/config``, then in-cluster. One ``ApiClient`` per
  process, owned by ``main`` and closed on exit.
- Errors: an ``ApiException`` with 429/5xx (or none at all: the connection failed) and network errors are
  ``RetryableError`` (honouring ``Retry-After``); 401/403 are retryable too but slowly (RBAC or a rotated token
  can be fixed without restarting us); other 4xx are ``PermanentError`` for that one operation.
- Scale targets: any namespaced resource with a ``/scale`` subresource, through the CustomObjectsApi scale
  endpoints; the plural comes from API discovery (cached), so a ``backendRef`` names only apiVersion and kind.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from enum import StrEnum
from pathlib import Path

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from tokenpools.controllers.inventory import ScaleTarget
from tokenpools.errors import PermanentError, RetryableError, TokenPoolsError

GROUP = "tokenpools.io"
VERSION = "v1alpha1"
PLURALS = {"TokenPool": "tokenpools", "TokenEntitlement": "tokenentitlements"}
COMPONENT = "tokenpools-controller"
AUTH_RETRY_S = 30.0
REQUEST_TIMEOUT_S = 15.0  # every call but a watch: an API server that stops answering is retryable, not a hang


class KubeMode(StrEnum):
    KUBECONFIG = "kubeconfig"
    IN_CLUSTER = "in-cluster"
    AUTO = "auto"


async def new_api_client(mode: KubeMode, kubeconfig: Path | None = None) -> ApiClient:
    """An ApiClient for the chosen mode (the caller closes it: ``async with``)."""
    try:
        if mode is KubeMode.IN_CLUSTER or (mode is KubeMode.AUTO and kubeconfig is None
                                           and os.environ.get("KUBERNETES_SERVICE_HOST")):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return ApiClient(configuration)
        path = str(kubeconfig) if kubeconfig is not None else None
        return await config.new_client_from_config(config_file=path, persist_config=False)
    except (config.ConfigException, OSError) as exc:
        raise PermanentError(f"cannot configure the Kubernetes client ({mode.value}): {exc}") from None


def api_message(exc: ApiException) -> str:
    """``403 Forbidden: deployments.apps "x" is forbidden: ...`` — the status and the server's own message."""
    message = exc.reason or ""
    body = exc.body
    if isinstance(body, (bytes, str)):
        try:
            message = json.loads(body).get("message", message)
        except (ValueError, AttributeError):
            pass
    return f"{exc.status} {message}".strip()


def classify(exc: BaseException, what: str) -> TokenPoolsError:
    """A Kubernetes client failure as a RetryableError or PermanentError (``what`` says what we were doing)."""
    if isinstance(exc, TokenPoolsError):
        return exc
    if isinstance(exc, ApiException):
        status = exc.status or 0
        text = f"{what}: {api_message(exc)}"
        if status == 0 or status == 429 or status >= 500:
            retry_after = str(dict(exc.headers or {}).get("Retry-After", ""))
            return RetryableError(text, float(retry_after) if retry_after.isdigit() else 1.0)
        if status in (401, 403):
            return RetryableError(text, AUTH_RETRY_S)
        return PermanentError(text)
    if isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError, OSError)):
        return RetryableError(f"{what}: {type(exc).__name__}: {exc}", 1.0)
    return PermanentError(f"{what}: {type(exc).__name__}: {exc}")


def is_status(exc: BaseException, *codes: int) -> bool:
    return isinstance(exc, ApiException) and exc.status in codes


class ScaleClient:
    """Read and set replicas through the scale subresource of any kind that has one."""

    def __init__(self, api: ApiClient) -> None:
        self._objects = client.CustomObjectsApi(api)
        self._plurals: dict[tuple[str, str, str], str] = {}

    async def plural(self, target: ScaleTarget) -> str:
        group, version = target.group_version
        if not group:
            raise PermanentError(f"{target}: core-group kinds have no scale support here (use a Deployment or a CRD)")
        cache_key = (group, version, target.kind)
        if cache_key not in self._plurals:
            try:
                resources = await self._objects.get_api_resources(group, version, _request_timeout=REQUEST_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 — classified
                raise classify(exc, f"discovering {target.api_version}") from None
            found = {r.kind: r.name for r in resources.resources or [] if "/" not in r.name}
            scalable = {r.name.split("/")[0] for r in resources.resources or [] if r.name.endswith("/scale")}
            plural = found.get(target.kind)
            if plural is None or plural not in scalable:
                raise PermanentError(f"{target}: {target.api_version} has no {target.kind} with a /scale subresource")
            self._plurals[cache_key] = plural
        return self._plurals[cache_key]

    async def get_replicas(self, target: ScaleTarget) -> int:
        group, version = target.group_version
        plural = await self.plural(target)
        try:
            scale = await self._objects.get_namespaced_custom_object_scale(group, version, target.namespace, plural, target.name,
                                                                           _request_timeout=REQUEST_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 — classified
            raise classify(exc, f"reading the scale of {target}") from None
        return int((scale.get("spec") or {}).get("replicas") or 0)

    async def set_replicas(self, target: ScaleTarget, replicas: int, field_manager: str = COMPONENT) -> int:
        group, version = target.group_version
        plural = await self.plural(target)
        patch = [{"op": "replace", "path": "/spec/replicas", "value": replicas}]
        try:
            scale = await self._objects.patch_namespaced_custom_object_scale(
                group, version, target.namespace, plural, target.name, patch, field_manager=field_manager,
                _request_timeout=REQUEST_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 — classified
            raise classify(exc, f"scaling {target} to {replicas}") from None
        return int((scale.get("spec") or {}).get("replicas") or 0)


class EventRecorder:
    """Kubernetes Events (core/v1, what ``kubectl describe`` shows) on the objects the controller acts on."""

    def __init__(self, api: ApiClient, instance: str) -> None:
        self._core = client.CoreV1Api(api)
        self._instance = instance

    async def record(self, involved: dict[str, str], reason: str, message: str, now_rfc3339: str,
                     warning: bool = False) -> None:
        namespace = involved["namespace"]
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{involved['name']}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self._instance,
            "firstTimestamp": now_rfc3339,
            "lastTimestamp": now_rfc3339,
            "count": 1,
        }
        try:
            await self._core.create_namespaced_event(namespace, body,  # type: ignore[arg-type]  # a dict goes as is
                                                     _request_timeout=REQUEST_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 — classified
            raise classify(exc, f"recording event {reason} on {involved.get('kind')} {namespace}/{involved['name']}") from None
