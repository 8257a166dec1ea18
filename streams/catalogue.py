"""The pools and entitlements the agents tick: the --config file first, then the compacted specs topic.

Every spec record replaces (or, ``deleted``, removes) one document; the whole set is then validated again by
``tokenpools.config`` (the same loader the CLI and the proxy use). A set that no longer validates is refused as a
whole and the previous catalogue stays in force; the caller dead-letters the record with the reason. A status the
controller wrote (``state`` other than Bound: Pending, Degraded, Expired) keeps the entitlement out of the tick;
otherwise capacity admission (``core.binding``, run at each tick in event time) decides who is Bound.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tokenpools.config import API_VERSION, ConfigError, LoadedConfig, load_config_documents
from tokenpools.core.classes import EntitlementState
from tokenpools.core.spec import EntitlementSpec
from tokenpools.streams.pool_state import PoolView
from tokenpools.topics.records import ProxyHeartbeat, SpecRecord

DocKey = tuple[str, str]  # (kind, name)


class Catalogue:
    def __init__(self, documents: Mapping[DocKey, dict[str, Any]], loaded: LoadedConfig,
                 status: Mapping[str, str] | None = None) -> None:
        self._documents = dict(documents)
        self._loaded = loaded
        self._status = dict(status or {})
        self._views = self._build_views()

    @classmethod
    def from_loaded(cls, loaded: LoadedConfig) -> Catalogue:
        docs = {}
        for raw in loaded.raw_documents:
            name = (raw.get("metadata") or {}).get("name", "")
            docs[(str(raw.get("kind")), str(name))] = raw
        return cls(docs, loaded)

    @property
    def pools(self) -> tuple[str, ...]:
        return tuple(self._views)

    def view(self, pool: str) -> PoolView | None:
        return self._views.get(pool)

    def apply(self, record: SpecRecord) -> str | None:
        """Apply one spec record; None when applied, else why the resulting set was refused."""
        key = (record.kind, record.name)
        documents = dict(self._documents)
        status = dict(self._status)
        if record.deleted:
            documents.pop(key, None)
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
            return "; ".join(str(p) for p in exc.problems)[:2000]
        self._documents, self._loaded, self._status = documents, loaded, status
        self._views = self._build_views()
        return None

    def _build_views(self) -> dict[str, PoolView]:
        return {
            name: PoolView(pool, tuple(self._with_status(e) for e in self._loaded.entitlements_of(name)))
            for name, pool in self._loaded.pools.items()
        }

    def _with_status(self, spec: EntitlementSpec) -> EntitlementSpec:
        state = self._status.get(spec.name)
        if state is None or state == EntitlementState.BOUND.value:
            return spec
        return dataclasses.replace(spec, state=EntitlementState(state))


class ProxyBook:
    """The newest heartbeat of every proxy replica (from the compacted heartbeats topic)."""

    def __init__(self) -> None:
        self._beats: dict[str, ProxyHeartbeat] = {}

    def apply(self, beat: ProxyHeartbeat) -> bool:
        """Keep the newer heartbeat; False when ``beat`` is older than the one known (a replayed record)."""
        known = self._beats.get(beat.proxy_id)
        if known is not None and known.t_ms > beat.t_ms:
            return False
        self._beats[beat.proxy_id] = beat
        return True

    def forget(self, proxy_id: str) -> None:
        self._beats.pop(proxy_id, None)

    def snapshot(self) -> dict[str, ProxyHeartbeat]:
        return dict(self._beats)
