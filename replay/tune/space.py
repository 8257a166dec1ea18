"""The space file: which settings a tuning run may change, over what values, for which outcomes, under which limits.

    parameters:
      policy.alpha_debt: {low: 0.5, high: 4.0}          # a range (log: true for a log scale; step: a grid step)
      policy.mean_slo: {choices: [frozen, recompute]}   # or a list of values
    objectives:
      - {outcome: p99_client_ttft_s.guaranteed, direction: minimize}
    constraints:
      - {outcome: given_up.guaranteed, "<=": 5}

A parameter is a Settings key (``group.field``, ``group.sub.field``) or a replayer knob (``replay.*``), each
applied as ``--set`` applies it. It is checked when the file is read, like a configuration: an unknown key, an
empty range, a bound outside the setting's own allowed range (its pydantic ``ge``/``gt``/``le``/``lt``), a choice
the setting refuses, an unknown parameter or outcome each make one problem naming the file and the line.
``load.*`` keys are refused: a recorded log's load is recorded, not generated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

from tokenpools.config import Settings, load_settings
from tokenpools.config.problems import describe, format_path, translate
from tokenpools.config.yamlio import RawDocument, YamlSyntaxError, parse_documents
from tokenpools.errors import ConfigError, ConfigProblem
from tokenpools.replay.experiments import REPLAY_KEYS, apply_replay_items
from tokenpools.replay.scenario import ReplayParams
from tokenpools.replay.tune.outcomes import groups, split_name

Scalar = int | float | str | bool


class Direction(StrEnum):
    MINIMIZE = "minimize"
    MAXIMIZE = "maximize"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)


class RangeSpec(_Strict):
    low: float
    high: float
    log: StrictBool = False
    step: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _shape(self) -> RangeSpec:
        if self.low >= self.high:
            raise ValueError(f"empty range: low ({describe(self.low)}) must be below high ({describe(self.high)})")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range needs low > 0, got {describe(self.low)}")
        if self.log and self.step is not None:
            raise ValueError("a range is either log or stepped, not both")
        return self


class ChoicesSpec(_Strict):
    choices: list[Scalar] = Field(min_length=1)


class ObjectiveSpec(_Strict):
    outcome: str
    direction: Direction


TODAY = "today"  # a constraint's bound: the outcome of today's settings on the tuning part


class ConstraintSpec(_Strict):
    outcome: str
    at_most: float | str | None = Field(None, alias="<=")
    at_least: float | str | None = Field(None, alias=">=")

    @field_validator("at_most", "at_least")
    @classmethod
    def _number_or_today(cls, value: float | str | None) -> float | str | None:
        if isinstance(value, str) and value != TODAY:
            raise ValueError(f"a bound is a number or {TODAY!r} (today's settings' outcome), got {value!r}")
        return value

    @model_validator(mode="after")
    def _one_bound(self) -> ConstraintSpec:
        if (self.at_most is None) == (self.at_least is None):
            raise ValueError('give exactly one bound: "<=" or ">="')
        return self


_TOP = ("parameters", "objectives", "constraints")


@dataclass(frozen=True, slots=True)
class Parameter:
    """One dimension of the search: a key as ``--set`` takes it, and its values (a range or choices)."""

    name: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    integer: bool = False
    choices: tuple[Scalar, ...] = ()

    @property
    def is_range(self) -> bool:
        return not self.choices


@dataclass(frozen=True, slots=True)
class Objective:
    outcome: str
    direction: Direction


@dataclass(frozen=True, slots=True)
class Constraint:
    """``outcome <= bound`` (or ``>=``). A bound written ``today`` is relative: it is NaN until ``resolve`` sets it
    to today's outcome, so "no worse than today's settings" reads the same for every trial."""

    outcome: str
    bound: float
    at_most: bool  # True: outcome <= bound; False: outcome >= bound
    relative: bool = False  # the bound was ``today``

    def violation(self, value: float) -> float:
        """Optuna's convention: <= 0 when met (NaN, or a relative bound not resolved: not met, by 1)."""
        if math.isnan(value) or math.isnan(self.bound):
            return 1.0
        return value - self.bound if self.at_most else self.bound - value

    def met(self, value: float) -> bool:
        return self.violation(value) <= 0

    def label(self) -> str:
        bound = f"today ({self.bound:g})" if self.relative else f"{self.bound:g}"
        return f"{self.outcome} {'<=' if self.at_most else '>='} {bound}"


