"""One control tick for one pool: usage samples → burst, debt, priority → limits, contention, desired replicas.

This is the single function the stream agents run on a timer and the replayer runs in event time. The order is:
condition (Eq. 2 and 3 EWMAs from this tick's sample), then prioritise (Eq. 1 with the new b_e, d_e), then decide
(limits by priority, desired replicas by the same demand).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tokenpools.core.capacity import Capacity
from tokenpools.core.limits import LimitConfig, compute_limits
from tokenpools.core.priority import PolicyConstants, burst_excess, priority, service_gap, update_burst, update_debt
from tokenpools.core.scaling import ScalingConfig, desired_replicas
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.windows import UsageSample


@dataclass(frozen=True, slots=True)
class Signals:
    """The EWMA state of one entitlement: burst intensity b_e and service debt d_e."""

    burst: float = 0.0
    debt: float = 0.0


@dataclass(frozen=True, slots=True)
class TickResult:
    signals: dict[str, Signals]
    priorities: dict[str, float]
    limits: dict[str, Capacity]
    contended: bool
    desired_replicas: int
    lent: Capacity


def condition(spec: EntitlementSpec, previous: Signals, sample: UsageSample | None, constants: PolicyConstants) -> Signals:
    """Eq. 2 and 3 for one entitlement. No sample (nothing measured yet) keeps the previous state."""
    if sample is None:
        return previous
    burst = update_burst(previous.burst, burst_excess(sample.used, spec.baseline), constants.gamma_burst)
    if not spec.service_class.accrues_debt:
        return Signals(burst=burst, debt=0.0)
    gap = service_gap(spec.baseline.tokens_per_s, sample.used.tokens_per_s, sample.demand.tokens_per_s)
    return Signals(burst=burst, debt=update_debt(previous.debt, gap, constants.gamma_debt))


def control_tick(
    pool: PoolSpec,
    entitlements: list[EntitlementSpec],
    previous: Mapping[str, Signals],
    samples: Mapping[str, UsageSample | None],
    capacity: Capacity,
    mean_slo_ms: float,
    backend_waiting: int = 0,
    constants: PolicyConstants = PolicyConstants(),
    limit_config: LimitConfig = LimitConfig(),
    scaling: ScalingConfig = ScalingConfig(),
) -> TickResult:
    """Entitlements are the pool's Bound ones; the others neither get limits nor count towards demand."""
    signals = {e.name: condition(e, previous.get(e.name, Signals()), samples.get(e.name), constants) for e in entitlements}
    priorities = {
        e.name: priority(e.service_class, e.slo_ms, mean_slo_ms, signals[e.name].burst, signals[e.name].debt, constants)
        for e in entitlements
    }
    demand = {e.name: (s.demand if (s := samples.get(e.name)) is not None else None) for e in entitlements}
    allocation = compute_limits(capacity, entitlements, priorities, demand, limit_config, backend_waiting)
    replicas = desired_replicas(pool, entitlements, demand, scaling)
    return TickResult(signals, priorities, allocation.limits, allocation.contended, replicas, allocation.lent)


def static_priorities(entitlements: list[EntitlementSpec], mean_slo_ms: float, constants: PolicyConstants) -> dict[str, float]:
    """Priorities with no burst and no debt: what a proxy uses before any limit update arrives."""
    return {e.name: priority(e.service_class, e.slo_ms, mean_slo_ms, 0.0, 0.0, constants) for e in entitlements}


def static_limits(
    pool: PoolSpec, entitlements: list[EntitlementSpec], mean_slo_ms: float, constants: PolicyConstants,
    limit_config: LimitConfig = LimitConfig(),
) -> dict[str, Capacity]:
    """Fail-static limits: the policy run with no measurement (everyone assumed to want its baseline).

    This is the proxy's fallback when limit updates stop: protected and elastic get their baselines, spot and
    preemptible share what is left. Never unlimited.
    """
    priorities = static_priorities(entitlements, mean_slo_ms, constants)
    return compute_limits(pool.capacity(), entitlements, priorities, {}, limit_config).limits
