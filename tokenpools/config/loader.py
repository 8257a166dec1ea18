"""Load, validate and convert: YAML (or CRD objects) → documents → the core's frozen specs.

Every problem is collected, located (file, document, kind and name, field path, line) and raised together in one
``ConfigError``. Rules across documents: names are unique per kind (the core keys pools and entitlements by name,
so ``metadata.namespace`` does not make a name unique), ``poolRef`` names a TokenPool of the same file, an API key
(digest or Secret reference) belongs to one entitlement, at most one TokenPoolsSettings document, at least one pool.
Entitlements keep the file's order: capacity admission binds them oldest first (``core.binding``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from tokenpools.config.documents import (
    API_VERSIONS,
    GIB,
    KINDS,
    BackendRef,
    Budget,
    Document,
    Resources,
    SecretKeyRef,
    TokenEntitlementDocument,
    TokenPoolDocument,
    TokenPoolsSettingsDocument,
    expires_at_s,
)
from tokenpools.config.problems import describe, format_path, translate
from tokenpools.config.settings import check_settings_values
from tokenpools.config.yamlio import RawDocument, YamlSyntaxError, parse_documents
from tokenpools.core.budgets import BudgetScope, BudgetSpec, Weights
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.errors import ConfigError, ConfigProblem


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """A validated configuration. Mappings keep the file's order; treat them as read-only."""

    source: str
    pools: dict[str, PoolSpec]
    entitlements: dict[str, EntitlementSpec]
    pool_documents: dict[str, TokenPoolDocument]
    entitlement_documents: dict[str, TokenEntitlementDocument]
    documents: tuple[Document, ...]  # every validated document, file order (publish with model_dump(mode="json"))
    raw_documents: tuple[dict[str, Any], ...]  # the same documents as written
    api_key_hashes: dict[str, tuple[str, ...]]  # entitlement → lowercase hex SHA-256 digests
    api_key_secret_refs: dict[str, tuple[SecretKeyRef, ...]]  # entitlement → Secrets the controllers resolve
    entitlement_by_key_hash: dict[str, str]  # digest → its first entitlement (file order)
    entitlements_by_key_hash: dict[str, tuple[str, ...]]  # digest → every entitlement it names, one per pool
    endpoints: dict[str, tuple[str, ...]]  # pool → backend base URLs (no trailing slash)
    backend_refs: dict[str, BackendRef]  # pool → the workload to scale
    settings_values: dict[str, Any]  # spec of the TokenPoolsSettings document ({} if none), for load_settings

    def entitlements_of(self, pool: str) -> list[EntitlementSpec]:
        """The pool's entitlements in file order."""
        return [e for e in self.entitlements.values() if e.pool == pool]


def load_config(path: str | Path) -> LoadedConfig:
    """Read and validate one YAML file of ``---``-separated documents."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigProblem(source, f"cannot read: {exc.strerror if isinstance(exc, OSError) else exc}")]) from None
    return load_config_text(text, source)


def load_config_text(text: str, source: str = "<string>") -> LoadedConfig:
    try:
        raws = parse_documents(text)
    except YamlSyntaxError as exc:
        raise ConfigError([ConfigProblem(source, str(exc), line=exc.line)]) from None
    return _build(raws, source)


def load_config_documents(documents: Iterable[Any], source: str = "<documents>") -> LoadedConfig:
    """The same validation for objects that are already parsed (custom resources read from the API server)."""
    return _build([RawDocument(i, d) for i, d in enumerate(documents, start=1) if d is not None], source)


_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _loc(path: str) -> tuple[int | str, ...]:
    return tuple(int(m[2]) if m[2] else m[1] for m in _PATH_PART.finditer(path))


def label(data: Any) -> tuple[str, str]:
    """A document's (kind, name) as written; "" for what is missing or not a string."""
    if not isinstance(data, dict):
        return "", ""
    kind = data.get("kind")
    meta = data.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return (kind if isinstance(kind, str) else ""), (name if isinstance(name, str) else "")


def _capacity(resources: Resources | None) -> Capacity:
    if resources is None:
        return Capacity()
    return Capacity(resources.tokens_per_second, resources.kv_cache_gib * GIB, float(resources.concurrency))


def to_pool_spec(doc: TokenPoolDocument) -> PoolSpec:
    s = doc.spec
    return PoolSpec(
        name=doc.metadata.name,
        model=s.model,
        per_replica=Capacity(s.per_replica.tokens_per_second, s.per_replica.kv_cache_gib * GIB, float(s.per_replica.concurrency)),
        min_replicas=s.scaling.min_replicas,
        max_replicas=s.scaling.max_replicas,
        replicas=s.scaling.initial_replicas,
        kv_bytes_per_token=s.kv_bytes_per_token_value(),
        default_max_tokens=s.defaults.max_tokens,
        token_bucket_window_s=s.token_bucket_window_seconds,
        engine_priority=s.engine_priority,
        shards=s.shards,
        enforcement=s.enforcement,
    )


