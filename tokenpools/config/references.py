"""The rules that check one document against the others of its set: a ``poolRef`` names a pool of the set, an API
key names one tenant and at most one entitlement per pool, a tenant budget is declared alike by every entitlement
of the tenant. The loader runs them over a whole set in document order (``loader._build``); a ``DocumentSet`` runs
them for the one document a change touches. Each accumulates what the documents before claimed (``key_owner``,
``declared``) and adds a problem to the later document of a clash.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from tokenpools.config.documents import Budget, TokenEntitlementDocument
from tokenpools.config.problems import Problems
from tokenpools.config.yamlio import RawDocument
from tokenpools.core.budgets import BudgetScope


class KeyHolder(NamedTuple):
    """An entitlement that lists an API key, as the reference check sees it."""

    name: str
    raw: RawDocument
    pool: str
    tenant: str


def key_holders(ent_docs: Mapping[str, TokenEntitlementDocument]) -> dict[str, tuple[str, ...]]:
    """API key digest → the entitlements that list it, in document order."""
    out: dict[str, dict[str, None]] = {}
    for name, doc in ent_docs.items():
        for key in doc.spec.api_keys:
            if key.sha256:
                out.setdefault(key.sha256.lower(), {})[name] = None
    return {digest: tuple(names) for digest, names in out.items()}


def first_key_holders(ent_docs: Mapping[str, TokenEntitlementDocument]) -> dict[str, str]:
    """API key digest → the first entitlement that lists it."""
    return {digest: names[0] for digest, names in key_holders(ent_docs).items()}


def check_references(raw: RawDocument, doc: TokenEntitlementDocument, pools: Mapping[str, object],
                     key_owner: dict[str, list[KeyHolder]], problems: Problems) -> None:
    """``poolRef`` names a pool of the file; an API key names one tenant, and at most one entitlement per pool
    (``key_owner`` accumulates who holds each key).

    One key may serve a tenant on several pools (the request's ``model`` picks the entitlement, docs/tenancy.md);
    two entitlements of one pool, or of two tenants, behind one key would make the key ambiguous or let it reach
    another tenant's entitlement. ``pools``: every pool name the documents claim, in document order; entitlements
    are checked in document order (the earlier holds the key, the later gets the problem)."""
    name = doc.metadata.name
    ref = doc.spec.pool_ref.name
    tenant = doc.spec.tenant_id
    if pools and ref not in pools:
        problems.add(raw, ("spec", "poolRef", "name"), f"no TokenPool named {ref!r} in this file (pools: {', '.join(pools)})")
    for i, key in enumerate(doc.spec.api_keys):
        identity = key_identity(doc, i)
        if identity is None:
            continue
        holders = key_owner.setdefault(identity, [])
        field, what = ("sha256", "API key") if key.sha256 else ("secretRef", "Secret key")
        clash = _clash(holders, raw, ref, tenant)
        if clash is None:
            holders.append(KeyHolder(name, raw, ref, tenant))
            continue
        holder, why = clash
        problems.add(raw, ("spec", "apiKeys", i, field),
                     f"the same {what} is listed twice in this entitlement" if holder.raw is raw
                     else f"the same {what} is already used by TokenEntitlement {holder.name!r} "
                          f"(document {holder.raw.index}){why}")


class TenantBudgetHolder(NamedTuple):
    """The first entitlement declaring a tenant budget: every later one of the tenant must declare it alike."""

    name: str
    raw: RawDocument
    index: int  # in its spec.budgets
    budget: Budget


_BUDGET_FIELDS = (("period", "period"), ("time_zone", "timeZone"), ("amount", "amount"), ("weights", "weights"),
                  ("rollover", "rollover"), ("alert_thresholds", "alertThresholds"))


def check_tenant_budgets(raw: RawDocument, doc: TokenEntitlementDocument,
                         declared: dict[tuple[str, str], TenantBudgetHolder], problems: Problems) -> None:
    """A tenant budget (``scope: tenant``) is one budget shared by every entitlement of the tenant declaring it: each
    must declare it alike (period, time zone, amount, weights, rollover, thresholds), or the proxies, the agents and
    the replayer would each enforce a different one. ``declared`` accumulates (tenant, budget name) → its first
    declaration; entitlements are checked in document order (the earlier holds, the later gets the problem, which
    names both paths)."""
    tenant = doc.spec.tenant_id
    for i, budget in enumerate(doc.spec.budgets):
        if budget.scope is not BudgetScope.TENANT:
            continue
        first = declared.setdefault((tenant, budget.name), TenantBudgetHolder(doc.metadata.name, raw, i, budget))
        if first.raw is raw:
            continue
        differ = [alias for field, alias in _BUDGET_FIELDS if getattr(budget, field) != getattr(first.budget, field)]
        if differ:
            problems.add(raw, ("spec", "budgets", i),
                         f"tenant budget {budget.name!r} of tenant {tenant!r} is declared differently by "
                         f"TokenEntitlement {first.name!r} (document {first.raw.index}, spec.budgets[{first.index}]): "
                         f"they differ in {', '.join(differ)}; every entitlement sharing a tenant budget declares it alike")


def _clash(holders: list[KeyHolder], raw: RawDocument, pool: str, tenant: str) -> tuple[KeyHolder, str] | None:
    """The holder a new holder of the key conflicts with, and why; None when it may share the key."""
    for holder in holders:
        if holder.raw is raw:
            return holder, ""
    for holder in holders:
        if holder.pool == pool:
            return holder, f" in the same pool {pool!r} (a key names one entitlement per pool)"
    for holder in holders:
        if holder.tenant != tenant:
            return holder, f" of tenant {holder.tenant!r} (a key names one tenant)"
    return None


def key_identity(doc: TokenEntitlementDocument, index: int) -> str | None:
    """What makes two API keys the same: the digest, or the Secret (namespace, name, key) that holds the key.

    None for an entry with neither or both (``check()`` reports it)."""
    key = doc.spec.api_keys[index]
    if (key.sha256 is None) == (key.secret_ref is None):
        return None
    if key.sha256:
        return key.sha256
    ref = key.secret_ref
    return None if ref is None else f"secret {doc.metadata.namespace or ''}/{ref.name}/{ref.key}"

