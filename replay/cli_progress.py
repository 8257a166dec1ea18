"""Terminal output of the replay commands (rich, on stderr): a progress bar and the headline numbers."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column as RichColumn, Table

from tokenpools.replay.results import MODE_KEYS, PAPER, fmt, lookup
from tokenpools.tables import Column, fit


@contextmanager
def progress_bar(console: Console, title: str, total: int, enabled: bool = True) -> Iterator[Callable[[str], None]]:
    """Yields ``advance(description)``: one step done, showing what runs next."""
    if not enabled:
        yield lambda _: None
        return
    # the description wraps rather than have rich cut the elapsed time ("0:01…") on a narrow terminal
    columns = (TextColumn(f"[bold]{title}[/]"), BarColumn(bar_width=20), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.description}", table_column=RichColumn(no_wrap=False, overflow="fold")))
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


METRIC_LABELS = {  # PAPER's metrics as a reader names them (a tenant's metric: the label, then ", tenant")
    "guaranteed_p99_ttft_s": "guaranteed P99 TTFT (s)",
    "max_waiting": "max backend waiting queue",
    "spot_throttle_rate": "spot refused share in overload",
    "priority": "priority w_e at first tick",
    "low_priority_denials": "low-priority denials (429)",
    "low_priority_refusals": "low-priority refusals",
    "peak_debt": "peak debt d_e",
    "debt_decay_s": "debt back below 0.05 (s)",
    "successes": "successful requests",
}


def metric_label(exp: str, metric: str) -> str:
    """"exp2", "low_priority_refusals.synth" → "Exp 2 low-priority refusals, synth"."""
    name, _, tenant = metric.partition(".")
    label = f"Exp {exp.removeprefix('exp')} {METRIC_LABELS.get(name, name.replace('_', ' '))}"
    return f"{label}, {tenant}" if tenant else label


def headline_table(results: Mapping[str, object], width: int) -> Table:
    """The paper's metrics, ours beside them under each load model that ran (open loop, closed loop)."""
    modes = [key for key in MODE_KEYS.values() if isinstance(results.get(key), Mapping)]
    columns = [Column("metric", keep=10), Column("paper", number=True, wrap=True, keep=5)]
    for rank, mode in enumerate(modes):
        label = mode.replace("_", " ")
        columns += [Column(f"token pools, {label}", number=True, keep=9 - 2 * rank),
                    Column(f"no admission control, {label}", number=True, keep=8 - 2 * rank)]
    rows = []
    for key in PAPER:
        exp, policy, *rest = key.split(".")
        if policy != "token_pools" or not any(lookup(results, f"{mode}.{exp}") is not None for mode in modes):
            continue
        metric = ".".join(rest)
        base = PAPER.get(f"{exp}.baseline.{metric}")
        paper = fmt(PAPER[key]) + (f" (baseline {fmt(base)})" if base is not None else "")
        cells = [fmt(lookup(results, f"{mode}.{exp}.{p}.{metric}")) for mode in modes for p in ("token_pools", "baseline")]
        rows.append([metric_label(exp, metric), paper, *cells])
    return fit(columns, rows, width, title="token pools vs no admission control (the paper's numbers beside them)")


def print_headline(console: Console, results: Mapping[str, object], out_dir: Path) -> None:
    console.print(headline_table(results, console.width))
    console.print(f"report: {out_dir / 'report.md'}   results: {out_dir / 'results.json'}", highlight=False)
