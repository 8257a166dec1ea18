"""Autoscaling from admission's capacity model (docs/semantics.md#scaling). The paper gives no algorithm; this is ours.

desired = clamp(⌈max over dimensions of demand_d / (per-replica_d · target utilisation)⌉, min, max), never below what
the Bound baselines need, with demand = protected baselines + elastic max(baseline, observed) + spot/preemptible
observed (optional). Because demand is compared with the *pool* total, capacity one entitlement leaves unused is
lent to another before the pool scales out. Scale-up applies at once; scale-down takes the highest recommendation
seen during the stabilisation window; no change within the cooldown after the previous one, except to reach the
protected floor (promised never exceeds provisioned). A recommendation is max(desired, floor), so a size the floor
required is stabilised like any other; a fresh stabiliser (a restarted scaler, no history) counts its current size
as recommended at its first step, so it too waits a full window before scaling down.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec


@dataclass(frozen=True, slots=True)
class ScalingConfig:
    target_utilization: float = 0.9
    include_spot: bool = True
    scale_down_stabilization_s: float = 60.0
    cooldown_s: float = 15.0

    def __post_init__(self) -> None:
        if not 0 < self.target_utilization <= 1:
            raise ValueError(f"`target_utilization` must be in (0, 1], got {self.target_utilization}")
        if self.scale_down_stabilization_s < 0 or self.cooldown_s < 0:
            raise ValueError("`scale_down_stabilization_s` and `cooldown_s` must be >= 0")


def pool_demand(entitlements: list[EntitlementSpec], demand: Mapping[str, Capacity | None], include_spot: bool) -> Capacity:
    """Summed as plain numbers, in the entitlements' order (one ``Capacity`` at the end, not one per addition)."""
    tokens = kv = slots = 0.0
    for e in entitlements:
        observed = demand.get(e.name)
        cls = e.service_class
        if cls.protected:
            b = e.baseline
            tokens, kv, slots = tokens + b.tokens_per_s, kv + b.kv_bytes, slots + b.concurrency
        elif cls is ServiceClass.ELASTIC:
            b = e.baseline
            seen = observed or b
            tokens += max(b.tokens_per_s, seen.tokens_per_s)
            kv += max(b.kv_bytes, seen.kv_bytes)
            slots += max(b.concurrency, seen.concurrency)
        elif include_spot and observed is not None:
            tokens, kv, slots = tokens + observed.tokens_per_s, kv + observed.kv_bytes, slots + observed.concurrency
    return Capacity(tokens, kv, slots)


def replicas_for(amount: Capacity, per_replica: Capacity, utilization: float = 1.0) -> int:
    need = 0
    for want, have in zip(amount.as_tuple(), per_replica.as_tuple()):
        if have > 0 and want > 0:
            need = max(need, math.ceil(want / (have * utilization) - 1e-9))
    return need


def protected_floor(pool: PoolSpec, entitlements: list[EntitlementSpec]) -> int:
    """Replicas the Bound baselines need: promised never exceeds provisioned."""
    promised = Capacity.total([e.baseline for e in entitlements if e.service_class.has_baseline])
    return replicas_for(promised, pool.per_replica)


def desired_replicas(
    pool: PoolSpec, entitlements: list[EntitlementSpec], demand: Mapping[str, Capacity | None], config: ScalingConfig
) -> int:
    want = replicas_for(pool_demand(entitlements, demand, config.include_spot), pool.per_replica, config.target_utilization)
    want = max(want, protected_floor(pool, entitlements))
    return min(pool.max_replicas, max(pool.min_replicas, want))


@dataclass(frozen=True, slots=True)
class Stabilizer:
    """Scale-down stabilisation and cooldown state for one pool (pure: ``step`` returns a new one)."""

    current: int
    last_change_s: float = -math.inf
    recommendations: tuple[tuple[float, int], ...] = ()

    def step(self, now_s: float, desired: int, floor: int, config: ScalingConfig) -> tuple[Stabilizer, int]:
        window_start = now_s - config.scale_down_stabilization_s
        target = max(desired, floor)
        history = self.recommendations or ((now_s, self.current),)
        recs = tuple(r for r in history if r[0] > window_start) + ((now_s, target),)
        if target < self.current:
            target = max(floor, min(self.current, max(r[1] for r in recs)))
        in_cooldown = now_s - self.last_change_s < config.cooldown_s
        if target == self.current or (in_cooldown and self.current >= floor):
            return replace(self, recommendations=recs), self.current
        return Stabilizer(target, now_s, recs), target
