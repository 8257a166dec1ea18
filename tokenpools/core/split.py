"""A limit split across a pool's proxy replicas by their recent demand, and held back while a moving split's
replicas still hold what they were granted before (shares mode: ``policy.fleet_enforcement=shares``).

The agents do this for every entitlement of a pool at every tick, P proxies each, so a split is kept as one
``Split``: the share most proxies get (every proxy without demand in the window gets the same one) and the
proxies that differ, and everything here works once per distinct share or per proxy that differs, never once per
proxy. Each rule has one implementation here, in the form the agents run it for a whole tick, and one form for a
single limit:

- the split: ``split_shares`` (``split_limits``: every entitlement's and the pool's, as a ``ProxySplit``;
  ``split_across_proxies``: one limit, proxy by proxy, as the proxies and the fleet model use it);
- the hold-back: ``hold_back_split`` (``hold_back_shares``: a whole ``ProxySplit``; ``hold_back_growth``: one
  limit, proxy by proxy).

The records they become are ``topics.limits``'s (``proxy_shares``, ``limit_update``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import NamedTuple

from tokenpools.core.capacity import Capacity


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
    split = split_shares(limit.tokens_per_s, limit.kv_bytes, limit.concurrency, proxy_index(proxies), demand_share,
                         floor_fraction)
    return {p: Capacity(tokens, kv, float(slots)) for p, (slots, tokens, kv) in zip(proxies, split.dense())}


Share = tuple[int, float, float]
"""One proxy's share of a limit: (concurrency slots, tokens/s, KV bytes), as a ``LimitUpdate`` carries it."""


class Split(NamedTuple):
    """One limit split across the live proxies, by position (``proxy_index``): ``common`` at every position but
    those in ``rest``. Most of a pool's proxies see no demand for a given entitlement in a window and get the same
    share, so a split holds one share per proxy with demand (and per proxy granted one slot more), not one per
    proxy; what works on it (the hold-back, the records, the grants) costs as much. (A NamedTuple: one is made per
    entitlement and tick; ``rest`` is never changed once made.)"""

    size: int
    common: Share
    rest: dict[int, Share]

    def at(self, position: int) -> Share:
        return self.rest.get(position, self.common)

    def dense(self) -> list[Share]:
        out = [self.common] * self.size
        for i, share in self.rest.items():
            out[i] = share
        return out


def proxy_index(proxies: Sequence[str]) -> dict[str, int]:
    """Every live proxy's position in id order: the positions of a ``Split``."""
    return {p: i for i, p in enumerate(sorted(proxies))}