@dataclass(frozen=True, slots=True)
class Space:
    source: str
    parameters: tuple[Parameter, ...]
    objectives: tuple[Objective, ...]
    constraints: tuple[Constraint, ...]
    digest: str  # sha256 of the file's text: a resumed study must search the same space


def load_space(path: Path, entitlements: Sequence[str], settings_values: Mapping[str, Any]) -> Space:
    """Read and check a space file against a configuration's entitlements and settings; ConfigError lists every
    problem, one line each (``file:line: where: what``)."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigProblem(source, f"cannot read: {exc.strerror if isinstance(exc, OSError) else exc}")]) from None
    return parse_space(text, source, entitlements, settings_values)


def parse_space(text: str, source: str, entitlements: Sequence[str], settings_values: Mapping[str, Any]) -> Space:
    try:
        docs = parse_documents(text)
    except YamlSyntaxError as exc:
        raise ConfigError([ConfigProblem(source, str(exc), line=exc.line)]) from None
    if len(docs) != 1 or not isinstance(docs[0].data, dict):
        raise ConfigError([ConfigProblem(source, "a space file is one YAML mapping with parameters, objectives and "
                                         "constraints", line=docs[1].line if len(docs) > 1 else None)])
    raw = docs[0]
    problems: list[ConfigProblem] = []

    def problem(loc: Sequence[int | str], message: str) -> None:
        problems.append(ConfigProblem(source, message, path=format_path(loc), line=raw.line_of(loc)))

    for key, line, first in raw.duplicate_keys:
        problems.append(ConfigProblem(source, f"duplicate key {key!r} (first at line {first})", line=line))
    data: dict[Any, Any] = raw.data
    for key in data:
        if key not in _TOP:
            problem((key,), f"unknown key (known: {', '.join(_TOP)})")
    parameters = _parameters(data.get("parameters"), problem, settings_values)
    known_groups = groups(entitlements)
    objectives = tuple(_list(data, "objectives", ObjectiveSpec, problem, known_groups, required=True))
    constraints = tuple(_list(data, "constraints", ConstraintSpec, problem, known_groups, required=False))
    if problems:
        raise ConfigError(sorted(problems, key=lambda p: p.line or 0))
    return Space(
        source, tuple(parameters),
        tuple(Objective(o.outcome, o.direction) for o in objectives),
        tuple(_constraint(c) for c in constraints),
        hashlib.sha256(text.encode()).hexdigest(),
    )


def _constraint(spec: ConstraintSpec) -> Constraint:
    bound = spec.at_most if spec.at_most is not None else spec.at_least
    relative = bound == TODAY
    return Constraint(spec.outcome, math.nan if relative else float(bound), spec.at_most is not None,  # type: ignore[arg-type]
                      relative)


def resolve(space: Space, today: Mapping[str, float]) -> Space:
    """The space with each ``today`` bound set to today's outcome (``today``: its outcomes on the tuning part)."""
    constraints = tuple(dataclasses.replace(c, bound=today[c.outcome]) if c.relative else c
                        for c in space.constraints)
    return dataclasses.replace(space, constraints=constraints)


_Problem = typing.Callable[[Sequence[int | str], str], None]


