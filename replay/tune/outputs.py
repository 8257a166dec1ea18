"""What a tuning run leaves in DIR: trials.csv, best.yaml, report.md, pareto.png (and speed.json, the timings).

``report.md`` holds no timing and no path of DIR, so two runs with the same seed, log and space write the same
bytes; the timings (each trial's real-time multiple and CPU µs per request, with the machine it ran on and that
machine's load) are in trials.csv and speed.json, and the report says so.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tokenpools.replay.tune.choose import Point, best, front, on_front
from tokenpools.replay.tune.outcomes import OutcomeKind
from tokenpools.replay.tune.space import Constraint, Space
from tokenpools.replay.tune.trials import TrialResult

SETTINGS_KIND = "TokenPoolsSettings"


@dataclass(frozen=True, slots=True)
class TrialRow:
    number: int
    state: str  # COMPLETE, FAIL
    params: dict[str, Any]
    outcomes: dict[str, float]  # NaN: undefined
    digest: str
    violations: tuple[float, ...]  # one per constraint, <= 0 when met
    wall_s: float | None
    cpu_us_per_request: float | None
    realtime_multiple: float | None
    machine: str = ""  # where it was timed (``machine.describe``)
    load_1m: float | None = None  # that machine's 1-minute load average then

    @property
    def feasible(self) -> bool:
        return self.state == "COMPLETE" and all(v <= 0 for v in self.violations)


@dataclass(frozen=True, slots=True)
class Findings:
    """Everything the outputs say, gathered once (``cli`` builds it from the study and the extra replays)."""

    space: Space
    log: str
    log_digest: str
    seed: int
    sampler: str
    batch: int
    holdout_fraction: float
    rows: tuple[TrialRow, ...]
    current: TrialResult  # today's settings on the tuning part
    held_out: Mapping[str, TrialResult]  # "current", "chosen" on the held-out part ({} without a hold-out)
    importances: Mapping[str, Mapping[str, float]]  # objective → parameter → importance (normalised)
    entitlements: tuple[str, ...] = ()

    def points(self) -> list[Point]:
        return [Point(r.number, tuple(r.outcomes[o.outcome] for o in self.space.objectives), r.feasible)
                for r in self.rows if r.state == "COMPLETE"]

    def directions(self) -> list[Any]:
        return [o.direction for o in self.space.objectives]

    def best_row(self) -> TrialRow | None:
        chosen = best(self.points(), self.directions())
        return None if chosen is None else next(r for r in self.rows if r.number == chosen.number)

    def current_point(self) -> Point:
        values = self.current.outcomes
        met = all(c.violation(values[c.outcome]) <= 0 for c in self.space.constraints)
        return Point(-1, tuple(values[o.outcome] for o in self.space.objectives), met)

    def current_on_front(self) -> bool:
        return on_front(self.current_point(), self.points(), self.directions())


def _num(value: float | None, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}g}"


# ---------------------------------------------------------------- trials.csv


def write_trials_csv(path: Path, findings: Findings) -> Path:
    names = [p.name for p in findings.space.parameters]
    outcome_names = list(findings.current.outcomes)
    header = ["trial", "state", "feasible", *names, *outcome_names, "digest", "realtime_multiple",
              "cpu_us_per_request", "machine", "load_1m"]
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        for r in findings.rows:
            w.writerow([r.number, r.state, r.feasible, *(r.params.get(n, "") for n in names),
                        *("" if math.isnan(r.outcomes.get(n, math.nan)) else r.outcomes[n] for n in outcome_names),
                        r.digest, "" if r.realtime_multiple is None else f"{r.realtime_multiple:.1f}",
                        "" if r.cpu_us_per_request is None else f"{r.cpu_us_per_request:.1f}",
                        r.machine, "" if r.load_1m is None else f"{r.load_1m:.2f}"])
    return path


# ---------------------------------------------------------------- best.yaml


def settings_changes(params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(nested Settings values, replayer knobs) of a point."""
    nested: dict[str, Any] = {}
    knobs: dict[str, Any] = {}
    for name, value in params.items():
        if name.startswith("replay."):
            knobs[name] = value
            continue
        node = nested
        *groups, leaf = name.split(".")
        for g in groups:
            node = node.setdefault(g, {})
        node[leaf] = value
    return nested, knobs


