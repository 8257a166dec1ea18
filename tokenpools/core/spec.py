"""Pools and entitlements as the core sees them: frozen, validated, unit-named.

The YAML/CRD schema in ``tokenpools.config`` converts into these; the core never parses anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenpools.core.budgets import BudgetSpec
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState, ServiceClass
from tokenpools.core.enforcement import Enforcement


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One model backend: a set of identical replicas with per-replica capacity and scaling bounds."""

    name: str
    model: str
    per_replica: Capacity
    min_replicas: int = 1
    max_replicas: int = 1
    replicas: int = 1
    kv_bytes_per_token: int = 147_456
    default_max_tokens: int = 256
    token_bucket_window_s: float = 10.0
    engine_priority: bool = False  # write vLLM's `priority` (core.engine_priority); off: a client's is stripped
    shards: int = 1  # partitions its events spread over, by entitlement (docs/scaling.md#the-two-stage-topology)
    enforcement: Enforcement = Enforcement.ENFORCE  # shadow: limits are evaluated and counted, not applied (docs/shadow.md)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("pool `name` must not be empty")
        if self.per_replica.concurrency < 1 or self.per_replica.concurrency != int(self.per_replica.concurrency):
            raise ValueError(f"pool {self.name}: `per_replica.concurrency` must be a whole number >= 1, got {self.per_replica.concurrency}")
        if self.min_replicas < 0:
            raise ValueError(f"pool {self.name}: `min_replicas` must be >= 0, got {self.min_replicas}")
        if self.max_replicas < max(1, self.min_replicas):
            raise ValueError(
                f"pool {self.name}: `max_replicas` must be >= max(1, min_replicas={self.min_replicas}), got {self.max_replicas}"
            )
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise ValueError(
                f"pool {self.name}: `replicas` must be within [{self.min_replicas}, {self.max_replicas}], got {self.replicas}"
            )
        if self.kv_bytes_per_token <= 0:
            raise ValueError(f"pool {self.name}: `kv_bytes_per_token` must be positive, got {self.kv_bytes_per_token}")
        if self.default_max_tokens <= 0:
            raise ValueError(f"pool {self.name}: `default_max_tokens` must be positive, got {self.default_max_tokens}")
        if self.token_bucket_window_s <= 0:
            raise ValueError(f"pool {self.name}: `token_bucket_window_s` must be positive, got {self.token_bucket_window_s}")
        if self.shards < 1:
            raise ValueError(f"pool {self.name}: `shards` must be >= 1, got {self.shards}")

    def capacity(self, ready_replicas: int | None = None) -> Capacity:
        """Λ_p = ready replicas × per-replica capacity."""
        n = self.replicas if ready_replicas is None else ready_replicas
        return self.per_replica.scaled(n)

    @property
    def max_capacity(self) -> Capacity:
        return self.per_replica.scaled(self.max_replicas)


@dataclass(frozen=True, slots=True)
class EntitlementSpec:
    """A tenant's grant on a pool: baselines in three dimensions, a class, an SLO, optional ceiling and expiry."""

    name: str
    pool: str
    service_class: ServiceClass
    slo_ms: float
    baseline: Capacity = field(default_factory=Capacity)
    tenant: str = ""
    burst_ceiling: Capacity | None = None
    expires_at_s: float | None = None
    state: EntitlementState = EntitlementState.BOUND
    queue_timeout_ms: int | None = None  # how long a refused request may wait for its check; None: the policy's default
    enforcement: Enforcement | None = None  # None: the pool's (docs/shadow.md)
    budgets: tuple[BudgetSpec, ...] = ()  # long-window budgets (docs/budgets.md); names unique
    labels: tuple[tuple[str, str], ...] = ()  # billing labels for the usage ledger, sorted by name

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("entitlement `name` must not be empty")
        names = [b.name for b in self.budgets]
        if len(set(names)) != len(names):
            raise ValueError(f"entitlement {self.name}: budget names must be unique, got {names}")
        if self.queue_timeout_ms is not None and self.queue_timeout_ms < 0:
            raise ValueError(f"entitlement {self.name}: `queue_timeout_ms` must be >= 0, got {self.queue_timeout_ms}")
        if self.slo_ms <= 0:
            raise ValueError(f"entitlement {self.name}: `slo_ms` must be positive, got {self.slo_ms}")
        if self.service_class.has_baseline and self.baseline.concurrency < 1:
            raise ValueError(
                f"entitlement {self.name}: a {self.service_class} entitlement needs `baseline.concurrency` >= 1, "
                f"got {self.baseline.concurrency}"
            )
        if self.baseline.concurrency != int(self.baseline.concurrency):
            raise ValueError(
                f"entitlement {self.name}: `baseline.concurrency` must be a whole number, got {self.baseline.concurrency}"
            )
        if not self.service_class.has_baseline and self.baseline != Capacity():
            raise ValueError(f"entitlement {self.name}: a {self.service_class} entitlement has no baseline; remove it")
        if self.burst_ceiling is not None and self.service_class.has_baseline:
            if not self.baseline.fits_in(self.burst_ceiling):
                raise ValueError(f"entitlement {self.name}: `burst_ceiling` must be >= the baseline in every dimension")

    def ceiling(self, pool_capacity: Capacity) -> Capacity:
        """The most this entitlement may ever be allowed: baseline for guaranteed, else its burst ceiling or the pool."""
        if self.service_class is ServiceClass.GUARANTEED:
            return self.baseline
        return Capacity(*self.ceiling_values(pool_capacity.as_tuple()))

    def ceiling_values(self, pool: tuple[float, float, float]) -> tuple[float, float, float]:
        """``ceiling`` as plain numbers, for a pool capacity given as ``Capacity.as_tuple()``: what the per-tick
        policy computes once per entitlement and tick instead of building a validated ``Capacity`` in its loops."""
        b = self.baseline
        if self.service_class is ServiceClass.GUARANTEED:
            return (b.tokens_per_s, b.kv_bytes, b.concurrency)
        c = self.burst_ceiling.as_tuple() if self.burst_ceiling is not None else pool
        return (max(b.tokens_per_s, min(c[0], pool[0])), max(b.kv_bytes, min(c[1], pool[1])),
                max(b.concurrency, min(c[2], pool[2])))

    def is_expired(self, now_s: float) -> bool:
        return self.expires_at_s is not None and now_s >= self.expires_at_s
