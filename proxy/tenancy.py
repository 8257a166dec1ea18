"""Who may call what: API key digest → tenant, (tenant, model) → entitlement, as one immutable, versioned view.

A key identifies a tenant: the entitlements that list its digest (the config validator allows one per pool, all of
one ``tenantId``). The request's ``model`` then picks, among them, the one whose pool serves that model; no key
ever reaches an entitlement that does not list it, so another tenant's pool is unreachable whatever a request
says. Two of a key's entitlements in pools serving the same model: the older one (document order) serves it.

The view is pure data, built whole from the specs in force (``build``) and swapped in one assignment on the event
loop (``live_specs``): a request sees the old view or the new one, never half of a change. Its ``version`` is the
specs' version it was built from (the catalogue's, or the count of file edits applied).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.auth import bearer_key


@dataclass(frozen=True, slots=True)
class Tenant:
    """What one key opens: its entitlements (document order) and, by model, the one serving it."""

    digest: bytes
    entitlements: tuple[str, ...]
    by_model: Mapping[str, str]

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self.by_model)


@dataclass(frozen=True, slots=True)
class Tenancy:
    version: int
    pools: Mapping[str, PoolSpec]
    entitlements: Mapping[str, EntitlementSpec]
    _tenants: Mapping[bytes, Tenant] = field(repr=False)

    @classmethod
    def build(cls, version: int, pools: Mapping[str, PoolSpec], entitlements: Mapping[str, EntitlementSpec],
              holders: Mapping[str, str | tuple[str, ...]]) -> Tenancy:
        """``holders``: lowercase SHA-256 hex of a key → the entitlement(s) listing it. Raises ValueError for what the
        validator refuses (a key naming two entitlements of one pool, or two tenants, or an unknown one)."""
        tenants: dict[bytes, Tenant] = {}
        order = {name: i for i, name in enumerate(entitlements)}
        for digest, names in holders.items():
            named = (names,) if isinstance(names, str) else tuple(dict.fromkeys(names))
            unknown = [n for n in named if n not in order]
            if unknown:
                raise ValueError(f"an API key maps to unknown entitlement {unknown[0]!r}")
            listed = sorted(named, key=order.__getitem__)
            by_model: dict[str, str] = {}
            seen_pools: dict[str, str] = {}
            tenant_ids = set()
            for name in listed:
                spec = entitlements[name]
                pool = pools.get(spec.pool)
                if pool is None:
                    raise ValueError(f"entitlement {name}: pool {spec.pool!r} is not served by this proxy")
                if spec.pool in seen_pools:
                    raise ValueError(f"an API key names entitlements {seen_pools[spec.pool]!r} and {name!r} of one "
                                     f"pool {spec.pool!r}")
                seen_pools[spec.pool] = name
                tenant_ids.add(spec.tenant)
                by_model.setdefault(pool.model, name)
            if len(tenant_ids) > 1:
                raise ValueError(f"an API key names entitlements of tenants {', '.join(sorted(tenant_ids))}")
            if len(digest) != 64 or digest != digest.lower():
                raise ValueError("API key digests must be lowercase sha256 hex")
            raw = bytes.fromhex(digest)
            tenants[raw] = Tenant(raw, tuple(listed), MappingProxyType(by_model))
        return cls(version, MappingProxyType(dict(pools)), MappingProxyType(dict(entitlements)),
                   MappingProxyType(tenants))

    def lookup(self, authorization: str | None) -> Tenant | None:
        """The tenant of an ``Authorization: Bearer <key>`` header, or None (missing, malformed, unknown)."""
        key = bearer_key(authorization)
        if key is None:
            return None
        presented = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
        tenant = self._tenants.get(presented)
        if tenant is None or not hmac.compare_digest(tenant.digest, presented):
            return None
        return tenant

    def entitlement_for(self, tenant: Tenant, model: str) -> str | None:
        """The tenant's entitlement serving ``model``; None when the tenant has none (the model may exist for others:
        that is not said)."""
        return tenant.by_model.get(model)

    def __len__(self) -> int:
        return len(self._tenants)
