"""The one follower of the compacted specs topic: the pools and entitlements in force, for any component.

The catalogue starts from the --config file's documents and then follows the topic. Every spec record replaces
(or, ``deleted`` or a tombstone, removes) one document, keyed (kind, name), and the set must still validate as
``tokenpools.config`` validates a file. A record is checked for what it changes (``config.docset``: the document
alone, and the rules across documents it takes part in), so it costs the same at 20 documents or 20,000; a set that
would no longer validate is refused as a whole, with the problems the full validation gives, and the previous
catalogue stays in force; ``follow`` dead-letters the record with the reason. A status the controller wrote
(``state`` other than Bound: Pending, Degraded, Expired) is kept with its entitlement and applied to its spec;
otherwise capacity admission (``core.binding``) decides who is Bound, where the component runs it.

Components read the catalogue (``pools``, ``pool``, ``entitlements_of``, ``version``) and build their own views
of it (the agents' ``PoolView``), so this module knows no component. The views are kept until a record changes
them: reading a pool's entitlements on every tick costs a dict lookup.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable

from tokenpools.config import LoadedConfig
from tokenpools.config.docset import ENTITLEMENT, DocumentSet
from tokenpools.core.classes import EntitlementState
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.errors import ConfigProblem
from tokenpools.runtime.deadletter import DeadLetters
from tokenpools.topics.codec import DecodeError, decode
from tokenpools.topics.records import DeadLetterReason, SpecRecord

KINDS = ("TokenPool", "TokenEntitlement")
MAX_PROBLEM_CHARS = 2000


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    """What applied records changed: the entitlements created, changed or removed; the pools whose document or
    entitlements changed (an entitlement's pool before and after); the pools whose own document changed."""

    entitlements: set[str]
    pools: set[str]
    pool_documents: set[str]

    def merge(self, other: Change) -> Change:
        return Change(self.entitlements | other.entitlements, self.pools | other.pools,
                      self.pool_documents | other.pool_documents)


class Catalogue:
    """The documents in force, the controller's statuses, and the views components read; changed record by record."""

    def __init__(self, documents: DocumentSet, history_ms: int = 0) -> None:
        self._documents = documents
        # pool → (t_ms of the record, its entitlements after it), oldest first: what a pool's membership was at a
        # past instant (``entitlements_at``), kept for ``history_ms`` past the newest change; 0 keeps none
        self._history_ms = history_ms
        self._history: dict[str, list[tuple[int, tuple[EntitlementSpec, ...]]]] = {}
        self._status: dict[str, str] = {}  # entitlement → the state its last record carried (not None)
        self._views: dict[str, tuple[EntitlementSpec, ...]] = {}  # pool → entitlements_of, made when first read
        self._pool_names: tuple[str, ...] | None = None
        self._generations: dict[tuple[str, str], int] = {}  # (kind, name) → the controller's generation in force
        self.version = 0  # how many records changed the set since start (a refused one does not)
        self._changed = Change(set(), set(), set())  # since the last ``take_changes``

    def take_changes(self) -> Change:
        """What the records applied since the last call changed (and start afresh): a follower's view updates only
        those (the proxy's ``live_specs``)."""
        changed, self._changed = self._changed, Change(set(), set(), set())
        return changed

    @classmethod
    def from_loaded(cls, loaded: LoadedConfig, history_ms: int = 0) -> Catalogue:
        return cls(DocumentSet.from_loaded(loaded), history_ms)

    @property
    def pools(self) -> tuple[str, ...]:
        """The pools' names in document order."""
        if self._pool_names is None:
            self._pool_names = tuple(self._documents.pools)
        return self._pool_names

    def pool(self, name: str) -> PoolSpec | None:
        return self._documents.pools.get(name)

    def entitlements_of(self, pool: str) -> tuple[EntitlementSpec, ...]:
        """The pool's entitlements, oldest first, each in the state the controller last gave it (if not Bound)."""
        view = self._views.get(pool)
        if view is None:
            if pool not in self._documents.pools:
                return ()
            view = self._views[pool] = tuple(self._with_status(e) for e in self._documents.entitlements_of(pool))
        return view

    def history_of(self, pool: str) -> tuple[tuple[int, tuple[EntitlementSpec, ...]], ...]:
        """The pool's kept membership history: (t_ms of a record, the entitlements after it), oldest first, the
        first entry (t_ms -1) the state before the first record kept; () when none is kept."""
        return tuple(self._history.get(pool, ()))

    def entitlement_names(self) -> tuple[str, ...]:
        """Every entitlement's name, pool by pool in document order."""
        return tuple(e.name for pool in self.pools for e in self._documents.entitlements_of(pool))

    def key_digests_of(self, entitlement: str) -> tuple[str, ...]:
        """The entitlement's API key digests (lowercase SHA-256 hex) as its document lists them."""
        return self._documents.api_key_digests(entitlement)

    def endpoints_of(self, pool: str) -> tuple[str, ...]:
        return self._documents.endpoints(pool)

    def apply(self, record: SpecRecord) -> str | None:
        """Apply one spec record; None when applied, else why the resulting set was refused.

        A record whose ``generation`` (the custom resource's, set by the controller; 0: none) is older than the one
        in force for its document is refused: a stale record never wins, whatever order it arrives in. A removal
        forgets the generation (a re-created resource starts again at 1)."""
        kind, name, documents = record.kind, record.name, self._documents
        held = self._generations.get((kind, name))
        if record.generation and not record.deleted and held is not None and record.generation < held:
            return (f"spec {kind}/{name}: generation {record.generation} is older than generation {held} in force "
                    "(a stale record)")
        before = documents.entitlement(name) if kind == ENTITLEMENT else None
        touched = {before.pool} if before is not None else set()
        if kind == ENTITLEMENT and not record.deleted and isinstance(record.spec, dict):
            touched.add(str(record.pool or ""))
        if self._history_ms:  # the state before this record, for instants before it (once per pool)
            for pool in touched | ({name} if kind != ENTITLEMENT else set()):
                if pool and pool not in self._history and pool in documents.pools:
                    self._history[pool] = [(-1, self.entitlements_of(pool))]
        seen = self._seen(kind, name)
        source = f"spec {kind}/{name}"
        problems = (documents.remove(kind, name, source) if record.deleted
                    else documents.put(kind, name, record.spec, source))
        if problems is not None:
            return _summary(problems)
        if record.deleted:
            self._generations.pop((kind, name), None)
        elif record.generation:
            self._generations[(kind, name)] = record.generation
        if kind == ENTITLEMENT:
            if record.deleted or record.state is None:
                self._status.pop(name, None)
            else:
                self._status[name] = record.state
        else:
            self._pool_names = None
        self.version += 1
        if self._seen(kind, name) == seen:  # the same document again (a restart re-reads the topic): no change
            return None
        if kind == ENTITLEMENT:
            self._changed.entitlements.add(name)
            for spec in (before, documents.entitlement(name)):
                if spec is not None:
                    self._views.pop(spec.pool, None)
                    self._changed.pools.add(spec.pool)
                    self._remember(spec.pool, record.t_ms)
        else:
            self._views.pop(name, None)
            self._changed.pools.add(name)
            self._changed.pool_documents.add(name)
        return None

    def _remember(self, pool: str, t_ms: int) -> None:
        """Note the pool's entitlements after a record of ``t_ms``, and forget what is older than the history kept
        (keeping the last state before the cut: it is the state at the cut)."""
        if not self._history_ms or pool not in self._documents.pools:
            return
        history = self._history.setdefault(pool, [(-1, ())])
        history.append((max(t_ms, history[-1][0]), self.entitlements_of(pool)))
        cut = history[-1][0] - self._history_ms
        while len(history) > 1 and history[1][0] <= cut:
            history.pop(0)

    def _seen(self, kind: str, name: str) -> tuple[object, ...]:
        """What a component sees of one document: its spec (with its status), keys or endpoints, and its place."""
        documents = self._documents
        if kind == ENTITLEMENT:
            return documents.entitlement(name), self._status.get(name), documents.api_key_digests(name)
        return documents.pools.get(name), documents.endpoints(name), tuple(documents.pools).index(name) \
            if name in documents.pools else None

    def _with_status(self, spec: EntitlementSpec) -> EntitlementSpec:
        state = self._status.get(spec.name)
        if state is None or state == EntitlementState.BOUND.value:
            return spec
        return dataclasses.replace(spec, state=EntitlementState(state))


def _summary(problems: Iterable[ConfigProblem]) -> str:
    """The problems joined by "; " and cut at MAX_PROBLEM_CHARS, reading no more of them than the cut keeps."""
    parts: list[str] = []
    length = -2
    for problem in problems:
        parts.append(str(problem))
        length += len(parts[-1]) + 2
        if length >= MAX_PROBLEM_CHARS:
            break
    return "; ".join(parts)[:MAX_PROBLEM_CHARS]


class SpecOutcome(enum.StrEnum):
    APPLIED = "applied"  # the record replaced or removed its document
    REFUSED = "refused"  # the set it would make does not validate: dead-lettered, previous set kept
    UNDECODABLE = "undecodable"  # not a spec record: dead-lettered
    IGNORED = "ignored"  # a tombstone whose key names no document kind


def judge(catalogue: Catalogue, key: bytes | None, value: bytes | None
          ) -> tuple[SpecOutcome, DeadLetterReason | None, str]:
    """One record of the specs topic into ``catalogue``: the outcome and, for what must be dead-lettered, the reason
    and the detail. Synchronous, for a follower that writes its dead letters its own way (the proxy's event
    pipeline); ``follow`` writes them itself."""
    if value is None:  # a tombstone: the key is "<kind>/<name>"
        kind, _, name = (key or b"").decode("utf-8", "replace").partition("/")
        if kind not in KINDS or not name:
            return SpecOutcome.IGNORED, None, ""
        removal = SpecRecord(kind=kind, name=name, pool="", spec={}, deleted=True, t_ms=0)  # type: ignore[arg-type]
        # the deleted record before a tombstone was dead-lettered already if it was refused
        return (SpecOutcome.APPLIED if catalogue.apply(removal) is None else SpecOutcome.REFUSED), None, ""
    try:
        record = decode(SpecRecord, value)
    except DecodeError as exc:
        return SpecOutcome.UNDECODABLE, exc.reason, exc.detail
    problem = catalogue.apply(record)
    if problem is not None:
        return SpecOutcome.REFUSED, DeadLetterReason.INVALID, f"spec refused, previous specs kept: {problem}"
    return SpecOutcome.APPLIED, None, ""


async def follow(catalogue: Catalogue, dead_letters: DeadLetters, topic: str, partition: int, offset: int,
                 key: bytes | None, value: bytes | None) -> SpecOutcome:
    """One record of the specs topic into ``catalogue``; what is not applied is dead-lettered with the reason."""
    outcome, reason, detail = judge(catalogue, key, value)
    if reason is not None:
        await dead_letters.handle(reason, detail, topic, partition, offset, key, value)
    return outcome
