"""Run experiments end to end: scenario → replays (token pools and the baseline) → logs, figures, sweeps, report.

Shared by ``tokenpools experiment`` and ``tokenpools demo``. Every experiment runs under both load models, open
loop (Poisson arrivals) and closed loop (N clients that wait for their answers), unless ``--set load.mode=...``
picks one; ``results.json`` keeps them apart (``open_loop`` / ``closed_loop``, then experiment, then policy) and adds
the targets computed from them. The sweeps run in the first mode. Progress goes to a callback (the CLI
draws a rich bar on stderr); nothing written to ``out_dir`` depends on time or on the machine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tokenpools.errors import ConfigError, override_problem
from tokenpools.replay import logio, plots, report, results
from tokenpools.replay.experiments import MODES, build, own_items, split_overrides
from tokenpools.replay.replayer import ReplayResult, replay
from tokenpools.replay.sweep import markdown, points, run_sweep

POLICIES = ("token-pools", "none")

DEMO_SWEEPS: dict[str, tuple[tuple[str, ...], ...]] = {
    "exp1": (("policy.lend_idle_protected=true,false", "replay.backend_waiting=tick,off"),
             ("policy.queue_slo_fraction=0,0.25,0.5,1",)),
    "exp2": (("streams.tick_s=2.5,5,10", "policy.gamma_debt=0.5,0.7,0.85"), ("replay.backend_waiting=tick,off",),
             ("policy.queue_slo_fraction=0,0.25,0.5,1",)),
}

SWEEP_METRICS: dict[str, tuple[str, ...]] = {
    "exp1": ("guaranteed_p99_ttft_s", "guaranteed_max_ttft_s", "guaranteed_p99_client_ttft_s", "max_waiting",
             "spot_throttle_rate", "spot_mean_running_by_phase", "guaranteed_refusals", "decisions"),
    "exp2": ("peak_debt", "debt_decay_s", "low_priority_denials", "p99_client_ttft_s", "successes", "max_waiting"),
}

Progress = Callable[[str], None]


def _flat(prefix: str, value: object, out: dict[str, object]) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value


def sweep_metrics(name: str) -> Callable[[Mapping[str, ReplayResult]], dict[str, object]]:
    def metrics(runs: Mapping[str, ReplayResult]) -> dict[str, object]:
        summary = results.summarize(name, runs)["token_pools"]
        row: dict[str, object] = {}
        for key in SWEEP_METRICS[name]:
            value = summary.get(key)
            if key == "decisions":  # only the low-priority refusals of protected entitlements
                value = {e: c.get("low_priority", 0) for e, c in value.items() if e.startswith("guaranteed")}
                key = "low_priority_refusals"
            if key == "spot_mean_running_by_phase":
                value = {"overload": list(value.values())[1]}
                key = "spot_running"
            _flat(key, value, row)
        return row
    return metrics


def modes_of(overrides: Sequence[str]) -> tuple[str, ...]:
    """The load models to run: the one ``--set load.mode=...`` names (the last, as for any key), else both."""
    _, load_items, _ = split_overrides(overrides)
    chosen = [item.partition("=")[2].strip() for item in load_items if item.partition("=")[0].strip() == "load.mode"]
    if chosen and chosen[-1] not in MODES:
        raise ConfigError([override_problem("load.mode", f"must be one of {', '.join(MODES)}, got {chosen[-1]!r}")])
    return (chosen[-1],) if chosen else MODES


def check(names: Sequence[str], overrides: Sequence[str] = (),
          sweeps: Mapping[str, Sequence[Sequence[str]]] | None = None, config: Path | None = None) -> None:
    """Build every scenario ``run`` would replay (nothing is replayed or written): a bad ``--set``, ``--sweep``
    or config fails here, before any work, in one line."""
    from tokenpools.replay.sweep import check_points, parse_grid

    sweeps = DEMO_SWEEPS if sweeps is None else sweeps
    modes = modes_of(overrides)
    for name in names:
        chosen = config if len(names) == 1 else None
        own = _own(name, names, overrides)
        for mode in modes:
            build(name, [*own, f"load.mode={mode}"], chosen)
        for grid_items in sweeps.get(name, ()):
            check_points(lambda items, n=name, c=chosen: build(n, items, c), parse_grid(grid_items),
                         fixed=[*own, f"load.mode={modes[0]}"])


def _own(name: str, names: Sequence[str], overrides: Sequence[str]) -> list[str]:
    """The items ``name`` is built with: all of them when it runs alone (one another experiment alone reads is
    refused, named), else without those (``demo`` passes its items to both: Exp 1's ``load.c_always`` is Exp 1's)."""
    return list(overrides) if len(names) == 1 else own_items(name, overrides)


def steps(names: Sequence[str], sweeps: Mapping[str, Sequence[Sequence[str]]], overrides: Sequence[str] = ()) -> int:
    """How many progress steps ``run`` reports (for the progress bar's total)."""
    from tokenpools.replay.sweep import parse_grid

    total = 0
    for name in names:
        total += (len(POLICIES) + 2) * len(modes_of(overrides))  # replays, figures, log
        for grid in sweeps.get(name, ()):
            total += len(points(parse_grid(grid)))
    return total + 1


def run(names: Sequence[str], out_dir: Path, overrides: Sequence[str] = (), command: str = "tokenpools demo",
        sweeps: Mapping[str, Sequence[Sequence[str]]] | None = None, config: Path | None = None,
        progress: Progress = lambda _: None) -> dict[str, object]:
    """Run ``names`` and write report.md, results.json, figures, each replay's log and sweep tables to ``out_dir``."""
    from tokenpools.replay.sweep import parse_grid

    check(names, overrides, sweeps, config)
    out_dir.mkdir(parents=True, exist_ok=True)
    sweeps = DEMO_SWEEPS if sweeps is None else sweeps
    modes = modes_of(overrides)
    by_mode: dict[str, dict[str, object]] = {results.MODE_KEYS[mode]: {} for mode in modes}
    figures: dict[str, list[str]] = {}
    tables: dict[str, str] = {}
    for name in names:
        own = _own(name, names, overrides)
        for mode in modes:
            label = results.MODE_LABELS[mode]
            items = [*own, f"load.mode={mode}"]
            scenario = build(name, items, config if len(names) == 1 else None)
            runs: dict[str, ReplayResult] = {}
            for policy in POLICIES:
                progress(f"{name}, {label}: replaying with {policy}")
                runs[policy] = replay(scenario, policy)
            progress(f"{name}, {label}: writing the replay's log")
            folder = out_dir / name if mode == "open" else out_dir / name / results.MODE_KEYS[mode].replace("_", "-")
            for policy, result in runs.items():
                logio.write_log(result, folder / f"log-{policy}")
            progress(f"{name}, {label}: drawing figures")
            drawn = plots.experiment_figures(name, runs, out_dir, label)
            figures.setdefault(name, []).extend(p.name for p in drawn)
            by_mode[results.MODE_KEYS[mode]][name] = results.summarize(name, runs)
        first = [*own, f"load.mode={modes[0]}"]
        for grid_items in sweeps.get(name, ()):
            grid = parse_grid(grid_items)
            title = f"{name}, {results.MODE_LABELS[modes[0]]}: " + " × ".join(grid)
            df = run_sweep(lambda items, n=name: build(n, items, config if len(names) == 1 else None), grid,
                           sweep_metrics(name), fixed=first, progress=lambda t=title: progress(f"sweep {t}"))
            stem = f"sweep_{name}_" + "_".join(k.split(".")[-1] for k in grid)
            df.write_csv(out_dir / f"{stem}.csv", float_precision=4)
            tables[title] = markdown(df)
    progress("writing report.md and results.json")
    all_results: dict[str, object] = dict(by_mode)
    all_results["targets"] = results.targets(by_mode)
    report.write_json(out_dir / "results.json", all_results)
    text = report.render(all_results, list(names), figures, tables, command, overrides)
    (out_dir / "report.md").write_text(text, encoding="utf-8")
    return all_results
