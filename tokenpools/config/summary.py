"""What a configuration means before any traffic: capacity, binding, static priorities and fail-static limits.

Pure (time is an argument): ``tokenpools validate`` and ``tokenpools demo`` render it; tests assert on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenpools.config.loader import LoadedConfig
from tokenpools.config.settings import PolicySettings
from tokenpools.core.binding import Binding, bind_entitlements
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState
from tokenpools.core.priority import mean_slo_ms, priority
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.tick import static_limits, static_priorities


@dataclass(frozen=True, slots=True)
class EntitlementRow:
    spec: EntitlementSpec
    binding: Binding
    priority: float | None  # w_e with b_e = d_e = 0 (what it gets once Bound, for non-Bound ones)
    static_limit: Capacity | None  # None unless Bound
    api_keys: int  # digests + Secret references


@dataclass(frozen=True, slots=True)
class PoolSummary:
    pool: PoolSpec
    capacity: Capacity  # at the current replicas
    max_capacity: Capacity
    mean_slo_ms: float | None  # ℓ̄* over the Bound entitlements; None when there is none
    rows: tuple[EntitlementRow, ...]

    @property
    def bound_baselines(self) -> Capacity:
        return Capacity.total([r.spec.baseline for r in self.rows if r.binding.state is EntitlementState.BOUND])


def effective_bindings(pool: PoolSpec, entitlements: list[EntitlementSpec], now_s: float) -> dict[str, Binding]:
    """``core.binding.bind_entitlements``, except that a state set in the config (``spec.state``) is kept as is.

    An entitlement forced to a non-Bound state holds no capacity, so it does not take part in binding.
    """
    forced = {e.name: Binding(e.state, "state set in the config") for e in entitlements if e.state is not EntitlementState.BOUND}
    bound = bind_entitlements(pool, [e for e in entitlements if e.name not in forced], now_s)
    return {e.name: forced.get(e.name) or bound[e.name] for e in entitlements}


def summarize(config: LoadedConfig, policy: PolicySettings, now_s: float) -> list[PoolSummary]:
    constants = policy.to_constants()
    limit_config = policy.to_limit_config()
    out: list[PoolSummary] = []
    for pool in config.pools.values():
        entitlements = config.entitlements_of(pool.name)
        bindings = effective_bindings(pool, entitlements, now_s)
        bound = [e for e in entitlements if bindings[e.name].state is EntitlementState.BOUND]
        mean = mean_slo_ms(e.slo_ms for e in bound) if bound else None
        priorities = static_priorities(bound, mean, constants) if mean is not None else {}
        limits = static_limits(pool, bound, mean, constants, limit_config) if mean is not None else {}

        def weight(e: EntitlementSpec) -> float | None:
            if e.name in priorities or mean is None:
                return priorities.get(e.name)
            return priority(e.service_class, e.slo_ms, mean, 0.0, 0.0, constants)

        rows = tuple(
            EntitlementRow(
                spec=e,
                binding=bindings[e.name],
                priority=weight(e),
                static_limit=limits.get(e.name),
                api_keys=len(config.api_key_hashes.get(e.name, ())) + len(config.api_key_secret_refs.get(e.name, ())),
            )
            for e in entitlements
        )
        out.append(PoolSummary(pool, pool.capacity(), pool.max_capacity, mean, rows))
    return out


def summary_json(config: LoadedConfig, summaries: list[PoolSummary]) -> dict[str, object]:
    """A plain-data form of the summaries (for ``tokenpools demo --out``)."""

    def cap(c: Capacity | None) -> dict[str, float] | None:
        return None if c is None else {"tokens_per_s": c.tokens_per_s, "kv_bytes": c.kv_bytes, "concurrency": c.concurrency}

    return {
        "source": config.source,
        "pools": [
            {
                "name": s.pool.name,
                "model": s.pool.model,
                "kv_bytes_per_token": s.pool.kv_bytes_per_token,
                "replicas": s.pool.replicas,
                "max_replicas": s.pool.max_replicas,
                "per_replica": cap(s.pool.per_replica),
                "capacity": cap(s.capacity),
                "max_capacity": cap(s.max_capacity),
                "mean_slo_ms": s.mean_slo_ms,
                "entitlements": [
                    {
                        "name": r.spec.name,
                        "class": r.spec.service_class.value,
                        "slo_ms": r.spec.slo_ms,
                        "state": r.binding.state.value,
                        "reason": r.binding.reason,
                        "baseline": cap(r.spec.baseline),
                        "priority": r.priority,
                        "static_limit": cap(r.static_limit),
                    }
                    for r in s.rows
                ],
            }
            for s in summaries
        ],
    }
