"""Verdicts → the compacted specs topic (key ``<kind>/<name>``), publishing only what changed, in a safe order.

The agents check the set after every record (``runtime.specs``) and refuse a record that leaves it invalid,
so the order matters: withdrawn entitlements first, then pools, then entitlements, then withdrawn
pools — an entitlement never arrives before its pool, and a pool never leaves while an entitlement still names
it. A withdrawal is a ``deleted`` record followed by a tombstone (compaction then forgets the key).
Compaction keeps only the last record of each key, in offset order, so a reader that starts later sees a pool at
its last record: a republished pool is therefore followed by its entitlements again, and every entitlement's last
record stays after its pool's. Otherwise a proxy or worker that starts from settings only (or from a file without
that pool) would read the entitlement first, refuse it, and serve the pool without it.
A restarted controller republishes everything once (harmless on a compacted topic).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenpools.controllers.inventory import PoolEntry, ScaleTarget
from tokenpools.controllers.publisher import Publisher
from tokenpools.controllers.reconcile import ENTITLEMENT, POOL, Evaluation, Key, Verdict
from tokenpools.runtime.clock import Clock
from tokenpools.topics.records import SpecRecord


def spec_key(key: Key) -> str:
    return f"{key[0]}/{key[1]}"


def _record(verdict: Verdict, t_ms: int) -> SpecRecord:
    return SpecRecord(  # kind and state are the Literal values of the record (reconcile only makes those)
        kind=verdict.kind, name=verdict.name, pool=verdict.pool, generation=verdict.generation,  # type: ignore[arg-type]
        spec=dict(verdict.spec or {}), state=None if verdict.state is None else verdict.state.value,
        reason=f"{verdict.reason.value}: {verdict.message}"[:2000], t_ms=t_ms)


def _signature(r: SpecRecord) -> tuple[Any, ...]:
    return (r.pool, r.generation, r.spec, r.state, r.reason)


class SpecPublisher:
    def __init__(self, publisher: Publisher, topic: str, clock: Clock) -> None:
        self.publisher, self.topic, self.clock = publisher, topic, clock
        self.published: dict[Key, SpecRecord] = {}

    async def sync(self, evaluation: Evaluation) -> int:
        """Publish the differences from what was published before; how many records were sent."""
        t_ms = self.clock.wall_ms()
        wanted = {k: _record(v, t_ms) for k, v in evaluation.verdicts.items() if v.spec is not None}
        gone = [k for k in self.published if k not in wanted]
        changed = [k for k, r in wanted.items() if k not in self.published or _signature(self.published[k]) != _signature(r)]
        pools = {k[1] for k in changed if k[0] == POOL}  # their entitlements follow them again (module doc)
        changed += [k for k, r in wanted.items() if k[0] == ENTITLEMENT and r.pool in pools and k not in changed]
        sent = 0
        for kind, removal in ((ENTITLEMENT, True), (POOL, False), (ENTITLEMENT, False), (POOL, True)):
            for key in (gone if removal else changed):
                if key[0] != kind:
                    continue
                if removal:
                    last = self.published[key]
                    await self.publisher.publish(self.topic, spec_key(key), last.model_copy(
                        update={"deleted": True, "spec": {}, "state": None, "reason": "withdrawn", "t_ms": t_ms}))
                    await self.publisher.publish(self.topic, spec_key(key), None)
                    del self.published[key]
                    sent += 2
                else:
                    await self.publisher.publish(self.topic, spec_key(key), wanted[key])
                    self.published[key] = wanted[key]
                    sent += 1
        return sent


def pool_entries(evaluation: Evaluation, default_namespace: str) -> dict[str, PoolEntry]:
    """The inventory the metrics and scaler loops work from."""
    entries: dict[str, PoolEntry] = {}
    loaded = evaluation.loaded
    if loaded is None:
        return entries
    for name, pool in evaluation.pools.items():
        namespace = loaded.pool_documents[name].metadata.namespace or default_namespace
        ref = loaded.backend_refs[name]
        target = ScaleTarget(ref.api_version, ref.kind, ref.name, ref.namespace or namespace)
        summary = evaluation.summaries.get(name)
        entries[name] = PoolEntry(pool, namespace, target, summary.floor_replicas if summary else 0)
    return entries


def states_of(evaluation: Evaluation) -> Mapping[str, str]:
    """Entitlement → state (for logs and tests)."""
    return {k[1]: v.state.value for k, v in evaluation.verdicts.items() if k[0] == ENTITLEMENT and v.state is not None}
