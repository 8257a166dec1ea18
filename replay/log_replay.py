"""``tokenpools replay LOG``: a recorded log through the core and the backend simulator, once or over a grid.

A log is decoded once (``logio.read_log``) and replayed from its requests' first attempts; the retries are its
clients' as ``replay.clients`` fitted them, and the summary shows that model and the requests given up and pending
per entitlement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tokenpools.config import LoadedConfig
from tokenpools.errors import PermanentError
from tokenpools.replay import logio, metrics, report, trace
from tokenpools.replay.replayer import ReplayResult, replay
from tokenpools.replay.budget_options import with_budgets
from tokenpools.replay.results import budget_lines, budget_rows, r4
from tokenpools.replay.scenario import ReplayParams
from tokenpools.replay.sweep import markdown, parse_grid, points

if TYPE_CHECKING:
    import polars as pl


def pool_of(config: LoadedConfig):
    if len(config.pools) != 1:
        raise PermanentError(f"replay needs exactly one pool in the configuration, found {sorted(config.pools)}")
    pool = next(iter(config.pools.values()))
    return pool, config.entitlements_of(pool.name)


def summary(result: ReplayResult, recorded) -> dict[str, object]:
    """The outcome of one replay: agreement with the recorded decisions, refusals, latency, queue; and, when an
    entitlement has a budget, each budget's periods (docs/budgets.md#replay)."""
    rate, compared = logio.match_rate(result, recorded)
    names = [e.name for e in result.scenario.entitlements]
    budgets = budget_rows(result)
    return {
        **({"budgets": budgets} if budgets else {}),
        "policy": result.policy,
        "decisions": len(result.decisions.t_s),
        "match_rate": r4(rate),
        "compared": compared,
        "by_entitlement": metrics.decision_counts(result),
        "p99_ttft_s": {n: r4(metrics.p99(metrics.ttfts(result, [n]))) for n in names},
        "p99_e2e_s": {n: r4(metrics.p99(metrics.e2es(result, [n]))) for n in names},
        "max_waiting": metrics.max_waiting(result),
        "preempted": result.preempted,
        **_client_rows(result),
    }


def _client_rows(result: ReplayResult) -> dict[str, object]:
    """The client model a log replay retried with (per entitlement) and the requests it gave up or left pending."""
    fitted = result.scenario.retry.fitted
    names = [e.name for e in result.scenario.entitlements]
    rows: dict[str, object] = {"abandoned": {n: result.abandoned.get(n, 0) for n in names},
                               "pending": {n: result.pending.get(n, 0) for n in names}}
    if fitted is not None:
        rows["clients"] = {n: fitted.fit_of(n).describe() for n in names}
    return rows


def client_lines(data: dict[str, object]) -> list[str]:
    """The client model and the requests given up/pending, as ``tokenpools replay`` prints them."""
    lines = []
    for ent, fit in dict(data.get("clients", {})).items():  # type: ignore[call-overload]
        offset = "—" if fit["offset_p50_s"] is None else f"+{fit['offset_p50_s']:.3f} s (p90 +{fit['offset_p90_s']:.3f} s)"
        lines.append(f"clients of {ent} ({fit['basis']}, {fit['refusals']} refusals): retry {offset} after the "
                     f"estimate, at most {fit['max_retries']} times, {fit['never_retried']:.0%} never retry")
    lines.append("gave up " + report.fmt(data["abandoned"]) + "; pending " + report.fmt(data["pending"]))
    return lines


def check_capacity_changes(changes: Sequence[tuple[float, int]], duration_s: float) -> None:
    """``PermanentError`` (one line) for a capacity change at or after the end of the log's load: it would change
    no decision, and the replay would report the log as if it had been asked for nothing."""
    late = [t for t, _ in changes if t >= duration_s]
    if late:
        at = ", ".join(f"{t:g} s" for t in late)
        raise PermanentError(f"--capacity-change at {at}: the log's load ends {duration_s:g} s after its start, so "
                             f"it would change nothing (T is seconds after the log's start)")


def replay_log(log: Path, config: LoadedConfig, params: ReplayParams, changes: Sequence[tuple[float, int]],
               policy: str, out: Path, budgets: Sequence[str] = ()) -> str:
    """Replay ``log`` once; ``budgets`` are what-if budget items (``replay.budget_options``) on its entitlements.
    ``out`` is made once the replay ran: an input refused (the log, the config, a budget, the policy) leaves none."""
    trace.log_dir(log)  # before the config's checks: a missing log, or a folder of logs, is named first
    pool, ents = pool_of(config)
    ents = with_budgets(ents, budgets)
    scenario, recorded = logio.scenario_from_data(logio.read_log(log), pool, ents, params, changes)
    check_capacity_changes(changes, scenario.duration_s)
    result = replay(scenario, policy)
    data = summary(result, recorded)
    out.mkdir(parents=True, exist_ok=True)
    logio.write_log(result, out / "log")
    report.write_json(out / "summary.json", data)
    rate = data["match_rate"]
    lines = [f"replayed {data['decisions']} decisions of {log} with {policy}: "
             f"{'—' if rate is None else f'{rate:.1%}'} of {data['compared']} recorded decisions made the same way",
             f"max backend waiting {data['max_waiting']}; P99 TTFT " + report.fmt(data["p99_ttft_s"]),
             *client_lines(data),
             *budget_lines(data.get("budgets", [])),
             f"wrote {out / 'summary.json'} and the replayed log under {out / 'log'}"]
    return "\n".join(lines)


def sweep_log(log: Path, config: LoadedConfig, params_for: Callable[[list[str]], ReplayParams],
              fixed: Sequence[str], grid_items: Sequence[str], changes: Sequence[tuple[float, int]], policy: str,
              out: Path, budgets: Sequence[str] = ()) -> pl.DataFrame:
    """Replay ``log`` at every point of the grid; write ``out/sweep.csv`` and ``out/sweep.md``; the table."""
    import polars as pl

    pool, ents = pool_of(config)
    ents = with_budgets(ents, budgets)
    grid = parse_grid(grid_items)
    data = logio.read_log(log)  # decoded once for every grid point
    rows: list[dict[str, object]] = []
    for point in points(grid):
        params = params_for([*fixed, *(f"{k}={v}" for k, v in point.items())])
        scenario, recorded = logio.scenario_from_data(data, pool, ents, params, changes)
        check_capacity_changes(changes, scenario.duration_s)
        point_data = summary(replay(scenario, policy), recorded)
        row: dict[str, object] = dict(point)
        row["match_rate"] = point_data["match_rate"]
        row["max_waiting"] = point_data["max_waiting"]
        for ent, counts in point_data["by_entitlement"].items():
            row[f"{ent}.refused"] = sum(v for k, v in counts.items() if k != "admitted")
        for ent, value in point_data["p99_ttft_s"].items():
            row[f"{ent}.p99_ttft_s"] = value
        for b in point_data.get("budgets", []):  # (only with budgets: a sweep without them keeps its columns)
            key = f"{b['entitlement']}.{b['budget']}@{b['period_start']}"
            row[f"{key}.exhausted_at"] = b["exhausted_at"]
            row[f"{key}.refused_budget_exhausted"] = b["refused_budget_exhausted"]
        rows.append(row)
    df = pl.DataFrame(rows, infer_schema_length=None)
    out.mkdir(parents=True, exist_ok=True)  # (once every point ran, as replay_log's)
    df.write_csv(out / "sweep.csv", float_precision=4)
    (out / "sweep.md").write_text(markdown(df), encoding="utf-8")
    return df
