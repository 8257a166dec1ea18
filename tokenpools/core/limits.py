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
            if d is None:
                out.append(min(ceiling[dim], base[dim]))
                continue
            asked = d[dim] * scale
            if dim == 2:  # whole sequences
                asked = math.ceil(asked - 1e-9)
            out.append(min(ceiling[dim], asked))
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
        claims = {i: Claim(weights[i], max(0.0, target[i] - grants[i])) for i in members}
        for i, extra in water_fill(free, claims).items():
            grants[i] += extra
            free -= extra
        free = max(0.0, free)

    elastic_target = [0.0] * len(grants)
    for i in rows.elastic:
        elastic_target[i] = min(wants[i], baselines[i][dim])
    fill(rows.elastic, elastic_target)
    for members in rows.tiers:
        fill(members, wants)
    fill(rows.may_burst, [c[dim] for c in rows.ceilings])
    return grants, lent


def _demand_exceeds(capacity: Capacity, rows: _Rows) -> bool:
    totals = [0.0, 0.0, 0.0]
    for base, d in zip(rows.baselines, rows.demand):
        values = base if d is None else d
        for i in range(3):
            totals[i] += values[i]
    return any(t > c * (1 + 1e-9) for t, c in zip(totals, capacity.as_tuple()) if c > 0)


def split_across_proxies(limit: Capacity, demand_share: Mapping[str, float], floor_fraction: float = 0.1) -> dict[str, Capacity]:
    """Split one entitlement's limit across proxy replicas by their recent share of its demand.

    Every live proxy first gets ``floor_fraction``/N of the limit (so a replica that sees its first request can
    still admit it); the rest follows the demand shares (equal when none is known). Tokens/s and KV add up to the
    limit exactly; concurrency is whole slots adding up to the limit, each proxy getting at least one while the
    limit has one per proxy. (``split_shares`` computes it; this is its form with a ``Capacity`` per proxy.)
    """
    if not demand_share:
        return {}
    proxies = sorted(demand_share)
    shares = split_shares(limit.tokens_per_s, limit.kv_bytes, limit.concurrency, proxy_index(proxies), demand_share,
                          floor_fraction)
    return {p: Capacity(tokens, kv, float(slots)) for p, (slots, tokens, kv) in zip(proxies, shares)}


Share = tuple[int, float, float]
"""One proxy's share of a limit: (concurrency slots, tokens/s, KV bytes), as a ``LimitUpdate`` carries it."""


def proxy_index(proxies: Sequence[str]) -> dict[str, int]:
    """Every live proxy's position in id order: the layout ``split_shares`` aligns its result with."""
    return {p: i for i, p in enumerate(sorted(proxies))}


def split_shares(tokens_per_s: float, kv_bytes: float, concurrency: float, index: Mapping[str, int],
                 demand: Mapping[str, float], floor_fraction: float = 0.1) -> list[Share]:
    """``split_across_proxies`` as shares aligned with ``index`` (``proxy_index`` of every live proxy, built once
    for all the entitlements of a tick); ``demand`` may leave out the proxies without any (absent is 0; ids
    not in ``index`` are ignored).

    A share depends only on the proxy's fraction of the limit, and every proxy without demand has the same one, so
    the work is done once per distinct fraction (at most one more than the proxies with demand): O(P) to lay out
    the result (a list repeat) plus O(k log k) for k proxies with demand, not sorts and a ``Capacity`` per proxy.
    Proxies of equal fraction are next to each other in both orders the rounding uses (by fraction, then id), so a
    group's spare slots go to its first members by id, as they would one proxy at a time.
    """
    if not 0 <= floor_fraction <= 1:
        raise ValueError(f"`floor_fraction` must be in [0, 1], got {floor_fraction}")
    n = len(index)
    if n == 0:
        return []
    positive = {index[p]: (v if (v := demand[p]) > 0.0 else 0.0) for p in sorted(demand) if p in index}
    total_share = sum(positive.values())
    floor_part, equal = floor_fraction / n, 1 / n
    rest = 1 - floor_fraction

    idle = floor_part + rest * (0.0 / total_share if total_share > 0 else equal)  # every proxy without demand
    members: dict[float, list[int]] = {}  # fraction → its proxies (by id), but for the idle group's: implicit
    for i, share in sorted(positive.items()):
        f = floor_part + rest * (share / total_share if total_share > 0 else equal)
        if f != idle:
            members.setdefault(f, []).append(i)
    idle_count = n - sum(len(m) for m in members.values())
    groups = sorted([*members, idle] if idle_count else members, reverse=True)  # largest fraction first
    counts = [idle_count if f == idle else len(members[f]) for f in groups]
    base, ups = _group_slots(groups, counts, int(concurrency + 1e-9), n)
    plain: list[Share] = [(b, tokens_per_s * f, kv_bytes * f) for b, f in zip(base, groups)]
    up: list[Share] = [(b + 1, tokens, kv) for b, tokens, kv in plain]
    out = [plain[groups.index(idle) if idle_count else 0]] * n  # without an idle group, all set below
    if idle_count and (end := ups[groups.index(idle)]):
        # the idle group is every proxy in no other group: its first ``ups`` by id get one more slot
        for i in sorted(i for m in members.values() for i in m):
            if i >= end:
                break
            end += 1
        out[:end] = [up[groups.index(idle)]] * end  # (the other groups' proxies in there are set below)
    for g, f in enumerate(groups):
        if f != idle:
            for k, i in enumerate(members[f]):
                out[i] = up[g] if k < ups[g] else plain[g]
    return out


