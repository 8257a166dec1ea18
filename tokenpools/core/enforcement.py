"""Whether a limit refuses or only records: ``enforcement: enforce|shadow`` on a pool and on an entitlement.

A shadow limit is evaluated and counted, and the request passes (the peer is Envoy's shadow mode for rate limits):
a new or tightened limit can be watched on real traffic before it refuses anyone (docs/shadow.md). Only the limit
checks are shadowed (concurrency, token budget, KV, low priority); an unknown key or an entitlement that is not
Bound is refused whatever the mode: those are identity, not limits.
"""

from __future__ import annotations

from enum import StrEnum

from tokenpools.core.outcomes import AdmissionOutcome


class Enforcement(StrEnum):
    ENFORCE = "enforce"
    SHADOW = "shadow"


SHADOWABLE: frozenset[AdmissionOutcome] = frozenset({
    AdmissionOutcome.REFUSED_CONCURRENCY,
    AdmissionOutcome.REFUSED_TOKEN_BUDGET,
    AdmissionOutcome.REFUSED_KV,
    AdmissionOutcome.REFUSED_LOW_PRIORITY,
})
"""The refusals a shadow entitlement turns into admissions that carry them (``Decision.would_refuse``)."""


def effective(entitlement: Enforcement | None, pool: Enforcement) -> Enforcement:
    """The mode in force for an entitlement: its own when set, else its pool's."""
    return pool if entitlement is None else entitlement
