"""Per-tick effective limits: from measured demand and the pool's capacity to a ceiling per entitlement.

Each of the three dimensions (tokens/s, KV bytes, concurrency) is allocated independently by the same tiers:

0. protected baselines (dedicated, guaranteed) are reserved in full and never shrunk;
   the part of a protected baseline its owner does not currently demand is *lent* to the tiers below
   (``lend_idle_protected``, off by default; the owner gets it back through the admission priority check at once,
   and for good at the next tick). Off by default because a borrower that cannot be preempted holds the slot until
   its request ends, which is the protected tenant's latency (the replay of Exp 1 shows guaranteed P99 TTFT 2.1 s
   with lending against 0.14 s without); turn it on for utilisation when that is acceptable;
1. elastic baselines, up to what each demands, shared by priority weight when they do not all fit;
2. bursts of dedicated and elastic above their baselines;
3. spot; 4. preemptible (squeezed first, so served last);
5. whatever is still idle goes to every entitlement allowed to burst, by priority weight, up to its ceiling, so that
   fresh demand finds headroom.

Within a tier the split is weighted water-filling by priority w_e; guaranteed is capped at its baseline; every other
class at its burst ceiling (or the pool). An entitlement whose demand is unknown is assumed to want its baseline.
A measured concurrency demand is a time-weighted average; since a sequence needs a whole slot, the concurrency
an entitlement wants is rounded up to whole slots (otherwise a higher priority wanting 0.3 of a slot could round to
0 slots while a lower one rounds up to 1).

The pool is *contended* when demand exceeds capacity in any dimension, or the backend reports a waiting queue.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.fairshare import Claim, round_down_fair, water_fill
from tokenpools.core.spec import EntitlementSpec


@dataclass(frozen=True, slots=True)
class LimitConfig:
    """Knobs of the limit policy."""

    lend_idle_protected: bool = False
    burst_headroom: float = 0.25  # a bursting entitlement asks for its demand × (1 + headroom)

    def __post_init__(self) -> None:
        if self.burst_headroom < 0:
            raise ValueError(f"`burst_headroom` must be >= 0, got {self.burst_headroom}")


@dataclass(frozen=True, slots=True)
class Allocation:
    limits: dict[str, Capacity]
    contended: bool
    lent: Capacity  # idle protected capacity lent to others in this tick


_TIER_OF_BURST = {
    ServiceClass.DEDICATED: 2,
    ServiceClass.ELASTIC: 2,
    ServiceClass.SPOT: 3,
    ServiceClass.PREEMPTIBLE: 4,
}


def compute_limits(
    capacity: Capacity,
    entitlements: list[EntitlementSpec],
    priorities: Mapping[str, float],
    demand: Mapping[str, Capacity | None],
    config: LimitConfig = LimitConfig(),
    backend_waiting: int = 0,
) -> Allocation:
    """Effective per-entitlement limits for one tick. Pure; the order of ``entitlements`` breaks rounding ties."""
    order = sorted(entitlements, key=lambda e: (-priorities.get(e.name, 0.0), e.name))
    per_dim: list[dict[str, float]] = []
    lent: list[float] = []
    for dim in range(3):
        grants, lent_dim = _allocate_dimension(dim, capacity, order, priorities, demand, config)
        per_dim.append(grants)
        lent.append(lent_dim)
    # concurrency is a whole number of sequences: round the float grants without exceeding their sum
    slot_caps = {e.name: int(e.ceiling(capacity).concurrency + 1e-9) for e in order}
    slot_total = int(sum(per_dim[2].values()) + 1e-6)
    slots = round_down_fair(per_dim[2], slot_caps, slot_total, [e.name for e in order])
    limits = {
        e.name: Capacity(per_dim[0][e.name], per_dim[1][e.name], float(slots[e.name])) for e in order
    }
    contended = backend_waiting > 0 or _demand_exceeds(capacity, order, demand)
    return Allocation(limits, contended, Capacity.from_tuple(lent))


def _want(spec: EntitlementSpec, dim: int, pool: Capacity, demand: Capacity | None, headroom: float) -> float:
    ceiling = spec.ceiling(pool).as_tuple()[dim]
    if demand is None:
        return min(ceiling, spec.baseline.as_tuple()[dim])
    asked = demand.as_tuple()[dim] * (1.0 + headroom)
    if dim == 2:  # whole sequences
        asked = math.ceil(asked - 1e-9)
    return min(ceiling, asked)


def _allocate_dimension(
    dim: int,
    capacity: Capacity,
    order: list[EntitlementSpec],
    priorities: Mapping[str, float],
    demand: Mapping[str, Capacity | None],
    config: LimitConfig,
) -> tuple[dict[str, float], float]:
    total = capacity.as_tuple()[dim]
    grants = {e.name: 0.0 for e in order}
    protected = [e for e in order if e.service_class.protected]
    reserved = sum(e.baseline.as_tuple()[dim] for e in protected)
    lent = 0.0
    for e in protected:
        base = e.baseline.as_tuple()[dim]
        grants[e.name] = base
        d = demand.get(e.name)
        if config.lend_idle_protected and d is not None:
            lent += max(0.0, base - d.as_tuple()[dim])
    lent = min(lent, reserved)
    # what the pool has beyond the protected baselines *in use*: when the pool is smaller than the baselines
    # (outage, scaled below them) an idle baseline is only lendable as far as the pool physically has it
    free = max(0.0, total - (reserved - lent))
    weight = {e.name: max(priorities.get(e.name, 0.0), 1e-12) for e in order}
    ceilings = {e.name: e.ceiling(capacity).as_tuple()[dim] for e in order}
    wants = {e.name: _want(e, dim, capacity, demand.get(e.name), config.burst_headroom) for e in order}

    def fill(members: list[EntitlementSpec], target: Mapping[str, float]) -> None:
        nonlocal free
        claims = {e.name: Claim(weight[e.name], max(0.0, target[e.name] - grants[e.name])) for e in members}
        for name, extra in water_fill(free, claims).items():
            grants[name] += extra
            free -= extra
        free = max(0.0, free)

    elastic = [e for e in order if e.service_class is ServiceClass.ELASTIC]
    fill(elastic, {e.name: min(wants[e.name], e.baseline.as_tuple()[dim]) for e in elastic})
    for tier in (2, 3, 4):
        members = [e for e in order if _TIER_OF_BURST.get(e.service_class) == tier]
        fill(members, wants)
    fill([e for e in order if e.service_class.may_burst], ceilings)
    return grants, lent


def _demand_exceeds(capacity: Capacity, order: list[EntitlementSpec], demand: Mapping[str, Capacity | None]) -> bool:
    totals = [0.0, 0.0, 0.0]
    for e in order:
        d = demand.get(e.name)
        values = e.baseline.as_tuple() if d is None else d.as_tuple()
        for i in range(3):
            totals[i] += values[i]
    return any(t > c * (1 + 1e-9) for t, c in zip(totals, capacity.as_tuple()) if c > 0)


def split_across_proxies(limit: Capacity, demand_share: Mapping[str, float], floor_fraction: float = 0.1) -> dict[str, Capacity]:
    """Split one entitlement's limit across proxy replicas by their recent share of its demand.

    Every live proxy first gets ``floor_fraction``/N of the limit (so a replica that sees its first request can
    still admit it); the rest follows the demand shares (equal when none is known). Tokens/s and KV add up to the
    limit exactly; concurrency is whole slots adding up to the limit, each proxy getting at least one while the
    limit has one per proxy.
    """
    if not demand_share:
        return {}
    if not 0 <= floor_fraction <= 1:
        raise ValueError(f"`floor_fraction` must be in [0, 1], got {floor_fraction}")
    proxies = sorted(demand_share)
    n = len(proxies)
    positive = {p: max(0.0, demand_share[p]) for p in proxies}
    total_share = sum(positive.values())
    fractions = {
        p: floor_fraction / n + (1 - floor_fraction) * (positive[p] / total_share if total_share > 0 else 1 / n)
        for p in proxies
    }
    slots_total = int(limit.concurrency + 1e-9)
    if slots_total >= n:
        base = {p: 1 for p in proxies}
        extra = {p: fractions[p] * (slots_total - n) for p in proxies}
        extra_int = round_down_fair(extra, {p: slots_total for p in proxies}, slots_total - n,
                                    sorted(proxies, key=lambda p: -fractions[p]))
        slots = {p: base[p] + extra_int[p] for p in proxies}
    else:  # fewer slots than proxies: one each to the proxies with the largest shares
        ranked = sorted(proxies, key=lambda p: -fractions[p])
        slots = {p: 1 if i < slots_total else 0 for i, p in enumerate(ranked)}
    return {
        p: Capacity(limit.tokens_per_s * fractions[p], limit.kv_bytes * fractions[p], float(slots[p])) for p in proxies
    }


def hold_back_growth(limit_slots: int, targets: Mapping[str, int], in_flight: Mapping[str, int]) -> dict[str, int]:
    """The concurrency each proxy may be granted now, so that a moving split never puts more than the limit in flight.

    A proxy enforces its share on new admissions only: when the split moves (say 3/3 → 5/1) the replica whose share
    shrank keeps what it admitted under the old share until those requests end, and a replica granted its new share
    at once would put up to limit + Δshare in flight. So a proxy may grow only into slots no other proxy holds::

        grant_p = max(0, min(target_p, limit − Σ_{q≠p} max(target_q, in_flight_q)))

    ``targets`` are the split's whole slots per proxy (``split_across_proxies``); ``in_flight`` what each proxy has
    admitted and not yet completed, as last reported (a proxy absent from ``targets`` holds its in-flight and gets
    nothing; absent from ``in_flight`` means none). A shrinking proxy gets its new target at once; a growing one
    gets the rest of its target on a later tick, as the others' requests end.

    Invariant (tests/unit/test_core_limits_split.py): grant_p ≤ target_p, and whenever the in-flight reports are
    current, Σ_p max(grant_p, in_flight_p) ≤ max(limit, Σ_p in_flight_p) — what the proxies can have in flight
    together never exceeds the limit, unless it already did before this split (then nobody grows).
    """
    if limit_slots < 0:
        raise ValueError(f"`limit_slots` must be >= 0, got {limit_slots}")
    for name, mapping in (("targets", targets), ("in_flight", in_flight)):
        if any(v < 0 for v in mapping.values()):
            raise ValueError(f"`{name}` must be >= 0 per proxy, got {dict(mapping)}")
    held = {p: max(targets.get(p, 0), in_flight.get(p, 0)) for p in {*targets, *in_flight}}
    total_held = sum(held.values())
    return {p: max(0, min(t, limit_slots - (total_held - held[p]))) for p, t in targets.items()}
