"""One trial: the log (or a part of it) replayed once under the base settings plus a point's ``--set`` items.

A trial is a pure function of its inputs (the replay is deterministic); its ``digest`` — the SHA-256 of its
outcomes' canonical JSON and of every replayed decision's time and outcome — is the same wherever it runs, which
is how serial, ``--workers`` and ``--ray`` runs are compared. The timings beside it (wall and CPU seconds of the
replay, the machine it ran on and that machine's load: ``machine``) are measured here and are the only thing that
differs between runs.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.replay import logio
from tokenpools.replay.experiments import recorded_params
from tokenpools.replay.logio import LogData
from tokenpools.replay.replayer import replay
from tokenpools.replay.tune import machine
from tokenpools.replay.tune.outcomes import outcomes


@dataclass(frozen=True, slots=True)
class TrialContext:
    """What every trial shares besides the log: the pool, its entitlements, the configuration's settings, the
    fixed ``--set`` items (the search's items win over them), the capacity changes and the policy."""

    pool: PoolSpec
    entitlements: tuple[EntitlementSpec, ...]
    settings_values: Mapping[str, Any] = field(default_factory=dict)
    fixed: tuple[str, ...] = ()
    changes: tuple[tuple[float, int], ...] = ()
    policy: str = "token-pools"


@dataclass(frozen=True, slots=True)
class TrialResult:
    number: int
    outcomes: dict[str, float]
    digest: str
    requests: int
    simulated_s: float
    wall_s: float
    cpu_s: float
    machine: str = ""  # where it was timed (``machine.describe``)
    load_1m: float | None = None  # that machine's 1-minute load average when the replay ended

    @property
    def realtime_multiple(self) -> float:
        """Replayed seconds per wall-clock second of the replay."""
        return self.simulated_s / self.wall_s if self.wall_s > 0 else math.inf

    @property
    def cpu_us_per_request(self) -> float:
        return 1e6 * self.cpu_s / self.requests if self.requests else 0.0


def run_trial(data: LogData, context: TrialContext, number: int, items: Sequence[str]) -> TrialResult:
    params = recorded_params(context.settings_values, [*context.fixed, *items])  # (the CLI checked the fixed ones)
    scenario, _ = logio.scenario_from_data(data, context.pool, context.entitlements, params, context.changes)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    result = replay(scenario, context.policy)
    wall_s, cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
    values = outcomes(result)
    h = hashlib.sha256(canonical_json(values).encode())
    h.update(repr((result.decisions.t_s, result.decisions.outcome)).encode())
    return TrialResult(number, values, h.hexdigest(), len(scenario.arrivals), scenario.duration_s, wall_s, cpu_s,
                       machine.describe(), machine.load_1m())


def canonical_json(values: Mapping[str, float]) -> str:
    """Sorted keys, NaN as null, floats as Python writes them (shortest round trip)."""
    return json.dumps({k: (None if math.isnan(v) else v) for k, v in values.items()}, sort_keys=True,
                      separators=(",", ":"), allow_nan=False)