def to_budget_spec(budget: Budget) -> BudgetSpec:
    """A checked budget document as the core's budget (the document's ``check()`` found no issue)."""
    w = budget.weights
    return BudgetSpec(
        name=budget.name,
        period=budget.period,
        amount=float(budget.amount),
        time_zone=budget.time_zone,
        scope=budget.scope,
        weights=Weights(prompt=float(w.prompt), cached_prompt=float(w.cached_prompt), completion=float(w.completion)),
        rollover_max=0.0 if budget.rollover is None else float(budget.rollover.max_units),
        alert_thresholds=tuple(float(t) for t in budget.alert_thresholds),
        on_stale=budget.on_stale,
    )


def to_entitlement_spec(doc: TokenEntitlementDocument) -> EntitlementSpec:
    s = doc.spec
    return EntitlementSpec(
        name=doc.metadata.name,
        pool=s.pool_ref.name,
        service_class=s.qos.service_class,
        slo_ms=s.qos.slo_target_ms,
        baseline=_capacity(s.resources) if s.qos.service_class.has_baseline else Capacity(),
        tenant=s.tenant_id,
        burst_ceiling=None if s.burst_ceiling is None else _capacity(s.burst_ceiling),
        expires_at_s=expires_at_s(s.expires_at),
        state=s.state or EntitlementState.BOUND,
        queue_timeout_ms=s.qos.queue_timeout_ms,
        enforcement=s.enforcement,
        budgets=tuple(to_budget_spec(b) for b in s.budgets),
        labels=tuple(sorted(doc.metadata.labels.items())),
    )


class Problems:
    """The problems found so far, each located in its document; ``sorted()`` is the order ``ConfigError`` lists."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[ConfigProblem] = []

    def add(self, raw: RawDocument | None, loc: Sequence[int | str], message: str, line: int | None = None) -> None:
        if raw is None:
            self.items.append(ConfigProblem(self.source, message, line=line))
            return
        kind, name = label(raw.data)
        self.items.append(ConfigProblem(
            self.source, message, path=format_path(loc), document=raw.index, kind=kind, name=name,
            line=line if line is not None else raw.line_of(loc),
        ))

    def sorted(self) -> list[ConfigProblem]:
        return sorted(self.items, key=lambda p: (p.document or 0, p.line or 0))


def validate_document(raw: RawDocument, problems: Problems) -> tuple[Document | None, bool]:
    """The parsed document (None when its shape is wrong) and whether it also passed its own ``check()``."""
    for key, line, first in raw.duplicate_keys:
        problems.add(raw, (), f"duplicate key {key!r} (first at line {first})", line=line)
    data = raw.data
    if not isinstance(data, dict):
        problems.add(raw, (), f"must be a mapping with apiVersion, kind, metadata and spec, got {describe(data)}")
        return None, False
    ok = True
    if data.get("apiVersion") not in API_VERSIONS:
        what = "required field is missing" if "apiVersion" not in data else f"unknown apiVersion {describe(data['apiVersion'])}"
        problems.add(raw, ("apiVersion",), f"{what} (known: {', '.join(API_VERSIONS)})")
        ok = False
    if data.get("kind") not in KINDS:
        what = "required field is missing" if "kind" not in data else f"unknown kind {describe(data['kind'])}"
        problems.add(raw, ("kind",), f"{what} (known: {', '.join(sorted(KINDS))})")
        ok = False
    if not ok:
        return None, False
    model = KINDS[data["kind"]]
    try:
        doc = model.model_validate(data)
    except ValidationError as exc:
        for loc, message in translate(exc, model):
            problems.add(raw, loc, message)
        return None, False
    issues = doc.check()
    if isinstance(doc, TokenPoolsSettingsDocument):
        issues += [(format_path(("spec",) + loc), message) for loc, message in check_settings_values(doc.spec)]
    for path, message in issues:
        problems.add(raw, _loc(path), message)
    return doc, not issues


def to_spec(raw: RawDocument, doc: TokenPoolDocument | TokenEntitlementDocument,
            problems: Problems) -> PoolSpec | EntitlementSpec | None:
    """The core's spec of a document that passed its checks; None (and a problem) if the core refuses it."""
    try:
        return to_pool_spec(doc) if isinstance(doc, TokenPoolDocument) else to_entitlement_spec(doc)
    except ValueError as exc:  # the core's own checks: the schema should have caught it first
        problems.add(raw, ("spec",), str(exc))
        return None


