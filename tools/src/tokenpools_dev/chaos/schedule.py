"""The fault schedule of a chaos run, pure: a function of the seed and the run's length (docs/chaos.md).

Every kind is injected at least once, in an order the seed shuffles, then further faults of kinds the seed draws
fill the count. Faults are spaced evenly over the load (each at a seeded point of its own slot, never two at once),
so each has recovered before the next begins and the checker can tell which fault a symptom belongs to.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum


class FaultKind(StrEnum):
    AGENTS_KILL = "agents_kill"  # SIGKILL an agents worker, start it again
    BROKER_PAUSE = "broker_pause"  # SIGSTOP the broker longer than the producer timeout, then SIGCONT
    BROKER_RESTART = "broker_restart"  # stop the broker and start it again on its data
    PROXY_KILL = "proxy_kill"  # SIGKILL a proxy, start it again on its port
    CONTROLLER_RESTART = "controller_restart"  # stop the controller and start it again
    PROXY_PAUSE = "proxy_pause"  # SIGSTOP a proxy for a few seconds (its consumers and its requests stall)

    @property
    def targets_proxy(self) -> bool:
        return self in (FaultKind.PROXY_KILL, FaultKind.PROXY_PAUSE)


@dataclass(frozen=True, slots=True)
class Fault:
    at_s: float  # wall seconds after the load's start
    kind: FaultKind
    target: int  # the proxy's or agents worker's index (0 for the broker and the controller)


def schedule(seed: int, load_s: float, count: int, proxies: int, workers: int, lead_s: float = 10.0,
             tail_s: float = 20.0) -> list[Fault]:
    """``count`` faults (at least one of each kind) in [lead_s, load_s − tail_s), in time order."""
    kinds = list(FaultKind)
    if count < len(kinds):
        raise ValueError(f"`count` must be >= {len(kinds)} (one fault of each kind), got {count}")
    if proxies < 1 or workers < 1:
        raise ValueError(f"`proxies` and `workers` must be >= 1, got {proxies}, {workers}")
    span_s = load_s - tail_s - lead_s
    if span_s <= 0:
        raise ValueError(f"the load ({load_s:g} s) leaves no time for faults after {lead_s:g} s and before the last "
                         f"{tail_s:g} s")
    rng = random.Random(f"{seed}:chaos")
    order = kinds[:]
    rng.shuffle(order)
    order += [rng.choice(kinds) for _ in range(count - len(kinds))]
    slot_s = span_s / count
    out = []
    for i, kind in enumerate(order):
        at_s = lead_s + slot_s * (i + 0.2 * rng.random())  # early in its slot: the rest is recovery
        target = rng.randrange(proxies) if kind.targets_proxy else rng.randrange(workers) \
            if kind is FaultKind.AGENTS_KILL else 0
        out.append(Fault(round(at_s, 3), kind, target))
    return out