def _parameters(value: Any, problem: _Problem, settings_values: Mapping[str, Any]) -> list[Parameter]:
    if not isinstance(value, dict) or not value:
        problem(("parameters",) if value is not None else (), "parameters: a mapping of at least one setting to "
                "its range ({low, high}) or choices ({choices: [...]})")
        return []
    out = []
    for name, spec in value.items():
        loc: tuple[int | str, ...] = ("parameters", str(name))
        target = _target(str(name))
        if isinstance(target, str):
            problem(loc, target)
            continue
        if not isinstance(spec, dict):
            problem(loc, "must be a mapping: {low, high} (log, step optional) or {choices: [...]}")
            continue
        model = ChoicesSpec if "choices" in spec else RangeSpec
        try:
            parsed = model.model_validate(spec)
        except ValidationError as exc:
            for where, message in _one_per_typo(translate(exc, model, prefix=loc)):
                problem(where, message)
            continue
        parameter = _checked(str(name), parsed, target, loc, problem, settings_values)
        if parameter is not None:
            out.append(parameter)
    return out


@dataclass(frozen=True, slots=True)
class _Target:
    """What a parameter sets: its type and its allowed interval."""

    numeric: bool
    integer: bool
    lower: tuple[float, bool] | None = None  # (bound, inclusive)
    upper: tuple[float, bool] | None = None


_REPLAY_TARGETS = {"grace_s": _Target(True, False, (0.0, True)), "sample_s": _Target(True, False, (0.0, False)),
                   "backend_waiting": _Target(False, False), "backend": _Target(False, False)}


def _target(name: str) -> _Target | str:
    """The setting a parameter names, or what is wrong with the name."""
    if name.startswith("load."):
        return "load.* options do not apply to a recorded log (its load is recorded)"
    if name.startswith("replay."):
        key = name.removeprefix("replay.")
        if key not in REPLAY_KEYS or key not in _REPLAY_TARGETS:
            return f"unknown parameter: no replayer knob {key!r} (known: {', '.join('replay.' + k for k in REPLAY_KEYS)})"
        return _REPLAY_TARGETS[key]
    model: type[BaseModel] = Settings
    parts = name.split(".")
    for depth, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            where = "settings group" if depth == 0 else f"setting of {'.'.join(parts[:depth])}"
            return f"unknown parameter: no {where} {part!r} (known: {', '.join(model.model_fields)})"
        annotation = field.annotation
        is_group = isinstance(annotation, type) and issubclass(annotation, BaseModel)
        if depth == len(parts) - 1:
            if is_group:
                return f"unknown parameter: {name} is a group of settings; name one of its fields"
            return _field_target(field)
        if not is_group:
            return f"unknown parameter: {'.'.join(parts[: depth + 1])} is a setting, not a group"
        model = annotation  # type: ignore[assignment]
    return f"unknown parameter {name!r}"


def _field_target(field: FieldInfo) -> _Target:
    annotation = field.annotation
    args = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else ()
    base = next((a for a in args if a is not type(None)), annotation) if args else annotation
    numeric = base in (int, float)
    lower = upper = None
    for meta in field.metadata:
        if isinstance(meta, annotated_types.Ge):
            lower = (float(meta.ge), True)  # type: ignore[arg-type]
        elif isinstance(meta, annotated_types.Gt):
            lower = (float(meta.gt), False)  # type: ignore[arg-type]
        elif isinstance(meta, annotated_types.Le):
            upper = (float(meta.le), True)  # type: ignore[arg-type]
        elif isinstance(meta, annotated_types.Lt):
            upper = (float(meta.lt), False)  # type: ignore[arg-type]
    return _Target(numeric, base is int, lower, upper)


def _interval(target: _Target) -> str:
    low = "(-inf" if target.lower is None else ("[" if target.lower[1] else "(") + f"{target.lower[0]:g}"
    high = "inf)" if target.upper is None else f"{target.upper[0]:g}" + ("]" if target.upper[1] else ")")
    return f"{low}, {high}"


def _allowed(value: float, target: _Target) -> bool:
    if target.lower is not None and (value < target.lower[0] or (value == target.lower[0] and not target.lower[1])):
        return False
    return not (target.upper is not None
                and (value > target.upper[0] or (value == target.upper[0] and not target.upper[1])))


