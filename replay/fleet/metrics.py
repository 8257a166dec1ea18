"""What a fleet run measures, against the fleet-wide truth that no single proxy sees.

Beside the enforcers, ``FleetMeter`` keeps per entitlement what the whole fleet has in flight (N_e) and a
fleet-wide token bucket B_e: the pool's depth (limit × ``token_bucket_window_s``) and refill (the tokens/s limit),
charged by every admission anywhere in the fleet and refunded by every settlement, with the controller's own
arithmetic (start full, refill then charge, refunds never overfill; the bucket may go below zero when the fleet
admitted more than it held). Definitions (per entitlement, summed for the run):

- attempts, admitted, refused by ``AdmissionOutcome``;
- a **false refusal** is a refusal while N_e < L_e (the fleet-wide concurrency limit) and B_e held the request's
  cost (n_in + max_tokens): one enforcer with the fleet's limits would have admitted it. (The exact reference has
  none, up to float rounding: B_e then runs the same arithmetic as its controller's bucket, refilled at other
  instants, so a bucket within ``FALSE_REFUSAL_TOLERANCE_TOKENS`` of the cost does not count.)
- **overshoot**: fleet-wide in flight above the limit, the maximum of (N_e − L_e)⁺ in slots and the integral
  ∫(N_e − L_e)⁺ dt, reported as a fraction of ∫L_e dt over the run;
- **update cost**: the bytes one proxy reads per tick (the encoded record of the policy's ``wire``), mean and max.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from tokenpools.core.admission import EntitlementLimits
from tokenpools.core.outcomes import AdmissionOutcome

FALSE_REFUSAL_TOLERANCE_TOKENS = 1e-6


@dataclass(frozen=True, slots=True)
class EntitlementFigures:
    """One entitlement's figures for a run."""

    name: str
    limit_slots: int
    attempts: int
    admitted: int
    refused: Mapping[AdmissionOutcome, int]
    false_refusals: int
    overshoot_max_slots: int
    overshoot_slot_s: float  # ∫(N − L)⁺ dt
    limit_slot_s: float  # ∫L dt

    @property
    def refusals(self) -> int:
        return sum(self.refused.values())


@dataclass(frozen=True, slots=True)
class FleetFigures:
    """A run's figures: the per-entitlement ones and their totals."""

    duration_s: float
    entitlements: tuple[EntitlementFigures, ...]
    ticks: int
    update_bytes_mean: float  # per tick, per proxy; 0 when nothing is sent
    update_bytes_max: int

    @property
    def attempts(self) -> int:
        return sum(e.attempts for e in self.entitlements)

    @property
    def admitted(self) -> int:
        return sum(e.admitted for e in self.entitlements)

    @property
    def refused(self) -> dict[AdmissionOutcome, int]:
        totals: dict[AdmissionOutcome, int] = {}
        for e in self.entitlements:
            for outcome, n in e.refused.items():
                totals[outcome] = totals.get(outcome, 0) + n
        return dict(sorted(totals.items()))

    @property
    def refusals(self) -> int:
        return sum(e.refusals for e in self.entitlements)

    @property
    def false_refusals(self) -> int:
        return sum(e.false_refusals for e in self.entitlements)

    @property
    def refused_fraction(self) -> float:
        return self.refusals / self.attempts if self.attempts else 0.0

    @property
    def overshoot_max_slots(self) -> int:
        return max((e.overshoot_max_slots for e in self.entitlements), default=0)

    @property
    def overshoot_fraction(self) -> float:
        """Σ_e ∫(N_e − L_e)⁺ dt ÷ Σ_e ∫L_e dt."""
        limit = sum(e.limit_slot_s for e in self.entitlements)
        return sum(e.overshoot_slot_s for e in self.entitlements) / limit if limit else 0.0

    def summary(self) -> dict[str, object]:
        """The run's totals as plain JSON values."""
        return {
            "attempts": self.attempts,
            "admitted": self.admitted,
            "refused": {outcome.value: n for outcome, n in self.refused.items()},
            "refusals": self.refusals,
            "refused_fraction": self.refused_fraction,
            "false_refusals": self.false_refusals,
            "overshoot_max_slots": self.overshoot_max_slots,
            "overshoot_fraction": self.overshoot_fraction,
            "ticks": self.ticks,
            "update_bytes_mean": self.update_bytes_mean,
            "update_bytes_max": self.update_bytes_max,
        }


def refusal_ratio(design: FleetFigures, exact: FleetFigures) -> float:
    """refusals(design) ÷ refusals(exact) on the same trace: 1.0 when both refuse nothing, inf when only the design
    does."""
    if exact.refusals == 0:
        return 1.0 if design.refusals == 0 else math.inf
    return design.refusals / exact.refusals