def split_shares(tokens_per_s: float, kv_bytes: float, concurrency: float, index: Mapping[str, int],
                 demand: Mapping[str, float], floor_fraction: float = 0.1) -> Split:
    """``split_across_proxies`` as a ``Split`` over ``index`` (``proxy_index`` of every live proxy, built once
    for all the entitlements of a tick); ``demand`` may leave out the proxies without any (absent is 0; ids
    not in ``index`` are ignored).

    A share depends only on the proxy's fraction of the limit, and every proxy without demand has the same one, so
    the work is done once per distinct fraction (at most one more than the proxies with demand), O(k log k) for k
    proxies with demand, not sorts and a ``Capacity`` per proxy. Proxies of equal fraction are next to each other in
    both orders the rounding uses (by fraction, then id), so a group's spare slots go to its first members by id, as
    they would one proxy at a time.
    """
    if not 0 <= floor_fraction <= 1:
        raise ValueError(f"`floor_fraction` must be in [0, 1], got {floor_fraction}")
    n = len(index)
    if n == 0:
        return Split(0, (0, 0.0, 0.0), {})
    positive = dict(sorted([(i, v if v > 0.0 else 0.0) for p, v in demand.items() if (i := index.get(p)) is not None]))
    total_share = sum(positive.values())
    floor_part, equal = floor_fraction / n, 1 / n
    by_demand = 1 - floor_fraction

    idle = floor_part + by_demand * (0.0 / total_share if total_share > 0 else equal)  # every proxy without demand
    members: dict[float, list[int]] = {}  # fraction → its proxies (by id), but for the idle group's: implicit
    if total_share > 0:  # (else every proxy's fraction is the idle one)
        for i, share in positive.items():  # (in id order)
            f = floor_part + by_demand * (share / total_share)
            if f != idle:
                if (group := members.get(f)) is None:
                    members[f] = [i]
                else:
                    group.append(i)
    idle_count = n - sum(len(m) for m in members.values())
    groups = sorted([*members, idle] if idle_count else members, reverse=True)  # largest fraction first
    counts = [idle_count if f == idle else len(members[f]) for f in groups]
    base, ups = _group_slots(groups, counts, int(concurrency + 1e-9), n)
    plain: list[Share] = [(b, tokens_per_s * f, kv_bytes * f) for b, f in zip(base, groups)]
    up: list[Share] = [(b + 1, tokens, kv) for b, tokens, kv in plain]
    shares: dict[int, Share] = {}
    if idle_count:  # every proxy in no other group; its first ``ups`` by id get one more slot
        g = groups.index(idle)
        common, more = plain[g], ups[g]
        if more > idle_count - more:  # most of them: the one more is the common share
            common, more = up[g], idle_count - more
        if more:  # the first ``more`` idle positions by id get ``up`` (or the last ones keep ``plain``)
            taken = sorted(i for m in members.values() for i in m)
            if common is plain[g]:
                end = more
                for i in taken:
                    if i >= end:
                        break
                    end += 1
                span, other = range(end), up[g]
            else:
                start = n - more
                for i in reversed(taken):
                    if i < start:
                        break
                    start -= 1
                span, other = range(start, n), plain[g]
            shares.update(dict.fromkeys(set(span).difference(taken), other))
    else:
        common = plain[0]
    for g, f in enumerate(groups):
        if f != idle:
            group = members[f]
            shares.update(dict.fromkeys(group[:ups[g]], up[g]))
            if plain[g] is not common:
                shares.update(dict.fromkeys(group[ups[g]:], plain[g]))
    return Split(n, common, shares)


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
    split = Split(len(proxies), (0, 0.0, 0.0), {i: (targets[p], 0.0, 0.0) for i, p in enumerate(proxies) if p in targets})
    held = {i: h for i, p in enumerate(proxies) if (h := in_flight.get(p, 0))}
    granted = hold_back_split(limit_slots, split, held)
    return {p: granted.at(i)[0] for i, p in enumerate(proxies) if p in targets}


def hold_back_split(limit_slots: int, split: Split, held: Mapping[int, int]) -> Split:
    """``hold_back_growth`` of a split's targets, with ``held`` by position, only where a proxy holds any (inputs
    >= 0, not checked: the caller's own split and levels).

    While what the proxies hold, Σ max(target, held), stays within the limit every proxy gets its target and the
    same split comes back. Otherwise each may have what it holds less the excess, at most its target; one that
    holds no more than its target gets target − excess: the same for every proxy of a share, so the common share
    is cut once and only the rest and the holders are looked at, one by one."""
    common, rest = split.common, split.rest
    total = (split.size - len(rest)) * common[0]
    for share in rest.values():
        total += share[0]
    for i, h in held.items():
        target = rest.get(i, common)[0]
        if h > target:
            total += h - target
    if total <= limit_slots:
        return split
    excess = total - limit_slots  # limit − Σ_{q≠p} held_q = held_p − excess
    cuts: dict[int, Share] = {}  # id(share) → the share cut by the excess (a split has few distinct shares)
    grant = common[0] - excess
    new_common = cuts[id(common)] = ((grant if grant > 0 else 0), common[1], common[2])
    shares: dict[int, Share] = {}
    for i, share in rest.items():
        if i not in held:
            kept = cuts.get(id(share))
            if kept is None:
                grant = share[0] - excess
                kept = cuts[id(share)] = ((grant if grant > 0 else 0), share[1], share[2])
            shares[i] = kept
    for i, h in held.items():
        share = rest.get(i, common)
        target = share[0]
        if h > target:
            grant = h - excess
            shares[i] = share if grant >= target else ((grant if grant > 0 else 0), share[1], share[2])
            continue
        kept = cuts.get(id(share))
        if kept is None:
            grant = target - excess
            kept = cuts[id(share)] = ((grant if grant > 0 else 0), share[1], share[2])
        if kept is not new_common:
            shares[i] = kept
    return Split(split.size, new_common, shares)