def _group_slots(groups: list[float], counts: list[int], slots_total: int, n: int) -> tuple[list[int], list[int]]:
    """Whole slots per fraction group (largest fraction first, ``counts`` proxies each): every member's base, and
    how many of its first members get one more. The same arithmetic as one proxy at a time: with a slot per proxy,
    1 + ``round_down_fair`` of fraction × the slots beyond one each (a group's rank is its first member's);
    with fewer slots than proxies, one each to the first proxies by fraction."""
    if slots_total < n:
        ups, left = [], slots_total
        for count in counts:
            ups.append(min(left, count))
            left -= ups[-1]
        return [0] * len(groups), ups
    beyond = slots_total - n
    extras = [f * beyond for f in groups]
    whole = [min(slots_total, math.floor(x + 1e-9)) for x in extras]
    spare = beyond - sum(c * w for c, w in zip(counts, whole))
    starts = [0]
    for count in counts[:-1]:
        starts.append(starts[-1] + count)
    ups = [0] * len(groups)
    for g in sorted(range(len(groups)), key=lambda g: (-(extras[g] - math.floor(extras[g] + 1e-9)), starts[g])):
        if spare <= 0:
            break
        if extras[g] - whole[g] > 1e-9 and whole[g] < slots_total:
            ups[g] = min(spare, counts[g])
            spare -= ups[g]
    return [1 + w for w in whole], ups


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
    proxies = [*targets, *(p for p in in_flight if p not in targets)]
    shares = hold_back_shares(limit_slots, [(targets.get(p, 0), 0.0, 0.0) for p in proxies],
                              [in_flight.get(p, 0) for p in proxies])
    return {p: share[0] for p, share in zip(targets, shares)}


def hold_back_shares(limit_slots: int, shares: list[Share], held: list[int]) -> list[Share]:
    """``hold_back_growth`` of the targets ``shares`` (their slots), with ``held`` aligned by proxy (a proxy that
    only holds has a share of 0 slots). Inputs >= 0, not checked: the caller's own split and levels.

    While what the proxies hold, Σ max(target, held), stays within the limit every proxy gets its target and the
    same list comes back; otherwise a share whose slots change is rebuilt. (Comparisons, not ``max``/``min``
    calls: this runs once per entitlement and proxy in a shares-mode tick.)"""
    total = 0
    for (target, _, _), h in zip(shares, held):
        total += h if h > target else target
    if total <= limit_slots:
        return shares
    excess = total - limit_slots  # a proxy may have what it holds less the excess: limit − Σ_{q≠p} held_q
    out = []
    for share, h in zip(shares, held):
        target = share[0]
        grant = (h if h > target else target) - excess
        out.append(share if grant >= target else ((grant if grant > 0 else 0), share[1], share[2]))
    return out
