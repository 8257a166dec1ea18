"""The search: an Optuna study in DIR, asked for points in fixed-size batches and told their results in order.

Determinism: the sampler is seeded, and a batch is always ``batch`` points (the last one the remainder), asked
together and told in trial-number order once all of them are back. Batch k+1 is asked when batch k−1 has been told
(two batches in flight: the next one is already queued behind the one being waited for, so the workers do not
idle while a batch's slowest trial finishes); the sampler sees batch k as running (TPE's constant liar). The
order of asks and tells is fixed by that rule alone, never by which trial finished first or how many processes or
nodes ran them, so a serial run, ``--workers K`` and ``--ray`` ask the same points and find the same best one.
(A resumed study starts a new sampler: its later points depend on where the first run stopped.)

Samplers: TPE for one objective (constant liar, so a batch's points spread out), NSGA-II for several (population
``min(50, max(batch, trials // 4))``), both with the constraints (``constraints_func`` reads each trial's
violations, stored as its ``constraints`` user attribute); ``grid`` walks every combination of the choices and
steps (in an order its seed shuffles), at most ``trials`` of them, and ``random`` samples uniformly.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from tokenpools.errors import ConfigError, ConfigProblem
from tokenpools.replay.tune.executors import Job, Pending
from tokenpools.replay.tune.space import Direction, Parameter, Space, format_value
from tokenpools.replay.tune.trials import TrialResult

STUDY_NAME = "tokenpools-tune"
JOURNAL = "study.journal"


class SamplerKind(StrEnum):
    AUTO = "auto"
    TPE = "tpe"
    NSGA2 = "nsga2"
    GRID = "grid"
    RANDOM = "random"


def distributions(space: Space) -> dict[str, BaseDistribution]:
    out: dict[str, BaseDistribution] = {}
    for p in space.parameters:
        if not p.is_range:
            out[p.name] = CategoricalDistribution(p.choices)
        elif p.integer:
            out[p.name] = IntDistribution(int(p.low), int(p.high), log=p.log, step=int(p.step or 1))  # type: ignore[arg-type]
        else:
            out[p.name] = FloatDistribution(p.low, p.high, log=p.log, step=p.step)  # type: ignore[arg-type]
    return out


def grid_values(p: Parameter) -> list[Any]:
    if not p.is_range:
        return list(p.choices)
    if p.step is None:
        raise ConfigError([ConfigProblem("--sampler grid", f"{p.name} is a range without a step: give it a step or "
                                         "choices, or use another sampler")])
    n = int(math.floor((p.high - p.low) / p.step + 1e-9))  # type: ignore[operator]
    values = [p.low + i * p.step for i in range(n + 1)]  # type: ignore[operator]
    return [int(round(v)) for v in values] if p.integer else [round(v, 12) for v in values]


def grid_size(space: Space) -> int:
    return math.prod(len(grid_values(p)) for p in space.parameters)


def _violations(trial: FrozenTrial) -> Sequence[float]:
    return trial.user_attrs.get("constraints", ())


def make_sampler(kind: SamplerKind, space: Space, seed: int, trials: int, batch: int) -> optuna.samplers.BaseSampler:
    constraints = _violations if space.constraints else None
    if kind is SamplerKind.AUTO:
        kind = SamplerKind.TPE if len(space.objectives) == 1 else SamplerKind.NSGA2
    with warnings.catch_warnings():  # constant_liar and constraints_func are "experimental" arguments
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if kind is SamplerKind.TPE:
            return optuna.samplers.TPESampler(seed=seed, constant_liar=True, constraints_func=constraints)
        if kind is SamplerKind.NSGA2:
            return optuna.samplers.NSGAIISampler(seed=seed, constraints_func=constraints,
                                                 population_size=min(50, max(batch, trials // 4, 2)))
        if kind is SamplerKind.GRID:
            return optuna.samplers.GridSampler({p.name: grid_values(p) for p in space.parameters}, seed=seed)
        return optuna.samplers.RandomSampler(seed=seed)


def open_study(out: Path, sampler: optuna.samplers.BaseSampler, space: Space, resume: bool,
               attrs: dict[str, Any]) -> optuna.Study:
    """The study in ``out``: a new one, or (``resume``) the one there, refused when it was made for another log,
    space file or hold-out (``attrs``, stored as study user attributes)."""
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    path = out / JOURNAL
    exists = path.exists() and path.stat().st_size > 0
    if exists and not resume:
        raise ConfigError([ConfigProblem(str(out), "holds a study already: pass --resume to continue it, or "
                                         "choose another --out")])
    if resume and not exists:
        raise ConfigError([ConfigProblem(str(out), "--resume: there is no study to continue here")])
    storage = JournalStorage(JournalFileBackend(str(path)))
    directions = [d.value for d in (o.direction for o in space.objectives)]
    if resume:
        study = optuna.load_study(study_name=STUDY_NAME, storage=storage, sampler=sampler)
        for key, value in attrs.items():
            stored = study.user_attrs.get(key)
            if stored != value:
                raise ConfigError([ConfigProblem(str(out), f"--resume: the study was made with another {key} "
                                                 f"({str(stored)[:16]}…, now {str(value)[:16]}…); tune into "
                                                 "another --out")])
        return study
    study = optuna.create_study(study_name=STUDY_NAME, storage=storage, sampler=sampler, directions=directions)
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    return study


def items_of(space: Space, params: dict[str, Any]) -> tuple[str, ...]:
    """A point as ``--set`` items, in the space file's order."""
    return tuple(f"{p.name}={format_value(params[p.name])}" for p in space.parameters)


