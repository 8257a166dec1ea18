"""The read API: ``GET /v1/tokenpools/limits`` for a tenant, ``GET /v1/tokenpools/admin/limits`` for operators.

A tenant authenticates with its API key and is shown its own entitlements, all those its key names (one per pool,
``tenancy``) (``limits_view``); the admin view
needs the operators' key, held in the settings only as its SHA-256 (``proxy.admin_key_sha256``) and compared in
constant time, and is off (404) when none is configured. A tenant key never opens the admin view, and the admin
key is no tenant's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from tokenpools.proxy.access.auth import presents_digest
from tokenpools.proxy.views.limits_view import entitlement_view
from tokenpools.proxy.http.messages import Request, Response, error_response
from tokenpools.proxy.admission.handlers import Handlers
from tokenpools.proxy.admission.pools import PoolRuntime
from tokenpools.proxy.admission.responses import unknown_key
from tokenpools.runtime.clock import Clock


class ReadApi:
    def __init__(self, *, proxy_id: str, handlers: Handlers, pools: Mapping[str, PoolRuntime], clock: Clock,
                 admin_key_sha256: str | None) -> None:
        self.proxy_id, self.handlers, self.pools, self.clock = proxy_id, handlers, pools, clock
        self._admin = bytes.fromhex(admin_key_sha256) if admin_key_sha256 else None

    async def limits(self, request: Request) -> Response:
        handlers = self.handlers  # its tenancy and runtimes are the ones in force (live specs)
        tenant = handlers.tenancy.lookup(request.headers.get("authorization"))
        if tenant is None:
            return unknown_key()
        now_s = self.clock.now_s()
        return self._answer([entitlement_view(handlers.runtime_of[name], name, now_s) for name in tenant.entitlements])

    async def admin_limits(self, request: Request) -> Response:
        if self._admin is None:
            return error_response(404, "the admin view is off (proxy.admin_key_sha256 is not set)",
                                  "invalid_request_error", "not_found")
        if not presents_digest(request.headers.get("authorization"), self._admin):
            return error_response(401, "the admin view needs the operators' key", "authentication_error",
                                  "unknown_key")
        now_s = self.clock.now_s()
        return self._answer([entitlement_view(rt, name, now_s) for rt in self.pools.values()
                             for name in rt.entitlements])

    def _answer(self, entitlements: list[dict[str, Any]]) -> Response:
        body = {"object": "tokenpools.limits", "proxy_id": self.proxy_id, "entitlements": entitlements}
        return Response(200, orjson.dumps(body), {"Cache-Control": "no-store"}, "application/json")