def _merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def best_yaml(raw_documents: Sequence[Mapping[str, Any]], params: Mapping[str, Any], header: str) -> str:
    """The configuration's documents with the point's settings in its TokenPoolsSettings document (added when it
    has none): a file ``tokenpools validate`` accepts and ``--config`` applies. Replayer knobs (``replay.*``) are
    not settings: the header lists them as ``--set`` items."""
    nested, knobs = settings_changes(params)
    docs = [dict(d) for d in raw_documents]
    settings = next((d for d in docs if d.get("kind") == SETTINGS_KIND), None)
    if settings is None:
        api = next((d.get("apiVersion") for d in docs if d.get("apiVersion")), "tokenpools.io/v1alpha1")
        settings = {"apiVersion": api, "kind": SETTINGS_KIND, "spec": {}}
        docs.append(settings)
    settings["spec"] = _merge(settings.get("spec") or {}, nested)
    lines = [f"# {line}" for line in header.splitlines()]
    lines += [f"# replayer knob (not a setting): --set {k}={v}" for k, v in knobs.items()]
    return "\n".join(lines) + "\n" + yaml.safe_dump_all(docs, sort_keys=False, allow_unicode=True)


# ---------------------------------------------------------------- report.md


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def _yes(met: bool) -> str:
    return "yes" if met else "no"


def _nearest_row(constraint: Constraint, done: Sequence[TrialRow], today: Mapping[str, float]) -> list[str]:
    """The completed trial whose outcome comes nearest the constraint's bound (the lowest violation)."""
    rows = [r for r in done if not math.isnan(r.outcomes[constraint.outcome])]
    today_value = today[constraint.outcome]
    if not rows:
        return [constraint.label(), "—", "—", "—", _num(today_value), _yes(constraint.met(today_value))]
    near = min(rows, key=lambda r: (constraint.violation(r.outcomes[constraint.outcome]), r.number))
    value = near.outcomes[constraint.outcome]
    return [constraint.label(), str(near.number), _num(value), _yes(constraint.met(value)), _num(today_value),
            _yes(constraint.met(today_value))]


def report_md(findings: Findings, config_source: str) -> str:
    space = findings.space
    chosen = findings.best_row()
    done = [r for r in findings.rows if r.state == "COMPLETE"]
    feasible = [r for r in done if r.feasible]
    lines = ["# tokenpools tune", "",
             f"Log `{findings.log}` (digest `{findings.log_digest[:16]}`), configuration `{config_source}`, space "
             f"`{space.source}` (digest `{space.digest[:16]}`); sampler {findings.sampler}, seed {findings.seed}, "
             f"batches of {findings.batch}; "
             + (f"the last {findings.holdout_fraction:.0%} of the log's arrivals held out."
                if findings.held_out else "nothing held out."), "",
             f"{len(findings.rows)} trials: {len(done)} completed, {len(feasible)} feasible "
             f"(meeting {len(space.constraints)} constraint{'s' if len(space.constraints) != 1 else ''}).", "",
             "Objectives: " + "; ".join(f"{o.direction.value} `{o.outcome}`" for o in space.objectives) + ".", "",
             "## Best point", ""]
    if chosen is None:
        lines += ["No trial met every constraint: there is no best point, and best.yaml is not written. Each "
                  "constraint's nearest trial, and today's settings, on the tuning part (a bound no trial reaches "
                  "is out of this space's reach on this log: loosen it, or search other settings):", ""]
        lines += _table(["constraint", "nearest trial", "its value", "met", "today", "met"],
                        [_nearest_row(c, done, findings.current.outcomes) for c in space.constraints])
        lines += [""]
    else:
        rule = ("the feasible trial best on the objective" if len(space.objectives) == 1 else
                "the feasible Pareto point best on the first objective (ties: the next objectives, then the "
                "lowest trial number)")
        lines += [f"Trial {chosen.number}, {rule}.", ""]
        lines += _table(["parameter", "best", "today"],
                        [[p.name, str(chosen.params.get(p.name)), "(configuration)"] for p in space.parameters])
        lines += [""]
        lines += _table(["objective", "best", "today"],
                        [[f"{o.direction.value} {o.outcome}", _num(chosen.outcomes[o.outcome]),
                          _num(findings.current.outcomes[o.outcome])] for o in space.objectives])
        lines += [""]
        if space.constraints:
            lines += _table(["constraint", "best", "met", "today", "met"],
                            [[c.label(), _num(chosen.outcomes[c.outcome]),
                              _yes(c.met(chosen.outcomes[c.outcome])),
                              _num(findings.current.outcomes[c.outcome]),
                              _yes(c.met(findings.current.outcomes[c.outcome]))]
                             for c in space.constraints])
            lines += [""]
    on = findings.current_on_front()
    current_feasible = findings.current_point().feasible
    lines += ["## Today's settings", "",
              ("No trial is feasible: none can be compared with today's settings."
               if not feasible else
               "Today's settings are **on the front**: no feasible trial beats them on every objective."
               if on else "Today's settings are **not on the front**: a feasible trial is at least as good on every "
               "objective and better on one.")
              + ("" if current_feasible else " They do not meet every constraint."), ""]
    if len(space.objectives) > 1:
        points = front(findings.points(), findings.directions())
        lines += ["## Pareto front", ""]
        lines += _table(["trial", *[p.name for p in space.parameters], *[o.outcome for o in space.objectives]],
                        [[str(r.number), *(str(r.params.get(p.name)) for p in space.parameters),
                          *(_num(r.outcomes[o.outcome]) for o in space.objectives)]
                         for r in findings.rows if r.number in {p.number for p in points}])
        lines += [""]
    if findings.held_out:
        lines += ["## Held-out check", "",
                  "The same settings on the part of the log no trial saw (the chosen point, and today's):", ""]
        keys = [o.outcome for o in space.objectives] + [c.outcome for c in space.constraints]
        keys += [k for k in ("goodput_tokens_per_s.pool", "given_up.pool", "refused.pool") if k not in keys]
        tuned = chosen.outcomes if chosen is not None else {}
        lines += _table(["outcome", "today, tuning part", "chosen, tuning part", "today, held out", "chosen, held out"],
                        [[k, _num(findings.current.outcomes[k]), _num(tuned.get(k)),
                          _num(findings.held_out["current"].outcomes[k]),
                          _num(findings.held_out["chosen"].outcomes[k]) if "chosen" in findings.held_out else "—"]
                         for k in dict.fromkeys(keys)])
        lines += [""]
    if findings.importances:
        lines += ["## Importance of each parameter", "",
                  "PED-ANOVA over the completed trials (normalised to 1 per objective):", ""]
        lines += _table(["parameter", *findings.importances],
                        [[p.name, *(_num(findings.importances[o].get(p.name), 3) for o in findings.importances)]
                         for p in space.parameters])
        lines += [""]
    if chosen is not None:
        lines += ["## The chosen point by entitlement", "",
                  "A recorded log has no phases; its parts (tuning, held out) stand in for them.", ""]
        kinds = [OutcomeKind.ADMITTED, OutcomeKind.REFUSED, OutcomeKind.GIVEN_UP, OutcomeKind.P99_TTFT_S,
                 OutcomeKind.P99_CLIENT_TTFT_S, OutcomeKind.GOODPUT_TOKENS_PER_S]
        parts = [("tuning", chosen.outcomes)]
        if "chosen" in findings.held_out:
            parts.append(("held out", findings.held_out["chosen"].outcomes))
        names = list(findings.entitlements)
        for label, values in parts:
            lines += [f"{label}:", ""]
            lines += _table(["entitlement", *(k.value for k in kinds)],
                            [[n, *(_num(values.get(f"{k.value}.{n}")) for k in kinds)] for n in names])
            lines += [""]
    lines += ["## Replay speed", "",
              "Each trial's replay speed, its real-time multiple and CPU µs per request, is in `trials.csv` beside "
              "the machine it ran on and that machine's load, and their medians in `speed.json`: timings differ "
              "from run to run, so this report holds none, and the same seed, log and space give the same bytes.",
              ""]
    return "\n".join(lines)


