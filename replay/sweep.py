"""Parameter sweeps: a grid of ``--set`` items, one replay per grid point, one table row per point (polars).

``--sweep streams.tick_s=2,5,10 --sweep policy.gamma_debt=0.5,0.7`` is the cartesian product of the value lists,
in the order given (the first key varies slowest). Keys are Settings keys (``group.field``), ``load.*`` keys or
``replay.*`` keys; every grid point also gets the fixed ``--set`` items (the grid wins on a clash).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import polars as pl

from tokenpools.errors import ConfigError
from tokenpools.replay.replayer import ReplayResult, replay
from tokenpools.replay.scenario import ReplayUsageError, Scenario

if TYPE_CHECKING:
    from rich.table import Table


def parse_grid(items: Sequence[str]) -> dict[str, list[str]]:
    """{"streams.tick_s": ["2", "5", "10"], ...} from ``key=v1,v2,...`` items; a repeated key is an error."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise ReplayUsageError(f"--sweep expects KEY=V1,V2,... such as streams.tick_s=2,5,10, got {item!r}")
        if key in grid:
            raise ReplayUsageError(f"--sweep names {key!r} twice; give all its values in one item")
        grid[key] = [v.strip() for v in values.split(",") if v.strip()]
    return grid


def points(grid: Mapping[str, Sequence[str]]) -> list[dict[str, str]]:
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def check_points(build: Callable[[list[str]], object], grid: Mapping[str, Sequence[str]],
                 fixed: Sequence[str] = ()) -> None:
    """Build every point of ``grid`` (nothing replayed), so that a bad value fails before any work. A problem with
    a swept key names ``--sweep``, the option that gave the value, not ``--set``."""
    for point in points(grid):
        try:
            build([*fixed, *(f"{k}={v}" for k, v in point.items())])
        except ConfigError as exc:
            raise ConfigError(replace(p, source="--sweep") if p.source == "--set" and p.path in grid else p
                              for p in exc.problems) from None
        except ReplayUsageError as exc:
            values = " ".join(f"{k}={v}" for k, v in point.items())
            raise ReplayUsageError(f"--sweep point {values}: {exc}") from None


def run_sweep(
    build: Callable[[list[str]], Scenario],
    grid: Mapping[str, Sequence[str]],
    metrics: Callable[[Mapping[str, ReplayResult]], Mapping[str, object]],
    fixed: Sequence[str] = (),
    policies: Sequence[str] = ("token-pools",),
    progress: Callable[[], None] | None = None,
) -> pl.DataFrame:
    """One row per grid point: the point's values (as given) and ``metrics`` of its replays."""
    rows: list[dict[str, object]] = []
    for point in points(grid):
        overrides = [*fixed, *(f"{k}={v}" for k, v in point.items())]
        scenario = build(overrides)
        runs = {policy: replay(scenario, policy) for policy in policies}
        rows.append({**point, **metrics(runs)})
        if progress is not None:
            progress()
    if not rows:
        return pl.DataFrame()
    return pl.DataFrame(rows, infer_schema_length=None)


def markdown(df: pl.DataFrame, float_digits: int = 3) -> str:
    """A GitHub table (no pandas/tabulate needed); floats with a fixed number of digits, None as —."""
    if df.is_empty():
        return "(empty sweep)\n"
    header = "| " + " | ".join(df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    lines = [header, rule]
    for row in df.iter_rows():
        lines.append("| " + " | ".join(cell(value, float_digits) for value in row) + " |")
    return "\n".join(lines) + "\n"


def cell(value: object, float_digits: int = 3) -> str:
    """One value of a sweep as its tables show it: floats with a fixed number of digits, None as —."""
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{float_digits}f}"
    return str(value)


def terminal_table(df: pl.DataFrame, grid_keys: Sequence[str], width: int) -> Table:
    """The sweep for a terminal of ``width`` columns (``tokenpools replay --sweep``): the swept keys and the match
    rate stay, then the backend's queue; the per-entitlement columns go first when it does not fit (sweep.csv has
    them all). A header's dots become spaces so that it can wrap."""
    from tokenpools.tables import Column, fit

    def keep(name: str) -> int:
        if name in grid_keys:
            return 100
        return {"match_rate": 90, "max_waiting": 80}.get(name, 10 if name.endswith(".refused") else 0)

    columns = [Column(name.replace(".", " ").replace("_", " "), number=name not in grid_keys, wrap=False, keep=keep(name))
               for name in df.columns]
    rows = [[cell(value) for value in row] for row in df.iter_rows()]
    return fit(columns, rows, width)
