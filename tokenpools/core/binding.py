"""Capacity admission (entitlement level): Bound, Degraded or Expired.

The paper binds a lease pod on a virtual node; here the same question is asked directly: do the baselines promised
so far fit the pool at its maximum replicas? Entitlements are considered in the given order (oldest first), so a
newcomer cannot displace an earlier grant. An entitlement whose spec forces a state other than Bound (an operator
holding it Pending, say) keeps that state and reserves nothing. Every class with a baseline (dedicated, guaranteed and elastic, whose
baseline is promised on average) reserves it; spot and preemptible reserve nothing and are always Bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState
from tokenpools.core.spec import EntitlementSpec, PoolSpec


@dataclass(frozen=True, slots=True)
class Binding:
    state: EntitlementState
    reason: str


def bind_entitlements(pool: PoolSpec | None, entitlements: list[EntitlementSpec], now_s: float) -> dict[str, Binding]:
    result: dict[str, Binding] = {}
    if pool is None:
        return {e.name: Binding(EntitlementState.PENDING, "pool not found") for e in entitlements}
    limit = pool.max_capacity
    held = Capacity()
    for e in entitlements:
        if e.is_expired(now_s):
            result[e.name] = Binding(EntitlementState.EXPIRED, f"expired at {e.expires_at_s}")
            continue
        if e.state is not EntitlementState.BOUND:
            result[e.name] = Binding(e.state, f"state {e.state.value} set in the spec")
            continue
        after = held + e.baseline
        if after.fits_in(limit):
            held = after
            result[e.name] = Binding(EntitlementState.BOUND, "baseline fits the pool at max replicas")
        else:
            result[e.name] = Binding(
                EntitlementState.DEGRADED,
                f"baseline does not fit: {_describe(after)} promised > {_describe(limit)} at {pool.max_replicas} replicas",
            )
    return result


def _describe(c: Capacity) -> str:
    return f"{c.tokens_per_s:.0f} tokens/s, {c.kv_bytes / 2**30:.2f} GiB KV, {c.concurrency:.0f} sequences"