# ---------------------------------------------------------------- pareto.png


def pareto_png(path: Path, findings: Findings) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    space = findings.space
    points = findings.points()
    chosen = findings.best_row()
    current = findings.current_point()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    if len(space.objectives) == 1:
        xs = [p.number for p in points]
        ax.scatter(xs, [p.values[0] for p in points], s=12,
                   c=["tab:blue" if p.feasible else "tab:gray" for p in points], label="trials (grey: infeasible)")
        ax.axhline(current.values[0], color="tab:red", linestyle="--", label="today's settings")
        if chosen is not None:
            ax.scatter([chosen.number], [chosen.outcomes[space.objectives[0].outcome]], marker="*", s=160,
                       color="tab:green", label=f"chosen (trial {chosen.number})")
        ax.set_xlabel("trial")
        ax.set_ylabel(f"{space.objectives[0].outcome} ({space.objectives[0].direction.value})")
    else:
        o1, o2 = space.objectives[0], space.objectives[1]
        ax.scatter([p.values[0] for p in points], [p.values[1] for p in points], s=12,
                   c=["tab:blue" if p.feasible else "tab:gray" for p in points], label="trials (grey: infeasible)")
        edge = sorted(front(points, findings.directions()), key=lambda p: p.values[0])
        ax.plot([p.values[0] for p in edge], [p.values[1] for p in edge], "-o", color="tab:orange", markersize=4,
                label="front")
        ax.scatter([current.values[0]], [current.values[1]], marker="X", s=120, color="tab:red",
                   label="today's settings")
        if chosen is not None:
            ax.scatter([chosen.outcomes[o1.outcome]], [chosen.outcomes[o2.outcome]], marker="*", s=160,
                       color="tab:green", label=f"chosen (trial {chosen.number})")
        ax.set_xlabel(f"{o1.outcome} ({o1.direction.value})")
        ax.set_ylabel(f"{o2.outcome} ({o2.direction.value})")
    ax.legend(fontsize=7)
    ax.set_title("tokenpools tune", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)
    return path
