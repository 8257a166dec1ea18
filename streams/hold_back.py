"""The hold-back of a moving per-proxy split (shares mode): a proxy may grow only into slots no other proxy holds.

A proxy enforces its share on new admissions only, and keeps admitting under its previous grant until the next
update reaches it, so what a proxy may hold is the larger of its in-flight level and its previous grant. Each
tick, every proxy's share of an entitlement's (and of the pool's) concurrency is held back to what the others
leave (``core.split.hold_back_growth``): a split that moves shrinks one replica at once and lets the other grow on
the next tick, never putting more than the limit in flight.

``hold_back_shares`` is what the agents run, on the tick's ``topics.limits.ProxySplit`` before it becomes records;
``hold_back`` is the same on a ``LimitUpdate`` (the reference the fleet model and the scripted tests compare with),
and ``grants_of`` the grants an update makes, which the next tick holds back against.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import compress

from tokenpools.core.capacity import Capacity
from tokenpools.core.split import hold_back_growth, hold_back_split
from tokenpools.topics.limits import ProxySplit
from tokenpools.topics.records import LimitUpdate


def hold_back(update: LimitUpdate, in_flight: Mapping[str, Mapping[str, int]],
              granted: Mapping[str, Mapping[str, int]] | None = None,
              pool_granted: Mapping[str, int] | None = None) -> LimitUpdate:
    """The update with each proxy's concurrency shares held back to what the other proxies may hold.

    What a proxy may hold is the larger of its in-flight level and its previous grant (``granted``: entitlement →
    proxy → slots of the last update; ``pool_granted``: proxy → pool slots): until this update reaches it, a
    proxy keeps admitting under its previous grant. So a split that moves shrinks the one replica at once and
    lets the other grow on the next tick, into slots the first no longer holds.
    """
    if not update.proxies:
        return update
    granted, pool_granted = granted or {}, pool_granted or {}
    shares = {s.proxy_id: dict(s.entitlements) for s in update.proxies}
    for e in update.entitlements:
        targets = {s.proxy_id: s.entitlements[e.name][0] for s in update.proxies if e.name in s.entitlements}
        levels, before = in_flight.get(e.name, {}), granted.get(e.name, {})
        held = {p: max(levels.get(p, 0), before.get(p, 0)) for p in shares}
        for proxy, slots in hold_back_growth(e.concurrency, targets, held).items():
            _, tokens_per_s, kv_bytes = shares[proxy][e.name]
            shares[proxy][e.name] = (slots, tokens_per_s, kv_bytes)
    pool_held = {p: max(sum(c.get(p, 0) for c in in_flight.values()), pool_granted.get(p, 0)) for p in shares}
    pool_targets = {s.proxy_id: s.pool_concurrency for s in update.proxies}
    pool_shares = hold_back_growth(update.capacity_concurrency, pool_targets, pool_held)
    proxies = tuple(s.model_copy(update={"pool_concurrency": pool_shares[s.proxy_id],
                                         "entitlements": shares[s.proxy_id]}) for s in update.proxies)
    return update.model_copy(update={"proxies": proxies})


def grants_of(update: LimitUpdate) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """(entitlement → proxy → slots, proxy → pool slots) that ``update`` grants: the next tick's ``hold_back``."""
    granted: dict[str, dict[str, int]] = {}
    for share in update.proxies:
        for name, (slots, _, _) in share.entitlements.items():
            granted.setdefault(name, {})[share.proxy_id] = slots
    return granted, {s.proxy_id: s.pool_concurrency for s in update.proxies}


def hold_back_shares(split: ProxySplit, limits: Mapping[str, Capacity], pool_slots: int,
                     in_flight: Mapping[str, Mapping[str, int]], granted: Mapping[str, Mapping[str, int]],
                     pool_granted: Mapping[str, int]) -> ProxySplit:
    """``hold_back`` of the update ``split`` makes, on the split itself (what the agents run): for each entitlement,
    what the proxies hold is looked up only where there is any (a previous grant, an in-flight level) and held
    against its split by ``core.split.hold_back_split``. ``limits`` are the tick's (the update's concurrency is
    their whole slots), ``pool_slots`` the update's pool concurrency."""
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