NO_DOCUMENTS = f"no documents: expected at least one TokenPool (apiVersion {API_VERSIONS[0]})"
NO_POOL = "no TokenPool document: entitlements need a pool to bind to"


def _build(raws: list[RawDocument], source: str) -> LoadedConfig:
    problems = Problems(source)
    if not raws:
        problems.add(None, (), NO_DOCUMENTS)
        raise ConfigError(problems.sorted())

    # names each kind claims, valid or not, so that a broken pool is not also reported as missing
    claimed: dict[str, dict[str, RawDocument]] = {kind: {} for kind in KINDS}
    parsed: list[tuple[RawDocument, Document, bool]] = []
    for raw in raws:
        doc, ok = validate_document(raw, problems)
        kind, name = label(raw.data)
        if kind in claimed and name:
            first = claimed[kind].setdefault(name, raw)
            if first is not raw:
                problems.add(raw, ("metadata", "name"), f"duplicate {kind} name {name!r} (also document {first.index})")
                continue
        if doc is not None:
            parsed.append((raw, doc, ok))

    settings_docs = [raw for raw in raws if label(raw.data)[0] == "TokenPoolsSettings"]
    for raw in settings_docs[1:]:
        problems.add(raw, ("kind",), f"only one TokenPoolsSettings document is allowed (also document {settings_docs[0].index})")

    pools: dict[str, PoolSpec] = {}
    pool_docs: dict[str, TokenPoolDocument] = {}
    entitlements: dict[str, EntitlementSpec] = {}
    ent_docs: dict[str, TokenEntitlementDocument] = {}
    settings_values: dict[str, Any] = {}
    key_owner: dict[str, list[KeyHolder]] = {}
    tenant_budgets: dict[tuple[str, str], TenantBudgetHolder] = {}
    for raw, doc, ok in parsed:
        if isinstance(doc, TokenEntitlementDocument):  # references are checked even when the document has problems
            check_references(raw, doc, claimed["TokenPool"], key_owner, problems)
            check_tenant_budgets(raw, doc, tenant_budgets, problems)
        if not ok:
            continue
        if isinstance(doc, TokenPoolsSettingsDocument):
            settings_values = settings_values or dict(doc.spec)
            continue
        spec = to_spec(raw, doc, problems)
        if isinstance(spec, PoolSpec) and isinstance(doc, TokenPoolDocument):
            pools[doc.metadata.name], pool_docs[doc.metadata.name] = spec, doc
        elif isinstance(spec, EntitlementSpec) and isinstance(doc, TokenEntitlementDocument):
            entitlements[doc.metadata.name], ent_docs[doc.metadata.name] = spec, doc

    if not problems.items and not pools:  # only when nothing else explains it (a misspelt kind, a broken document)
        problems.add(None, (), NO_POOL)
    if problems.items:
        raise ConfigError(problems.sorted())
    return LoadedConfig(
        source=source,
        pools=pools,
        entitlements=entitlements,
        pool_documents=pool_docs,
        entitlement_documents=ent_docs,
        documents=tuple(doc for _, doc, _ in parsed),
        raw_documents=tuple(raw.data for raw, _, _ in parsed),
        api_key_hashes={n: tuple(k.sha256 for k in d.spec.api_keys if k.sha256) for n, d in ent_docs.items()},
        api_key_secret_refs={n: tuple(k.secret_ref for k in d.spec.api_keys if k.secret_ref) for n, d in ent_docs.items()},
        entitlement_by_key_hash=_first_holders(ent_docs),
        entitlements_by_key_hash=_holders(ent_docs),
        endpoints={name: tuple(d.spec.endpoints) for name, d in pool_docs.items()},
        backend_refs={name: d.spec.backend_ref for name, d in pool_docs.items()},
        settings_values=settings_values,
    )


class KeyHolder(NamedTuple):
    """An entitlement that lists an API key, as the reference check sees it."""

    name: str
    raw: RawDocument
    pool: str
    tenant: str


def _holders(ent_docs: Mapping[str, TokenEntitlementDocument]) -> dict[str, tuple[str, ...]]:
    out: dict[str, dict[str, None]] = {}
    for name, doc in ent_docs.items():
        for key in doc.spec.api_keys:
            if key.sha256:
                out.setdefault(key.sha256.lower(), {})[name] = None
    return {digest: tuple(names) for digest, names in out.items()}


def _first_holders(ent_docs: Mapping[str, TokenEntitlementDocument]) -> dict[str, str]:
    return {digest: names[0] for digest, names in _holders(ent_docs).items()}


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

