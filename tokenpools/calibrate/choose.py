"""Each step's verdict against the P99 TTFT target, and the step whose figures become ``perReplica`` (pure).

The chosen step is the one of the largest concurrency among those UNDER_TARGET: every request answered and P99 TTFT
at most the target. It is the largest rather than the last of an unbroken run from concurrency 1, so one noisy
step (a neighbour's job on a shared machine) does not hide a larger concurrency that met the target; a step with a
failed request is never chosen. Two properties follow and are tested: the chosen step's P99 TTFT is within the
target, and a larger target never chooses a smaller concurrency.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from tokenpools.calibrate.stats import StepStats


class StepVerdict(StrEnum):
    UNDER_TARGET = "under target"  # every request answered; P99 TTFT <= the target
    OVER_TARGET = "over target"  # every request answered; P99 TTFT above the target
    FAILED = "failed"  # a request failed, or none was answered, or no token counted: it says nothing of the capacity


def verdict(step: StepStats, ttft_p99_target_s: float) -> StepVerdict:
    if step.failed or step.ttft_p99_s is None or step.total_tokens_per_s <= 0:
        return StepVerdict.FAILED
    return StepVerdict.UNDER_TARGET if step.ttft_p99_s <= ttft_p99_target_s else StepVerdict.OVER_TARGET


def choose(steps: Sequence[StepStats], ttft_p99_target_s: float) -> StepStats | None:
    """The UNDER_TARGET step of the largest concurrency (the first such if two share it); None if there is none."""
    chosen: StepStats | None = None
    for step in steps:
        if verdict(step, ttft_p99_target_s) is StepVerdict.UNDER_TARGET and (
                chosen is None or step.concurrency > chosen.concurrency):
            chosen = step
    return chosen
