"""The one follower of the compacted specs topic: the pools and entitlements in force, for any component.

The catalogue starts from the --config file's documents and then follows the topic. Every spec record replaces
(or, ``deleted`` or a tombstone, removes) one document, keyed (kind, name); the whole set is then validated again by
``tokenpools.config`` (the same loader the CLI and the proxy use). A set that no longer validates is refused as a
whole and the previous catalogue stays in force; ``follow`` dead-letters the record with the reason. A status the
controller wrote (``state`` other than Bound: Pending, Degraded, Expired) is kept with its entitlement and applied
to its spec; otherwise capacity admission (``core.binding``) decides who is Bound, where the component runs it.

Components read the catalogue (``pools``, ``pool``, ``entitlements_of``, ``version``) and build their own views
of it (the agents' ``PoolView``), so this module knows no component.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from tokenpools.config import API_VERSION, ConfigError, LoadedConfig, load_config_documents
from tokenpools.core.classes import EntitlementState
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.runtime.deadletter import DeadLetters
from tokenpools.topics.codec import DecodeError, decode
from tokenpools.topics.records import DeadLetterReason, SpecRecord

DocKey = tuple[str, str]  # (kind, name)
KINDS = ("TokenPool", "TokenEntitlement")
MAX_PROBLEM_CHARS = 2000


class Catalogue:
    """The documents in force, their validated form and the controller's statuses; replaced whole on each change."""

    def __init__(self, documents: Mapping[DocKey, dict[str, Any]], loaded: LoadedConfig,
                 status: Mapping[str, str] | None = None) -> None:
        self._documents = dict(documents)
        self._loaded = loaded
        self._status = dict(status or {})
        self._entitlements = self._with_statuses()
        self.version = 0  # how many records changed the set since start (a refused one does not)

    @classmethod
    def from_loaded(cls, loaded: LoadedConfig) -> Catalogue:
        docs = {}
        for raw in loaded.raw_documents:
            name = (raw.get("metadata") or {}).get("name", "")
            docs[(str(raw.get("kind")), str(name))] = raw
        return cls(docs, loaded)

    @property
    def loaded(self) -> LoadedConfig:
        return self._loaded

    @property
    def pools(self) -> tuple[str, ...]:
        return tuple(self._loaded.pools)

    def pool(self, name: str) -> PoolSpec | None:
        return self._loaded.pools.get(name)

    def entitlements_of(self, pool: str) -> tuple[EntitlementSpec, ...]:
        """The pool's entitlements, oldest first, each in the state the controller last gave it (if not Bound)."""
        return self._entitlements.get(pool, ())

    def apply(self, record: SpecRecord) -> str | None:
        """Apply one spec record; None when applied, else why the resulting set was refused."""
        key = (record.kind, record.name)
        documents = dict(self._documents)
        status = dict(self._status)
        if record.deleted:
            documents.pop(key, None)
            if record.kind == "TokenEntitlement":  # a pool may share an entitlement's name, never its status
                status.pop(record.name, None)
        else:
            documents[key] = {"apiVersion": API_VERSION, "kind": record.kind,
                              "metadata": {"name": record.name}, "spec": dict(record.spec)}
            if record.kind == "TokenEntitlement":
                if record.state is None:
                    status.pop(record.name, None)
                else:
                    status[record.name] = record.state
        try:
            loaded = load_config_documents(list(documents.values()), source=f"spec {record.kind}/{record.name}")
        except ConfigError as exc:
            return "; ".join(str(p) for p in exc.problems)[:MAX_PROBLEM_CHARS]
        self._documents, self._loaded, self._status = documents, loaded, status
        self._entitlements = self._with_statuses()
        self.version += 1
        return None

    def _with_statuses(self) -> dict[str, tuple[EntitlementSpec, ...]]:
        return {name: tuple(self._with_status(e) for e in self._loaded.entitlements_of(name))
                for name in self._loaded.pools}

    def _with_status(self, spec: EntitlementSpec) -> EntitlementSpec:
        state = self._status.get(spec.name)
        if state is None or state == EntitlementState.BOUND.value:
            return spec
        return dataclasses.replace(spec, state=EntitlementState(state))


class SpecOutcome(enum.StrEnum):
    APPLIED = "applied"  # the record replaced or removed its document
    REFUSED = "refused"  # the set it would make does not validate: dead-lettered, previous set kept
    UNDECODABLE = "undecodable"  # not a spec record: dead-lettered
    IGNORED = "ignored"  # a tombstone whose key names no document kind


async def follow(catalogue: Catalogue, dead_letters: DeadLetters, topic: str, partition: int, offset: int,
                 key: bytes | None, value: bytes | None) -> SpecOutcome:
    """One record of the specs topic into ``catalogue``; what is not applied is dead-lettered with the reason."""
    if value is None:  # a tombstone: the key is "<kind>/<name>"
        kind, _, name = (key or b"").decode("utf-8", "replace").partition("/")
        if kind not in KINDS or not name:
            return SpecOutcome.IGNORED
        removal = SpecRecord(kind=kind, name=name, pool="", spec={}, deleted=True, t_ms=0)  # type: ignore[arg-type]
        # the deleted record before a tombstone was dead-lettered already if it was refused
        return SpecOutcome.APPLIED if catalogue.apply(removal) is None else SpecOutcome.REFUSED
    try:
        record = decode(SpecRecord, value)
    except DecodeError as exc:
        await dead_letters.handle(exc.reason, exc.detail, topic, partition, offset, key, value)
        return SpecOutcome.UNDECODABLE
    problem = catalogue.apply(record)
    if problem is not None:
        await dead_letters.handle(DeadLetterReason.INVALID, f"spec refused, previous specs kept: {problem}",
                                  topic, partition, offset, key, value)
        return SpecOutcome.REFUSED
    return SpecOutcome.APPLIED
