"""Priority (paper Eq. 1), service debt (Eq. 2) and burst intensity (Eq. 3).

These are the *conditioning* stage: EWMAs over per-tick measurements. Mapping the resulting signals to limits
is ``tokenpools.core.limits``; admission is ``tokenpools.core.admission``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import DEFAULT_CLASS_WEIGHTS, ServiceClass


@dataclass(frozen=True, slots=True)
class PolicyConstants:
    """Every constant of Eq. 1–3, with the paper's defaults (γ_b is not given by the paper: 0.7 is ours)."""

    alpha_slo: float = 2.0
    alpha_burst: float = 1.0
    alpha_debt: float = 4.0
    debt_factor_floor: float = 0.05  # ε in max(ε, 1 + α_debt·d_e): keeps w_e positive for heavy bursters
    gamma_debt: float = 0.7
    gamma_burst: float = 0.7
    debt_credit: bool = False  # service above the baseline counts as negative debt (off: debt measures under-service)
    class_weights: dict[ServiceClass, float] = field(default_factory=lambda: dict(DEFAULT_CLASS_WEIGHTS))

    def __post_init__(self) -> None:
        for name in ("alpha_slo", "alpha_burst", "alpha_debt"):
            if getattr(self, name) < 0:
                raise ValueError(f"`{name}` must be >= 0, got {getattr(self, name)}")
        if not 0 < self.debt_factor_floor <= 1:
            raise ValueError(f"`debt_factor_floor` must be in (0, 1], got {self.debt_factor_floor}")
        for name in ("gamma_debt", "gamma_burst"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be in [0, 1), got {getattr(self, name)}")
        if not isinstance(self.debt_credit, bool):  # a truthy string or 1 would silently switch Eq. 2's credit on
            raise ValueError(f"`debt_credit` must be true or false, got {self.debt_credit!r}")
        missing = set(ServiceClass) - set(self.class_weights)
        if missing:
            raise ValueError(f"`class_weights` lacks {sorted(missing)}")
        for cls, weight in self.class_weights.items():
            if weight <= 0:
                raise ValueError(f"`class_weights.{cls}` must be positive, got {weight}")

    def __hash__(self) -> int:  # dict field: hash by value so the constants can key caches
        return hash((self.alpha_slo, self.alpha_burst, self.alpha_debt, self.debt_factor_floor, self.gamma_debt,
                     self.gamma_burst, self.debt_credit, tuple(sorted(self.class_weights.items()))))


def priority(
    service_class: ServiceClass,
    slo_ms: float,
    mean_slo_ms: float,
    burst: float,
    debt: float,
    constants: PolicyConstants,
) -> float:
    """Eq. 1: w_e = w_κ · (1 + α_slo·ℓ*_e/ℓ̄*)⁻¹ · (1 + α_burst·b_e)⁻¹ · max(ε, 1 + α_debt·d_e).

    >>> round(priority(ServiceClass.ELASTIC, 500, 15_250, 0.0, 0.0, PolicyConstants()), 1)
    93.8
    """
    if mean_slo_ms <= 0:
        raise ValueError(f"`mean_slo_ms` must be positive, got {mean_slo_ms}")
    weight = constants.class_weights[service_class]
    slo_factor = 1.0 / (1.0 + constants.alpha_slo * slo_ms / mean_slo_ms)
    burst_factor = 1.0 / (1.0 + constants.alpha_burst * max(0.0, burst))
    debt_factor = max(constants.debt_factor_floor, 1.0 + constants.alpha_debt * debt)
    return weight * slo_factor * burst_factor * debt_factor


def mean_slo_ms(slos_ms: Iterable[float]) -> float:
    """ℓ̄*: the pool-average SLO of its Bound entitlements (the caller decides membership and freezing)."""
    values = list(slos_ms)
    if not values:
        raise ValueError("the pool has no Bound entitlement to average an SLO over")
    return math.fsum(values) / len(values)


def pool_mean_slo_ms(previous_ms: float | None, bound_slos_ms: Iterable[float], frozen: bool) -> float:
    """ℓ̄* under the pool's policy: ``frozen`` keeps the first value once there is one (what the paper's Exp 2
    numbers imply: 15,250 ms even after reports joins); otherwise it is the mean over the current Bound set.
    """
    if frozen and previous_ms is not None:
        return previous_ms
    return mean_slo_ms(bound_slos_ms)


def service_gap(baseline_tokens_per_s: float, measured_tokens_per_s: float, demanded_tokens_per_s: float,
                credit: bool = True) -> float:
    """g_e = clamp((target − λ̂_e)/λ_e, −1, 1) with target = min(λ_e, demanded rate); without ``credit``, clamped to
    [0, 1]: service above the target is not counted (``PolicyConstants.debt_credit``, docs/semantics.md#burst-and-debt).

    An idle tenant (no demand) is not underserved: its target is 0, so only over-use (negative gap) counts.
    """
    if baseline_tokens_per_s <= 0:
        return 0.0
    target = min(baseline_tokens_per_s, max(0.0, demanded_tokens_per_s))
    gap = (target - measured_tokens_per_s) / baseline_tokens_per_s
    return min(1.0, max(-1.0 if credit else 0.0, gap))


def update_debt(previous: float, gap: float, gamma: float) -> float:
    """Eq. 2: d_e ← γ_d·d_e + (1−γ_d)·g_e. Bounded in [−1, 1] because g_e is."""
    return gamma * previous + (1.0 - gamma) * gap


def burst_excess(actual: Capacity, baseline: Capacity) -> float:
    """Eq. 3's δ_e = Σ over (λ, χ, r) of max(0, actual/baseline − 1); dimensions without a baseline are skipped."""
    total = 0.0
    for used, base in zip(actual.as_tuple(), baseline.as_tuple()):
        if base > 0:
            total += max(0.0, used / base - 1.0)
    return total


def update_burst(previous: float, excess: float, gamma: float) -> float:
    """Eq. 3's EWMA: b_e ← γ_b·b_e + (1−γ_b)·δ_e."""
    return gamma * previous + (1.0 - gamma) * excess


def decay_steps(start: float, threshold: float, gamma: float) -> int:
    """How many zero-gap EWMA steps take |start| below threshold (used to reason about the ≈50 s debt decay).

    Counted by stepping Eq. 2 rather than from logarithms, so |start| == threshold needs one step (it is not yet
    *below*) and float rounding cannot put the answer off by one.
    """
    if threshold <= 0 or not 0 <= gamma < 1:
        raise ValueError(f"need threshold > 0 and 0 <= gamma < 1, got {threshold}, {gamma}")
    level, steps = abs(start), 0
    while level >= threshold:
        level = update_debt(level, 0.0, gamma)
        steps += 1
    return steps
