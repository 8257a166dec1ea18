"""Pure helpers and hypothesis strategies for the policy-core unit tests.

Nothing here starts a service, opens a socket, reads a clock or touches the file system. Test modules get the
strategies through the session-scoped ``core`` fixture and draw from them with ``st.data()``
(``data.draw(core.limits_case())``), so no test module imports this file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import strategies as st

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec

GIB = 2**30


@dataclass(frozen=True)
class CoreKit:
    """The strategies shared by several test modules (module-specific builders live in their modules)."""

    # ---- strategies ----------------------------------------------------------------------------------------
    @staticmethod
    def capacity(max_tokens_per_s: float = 10_000.0, max_kv_bytes: float = 64.0 * GIB, max_slots: int = 64,
                 min_slots: int = 0) -> st.SearchStrategy[Capacity]:
        """A capacity with whole concurrency (what pools, baselines and per-proxy limits carry)."""
        return st.builds(
            Capacity,
            st.floats(0.0, max_tokens_per_s, allow_nan=False),
            st.floats(0.0, max_kv_bytes, allow_nan=False),
            st.integers(min_slots, max_slots).map(float),
        )

    @staticmethod
    def demand(max_tokens_per_s: float = 10_000.0, max_kv_bytes: float = 64.0 * GIB,
               max_slots: float = 64.0) -> st.SearchStrategy[Capacity]:
        """Measured demand: fractional concurrency allowed (windows report time-weighted averages)."""
        return st.builds(
            Capacity,
            st.floats(0.0, max_tokens_per_s, allow_nan=False),
            st.floats(0.0, max_kv_bytes, allow_nan=False),
            st.floats(0.0, max_slots, allow_nan=False),
        )

    @staticmethod
    def priority() -> st.SearchStrategy[float]:
        """Priorities as Eq. 1 produces them: from 0.1·ε-ish up to a guaranteed tenant with maximal debt."""
        return _PRIORITY

    @staticmethod
    def entitlement(name: str, pool_capacity: Capacity,
                    service_class: ServiceClass | None = None) -> st.SearchStrategy[EntitlementSpec]:
        """Any class (or the one given); baselines up to 1.25 × the pool (so a protected baseline may exceed the
        current capacity); an optional burst ceiling."""
        return _entitlement(name, pool_capacity, service_class)

    @staticmethod
    def limits_case(max_entitlements: int = 7) -> st.SearchStrategy[LimitsCase]:
        """Everything ``compute_limits`` takes: a capacity, entitlements, priorities and demand (some unknown)."""
        return _limits_case(max_entitlements)


# Module-level strategies: building a strategy per draw (dynamic bounds) costs more than the test itself, so sizes
# are drawn as fractions of the pool and scaled.
# no subnormal fractions: a baseline of 1e-321 tokens/s is no rate a pool could have, and shares computed from such
# weights lose the bits that make them add up (a CI draw handed 240.00095 of 240 tokens/s to two entitlements)
_FRACTION = st.sampled_from([0.0, 0.25, 0.5, 1.0]) | st.floats(0.0, 1.0, allow_subnormal=False)
_SLO_MS = st.sampled_from([200.0, 500.0, 5_000.0, 30_000.0])
_CLASSES = st.sampled_from(list(ServiceClass))
_HEADROOM = st.sampled_from([0.0, 0.25, 1.0])
_PRIORITY = st.floats(1e-3, 5000.0, allow_nan=False, allow_infinity=False)
_POOL = st.builds(
    Capacity,
    st.sampled_from([0.0, 240.0]) | st.floats(0.0, 10_000.0),
    st.sampled_from([0.0, 16.0 * GIB]) | st.floats(0.0, 64.0 * GIB),
    st.integers(1, 64).map(float),
)


def _scaled(cap: Capacity, f: tuple[float, float, float], whole_slots: bool, min_slots: int = 0) -> Capacity:
    slots = f[2] * cap.concurrency
    if whole_slots:
        slots = float(max(min_slots, math.ceil(slots)))
    return Capacity(f[0] * cap.tokens_per_s, f[1] * cap.kv_bytes, slots)


@st.composite
def _entitlement(draw: st.DrawFn, name: str, pool_capacity: Capacity,
                 service_class: ServiceClass | None = None) -> EntitlementSpec:
    if service_class is None:
        service_class = draw(_CLASSES)
    baseline = Capacity()
    if service_class.has_baseline:  # up to 1.25 × the pool: a protected baseline may exceed the current capacity
        top = pool_capacity.scaled(1.25)
        baseline = _scaled(top, (draw(_FRACTION), draw(_FRACTION), draw(_FRACTION)), whole_slots=True, min_slots=1)
    ceiling = None
    if service_class is not ServiceClass.GUARANTEED and draw(st.booleans()):
        extra = _scaled(pool_capacity, (draw(_FRACTION), draw(_FRACTION), draw(_FRACTION)), whole_slots=True)
        ceiling = baseline + extra
    return EntitlementSpec(name=name, pool="pool", service_class=service_class, slo_ms=draw(_SLO_MS),
                           baseline=baseline, burst_ceiling=ceiling)


@st.composite
def _limits_case(draw: st.DrawFn, max_entitlements: int) -> LimitsCase:
    capacity = draw(_POOL)
    n = draw(st.integers(1, max_entitlements))
    specs = [draw(_entitlement(f"e{i}", capacity, None)) for i in range(n)]
    priorities = {e.name: draw(_PRIORITY) for e in specs}
    top = capacity.scaled(1.5)
    demand: dict[str, Capacity | None] = {}
    for e in specs:
        known = draw(st.integers(0, 3)) > 0
        fractions = (draw(_FRACTION), draw(_FRACTION), draw(_FRACTION))
        demand[e.name] = _scaled(top, fractions, whole_slots=False) if known else None
    return LimitsCase(capacity, specs, priorities, demand, draw(st.booleans()), draw(_HEADROOM))


@dataclass(frozen=True)
class LimitsCase:
    capacity: Capacity
    entitlements: list[EntitlementSpec]
    priorities: dict[str, float]
    demand: dict[str, Capacity | None]
    lend_idle_protected: bool
    burst_headroom: float


@pytest.fixture(scope="session")
def core() -> CoreKit:
    """The shared builders and strategies (session-scoped, so hypothesis tests may use it)."""
    return CoreKit()