def run(study: optuna.Study, space: Space, trials: int, batch: int,
        submit: Callable[[Sequence[Job]], Pending],
        done: Callable[[FrozenTrial, TrialResult | None], None] = lambda t, r: None,
        told_space: Callable[[], Space] | None = None) -> None:
    """Ask and tell until the study has ``trials`` finished trials, two batches in flight (a resumed study's
    unfinished ones are failed first: their results were lost). ``told_space`` gives the space the results are told
    against (its ``today`` bounds resolved); it is called once, before the first tell, so today's replay can run
    beside the first batches."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
        study.tell(t.number, state=TrialState.FAIL)
    dists = distributions(space)
    to_ask = trials - len(study.get_trials(deepcopy=False))
    in_flight: deque[tuple[list[optuna.Trial], Pending]] = deque()

    def ask_next() -> None:
        nonlocal to_ask
        asked = [study.ask(dists) for _ in range(min(batch, to_ask))]
        to_ask -= len(asked)
        in_flight.append((asked, submit([(t.number, items_of(space, t.params)) for t in asked])))

    while to_ask > 0 and len(in_flight) < IN_FLIGHT:
        ask_next()
    told = space if told_space is None or not in_flight else None
    while in_flight:
        asked, pending = in_flight.popleft()
        results = pending.result()
        if told is None:
            told = told_space() if told_space is not None else space
        for trial, result in zip(asked, results):
            done(_tell(study, told, trial, result), result)
        if to_ask > 0:
            ask_next()


IN_FLIGHT = 2
"""Batches submitted and not yet told: the one being waited for and the next."""


def _tell(study: optuna.Study, space: Space, trial: optuna.Trial, result: TrialResult) -> FrozenTrial:
    values = [result.outcomes[o.outcome] for o in space.objectives]
    trial.set_user_attr("digest", result.digest)
    trial.set_user_attr("realtime_multiple", result.realtime_multiple)  # (timings: trials.csv, not the report)
    trial.set_user_attr("cpu_us_per_request", result.cpu_us_per_request)
    trial.set_user_attr("machine", result.machine)
    trial.set_user_attr("load_1m", result.load_1m)
    trial.set_user_attr("outcomes", {k: (None if math.isnan(v) else v) for k, v in result.outcomes.items()})
    trial.set_user_attr("constraints", [c.violation(result.outcomes[c.outcome]) for c in space.constraints])
    if any(math.isnan(v) for v in values):
        trial.set_user_attr("failed", "an objective has no samples (NaN)")
        return study.tell(trial, state=TrialState.FAIL)
    return study.tell(trial, values)


def direction_list(space: Space) -> list[Direction]:
    return [o.direction for o in space.objectives]