def _checked(name: str, spec: RangeSpec | ChoicesSpec, target: _Target, loc: tuple[int | str, ...],
             problem: _Problem, settings_values: Mapping[str, Any]) -> Parameter | None:
    if isinstance(spec, ChoicesSpec):
        ok = True
        for i, choice in enumerate(spec.choices):
            message = _refused(name, choice, settings_values)
            if message is not None:
                problem((*loc, "choices", i), f"{name} refuses {describe(choice)}: {message}")
                ok = False
        return Parameter(name, choices=tuple(spec.choices)) if ok else None
    if not target.numeric:
        problem(loc, f"{name} is not a number: give {{choices: [...]}}")
        return None
    ok = True
    for bound in ("low", "high"):
        value = getattr(spec, bound)
        if not _allowed(value, target):
            problem((*loc, bound), f"{bound} {describe(value)} is outside {name}'s allowed range {_interval(target)}")
            ok = False
        elif target.integer and not float(value).is_integer():
            problem((*loc, bound), f"{name} is a whole number; {bound} must be one, got {describe(value)}")
            ok = False
    if target.integer and spec.step is not None and not float(spec.step).is_integer():
        problem((*loc, "step"), f"{name} is a whole number; step must be one, got {describe(spec.step)}")
        ok = False
    if not ok:
        return None
    return Parameter(name, spec.low, spec.high, spec.log, spec.step, target.integer)


def _refused(name: str, value: Scalar, settings_values: Mapping[str, Any]) -> str | None:
    """Why the setting refuses ``value`` (None: it takes it), by the same path ``--set`` takes."""
    item = f"{name}={format_value(value)}"
    try:
        if name.startswith("replay."):
            apply_replay_items(ReplayParams(), [item])
        else:
            load_settings(settings_values, [item])
    except ConfigError as exc:
        return "; ".join(p.message for p in exc.problems)
    except ValueError as exc:
        return str(exc)
    return None


def format_value(value: Scalar) -> str:
    """A value as a ``--set`` item spells it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _one_per_typo(found: list[tuple[tuple[int | str, ...], str]]) -> list[tuple[tuple[int | str, ...], str]]:
    """A misspelt key is one problem, not two: its "unknown field" (with the hint) stands for the "missing" one."""
    unknown = any(m.startswith("unknown field") for _, m in found)
    return [(loc, m) for loc, m in found if not (unknown and m == "required field is missing")]


def _list(data: Mapping[Any, Any], key: Literal["objectives", "constraints"],
          model: type[ObjectiveSpec] | type[ConstraintSpec], problem: _Problem,
          known_groups: Mapping[str, object], required: bool) -> list[Any]:
    value = data.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        problem((key,) if key in data else (), f"{key}: a list of at least one "
                + ("{outcome, direction: minimize|maximize}" if key == "objectives" else '{outcome, "<=": bound}'))
        return []
    out = []
    for i, item in enumerate(value):
        loc: tuple[int | str, ...] = (key, i)
        try:
            parsed = model.model_validate(item)
        except ValidationError as exc:
            for where, message in _one_per_typo(translate(exc, model, prefix=loc)):
                problem(where, message)
            continue
        message = outcome_problem(parsed.outcome, known_groups)
        if message is not None:
            problem((*loc, "outcome"), message)
            continue
        out.append(parsed)
    return out


def outcome_problem(name: str, known_groups: Mapping[str, object]) -> str | None:
    from tokenpools.replay.tune.outcomes import OutcomeKind

    split = split_name(name)
    if split is None:
        return (f"unknown outcome {name!r}: name it KIND.GROUP, KIND one of "
                f"{', '.join(k.value for k in OutcomeKind)}")
    if split[1] not in known_groups:
        return (f"unknown outcome {name!r}: {split[1]!r} is neither pool, a service class nor an entitlement of the "
                f"configuration (known: {', '.join(known_groups)})")
    return None

