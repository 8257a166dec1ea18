"""A valid set of documents that changes one TokenPool or TokenEntitlement at a time, checking what the change touches.

``load_config_documents`` validates a whole set, 30-50 us per document: a follower of the specs topic that did so
for every record would pay seconds per record at fleet scale. The set before a change is valid, so only what the
change can break needs checking, with the loader's own functions and ``references``' rules:

- the changed document alone (``validate_document``, then ``to_spec``);
- an entitlement put: its ``poolRef`` against the pools, each of its API keys against the entitlements that
  hold it already (the index key → entitlements: one per pool, one tenant), and each of its tenant budgets against
  the tenant's other entitlements declaring it (alike), checked in document order, as the loader does (the earlier
  holds the key or the budget, the later gets the problem);
- a pool removed: the entitlements that name it (the index pool → entitlements); the last pool or the last
  document removed: the set's own rules (no TokenPool, no documents);
- an entitlement removed or a pool put: nothing else (a pool is named by entitlements, it names nothing).

A change the whole set would refuse is refused with the problems the loader would list, located the same way
(document positions from ``InsertionOrder``) and in the same order, and the set stays as it was.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from tokenpools.config.documents import API_VERSION, Document, TokenEntitlementDocument, TokenPoolDocument
from tokenpools.config.loader import NO_DOCUMENTS, NO_POOL, LoadedConfig, to_spec, validate_document
from tokenpools.config.problems import Problems, label
from tokenpools.config.references import (
    KeyHolder,
    TenantBudgetHolder,
    check_references,
    check_tenant_budgets,
    key_identity,
)
from tokenpools.config.order import InsertionOrder
from tokenpools.config.yamlio import RawDocument
from tokenpools.core.budgets import BudgetScope
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.errors import ConfigProblem

DocKey = tuple[str, str]  # (kind, name)
POOL = "TokenPool"
ENTITLEMENT = "TokenEntitlement"


@dataclass(frozen=True, slots=True)
class _Entry:
    data: dict[str, Any]  # the document as written
    doc: Document  # as validated


class DocumentSet:
    """Documents keyed (kind, name) in document order, their specs, and the indexes the checks use.

    ``put`` and ``remove`` return None when the change is made, else the problems (an iterator, read lazily: a
    refusal costs what is read of it; read it before the next change)."""

    def __init__(self) -> None:
        self._entries: dict[DocKey, _Entry] = {}
        self._order: InsertionOrder[DocKey] = InsertionOrder()
        self._pools: dict[str, PoolSpec] = {}  # document order
        self._entitlements: dict[str, EntitlementSpec] = {}
        self._members: dict[str, dict[str, None]] = {}  # pool → the entitlements naming it, document order
        self._key_owner: dict[str, dict[str, None]] = {}  # API key identity (``key_identity``) → its entitlements
        self.pools: Mapping[str, PoolSpec] = MappingProxyType(self._pools)

    @classmethod
    def from_loaded(cls, loaded: LoadedConfig) -> DocumentSet:
        """The documents of a validated configuration, in its order."""
        out = cls()
        for data, doc in zip(loaded.raw_documents, loaded.documents, strict=True):
            key = label(data)
            out._entries[key] = _Entry(data, doc)
            out._order.add(key)
            if isinstance(doc, TokenPoolDocument):
                out._pools[key[1]] = loaded.pools[key[1]]
            elif isinstance(doc, TokenEntitlementDocument):
                out._add_entitlement(key[1], doc, loaded.entitlements[key[1]])
        return out

    def __len__(self) -> int:
        return len(self._entries)

    def entitlement(self, name: str) -> EntitlementSpec | None:
        return self._entitlements.get(name)

    def entitlements_of(self, pool: str) -> tuple[EntitlementSpec, ...]:
        """The pool's entitlements in document order (oldest first)."""
        entitlements = self._entitlements
        return tuple(entitlements[name] for name in self._members.get(pool, ()))

    def api_key_digests(self, name: str) -> tuple[str, ...]:
        """The entitlement's API keys given as ``sha256`` (lowercase), in order; a ``secretRef`` the controllers
        have not resolved into a digest names no key here."""
        entry = self._entries.get((ENTITLEMENT, name))
        if entry is None or not isinstance(entry.doc, TokenEntitlementDocument):
            return ()
        return tuple(k.sha256 for k in entry.doc.spec.api_keys if k.sha256)

    def endpoints(self, pool: str) -> tuple[str, ...]:
        """The pool's backend base URLs (``spec.endpoints``), () for no such pool."""
        entry = self._entries.get((POOL, pool))
        if entry is None or not isinstance(entry.doc, TokenPoolDocument):
            return ()
        return tuple(entry.doc.spec.endpoints)

    # ---- changes ------------------------------------------------------------------------------------------------
    def put(self, kind: str, name: str, spec: Mapping[str, Any], source: str) -> Iterator[ConfigProblem] | None:
        """Replace (in its place) or add (last) the document ``kind``/``name`` with this ``spec``."""
        _check_kind(kind)
        key = (kind, name)
        data = {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name}, "spec": dict(spec)}
        raw = RawDocument(self._order.position(key) if key in self._order else len(self._order) + 1, data)
        problems = Problems(source)
        doc, ok = validate_document(raw, problems)
        if isinstance(doc, TokenEntitlementDocument):  # checked even when the document has problems, as loaded
            self._check_references(key, raw, doc, problems)
        made = None
        if ok and isinstance(doc, (TokenPoolDocument, TokenEntitlementDocument)):
            made = to_spec(raw, doc, problems)
        if problems.items:
            return iter(problems.sorted())
        assert doc is not None and made is not None
        old = self._entries.get(key)
        self._entries[key] = _Entry(data, doc)
        self._order.add(key)
        if isinstance(made, PoolSpec):
            self._pools[name] = made
        else:
            assert isinstance(doc, TokenEntitlementDocument) and isinstance(made, EntitlementSpec)
            if old is not None:
                self._forget_keys(name, old.doc)
            self._add_entitlement(name, doc, made)
        return None

    def remove(self, kind: str, name: str, source: str) -> Iterator[ConfigProblem] | None:
        """Remove the document ``kind``/``name`` (nothing to do if there is none)."""
        _check_kind(kind)
        key = (kind, name)
        entry = self._entries.get(key)
        if entry is None:
            return None
        if kind == POOL:
            refused = self._removal_problems(name, source)
            if refused is not None:
                return refused
            del self._pools[name]
        else:
            spec = self._entitlements.pop(name)
            self._leave(spec.pool, name)
            self._forget_keys(name, entry.doc)
        del self._entries[key]
        self._order.remove(key)
        return None

    # ---- the checks ---------------------------------------------------------------------------------------------
    def _check_references(self, key: DocKey, raw: RawDocument, doc: TokenEntitlementDocument,
                          problems: Problems) -> None:
        """The loader's reference checks on the documents they can concern: this one, the holders of its keys, and
        the tenant's entitlements declaring one of its tenant budgets.

        The set is valid without this document, so every other document holds keys of its own, names a pool and
        declares its tenant budgets like the tenant's other entitlements."""
        involved: dict[DocKey, tuple[RawDocument, TokenEntitlementDocument]] = {key: (raw, doc)}
        for i in range(len(doc.spec.api_keys)):
            identity = key_identity(doc, i)
            for owner in (() if identity is None else self._key_owner.get(identity, ())):
                if owner != key[1]:
                    involved[(ENTITLEMENT, owner)] = self._located(owner)
        for sharer in self._sharers(key[1], doc):
            involved[(ENTITLEMENT, sharer)] = self._located(sharer)
        order = self._order
        key_owner: dict[str, list[KeyHolder]] = {}
        tenant_budgets: dict[tuple[str, str], TenantBudgetHolder] = {}
        for k in sorted(involved, key=lambda k: (0, order.rank(k)) if k in order else (1, 0)):  # a new one goes last
            check_references(*involved[k], self._pools, key_owner, problems)
            check_tenant_budgets(*involved[k], tenant_budgets, problems)

    def _sharers(self, name: str, doc: TokenEntitlementDocument) -> list[str]:
        """The tenant's other entitlements declaring a tenant budget of a name ``doc`` declares one of (a scan of the
        specs, only for a document with a tenant budget)."""
        names = {b.name for b in doc.spec.budgets if b.scope is BudgetScope.TENANT}
        if not names:
            return []
        tenant = doc.spec.tenant_id
        return [other for other, spec in self._entitlements.items() if other != name and spec.tenant == tenant
                and any(b.scope is BudgetScope.TENANT and b.name in names for b in spec.budgets)]

    def _located(self, name: str) -> tuple[RawDocument, TokenEntitlementDocument]:
        key = (ENTITLEMENT, name)
        entry = self._entries[key]
        assert isinstance(entry.doc, TokenEntitlementDocument)
        return RawDocument(self._order.position(key), entry.data), entry.doc

    def _removal_problems(self, pool: str, source: str) -> Iterator[ConfigProblem] | None:
        if len(self._entries) == 1 or len(self._pools) == 1:
            found = Problems(source)  # with no pool left, the loader checks no poolRef: only the set's own rule
            found.add(None, (), NO_DOCUMENTS if len(self._entries) == 1 else NO_POOL)
            return iter(found.sorted())
        orphans = list(self._members.get(pool, ()))
        if not orphans:
            return None
        remaining = {name: None for name in self._pools if name != pool}
        return self._orphan_problems(pool, orphans, remaining, source)

    def _orphan_problems(self, pool: str, orphans: list[str], remaining: dict[str, None],
                         source: str) -> Iterator[ConfigProblem]:
        """One problem per entitlement naming the pool, in document order (their own keys are unique), each
        located in the set without the pool."""
        gone = self._order.rank((POOL, pool))
        for name in orphans:
            raw, doc = self._located(name)
            if gone < self._order.rank((ENTITLEMENT, name)):
                raw = RawDocument(raw.index - 1, raw.data)
            found = Problems(source)
            check_references(raw, doc, remaining, {}, found)
            yield from found.items

    # ---- the indexes --------------------------------------------------------------------------------------------
    def _add_entitlement(self, name: str, doc: TokenEntitlementDocument, spec: EntitlementSpec) -> None:
        """Index a document just put (its old keys already forgotten)."""
        previous = self._entitlements.get(name)
        if previous is None or previous.pool != spec.pool:
            if previous is not None:
                self._leave(previous.pool, name)
            self._join(spec.pool, name)
        self._entitlements[name] = spec
        for i in range(len(doc.spec.api_keys)):
            identity = key_identity(doc, i)
            if identity is not None:
                self._key_owner.setdefault(identity, {})[name] = None

    def _join(self, pool: str, name: str) -> None:
        members = self._members.setdefault(pool, {})
        last = next(reversed(members), None)
        members[name] = None
        rank = self._order.rank
        if last is not None and rank((ENTITLEMENT, last)) > rank((ENTITLEMENT, name)):  # moved from another pool
            self._members[pool] = dict.fromkeys(sorted(members, key=lambda n: rank((ENTITLEMENT, n))))

    def _leave(self, pool: str, name: str) -> None:
        members = self._members[pool]
        del members[name]
        if not members:
            del self._members[pool]

    def _forget_keys(self, name: str, doc: Document) -> None:
        assert isinstance(doc, TokenEntitlementDocument)
        for i in range(len(doc.spec.api_keys)):
            identity = key_identity(doc, i)
            owners = None if identity is None else self._key_owner.get(identity)
            if owners is not None and name in owners:
                del owners[name]
                if not owners:
                    del self._key_owner[identity]  # type: ignore[arg-type]


def _check_kind(kind: str) -> None:
    if kind not in (POOL, ENTITLEMENT):
        raise ValueError(f"only {POOL} and {ENTITLEMENT} documents change one at a time, got {kind!r}")
