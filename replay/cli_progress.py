"""Terminal output of the replay commands (rich, on stderr): a progress bar and the headline numbers."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tokenpools.replay.results import PAPER, fmt, lookup


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
    table = Table(title="token pools vs no admission control (paper in brackets)", title_justify="left")
    table.add_column("metric")
    table.add_column("token pools", justify="right")
    table.add_column("no admission control", justify="right")
    for key in PAPER:
        exp, policy, *rest = key.split(".")
        if policy != "token_pools":
            continue
        metric = ".".join(rest)
        ours = lookup(results, key)
        if ours is None and lookup(results, exp) is None:
            continue
        base = lookup(results, f"{exp}.baseline.{metric}")
        table.add_row(f"{exp} {metric}", f"{fmt(ours)} [dim]({fmt(PAPER[key])})[/]",
                      fmt(base) + (f" [dim]({fmt(PAPER[f'{exp}.baseline.{metric}'])})[/]"
                                   if f"{exp}.baseline.{metric}" in PAPER else ""))
    console.print(table)
    console.print(f"report: {out_dir / 'report.md'}   results: {out_dir / 'results.json'}")
