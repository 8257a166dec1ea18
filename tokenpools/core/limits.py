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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.fairshare import round_down_fair, water_fill_values
from tokenpools.core.spec import EntitlementSpec
from tokenpools.core.split import hold_back_growth, split_across_proxies

__all__ = ["Allocation", "LimitConfig", "compute_limits", "elastic_shares", "hold_back_growth", "split_across_proxies",
           "yielding"]
# (the per-proxy split lives in ``core.split``; its two functions stay importable from here, where they were)


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
    """Effective per-entitlement limits for one tick. Pure; the order of ``entitlements`` breaks rounding ties.

    Names are unique (they key the result). Each entitlement's baseline, ceiling and demand are read once, as plain
    numbers (``_Rows``); the tiers work on lists indexed by rank, so no validated ``Capacity`` is built until the
    limits themselves."""
    order = sorted(entitlements, key=lambda e: (-priorities.get(e.name, 0.0), e.name))
    rows = _Rows(order, capacity.as_tuple(), priorities, demand, config.burst_headroom)
    per_dim: list[list[float]] = []
    lent: list[float] = []
    for dim in range(3):
        grants, lent_dim = _allocate_dimension(dim, rows, config.lend_idle_protected)
        per_dim.append(grants)
        lent.append(lent_dim)
    # concurrency is a whole number of sequences: round the float grants without exceeding their sum
    slots_wanted = dict(enumerate(per_dim[2]))
    slot_caps = {i: int(c[2] + 1e-9) for i, c in enumerate(rows.ceilings)}
    slot_total = int(sum(per_dim[2]) + 1e-6)
    slots = round_down_fair(slots_wanted, slot_caps, slot_total, range(len(order)))
    tokens, kv = per_dim[0], per_dim[1]
    limits = {name: Capacity(tokens[i], kv[i], float(slots[i])) for i, name in enumerate(rows.names)}
    contended = backend_waiting > 0 or _demand_exceeds(capacity, rows)
    return Allocation(limits, contended, Capacity.from_tuple(lent))


class _Rows:
    """The entitlements of one ``compute_limits`` call, in rank order, as plain numbers: names, baselines,
    ceilings, demand (None: unknown), priority weights, and who belongs to which tier."""

    __slots__ = ("names", "baselines", "ceilings", "demand", "weights", "pool", "headroom", "protected",
                 "elastic", "tiers", "may_burst")

    def __init__(self, order: list[EntitlementSpec], pool: tuple[float, float, float],
                 priorities: Mapping[str, float], demand: Mapping[str, Capacity | None], headroom: float) -> None:
        self.names = [e.name for e in order]
        self.baselines = [e.baseline.as_tuple() for e in order]
        self.ceilings = [e.ceiling_values(pool) for e in order]
        self.demand = [None if (d := demand.get(e.name)) is None else d.as_tuple() for e in order]
        self.weights = [max(priorities.get(e.name, 0.0), 1e-12) for e in order]
        self.pool = pool
        self.headroom = headroom
        classes = [e.service_class for e in order]
        self.protected = [i for i, c in enumerate(classes) if c.protected]
        self.elastic = [i for i, c in enumerate(classes) if c is ServiceClass.ELASTIC]
        self.tiers = [[i for i, c in enumerate(classes) if _TIER_OF_BURST.get(c) == tier] for tier in (2, 3, 4)]
        self.may_burst = [i for i, c in enumerate(classes) if c.may_burst]

    def wants(self, dim: int) -> list[float]:
        """What each asks for in ``dim``: its demand × (1 + headroom) (whole sequences for concurrency), or its
        baseline when the demand is unknown; never above its ceiling."""
        scale = 1.0 + self.headroom
        out = []
        for ceiling, base, d in zip(self.ceilings, self.baselines, self.demand):
            top = ceiling[dim]
            asked = base[dim] if d is None else d[dim] * scale
            if d is not None and dim == 2:  # whole sequences
                asked = math.ceil(asked - 1e-9)
            out.append(asked if asked < top else top)  # min(top, asked)
        return out


def _allocate_dimension(dim: int, rows: _Rows, lend_idle_protected: bool) -> tuple[list[float], float]:
    total = rows.pool[dim]
    baselines, weights = rows.baselines, rows.weights
    grants = [0.0] * len(rows.names)
    reserved = sum(baselines[i][dim] for i in rows.protected)
    lent = 0.0
    for i in rows.protected:
        base = baselines[i][dim]
        grants[i] = base
        d = rows.demand[i]
        if lend_idle_protected and d is not None:
            lent += max(0.0, base - d[dim])
    lent = min(lent, reserved)
    # what the pool has beyond the protected baselines *in use*: when the pool is smaller than the baselines
    # (outage, scaled below them) an idle baseline is only lendable as far as the pool physically has it
    free = max(0.0, total - (reserved - lent))
    wants = rows.wants(dim)

    def fill(members: list[int], target: list[float]) -> None:
        nonlocal free
        caps = [room if (room := target[i] - grants[i]) > 0.0 else 0.0 for i in members]
        for i, extra in zip(members, water_fill_values(free, [weights[i] for i in members], caps)):
            grants[i] += extra
            free -= extra
        free = max(0.0, free)

    elastic_target = [0.0] * len(grants)
    for i in rows.elastic:
        elastic_target[i] = min(wants[i], baselines[i][dim])
    fill(rows.elastic, elastic_target)
    bursts, spot, preemptible = rows.tiers
    fill(bursts, wants)
    # how much elastic holds together is settled (by class, above); how it is split among them is priority's
    elastic = rows.elastic
    if len(elastic) > 1:
        shares = elastic_shares(sum(grants[i] for i in elastic), [weights[i] for i in elastic],
                                [baselines[i][dim] for i in elastic], [wants[i] for i in elastic])
        for i, share in zip(elastic, shares):
            grants[i] = share
    fill(spot, wants)
    fill(preemptible, wants)
    fill(rows.may_burst, [c[dim] for c in rows.ceilings])
    return grants, lent


