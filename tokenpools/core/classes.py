"""Service classes and entitlement states (docs/semantics.md#service-classes, paper Table 1)."""

from __future__ import annotations

from enum import StrEnum


class ServiceClass(StrEnum):
    """What an entitlement is promised. The value is the spelling used in config and on the wire."""

    DEDICATED = "dedicated"
    GUARANTEED = "guaranteed"
    ELASTIC = "elastic"
    SPOT = "spot"
    PREEMPTIBLE = "preemptible"

    @property
    def has_baseline(self) -> bool:
        """Dedicated, guaranteed and elastic carry a baseline; spot and preemptible have none."""
        return self in _WITH_BASELINE

    @property
    def protected(self) -> bool:
        """A protected baseline is reserved and never shrunk (dedicated, guaranteed)."""
        return self in _PROTECTED

    @property
    def may_burst(self) -> bool:
        """Everything but guaranteed may use idle capacity above its baseline."""
        return self is not ServiceClass.GUARANTEED

    @property
    def accrues_debt(self) -> bool:
        """Spot and preemptible keep d_e = 0 (docs/semantics.md#service-classes); the other classes follow Eq. 2."""
        return self in _WITH_BASELINE

    @property
    def evictable(self) -> bool:
        """Only preemptible in-flight requests may be aborted to make room for protected work."""
        return self is ServiceClass.PREEMPTIBLE

    @property
    def squeeze_rank(self) -> int:
        """Reclaim order: lower is squeezed first (preemptible, spot, elastic; protected never)."""
        return _SQUEEZE_RANK[self]


_WITH_BASELINE = frozenset({ServiceClass.DEDICATED, ServiceClass.GUARANTEED, ServiceClass.ELASTIC})
_PROTECTED = frozenset({ServiceClass.DEDICATED, ServiceClass.GUARANTEED})
_SQUEEZE_RANK = {
    ServiceClass.PREEMPTIBLE: 0,
    ServiceClass.SPOT: 1,
    ServiceClass.ELASTIC: 2,
    ServiceClass.GUARANTEED: 3,
    ServiceClass.DEDICATED: 3,
}

DEFAULT_CLASS_WEIGHTS: dict[ServiceClass, float] = {
    ServiceClass.DEDICATED: 1000.0,
    ServiceClass.GUARANTEED: 1000.0,
    ServiceClass.ELASTIC: 100.0,
    ServiceClass.SPOT: 1.0,
    ServiceClass.PREEMPTIBLE: 0.1,
}


class EntitlementState(StrEnum):
    """Lifecycle of an entitlement. Only BOUND admits traffic."""

    PENDING = "Pending"
    BOUND = "Bound"
    DEGRADED = "Degraded"
    EXPIRED = "Expired"
