"""What the scaler does with one scale command (pure): a function of the command, the pool, what the workload has
now, the per-pool state and ``now_s``.

- A command whose ``version`` is not newer than the last one seen for its pool is a replay: ignored.
- A command older than ``max_age_s`` is not intent any more (a scaler catching up after an outage): ignored.
- The wish is clamped to the pool's ``[minReplicas, maxReplicas]``; the floor is the larger of the command's and the
  controller's own view of what Bound baselines need (promised ≤ provisioned), never above ``maxReplicas``.
- ``core.scaling.Stabilizer`` applies the scale-down stabilisation window and the cooldown. When the workload has
  a different size than the stabiliser believes (someone scaled it by hand), the stabiliser starts from what is.
- Bounds are hard: a workload outside them is brought inside at once, cooldown or not.

The shell commits the returned state only after the patch succeeded, so a failed patch is tried again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from tokenpools.core.scaling import ScalingConfig, Stabilizer
from tokenpools.core.spec import PoolSpec
from tokenpools.topics.records import ScaleCommand


class ScaleOutcome(StrEnum):
    SCALED_UP = "scaled_up"
    SCALED_DOWN = "scaled_down"
    UNCHANGED = "unchanged"
    HELD_STABILIZATION = "held_stabilization"  # wants fewer replicas; the window still remembers a higher wish
    HELD_COOLDOWN = "held_cooldown"
    IGNORED_REPLAY = "ignored_replay"
    IGNORED_TOO_OLD = "ignored_too_old"

    @property
    def changes(self) -> bool:
        return self in (ScaleOutcome.SCALED_UP, ScaleOutcome.SCALED_DOWN)


class CommandFailure(StrEnum):
    """A scale command that led to no decision (the scaler counts these beside its decisions' ``ScaleOutcome``)."""

    FAILED = "failed"  # reading or patching the workload failed (dropped, or retried by the restarted loop)
    UNKNOWN_POOL = "unknown_pool"  # no such pool in the inventory


@dataclass(frozen=True, slots=True)
class PoolScaleState:
    stabilizer: Stabilizer | None = None
    last_version: int = -1


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    pool: str
    outcome: ScaleOutcome
    current: int
    replicas: int
    wanted: int  # the command's wish within [min, max]
    floor: int
    reason: str

    def describe(self) -> str:
        return (f"pool {self.pool}: {self.outcome.value} {self.current} → {self.replicas} "
                f"(wanted {self.wanted}, floor {self.floor}; {self.reason})")


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def decide(state: PoolScaleState, command: ScaleCommand, pool: PoolSpec, observed: int, local_floor: int,
           now_s: float, config: ScalingConfig, max_age_s: float) -> tuple[PoolScaleState, ScaleDecision]:
    """The new per-pool state and the decision (``replicas`` is what the workload should have)."""
    floor = min(pool.max_replicas, max(command.floor_replicas, local_floor))
    wanted = _clamp(command.desired_replicas, pool.min_replicas, pool.max_replicas)

    def skip(outcome: ScaleOutcome, reason: str) -> ScaleDecision:
        return ScaleDecision(pool.name, outcome, observed, observed, wanted, floor, reason)

    if command.version <= state.last_version:
        return state, skip(ScaleOutcome.IGNORED_REPLAY, f"version {command.version} <= {state.last_version}")
    if now_s * 1000 - command.t_ms > max_age_s * 1000:
        age_s = now_s - command.t_ms / 1000
        return replace(state, last_version=command.version), skip(ScaleOutcome.IGNORED_TOO_OLD, f"{age_s:.0f} s old")

    stabilizer = state.stabilizer or Stabilizer(current=observed)
    if stabilizer.current != observed:
        stabilizer = replace(stabilizer, current=observed)
    stabilizer, replicas = stabilizer.step(now_s, wanted, floor, config)
    bounded = _clamp(replicas, max(pool.min_replicas, floor), pool.max_replicas)
    if bounded != replicas:
        stabilizer = replace(stabilizer, current=bounded, last_change_s=now_s)
        replicas = bounded
    new_state = PoolScaleState(stabilizer, command.version)

    target = max(wanted, floor)
    if replicas > observed:
        outcome, why = ScaleOutcome.SCALED_UP, (
            "protected floor" if replicas == floor and floor > wanted else command.reason or "demand")
    elif replicas < observed:
        outcome, why = ScaleOutcome.SCALED_DOWN, (
            "outside maxReplicas" if observed > pool.max_replicas else command.reason or "demand")
    elif target == observed:
        outcome, why = ScaleOutcome.UNCHANGED, "at the wished size"
    elif target > observed or now_s - state_last_change(state) < config.cooldown_s:
        outcome, why = ScaleOutcome.HELD_COOLDOWN, f"cooldown {config.cooldown_s:g} s after the last change"
    else:
        outcome, why = ScaleOutcome.HELD_STABILIZATION, (
            f"a higher wish within the {config.scale_down_stabilization_s:g} s stabilisation window")
    return new_state, ScaleDecision(pool.name, outcome, observed, replicas, wanted, floor, why)


def state_last_change(state: PoolScaleState) -> float:
    return state.stabilizer.last_change_s if state.stabilizer is not None else float("-inf")
