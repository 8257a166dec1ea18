"""What a proxy reads per update under the ``shares`` design: the whole pool's ``LimitUpdate``, every proxy's share
in it (under ``counts`` it is one ``topics.counts.CountsRecord`` per pool).

``limit_update`` builds the record with the agents' own encoder (``topics.limits.limit_update``, its concurrency
held back by the agents) from a policy's grants, so its encoded size is the bytes every proxy reads per tick. The
model runs no tick of the policy core, so the tick it encodes is one with nothing measured (debt 0, burst 0), the
priority the one in the fleet limits, the pool never contended.
"""

from __future__ import annotations

from collections.abc import Mapping

from tokenpools.core.admission import EntitlementLimits
from tokenpools.core.capacity import Capacity
from tokenpools.core.split import ProxySplit, Share, Split
from tokenpools.core.tick import Signals, TickResult
from tokenpools.topics.limits import limit_update as encode_limit_update
from tokenpools.topics.records import LimitUpdate


def limit_update(limits: Mapping[str, EntitlementLimits], pool: Capacity, mean_slo_ms: float,
                 shares: Mapping[str, Mapping[str, Share]], pool_slots: Mapping[str, int],
                 t_ms: int, pool_name: str = "pool") -> LimitUpdate:
    """The update of version ``t_ms`` (the window's end, as the agents number them) carrying ``shares`` (proxy →
    entitlement → its share, every proxy holding every entitlement of ``limits``) and ``pool_slots``."""
    names = sorted(limits)
    tick = TickResult(
        signals={name: Signals() for name in names},
        priorities={name: limits[name].priority for name in names},
        limits={name: Capacity(limits[name].tokens_per_s, limits[name].kv_bytes, limits[name].concurrency)
                for name in names},
        contended=False, desired_replicas=0, lent=Capacity(0.0, 0.0, 0.0))
    proxies = tuple(sorted(shares))
    split = ProxySplit(proxies, {name: _split([shares[p][name] for p in proxies]) for name in names},
                       _split([(pool_slots[p], 0.0, 0.0) for p in proxies]))
    return encode_limit_update(pool_name, t_ms, t_ms, tick, pool, mean_slo_ms, split)


def _split(dense: list[Share]) -> Split:
    """Per-proxy shares (in proxy order) as a ``Split``: the first proxy's share in common, the others that differ."""
    common = dense[0] if dense else (0, 0.0, 0.0)
    return Split(len(dense), common, {i: share for i, share in enumerate(dense) if share != common})
