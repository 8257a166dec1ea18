"""Who may call what: API key digest → tenant, (tenant, model) → entitlement, as one immutable, versioned view.

A key identifies a tenant: the entitlements that list its digest (the config validator allows one per pool, all of
one ``tenantId``). The request's ``model`` then picks, among them, the one whose pool serves that model; no key
ever reaches an entitlement that does not list it, so another tenant's pool is unreachable whatever a request
says. Two of a key's entitlements in pools serving the same model: the older one (document order) serves it.

The view is pure data, built whole from the specs in force (``build``), or from the previous view and what a change
changed (``evolve``: its maps are ``PersistentMap``s, so the new view copies only the touched entries and the old one
stays whole), and swapped in one assignment on the event loop (``live_specs``): a request sees the old view or the
new one, never half of a change. Its ``version`` is the
specs' version it was built from (the catalogue's, or the count of file edits applied).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.access.auth import bearer_key
from tokenpools.proxy.access.persistent import PersistentMap

T = TypeVar("T")


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
        order = {name: i for i, name in enumerate(entitlements)}
        tenants = {}
        for digest, names in holders.items():
            tenant = _tenant(digest, (names,) if isinstance(names, str) else names, pools, entitlements,
                             order.get)
            tenants[tenant.digest] = tenant
        return cls(version, MappingProxyType(dict(pools)), PersistentMap(entitlements), PersistentMap(tenants))

    def evolve(self, version: int, pools: Mapping[str, PoolSpec], entitlements: Mapping[str, EntitlementSpec | None],
               holders: Mapping[str, tuple[str, ...]], order: Callable[[str], object]) -> Tenancy:
        """A new view with what changed: ``pools`` whole (a few dozen), ``entitlements`` changed or removed (None),
        and every key whose entry may have changed, with all its entitlements (none: the key is gone). ``order``
        ranks two of a key's entitlements (the older first). The keys are checked as ``build`` checks them (ValueError);
        this view is left as it was, so a request holding it sees it whole."""
        new_entitlements = self.entitlements.evolve(entitlements)  # type: ignore[attr-defined]
        changes: dict[bytes, Tenant | None] = {}
        for digest, names in holders.items():
            if names:
                tenant = _tenant(digest, names, pools, new_entitlements, order)
                changes[tenant.digest] = tenant
            else:
                changes[_raw(digest)] = None
        return Tenancy(version, MappingProxyType(dict(pools)), new_entitlements,
                       self._tenants.evolve(changes))  # type: ignore[attr-defined]

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


def _raw(digest: str) -> bytes:
    if len(digest) != 64 or digest != digest.lower():
        raise ValueError("API key digests must be lowercase sha256 hex")
    return bytes.fromhex(digest)


def _tenant(digest: str, names: tuple[str, ...], pools: Mapping[str, PoolSpec],
            entitlements: Mapping[str, EntitlementSpec], order: Callable[[str], object]) -> Tenant:
    """One key's entry, checked as the validator checks it (ValueError)."""
    named = tuple(dict.fromkeys(names))
    unknown = [n for n in named if n not in entitlements]
    if unknown:
        raise ValueError(f"an API key maps to unknown entitlement {unknown[0]!r}")
    listed = sorted(named, key=order)  # type: ignore[arg-type]
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
    raw = _raw(digest)
    return Tenant(raw, tuple(listed), MappingProxyType(by_model))


class RuntimeOf(Mapping[str, T]):
    """Entitlement → its pool's runtime, read through a view's entitlements and a snapshot of the runtimes (a few
    dozen), so that putting a view in force does not build a map of every entitlement."""

    __slots__ = ("_entitlements", "_runtimes")

    def __init__(self, entitlements: Mapping[str, EntitlementSpec], runtimes: Mapping[str, T]) -> None:
        self._entitlements, self._runtimes = entitlements, dict(runtimes)

    def __getitem__(self, name: str) -> T:
        return self._runtimes[self._entitlements[name].pool]

    def __iter__(self) -> Iterator[str]:
        return (n for n, spec in self._entitlements.items() if spec.pool in self._runtimes)

    def __len__(self) -> int:
        return sum(1 for _ in self)
