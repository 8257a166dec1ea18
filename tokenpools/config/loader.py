"""Load, validate and convert: YAML (or CRD objects) → documents → the core's frozen specs.

Every problem is collected, located (file, document, kind and name, field path, line) and raised together in one
``ConfigError``. Rules across documents: names are unique per kind (the core keys pools and entitlements by name,
so ``metadata.namespace`` does not make a name unique), at most one TokenPoolsSettings document, at least one pool
where nothing else can bring one (``SpecsSource``), and those of ``references`` (``poolRef`` names a TokenPool of the same file, an API key belongs to one tenant and one
entitlement per pool, a tenant budget is declared alike).
Entitlements keep the file's order: capacity admission binds them oldest first (``core.binding``).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from tokenpools.config.problems import Problems, describe, format_path, label, translate
from tokenpools.config.references import (
    KeyHolder,
    TenantBudgetHolder,
    check_references,
    check_tenant_budgets,
    first_key_holders,
    key_holders,
)
from tokenpools.config.sources import check_settings_values
from tokenpools.config.yamlio import RawDocument, YamlSyntaxError, parse_documents
from tokenpools.core.budgets import BudgetSpec, Weights
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


class SpecsSource(enum.StrEnum):
    """Where a process's pools and entitlements come from, which decides whether its file must hold a pool."""

    FILE = "file"  # the file alone (validate, replay, a proxy with Kafka off): without a pool nothing could be served
    TOPIC = "topic"  # the specs topic after the file (a proxy with Kafka, the agents): the file may be settings only


NO_DOCUMENTS = f"no documents: expected at least one TokenPool (apiVersion {API_VERSIONS[0]})"
NO_POOL = "no TokenPool document: entitlements need a pool to bind to"
NO_POOL_SETTINGS_ONLY = ("no TokenPool document: a file of settings only serves nothing where only the file "
                         "is read; a proxy with Kafka, or the agents, start from it and follow the specs topic")
NO_POOL_WITHOUT_TOPIC = ("no TokenPool document, and with Kafka off nothing else can bring one (the specs topic is "
                         "followed only with Kafka): add the pools and entitlements to the file, or turn Kafka on")


def missing_pools(loaded: LoadedConfig, specs: SpecsSource) -> str | None:
    """Why a configuration without a pool cannot run where its specs come from ``specs`` (None: it can). A file of
    settings only is enough for a process that follows the specs topic: it starts with no pools and serves what the
    topic brings; where only the file is read, nothing ever would."""
    if loaded.pools or specs is SpecsSource.TOPIC:
        return None
    return NO_POOL_WITHOUT_TOPIC


def require_pools(loaded: LoadedConfig, specs: SpecsSource) -> None:
    """``missing_pools`` as the ``ConfigError`` a command exits 2 on."""
    problem = missing_pools(loaded, specs)
    if problem is not None:
        raise ConfigError([ConfigProblem(loaded.source, problem)])


def load_config(path: str | Path, specs: SpecsSource = SpecsSource.FILE) -> LoadedConfig:
    """Read and validate one YAML file of ``---``-separated documents; with ``specs=TOPIC`` a file of settings only
    is valid (``missing_pools``)."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigProblem(source, f"cannot read: {exc.strerror if isinstance(exc, OSError) else exc}")]) from None
    return load_config_text(text, source, specs)


def load_config_text(text: str, source: str = "<string>", specs: SpecsSource = SpecsSource.FILE) -> LoadedConfig:
    try:
        raws = parse_documents(text)
    except YamlSyntaxError as exc:
        raise ConfigError([ConfigProblem(source, str(exc), line=exc.line)]) from None
    return _build(raws, source, specs)


def load_config_documents(documents: Iterable[Any], source: str = "<documents>") -> LoadedConfig:
    """The same validation for objects that are already parsed (custom resources read from the API server)."""
    return _build([RawDocument(i, d) for i, d in enumerate(documents, start=1) if d is not None], source)


_PATH_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _loc(path: str) -> tuple[int | str, ...]:
    return tuple(int(m[2]) if m[2] else m[1] for m in _PATH_PART.finditer(path))


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


def _build(raws: list[RawDocument], source: str, specs: SpecsSource = SpecsSource.FILE) -> LoadedConfig:
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

    # only when nothing else explains it (a misspelt kind, a broken document); with the topic, settings only will do,
    # but not entitlements without their pool (``references`` checks no poolRef when the file has no pool at all)
    if not problems.items and not pools and (specs is SpecsSource.FILE or claimed["TokenEntitlement"]):
        problems.add(None, (), NO_POOL if claimed["TokenEntitlement"] else NO_POOL_SETTINGS_ONLY)
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
        entitlement_by_key_hash=first_key_holders(ent_docs),
        entitlements_by_key_hash=key_holders(ent_docs),
        endpoints={name: tuple(d.spec.endpoints) for name, d in pool_docs.items()},
        backend_refs={name: d.spec.backend_ref for name, d in pool_docs.items()},
        settings_values=settings_values,
    )
