"""Custom resources (or a config file's documents) → a verdict per object: valid or not, and each entitlement's state.

Pure: a function of the objects and ``now_s``. The same loader the CLI, the proxy and the agents use
(``tokenpools.config``) validates the set; the objects it finds fault with are taken out one round at a time
(each round removes at least one), so one bad object never stops the others from binding:

- an object with problems: ``InvalidSpec`` (the problems are its status message; an entitlement is Pending);
- an entitlement whose ``poolRef`` names no valid pool: Pending, ``PoolNotFound`` (a pool created later binds it);
- the rest: capacity admission (``core.binding``) per pool, entitlements oldest first (``metadata.creationTimestamp``,
  then name), so a newcomer never displaces an earlier grant.

Only the valid set is published; a verdict with ``spec=None`` means "withdraw it from the specs topic".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tokenpools.config import ConfigError, LoadedConfig, load_config_documents
from tokenpools.core.binding import bind_entitlements
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState
from tokenpools.core.scaling import protected_floor
from tokenpools.core.spec import EntitlementSpec, PoolSpec

POOL = "TokenPool"
ENTITLEMENT = "TokenEntitlement"
Key = tuple[str, str]  # (kind, name)


class Reason(StrEnum):
    """Why an object is in its state: the ``reason`` of its status and conditions (CamelCase, as Kubernetes wants)."""

    VALID = "Valid"
    INVALID_SPEC = "InvalidSpec"
    BASELINE_FITS = "BaselineFits"
    NO_BASELINE = "NoBaselineNeeded"
    INSUFFICIENT_CAPACITY = "InsufficientCapacity"
    EXPIRED = "Expired"
    POOL_NOT_FOUND = "PoolNotFound"
    STATE_SET_IN_SPEC = "StateSetInSpec"


@dataclass(frozen=True, slots=True)
class Verdict:
    kind: str
    name: str
    pool: str  # the pool itself, or the entitlement's poolRef
    generation: int
    reason: Reason
    message: str
    state: EntitlementState | None = None  # entitlements only
    spec: dict[str, Any] | None = None  # the validated camelCase spec to publish; None: withdraw

    @property
    def valid(self) -> bool:
        return self.reason is not Reason.INVALID_SPEC


@dataclass(frozen=True, slots=True)
class PoolSummary:
    bound: int
    degraded: int
    other: int  # pending or expired
    promised: Capacity  # Bound baselines
    capacity_at_max: Capacity
    floor_replicas: int  # what the Bound baselines need (the scaler never goes below)


@dataclass(frozen=True, slots=True)
class Evaluation:
    verdicts: dict[Key, Verdict]
    pools: dict[str, PoolSpec] = field(default_factory=dict)
    bound: dict[str, tuple[EntitlementSpec, ...]] = field(default_factory=dict)  # pool → Bound entitlements
    summaries: dict[str, PoolSummary] = field(default_factory=dict)
    loaded: LoadedConfig | None = None


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(obj.get("kind", "")), str(meta.get("name", "") if isinstance(meta, Mapping) else "")


def _generation(obj: Mapping[str, Any]) -> int:
    meta = obj.get("metadata") or {}
    value = meta.get("generation") if isinstance(meta, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _pool_ref(obj: Mapping[str, Any]) -> str:
    spec = obj.get("spec")
    ref = spec.get("poolRef") if isinstance(spec, Mapping) else None
    name = ref.get("name") if isinstance(ref, Mapping) else None
    return name if isinstance(name, str) else ""


def _age_order(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    created = meta.get("creationTimestamp") if isinstance(meta, Mapping) else None
    return created if isinstance(created, str) else ""  # RFC 3339 UTC sorts as text; ties keep the given order


def _problem_text(path: str, message: str) -> str:
    return f"{path}: {message}" if path else message


def _validate(objects: list[Mapping[str, Any]]) -> tuple[LoadedConfig | None, dict[Key, list[str]], set[Key]]:
    """(the largest valid set's config, problems per invalid object, entitlements without a valid pool)."""
    invalid: dict[Key, list[str]] = {}
    orphans: set[Key] = set()
    while True:
        candidates = [o for o in objects if key_of(o) not in invalid and key_of(o) not in orphans]
        pools = {key_of(o)[1] for o in candidates if key_of(o)[0] == POOL}
        lost = {key_of(o) for o in candidates if key_of(o)[0] == ENTITLEMENT and _pool_ref(o) not in pools}
        if lost:
            orphans |= lost
            continue
        if not pools:
            return None, invalid, orphans
        try:
            return load_config_documents(candidates, source="kubernetes"), invalid, orphans
        except ConfigError as exc:
            found: dict[Key, list[str]] = {}
            for p in exc.problems:
                if p.kind and p.name:
                    found.setdefault((p.kind, p.name), []).append(_problem_text(p.path, p.message))
            if not found:  # nothing to blame one object for: every candidate carries the problems
                text = [_problem_text(p.path, p.message) for p in exc.problems]
                invalid.update({key_of(o): text for o in candidates})
                return None, invalid, orphans
            invalid.update(found)


def _binding_reason(spec: EntitlementSpec, state: EntitlementState, core_reason: str) -> Reason:
    if state is EntitlementState.BOUND:
        return Reason.BASELINE_FITS if spec.service_class.has_baseline else Reason.NO_BASELINE
    if state is EntitlementState.DEGRADED:
        return Reason.INSUFFICIENT_CAPACITY
    if state is EntitlementState.EXPIRED:
        return Reason.EXPIRED
    return Reason.POOL_NOT_FOUND if core_reason == "pool not found" else Reason.STATE_SET_IN_SPEC


def evaluate(objects: Sequence[Mapping[str, Any]], now_s: float) -> Evaluation:
    """Verdicts for every TokenPool and TokenEntitlement in ``objects`` (other kinds are ignored)."""
    ours = sorted((o for o in objects if key_of(o)[0] in (POOL, ENTITLEMENT)), key=_age_order)
    loaded, invalid, orphans = _validate(ours)
    verdicts: dict[Key, Verdict] = {}
    for obj in ours:
        kind, name = key = key_of(obj)
        ref, gen = (name if kind == POOL else _pool_ref(obj)), _generation(obj)
        state = None if kind == POOL else EntitlementState.PENDING
        if key in invalid:
            verdicts[key] = Verdict(kind, name, ref, gen, Reason.INVALID_SPEC, "; ".join(invalid[key]), state)
        elif key in orphans:
            verdicts[key] = Verdict(kind, name, ref, gen, Reason.POOL_NOT_FOUND, f"no valid TokenPool named {ref!r}", state)
    if loaded is None:
        return Evaluation(verdicts)

    bound: dict[str, tuple[EntitlementSpec, ...]] = {}
    summaries: dict[str, PoolSummary] = {}
    for pool_name, pool in loaded.pools.items():
        doc = loaded.pool_documents[pool_name]
        verdicts[(POOL, pool_name)] = Verdict(POOL, pool_name, pool_name, doc.metadata.generation or 0, Reason.VALID,
                                              "spec is valid", spec=_spec(doc))
        members = loaded.entitlements_of(pool_name)
        bindings = bind_entitlements(pool, members, now_s)
        for e in members:
            b = bindings[e.name]
            edoc = loaded.entitlement_documents[e.name]
            verdicts[(ENTITLEMENT, e.name)] = Verdict(
                ENTITLEMENT, e.name, pool_name, edoc.metadata.generation or 0,
                _binding_reason(e, b.state, b.reason), b.reason, b.state, _spec(edoc))
        held = tuple(e for e in members if bindings[e.name].state is EntitlementState.BOUND)
        bound[pool_name] = held
        degraded = sum(1 for e in members if bindings[e.name].state is EntitlementState.DEGRADED)
        summaries[pool_name] = PoolSummary(
            bound=len(held), degraded=degraded, other=len(members) - len(held) - degraded,
            promised=Capacity.total([e.baseline for e in held if e.service_class.has_baseline]),
            capacity_at_max=pool.max_capacity, floor_replicas=min(pool.max_replicas, protected_floor(pool, list(held))))
    return Evaluation(verdicts, dict(loaded.pools), bound, summaries, loaded)


def _spec(doc: Any) -> dict[str, Any]:
    spec: dict[str, Any] = doc.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    return spec


def next_change_s(evaluation: Evaluation, now_s: float) -> float | None:
    """When the verdicts change by time alone (the next expiry among unexpired entitlements), else None."""
    if evaluation.loaded is None:
        return None
    times = [e.expires_at_s for e in evaluation.loaded.entitlements.values()
             if e.expires_at_s is not None and e.expires_at_s > now_s]
    return min(times, default=None)
