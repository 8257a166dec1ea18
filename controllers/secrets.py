"""Reading the Secrets that hold API keys: ``get`` one named Secret at a time, never list or watch.

The controller's RBAC allows ``get`` on the Secrets deploy/base/rbac/controller.yaml names and nothing else, so it can
read only the Secrets an operator chose to hand it, in its own namespace. Without a watch, a changed Secret is seen
at the next evaluation (every ``controllers.resync_s``, and on any change to a pool or an entitlement).
``KeyResolver`` reads the Secrets the verdicts refer to and hands them to the pure ``api_keys.resolve``; what it
could not read is a reason, not an exception: the other keys and entitlements go on.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging

from typing import TYPE_CHECKING, Any

from tokenpools.controllers import api_keys
from tokenpools.controllers.reconcile import Evaluation
from tokenpools.runtime.backoff import ThrottledLog

if TYPE_CHECKING:
    from kubernetes_asyncio.client.api_client import ApiClient

log = logging.getLogger("tokenpools.controllers.secrets")


class KeyResolver:
    def __init__(self, api: ApiClient | None, default_namespace: str, throttled: ThrottledLog | None = None) -> None:
        """``api`` None: no Kubernetes (``--no-kubernetes``): every ``secretRef`` is left out, with the reason."""
        self._core: Any = None
        if api is not None:
            from kubernetes_asyncio import client

            self._core = client.CoreV1Api(api)
        self.default_namespace = default_namespace
        self.throttled = throttled or ThrottledLog(log)

    async def read(self, namespace: str, name: str) -> api_keys.SecretData | str:
        """The Secret's data, decoded; or why it could not be read."""
        if self._core is None:
            return "not resolvable without Kubernetes (--no-kubernetes): use sha256"
        from kubernetes_asyncio.client.exceptions import ApiException

        from tokenpools.controllers.kube import REQUEST_TIMEOUT_S, api_message

        try:
            secret = await asyncio.wait_for(self._core.read_namespaced_secret(name, namespace), REQUEST_TIMEOUT_S)
        except ApiException as exc:
            return "not found" if exc.status == 404 else f"cannot be read ({api_message(exc)})"
        except (asyncio.TimeoutError, OSError) as exc:
            return f"cannot be read ({type(exc).__name__})"
        data: dict[str, str] = {}
        for key, value in (secret.data or {}).items():
            try:
                data[key] = base64.b64decode(value, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                data[key] = ""  # not UTF-8 text: no API key a client could send
        return data

    async def resolve(self, evaluation: Evaluation) -> Evaluation:
        wanted = sorted(api_keys.referenced(evaluation, self.default_namespace))
        read = await asyncio.gather(*(self.read(ns, name) for ns, name in wanted))
        secrets = dict(zip(wanted, read))
        for (ns, name), data in secrets.items():
            if isinstance(data, str):
                self.throttled.warning(f"{ns}/{name}", "API keys in Secret %s/%s are left out: %s", ns, name, data)
        return api_keys.resolve(evaluation, secrets, self.default_namespace)
