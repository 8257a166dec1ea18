"""``tokenpools tune LOG --config FILE --space SPACE.yaml --out DIR``: the command's shell (the composition root).

It validates everything first (configuration, space file, ``--set`` items, log, options: each problem one line,
exit 2), decodes the log once, opens the study in DIR, runs the batches on the chosen executor with a progress
bar, replays today's settings and the chosen point on the held-out part, and writes the outputs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any

from tokenpools.errors import ConfigError, ConfigProblem


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", type=Path, metavar="LOG", help="a log directory written by `tokenpools record`")
    parser.add_argument("--config", type=Path, required=True, help="the pool and entitlements (YAML) to replay against")
    parser.add_argument("--space", type=Path, required=True, help="the space file: parameters, objectives, constraints")
    parser.add_argument("--out", type=Path, required=True, help="output directory (the study lives there too)")
    parser.add_argument("--trials", type=int, default=64, help="trials in the study, in all (default 64)")
    parser.add_argument("--batch", type=int, default=8,
                        help="points asked at a time (default 8); fixed, so any --workers or --ray gives the same trials")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="worker processes (default: the CPU count; 1 runs in this process)")
    parser.add_argument("--ray", metavar="ADDRESS", default=None,
                        help="run trials as Ray tasks on this existing cluster (needs tokenpools[ray]); --workers is ignored")
    parser.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    parser.add_argument("--sampler", choices=["auto", "tpe", "nsga2", "grid", "random"], default="auto",
                        help="auto (default): TPE for one objective, NSGA-II for several; grid needs choices or steps")
    parser.add_argument("--holdout", type=float, default=0.3,
                        help="the last fraction of the log's arrivals no trial sees, to check the result on (default 0.3; 0: none)")
    parser.add_argument("--resume", action="store_true", help="continue the study in --out (same log, space and hold-out)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--policy", default="token-pools", help="registered policy (default token-pools)")
    parser.add_argument("--capacity-change", action="append", default=[], metavar="T=SLOTS",
                        help="as for `tokenpools replay`; repeatable")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _usage(problems: list[str]) -> None:
    if problems:
        raise ConfigError([ConfigProblem("tokenpools tune", p) for p in problems])


def run(args: argparse.Namespace) -> int:
    import optuna
    from rich.console import Console

    from tokenpools.config import load_config
    from tokenpools.replay.cli import _capacity_changes
    from tokenpools.replay.experiments import recorded_params
    from tokenpools.replay.log_replay import pool_of
    from tokenpools.replay.logio import check_entitlements, read_log
    from tokenpools.replay.trace import TraceSchemaError
    from tokenpools.replay.tune import search
    from tokenpools.replay.tune.executors import HELD_OUT, TUNING, Closing, Executor, Processes, RayCluster, Serial, log_parts
    from tokenpools.replay.tune.space import load_space, resolve
    from tokenpools.replay.tune.trials import TrialContext

    _usage([m for ok, m in ((args.trials >= 1, f"--trials must be >= 1, got {args.trials}"),
                            (args.batch >= 1, f"--batch must be >= 1, got {args.batch}"),
                            (args.workers >= 1, f"--workers must be >= 1, got {args.workers}"),
                            (0 <= args.holdout < 1, f"--holdout must be in [0, 1), got {args.holdout}")) if not ok])
    config = load_config(args.config)
    pool, ents = pool_of(config)
    space = load_space(args.space, [e.name for e in ents], config.settings_values)
    recorded_params(config.settings_values, args.overrides)  # the fixed --set items, checked before any trial
    changes = tuple(_capacity_changes(args.capacity_change))
    if not args.log.is_dir():
        raise ConfigError([ConfigProblem(str(args.log), "no such log directory (write one with `tokenpools record`)")])
    try:
        data = read_log(args.log)
        parts = log_parts(data, args.holdout)
    except (TraceSchemaError, OSError) as exc:
        raise ConfigError([ConfigProblem(str(args.log), str(exc))]) from None
    check_entitlements(data, ents)  # before the study is opened and the first trial runs
    if changes:  # one at or after the end of the whole log's load would change no trial
        from tokenpools.replay.log_replay import check_capacity_changes
        from tokenpools.replay.logio import scenario_from_data

        whole, _ = scenario_from_data(data, pool, ents, recorded_params(config.settings_values, args.overrides))
        check_capacity_changes(changes, whole.duration_s)
    kind = search.SamplerKind(args.sampler)
    trials = min(args.trials, search.grid_size(space)) if kind is search.SamplerKind.GRID else args.trials
    context = TrialContext(pool, tuple(ents), config.settings_values, tuple(args.overrides), changes, args.policy)
    args.out.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = search.make_sampler(kind, space, args.seed, trials, args.batch)
    study = search.open_study(args.out, sampler, space, args.resume,
                              {"log_digest": data.digest, "space_digest": space.digest, "holdout": args.holdout})
    executor: Executor
    if args.ray:
        executor = RayCluster(args.ray, parts, context)
    elif args.workers > 1:
        executor = Processes(args.log, data.digest, args.holdout, context, args.workers)
    else:
        executor = Serial(parts, context)
    console = Console(stderr=True)
    with Closing(executor):
        today = executor.submit(TUNING, [(-1, ())])  # today's settings: first, beside the first batches
        unresolved = space
        with _progress(console, trials, len(study.get_trials(deepcopy=False)), space,
                       enabled=not args.no_progress) as advance:
            search.run(study, space, trials, args.batch, lambda jobs: executor.submit(TUNING, jobs), advance,
                       lambda: resolve(unresolved, today.result()[0].outcomes))  # "today" bounds read it
        current = today.result()[0]
        space = resolve(space, current.outcomes)
        findings = _findings(study, space, args, data.digest, kind, current, {}, [e.name for e in ents])
        chosen = findings.best_row()
        held_out = {}
        if HELD_OUT in parts:
            jobs = [(-1, ())] + ([(chosen.number, search.items_of(space, chosen.params))] if chosen else [])
            results = executor.submit(HELD_OUT, jobs).result()
            held_out = {"current": results[0], **({"chosen": results[1]} if chosen else {})}
    findings = _findings(study, space, args, data.digest, kind, current, held_out, [e.name for e in ents])
    summary = _write(args, config, findings)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        _print(console, summary)
    return 0


def _findings(study: Any, space: Any, args: argparse.Namespace, digest: str, kind: Any, current: Any,
              held_out: dict[str, Any], entitlements: list[str]) -> Any:
    from optuna.trial import TrialState

    from tokenpools.replay.tune.outputs import Findings, TrialRow

    rows = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        attrs = t.user_attrs
        outcomes = {k: (math.nan if v is None else float(v)) for k, v in attrs.get("outcomes", {}).items()}
        rows.append(TrialRow(t.number, t.state.name, dict(t.params), outcomes, attrs.get("digest", ""),
                             tuple(attrs.get("constraints", ())), attrs.get("wall_s"),
                             attrs.get("cpu_us_per_request"), attrs.get("realtime_multiple"),
                             attrs.get("machine", ""), attrs.get("load_1m")))
    return Findings(space, str(args.log), digest, args.seed, kind.value, args.batch, args.holdout, tuple(rows),
                    current, held_out, _importances(study, space), tuple(entitlements))


def _importances(study: Any, space: Any) -> dict[str, dict[str, float]]:
    """Per objective, PED-ANOVA importances (deterministic; no scikit-learn needed); {} with too few trials."""
    import optuna
    from optuna.trial import TrialState

    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2 or len(space.parameters) < 1:
        return {}
    out: dict[str, dict[str, float]] = {}
    for i, objective in enumerate(space.objectives):
        sign = 1.0 if objective.direction.value == "minimize" else -1.0  # PED-ANOVA looks at the low values
        try:
            with warnings.catch_warnings():  # the evaluator is "experimental"; its notes are not ours to show
                warnings.simplefilter("ignore")
                values = optuna.importance.get_param_importances(
                    study, evaluator=optuna.importance.PedAnovaImportanceEvaluator(),
                    target=lambda t, i=i, sign=sign: sign * t.values[i])
        except (RuntimeError, ValueError):
            return {}
        out[objective.outcome] = {k: float(v) for k, v in values.items()}
    return out


def _write(args: argparse.Namespace, config: Any, findings: Any) -> dict[str, Any]:
    from tokenpools.replay.report import write_json
    from tokenpools.replay.tune import outputs

    out: Path = args.out
    outputs.write_trials_csv(out / "trials.csv", findings)
    (out / "report.md").write_text(outputs.report_md(findings, str(args.config)), encoding="utf-8")
    outputs.pareto_png(out / "pareto.png", findings)
    chosen = findings.best_row()
    best_path = out / "best.yaml"
    if chosen is not None:
        header = (f"tokenpools tune: trial {chosen.number} of the study in this folder, on {findings.log} "
                  f"(digest {findings.log_digest[:16]})\napply with --config {best_path}")
        best_path.write_text(outputs.best_yaml(config.raw_documents, chosen.params, header), encoding="utf-8")
    elif best_path.exists():
        best_path.unlink()
    timed = [r for r in findings.rows if r.realtime_multiple is not None]
    speed = {
        "trials_timed": len(timed),
        "median_realtime_multiple": _median([r.realtime_multiple for r in timed]),
        "median_cpu_us_per_request": _median([r.cpu_us_per_request for r in timed]),
        "current_realtime_multiple": findings.current.realtime_multiple,
        "current_cpu_us_per_request": findings.current.cpu_us_per_request,
        "current_machine": findings.current.machine,
        "machines": sorted({r.machine for r in timed if r.machine}),
    }
    write_json(out / "speed.json", speed)
    space = findings.space

    def clean(values: dict[str, float], keys: list[str]) -> dict[str, float | None]:
        return {k: (None if math.isnan(values[k]) else values[k]) for k in keys}

    keys = list(dict.fromkeys([o.outcome for o in space.objectives] + [c.outcome for c in space.constraints]))
    return {
        "trials": len(findings.rows),
        "completed": sum(1 for r in findings.rows if r.state == "COMPLETE"),
        "feasible": sum(1 for r in findings.rows if r.feasible),
        "best": None if chosen is None else {
            "trial": chosen.number, "params": chosen.params, "outcomes": clean(chosen.outcomes, keys),
            "digest": chosen.digest},
        "current": {"outcomes": clean(findings.current.outcomes, keys), "on_front": findings.current_on_front()},
        "held_out": {k: clean(v.outcomes, keys) for k, v in findings.held_out.items()},
        "digests": [r.digest for r in findings.rows],
        "speed": speed,
        "files": [str(out / n) for n in ("best.yaml", "report.md", "pareto.png", "trials.csv", "speed.json")
                  if (out / n).exists()],
    }


def _median(values: list[float | None]) -> float | None:
    known = sorted(v for v in values if v is not None)
    return known[len(known) // 2] if known else None


def _print(console: Any, summary: dict[str, Any]) -> None:
    best = summary["best"]
    console.print(f"{summary['trials']} trials, {summary['feasible']} feasible", highlight=False)
    if best is None:
        console.print("no trial met every constraint: no best point", highlight=False)
    else:
        console.print(f"best: trial {best['trial']}", highlight=False)
        for heading, values in (("settings", best["params"]), ("outcomes", best["outcomes"])):
            console.print(f"  {heading}: " + ", ".join(f"{k} {_figure(v)}" for k, v in values.items()),
                          highlight=False)
    if best is None:
        console.print("no feasible trial to compare today's settings with (report.md: each constraint's nearest "
                      "trial)", highlight=False)
    else:
        console.print("today's settings are " + ("on the front" if summary["current"]["on_front"] else "dominated"),
                      highlight=False)
    speed = summary["speed"]
    if speed["trials_timed"]:
        console.print(f"replay speed: median {speed['median_realtime_multiple']:.0f}× real time, "
                      f"{speed['median_cpu_us_per_request']:.1f} µs CPU per request, on "
                      f"{'; '.join(speed['machines']) or 'an unnamed machine'} (each trial: trials.csv)",
                      highlight=False)
    console.print("wrote " + ", ".join(summary["files"]), highlight=False)


def _figure(value: object) -> str:
    """A parameter or outcome as a reader takes it in: 4 significant digits (best.yaml and trials.csv keep every
    digit), not 0.12990000000000013."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _progress(console: Any, total: int, already: int, space: Any, enabled: bool) -> Any:
    """A context giving ``advance(trial, result)``: trials done, best so far (first objective), ETA."""
    from contextlib import contextmanager

    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    objective = space.objectives[0]

    @contextmanager
    def bar() -> Any:
        if not enabled:
            yield lambda trial, result: None
            return
        columns = (TextColumn("[bold]tune[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.description}"))
        best: float | None = None
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task("", total=total, completed=already)

            def advance(trial: Any, result: Any) -> None:
                nonlocal best
                value = result.outcomes[objective.outcome] if result is not None else math.nan
                feasible = all(v <= 0 for v in trial.user_attrs.get("constraints", ()))
                if trial.state.name == "COMPLETE" and feasible and not math.isnan(value):
                    better = best is None or (value < best if objective.direction.value == "minimize" else value > best)
                    best = value if better else best
                shown = "—" if best is None else f"{best:.4g}"
                progress.update(task, advance=1, description=f"best {objective.outcome} {shown}")

            yield advance

    return bar()