@dataclass(frozen=True, slots=True)
class ProxySplit:
    """Every live proxy's share of each entitlement's limits and of the pool's concurrency, entitlement by
    entitlement (``core.split.Split``: a common share and the proxies that differ): the layout the split and the
    agents' hold-back compute in. ``topics.limits.proxy_shares`` turns it into a ``LimitUpdate``'s ``proxies`` (one
    ``ProxyShare`` per proxy), ``grants`` into what the next hold-back needs."""

    proxies: tuple[str, ...]  # every live proxy, sorted by id: the splits' positions
    shares: dict[str, Split]  # entitlement → its split, in the tick's order
    pool: Split  # the pool's concurrency (the shares' slots)

    def grants(self) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
        """(entitlement → proxy → slots, proxy → pool slots): ``streams.hold_back.grants_of`` of its records.
        Each map is a copy of one with every proxy at the common slots (copying a dict is much cheaper than
        building it), the rest put in."""
        every: dict[int, dict[str, int]] = {}  # common slots → every proxy at them

        def slots(split: Split) -> dict[str, int]:
            same = every.get(split.common[0])
            if same is None:
                same = every[split.common[0]] = dict.fromkeys(self.proxies, split.common[0])
            out = same.copy()
            for i, share in split.rest.items():
                out[self.proxies[i]] = share[0]
            return out

        return {name: slots(split) for name, split in self.shares.items()}, slots(self.pool)


def split_limits(limits: Mapping[str, Capacity], capacity: Capacity, proxies: Sequence[str],
                 demand: Mapping[str, Mapping[str, float]], totals: Mapping[str, float],
                 floor_fraction: float = 0.1) -> ProxySplit:
    """Every entitlement's limit and the pool's capacity split across ``proxies`` (every live one) by demand
    (``split_shares``). ``demand`` is entitlement → proxy → that proxy's recent demand, only where
    there was any; ``totals`` proxy → its demand over all entitlements (the pool's split)."""
    index = proxy_index(proxies)
    pool = split_shares(capacity.tokens_per_s, capacity.kv_bytes, capacity.concurrency, index, totals, floor_fraction)
    empty: Mapping[str, float] = {}
    shares = {name: split_shares(limit.tokens_per_s, limit.kv_bytes, limit.concurrency, index,
                                 demand.get(name, empty), floor_fraction)
              for name, limit in limits.items()}
    return ProxySplit(tuple(index), shares, pool)


def hold_back_shares(split: ProxySplit, limits: Mapping[str, Capacity], pool_slots: int,
                     in_flight: Mapping[str, Mapping[str, int]], granted: Mapping[str, Mapping[str, int]],
                     pool_granted: Mapping[str, int]) -> ProxySplit:
    """The hold-back of a whole tick's split, what the agents run (``streams.hold_back.hold_back`` is the same on
    the record the split makes): for each entitlement, what the proxies hold is looked up only where there is any
    (a previous grant, an in-flight level) and held against its split by ``hold_back_split``. ``limits`` are the
    tick's (the update's concurrency is their whole slots), ``pool_slots`` the update's pool concurrency."""
    at = {p: i for i, p in enumerate(split.proxies)}
    nothing: Mapping[str, int] = {}
    shares = {name: hold_back_split(int(limits[name].concurrency), column,
                                    _held(at, granted.get(name, nothing), in_flight.get(name, nothing)))
              for name, column in split.shares.items()}
    level: dict[str, int] = {}
    for per_proxy in in_flight.values():
        for proxy, n in per_proxy.items():
            level[proxy] = level.get(proxy, 0) + n
    return ProxySplit(split.proxies, shares, hold_back_split(pool_slots, split.pool, _held(at, pool_granted, level)))


def _held(at: Mapping[str, int], granted: Mapping[str, int], in_flight: Mapping[str, int]) -> dict[int, int]:
    """Position → what the live proxy there may hold, max(previous grant, in flight), where it is not 0."""
    held = ({i: granted[p] for p in compress(granted, granted.values()) if (i := at.get(p)) is not None}
            if any(granted.values()) else {})  # (a grant map is often all 0: looking is cheaper than collecting)
    for proxy, n in in_flight.items():
        if (i := at.get(proxy)) is not None and n > held.get(i, 0):
            held[i] = n
    return held
