"""Between the core's tick result and the limit-update record: building one (agents) and reading one's share
(proxies). Both sides use these two functions, so the split a proxy enforces is the split the agents computed.
"""

from __future__ import annotations

from collections.abc import Mapping

from tokenpools.core.admission import EntitlementLimits
from tokenpools.core.capacity import Capacity
from tokenpools.core.limits import split_across_proxies
from tokenpools.core.tick import TickResult
from tokenpools.topics.records import EntitlementLimit, LimitUpdate, ProxyShare


def build_limit_update(
    pool: str,
    version: int,
    t_ms: int,
    tick: TickResult,
    capacity: Capacity,
    mean_slo_ms: float,
    proxy_demand: Mapping[str, Mapping[str, float]],
    backend_waiting: float = 0.0,
    floor_fraction: float = 0.1,
) -> LimitUpdate:
    """``proxy_demand`` maps proxy id → entitlement → that proxy's recent demand (e.g. attempts in the window);
    every live proxy must appear, with an empty mapping if it saw nothing.
    """
    entitlements = tuple(
        EntitlementLimit(
            name=name,
            priority=tick.priorities[name],
            debt=tick.signals[name].debt,
            burst=tick.signals[name].burst,
            tokens_per_s=limit.tokens_per_s,
            kv_bytes=limit.kv_bytes,
            concurrency=int(limit.concurrency),
        )
        for name, limit in sorted(tick.limits.items())
    )
    proxies: tuple[ProxyShare, ...] = ()
    if proxy_demand:
        shares: dict[str, dict[str, tuple[int, float, float]]] = {p: {} for p in proxy_demand}
        totals = {p: sum(d.values()) for p, d in proxy_demand.items()}
        pool_split = split_across_proxies(capacity, totals, floor_fraction)
        for name, limit in tick.limits.items():
            split = split_across_proxies(limit, {p: d.get(name, 0.0) for p, d in proxy_demand.items()}, floor_fraction)
            for proxy_id, part in split.items():
                shares[proxy_id][name] = (int(part.concurrency), part.tokens_per_s, part.kv_bytes)
        proxies = tuple(
            ProxyShare(proxy_id=p, pool_concurrency=int(pool_split[p].concurrency), entitlements=shares[p])
            for p in sorted(shares)
        )
    return LimitUpdate(
        pool=pool,
        version=version,
        t_ms=t_ms,
        contended=tick.contended,
        backend_waiting=backend_waiting,
        mean_slo_ms=mean_slo_ms,
        capacity_tokens_per_s=capacity.tokens_per_s,
        capacity_kv_bytes=capacity.kv_bytes,
        capacity_concurrency=int(capacity.concurrency),
        entitlements=entitlements,
        proxies=proxies,
    )


def limits_for_proxy(update: LimitUpdate, proxy_id: str) -> tuple[dict[str, EntitlementLimits], int] | None:
    """The limits this proxy enforces and its share of the pool's concurrency.

    An update without per-proxy shares applies whole (one proxy). An update with shares that do not include this
    proxy returns None: the proxy keeps what it has until an update counts it in (it heartbeats first).
    """
    if not update.proxies:
        return (
            {
                e.name: EntitlementLimits(e.concurrency, e.tokens_per_s, e.kv_bytes, e.priority)
                for e in update.entitlements
            },
            update.capacity_concurrency,
        )
    share = next((p for p in update.proxies if p.proxy_id == proxy_id), None)
    if share is None:
        return None
    result = {}
    for e in update.entitlements:
        concurrency, tokens_per_s, kv_bytes = share.entitlements.get(e.name, (0, 0.0, 0.0))
        result[e.name] = EntitlementLimits(concurrency, tokens_per_s, kv_bytes, e.priority)
    return result, share.pool_concurrency
