"""One control tick for one pool: usage samples → burst, debt, priority → limits, contention, desired replicas.

``pool_tick`` is the single function the stream agents run once per closed window (``streams.pool_state``) and the
replayer runs in event time (``replay.policy``): from the pool's spec and all its entitlements it decides the
members (the ones Bound at the tick, ``core.binding``), ℓ̄* over them (``pool_mean_slo_ms``, frozen or recomputed),
the backend's waiting queue in whole requests (rounded up) and each member's concurrency in whole slots, around
``control_tick``. Whatever a setting does in a replay it does live, because both run this function.

``control_tick`` is the policy itself, in the order: condition (Eq. 2 and 3 EWMAs from this tick's sample), then
prioritise (Eq. 1 with the new b_e, d_e), then decide (limits by priority, desired replicas by the same demand).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from tokenpools.core.binding import bind_entitlements
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState
from tokenpools.core.limits import LimitConfig, compute_limits, yielding
from tokenpools.core.priority import (
    PolicyConstants,
    burst_excess,
    pool_mean_slo_ms,
    priority,
    service_gap,
    update_burst,
    update_debt,
)
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
    gap = service_gap(spec.baseline.tokens_per_s, sample.used.tokens_per_s, sample.demand.tokens_per_s,
                      constants.debt_credit)
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


@dataclass(frozen=True, slots=True)
class PoolTickResult:
    """One pool's tick: who took part, with which ℓ̄* and backend queue, and what ``control_tick`` decided.

    ``mean_slo_ms`` is ℓ̄* after this tick, the value to pass as ``previous_mean_slo_ms`` next time (None while the
    pool has never had a member); ``control_tick`` ran with it, or with 1.0 while there is none. ``concurrency`` is
    every member's limit in whole slots (``whole_slots``), the integer a proxy enforces; ``tick.limits`` carry the
    same numbers (as floats). ``yielding`` names the members whose limit is below their baseline because a higher
    priority holds more than its own (their refusals at the limit are for low priority, ``core.admission``)."""

    members: list[EntitlementSpec]
    mean_slo_ms: float | None
    backend_waiting: int
    tick: TickResult
    concurrency: dict[str, int]
    yielding: frozenset[str] = frozenset()  # members whose limit yielded to a higher priority (``core.limits.yielding``)


def whole_slots(concurrency: float) -> int:
    """A concurrency limit in whole slots: rounded down, a float a hair under a whole number (2.9999999999) counting
    as that number. The one rule for a limit's slots, the agents' update and the replay's admission alike (the limits
    ``compute_limits`` returns are whole already; this keeps it so for any caller)."""
    return int(concurrency + 1e-9)


def pool_tick(
    pool: PoolSpec,
    entitlements: Sequence[EntitlementSpec],
    now_s: float,
    *,
    previous: Mapping[str, Signals],
    previous_mean_slo_ms: float | None,
    mean_slo_frozen: bool,
    samples: Mapping[str, UsageSample | None],
    capacity: Capacity,
    backend_waiting: float,
    constants: PolicyConstants = PolicyConstants(),
    limit_config: LimitConfig = LimitConfig(),
    scaling: ScalingConfig = ScalingConfig(),
) -> PoolTickResult:
    """The tick of one pool at ``now_s`` (the closed window's end, in the specs' clock: expiries compare with it).

    ``entitlements`` are all the pool's, oldest first: the members are the ones Bound at ``now_s``
    (``bind_entitlements``), in that order. ℓ̄* is ``pool_mean_slo_ms`` over the members (frozen: the previous value
    once there is one); with no member the previous value stays. ``backend_waiting`` (requests, possibly a fractional
    average) is rounded up: a queue of 0.2 requests is still a queue. Each member's concurrency limit is rounded to
    whole slots by ``whole_slots``.
    """
    binding = bind_entitlements(pool, list(entitlements), now_s)
    members = [e for e in entitlements if binding[e.name].state is EntitlementState.BOUND]
    mean_slo = previous_mean_slo_ms
    if members:
        mean_slo = pool_mean_slo_ms(previous_mean_slo_ms, [e.slo_ms for e in members], mean_slo_frozen)
    waiting = math.ceil(backend_waiting)
    result = control_tick(pool, members, previous, samples, capacity, mean_slo or 1.0, waiting, constants,
                          limit_config, scaling)
    concurrency = {name: whole_slots(limit.concurrency) for name, limit in result.limits.items()}
    if any(float(slots) != result.limits[name].concurrency for name, slots in concurrency.items()):
        limits = {name: replace(limit, concurrency=float(concurrency[name])) for name, limit in result.limits.items()}
        result = replace(result, limits=limits)
    return PoolTickResult(members, mean_slo, waiting, result, concurrency,
                          yielding(members, result.limits, result.priorities, result.contended))


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
