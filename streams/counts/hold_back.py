"""The hold-back of a moving per-proxy split (shares mode): a proxy may grow only into slots no other proxy holds.

A proxy enforces its share on new admissions only, and keeps admitting under its previous grant until the next
update reaches it, so what a proxy may hold is the larger of its in-flight level and its previous grant. Each
tick, every proxy's share of an entitlement's (and of the pool's) concurrency is held back to what the others
leave (``core.split.hold_back_growth``): a split that moves shrinks one replica at once and lets the other grow on
the next tick, never putting more than the limit in flight.

What the agents run is ``core.split.hold_back_shares``, on the tick's ``core.split.ProxySplit`` before it becomes
records; ``hold_back`` here is the same rule on a ``LimitUpdate`` (the reference the fleet model and the scripted
tests compare with), and ``grants_of`` the grants an update makes, which the next tick holds back against.
"""

from __future__ import annotations

from collections.abc import Mapping

from tokenpools.core.split import hold_back_growth
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
