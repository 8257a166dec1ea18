"""Terminal output of the replay commands (rich, on stderr): a progress bar and the headline numbers."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tokenpools.replay.results import MODE_KEYS, PAPER, fmt, lookup


@contextmanager
def progress_bar(console: Console, title: str, total: int, enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """Yields ``advance(description)``: one step done, showing what runs next."""
    if not enabled:
        yield lambda _: None
        return
    columns = (TextColumn(f"[bold]{title}[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.description}"))
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("starting", total=total)
        first = True

        def advance(description: str) -> None:
            nonlocal first
            if not first:
                progress.advance(task)
            first = False
            progress.update(task, description=description)

        yield advance
        progress.update(task, completed=total, description="done")


def print_headline(console: Console, results: Mapping[str, object], out_dir: Path) -> None:
    """The paper's metrics, ours beside them under each load model that ran (open loop, closed loop)."""
    modes = [key for key in MODE_KEYS.values() if isinstance(results.get(key), Mapping)]
    table = Table(title="token pools vs no admission control (paper in its own column)", title_justify="left")
    table.add_column("metric")
    table.add_column("paper", justify="right")
    for mode in modes:
        label = mode.replace("_", " ")
        table.add_column(f"token pools, {label}", justify="right")
        table.add_column(f"no admission control, {label}", justify="right")
    for key in PAPER:
        exp, policy, *rest = key.split(".")
        if policy != "token_pools" or not any(lookup(results, f"{mode}.{exp}") is not None for mode in modes):
            continue
        metric = ".".join(rest)
        base = PAPER.get(f"{exp}.baseline.{metric}")
        paper = fmt(PAPER[key]) + (f" (baseline {fmt(base)})" if base is not None else "")
        cells = [fmt(lookup(results, f"{mode}.{exp}.{p}.{metric}")) for mode in modes for p in ("token_pools", "baseline")]
        table.add_row(f"{exp} {metric}", paper, *cells)
    console.print(table)
    console.print(f"report: {out_dir / 'report.md'}   results: {out_dir / 'results.json'}")
