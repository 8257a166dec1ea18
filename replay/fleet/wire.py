"""What a proxy reads per update under the ``shares`` design: the whole pool's ``LimitUpdate``, every proxy's share
in it (under ``counts`` it is one ``topics.counts.CountsRecord`` per pool).

``limit_update`` builds the record the agents publish (``topics.limits.build_limit_update``, its concurrency held
back by the agents) from a policy's grants, field for field, so its encoded size is the bytes every proxy reads
per tick. The model runs no tick of the policy core, so the signals are those of a tick with nothing measured
(debt 0, burst 0), the priority is the one in the fleet limits and the pool is never contended.
"""

from __future__ import annotations

from collections.abc import Mapping

from tokenpools.core.admission import EntitlementLimits
from tokenpools.core.capacity import Capacity
from tokenpools.topics.records import EntitlementLimit, LimitUpdate, ProxyShare


def limit_update(limits: Mapping[str, EntitlementLimits], pool: Capacity, mean_slo_ms: float,
                 shares: Mapping[str, Mapping[str, tuple[int, float, float]]], pool_slots: Mapping[str, int],
                 t_ms: int, pool_name: str = "pool") -> LimitUpdate:
    """The update of version ``t_ms`` (the window's end, as the agents number them) carrying ``shares``."""
    entitlements = tuple(
        EntitlementLimit(name=name, priority=lim.priority, debt=0.0, burst=0.0, tokens_per_s=lim.tokens_per_s,
                         kv_bytes=lim.kv_bytes, concurrency=lim.concurrency)
        for name, lim in sorted(limits.items())
    )
    proxies = tuple(
        ProxyShare(proxy_id=proxy, pool_concurrency=pool_slots[proxy], entitlements=dict(shares[proxy]))
        for proxy in sorted(shares)
    )
    return LimitUpdate(
        pool=pool_name, version=t_ms, t_ms=t_ms, contended=False, backend_waiting=0.0, mean_slo_ms=mean_slo_ms,
        capacity_tokens_per_s=pool.tokens_per_s, capacity_kv_bytes=pool.kv_bytes,
        capacity_concurrency=int(pool.concurrency), entitlements=entitlements, proxies=proxies,
    )