@dataclass(slots=True)
class _Truth:
    """One entitlement's fleet-wide state and running counts."""

    limit_slots: int
    tokens_per_s: float
    depth: float
    bucket: float
    bucket_updated_s: float
    changed_s: float
    in_flight: int = 0
    attempts: int = 0
    admitted: int = 0
    refused: dict[AdmissionOutcome, int] = field(default_factory=dict)
    false_refusals: int = 0
    overshoot_max_slots: int = 0
    overshoot_slot_s: float = 0.0

    def refill(self, now_s: float) -> None:  # the controller's _Ledger.refill
        elapsed = now_s - self.bucket_updated_s
        if elapsed > 0:
            self.bucket = min(self.depth, self.bucket + elapsed * self.tokens_per_s)
            self.bucket_updated_s = now_s

    def integrate(self, now_s: float) -> None:
        over = self.in_flight - self.limit_slots
        if over > 0:
            self.overshoot_slot_s += over * (now_s - self.changed_s)
        self.changed_s = now_s


class FleetMeter:
    """Counts a run's decisions and keeps the fleet-wide truth they are judged by. Time is an argument."""

    def __init__(self, limits: Mapping[str, EntitlementLimits], token_bucket_window_s: float,
                 start_s: float = 0.0) -> None:
        if token_bucket_window_s <= 0:
            raise ValueError(f"`token_bucket_window_s` must be positive, got {token_bucket_window_s}")
        self._start_s = start_s
        self._truth = {
            name: _Truth(lim.concurrency, lim.tokens_per_s, lim.tokens_per_s * token_bucket_window_s,
                         lim.tokens_per_s * token_bucket_window_s, start_s, start_s)
            for name, lim in sorted(limits.items())
        }
        self._update_bytes: list[int] = []

    def decided(self, entitlement: str, outcome: AdmissionOutcome, cost_tokens: int, now_s: float) -> bool:
        """Count one decision made anywhere in the fleet; True when it was a false refusal."""
        truth = self._truth[entitlement]
        truth.attempts += 1
        truth.refill(now_s)
        if outcome is AdmissionOutcome.ADMITTED:
            truth.admitted += 1
            truth.bucket -= cost_tokens
            truth.integrate(now_s)
            truth.in_flight += 1
            truth.overshoot_max_slots = max(truth.overshoot_max_slots, truth.in_flight - truth.limit_slots)
            return False
        truth.refused[outcome] = truth.refused.get(outcome, 0) + 1
        false = truth.in_flight < truth.limit_slots and truth.bucket >= cost_tokens + FALSE_REFUSAL_TOLERANCE_TOKENS
        truth.false_refusals += false
        return false

    def released(self, entitlement: str, refund_tokens: int, now_s: float) -> None:
        """One admitted request ended (anywhere), refunding ``refund_tokens`` (reserved − used) to the fleet."""
        truth = self._truth[entitlement]
        truth.integrate(now_s)
        truth.in_flight -= 1
        truth.refill(now_s)
        truth.bucket = min(truth.depth, truth.bucket + refund_tokens)

    def update_read(self, size_bytes: int) -> None:
        """One tick's update, as one proxy reads it."""
        self._update_bytes.append(size_bytes)

    def in_flight_of(self, entitlement: str) -> int:
        return self._truth[entitlement].in_flight

    def bucket_of(self, entitlement: str, now_s: float) -> float:
        truth = self._truth[entitlement]
        truth.refill(now_s)
        return truth.bucket

    def finish(self, end_s: float, ticks: int) -> FleetFigures:
        """The figures over [start, end_s]; requests still in flight count until ``end_s``."""
        duration_s = end_s - self._start_s
        figures = []
        for name, truth in self._truth.items():
            over = max(0, truth.in_flight - truth.limit_slots)
            figures.append(EntitlementFigures(
                name=name, limit_slots=truth.limit_slots, attempts=truth.attempts, admitted=truth.admitted,
                refused=dict(sorted(truth.refused.items())), false_refusals=truth.false_refusals,
                overshoot_max_slots=truth.overshoot_max_slots,
                overshoot_slot_s=truth.overshoot_slot_s + over * (end_s - truth.changed_s),
                limit_slot_s=truth.limit_slots * duration_s,
            ))
        sizes = self._update_bytes
        return FleetFigures(duration_s, tuple(figures), ticks, sum(sizes) / len(sizes) if sizes else 0.0,
                            max(sizes, default=0))