def elastic_shares(total: float, priorities: Sequence[float], baselines: Sequence[float],
                   wants: Sequence[float]) -> list[float]:
    """How the elastic entitlements split what they hold together in one dimension (docs/semantics.md#elastic-shares).

    Water-filling of ``total`` with weight w_e × baseline_e, each up to its want: with equal priorities the split
    follows the baselines; a higher priority gets a larger part of its baseline, and more than all of it when its
    priority wins the contended capacity. An entitlement ends above its baseline only if its priority is higher than
    that of every entitlement left below min(want, baseline): at the fill's level L each uncapped share is
    L·w·b, so a share above b means L·w > 1, and one below b means L·w' < 1, so w > w'. A zero baseline gets a tiny
    weight (it takes what the others cannot). Pure; the order of the inputs is the order of the result.
    """
    weights = [max(w, 1e-12) * (b if b > 0 else 1e-9) for w, b in zip(priorities, baselines)]
    return water_fill_values(total, weights, list(wants))


def yielding(entitlements: Sequence[EntitlementSpec], limits: Mapping[str, Capacity],
             priorities: Mapping[str, float], contended: bool) -> frozenset[str]:
    """The elastic entitlements that gave capacity they are promised to a higher priority this tick: a request of
    one of them refused at its concurrency limit is refused for low priority (``core.admission``), the paper's
    refusal for exactly this case (docs/semantics.md#elastic-shares). Only in a contended pool (``contended``, the
tick's flag, which the limit update carries): with capacity to spare every elastic entitlement has what it asks
for, and what is idle goes to whoever may burst. An entitlement is marked when all three hold:

    - its concurrency limit is below its baseline;
    - an elastic entitlement of higher priority holds a limit above its own baseline (what the re-split moves, it
      moves between elastic entitlements; a dedicated burst takes only capacity no elastic baseline asked for);
    - at the level the re-split filled to it would not have had one slot more had it asked for it:
      level × w_e × baseline_e < limit_e + 1, the level estimated as the largest limit_j ÷ (w_j × baseline_j) over
      the elastic entitlements (``elastic_shares`` gives an uncapped share level × w × baseline and a capped one
      less). A limit below the baseline because its own demand was small is not a priority's doing: its refusals
      stay ``concurrency``.

    Nobody is marked while a spot or preemptible entitlement holds a slot: those tiers are filled only after every
    elastic entitlement has its want (the level estimate alone would miss it when the bursters are all capped by
    their ceilings).

    Guaranteed and dedicated never yield (never below their baselines); spot and preemptible have no baseline to
    yield. Pure, O(E log E) from the published limits, priorities and baselines alone, so the replay's tick and a
    proxy reading a limit update compute the same set."""
    if not contended or any(e.service_class in _SERVED_LAST and limits[e.name].concurrency > 0
                            for e in entitlements if e.name in limits):
        # a slot held by spot or preemptible is one the re-split had left after every elastic want was met
        return frozenset()

    def weight(e: EntitlementSpec) -> float:
        return max(priorities.get(e.name, 0.0), 1e-12) * e.baseline.concurrency

    level = max((limits[e.name].concurrency / weight(e) for e in entitlements
                 if e.service_class is ServiceClass.ELASTIC and e.name in limits and e.baseline.concurrency > 0),
                default=0.0)
    ranked = sorted(entitlements, key=lambda e: -priorities.get(e.name, 0.0))
    out: set[str] = set()
    top_burster = None  # the highest priority seen so far among those above their baseline
    i = 0
    while i < len(ranked):
        j = i  # a run of equal priorities: none of them yields to another
        while j < len(ranked) and priorities.get(ranked[j].name, 0.0) == priorities.get(ranked[i].name, 0.0):
            j += 1
        group = ranked[i:j]
        if top_burster is not None:
            out.update(e.name for e in group
                       if e.service_class is ServiceClass.ELASTIC and e.name in limits
                       and limits[e.name].concurrency < e.baseline.concurrency - 1e-9
                       and level * weight(e) < limits[e.name].concurrency + 1.0)
        for e in group:
            if (e.service_class is ServiceClass.ELASTIC and e.name in limits
                    and limits[e.name].concurrency > e.baseline.concurrency + 1e-9):
                top_burster = e.name
        i = j
    return frozenset(out)


_SERVED_LAST = frozenset({ServiceClass.SPOT, ServiceClass.PREEMPTIBLE})


def _demand_exceeds(capacity: Capacity, rows: _Rows) -> bool:
    totals = [0.0, 0.0, 0.0]
    for base, d in zip(rows.baselines, rows.demand):
        values = base if d is None else d
        for i in range(3):
            totals[i] += values[i]
    return any(t > c * (1 + 1e-9) for t, c in zip(totals, capacity.as_tuple()) if c > 0)
