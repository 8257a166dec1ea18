"""The calibration as rich renderables: the table of steps, the notes and the snippet (no I/O: the caller prints)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from tokenpools.calibrate.choose import StepVerdict
from tokenpools.calibrate.result import Calibration, engine_full, ms

_STYLE = {StepVerdict.UNDER_TARGET: "green", StepVerdict.OVER_TARGET: "yellow", StepVerdict.FAILED: "red"}


def table(calibration: Calibration) -> Table:
    plan, chosen = calibration.plan, calibration.chosen()
    out = Table(title=f"{plan.base_url} — {plan.model}: P99 TTFT target {plan.ttft_p99_target_s * 1000:g} ms",
                title_justify="left")
    for name in ("concurrency", "requests", "failed", "output tokens/s", "total tokens/s", "P50 TTFT ms",
                 "P99 TTFT ms", "P99 e2e ms", "backend queue ms"):
        out.add_column(name, justify="right")
    out.add_column("verdict")
    for step, verdict in zip(calibration.steps, calibration.verdicts()):
        mark = " ◀ chosen" if step is chosen else ""
        out.add_row(str(step.concurrency), f"{step.requests:,}", f"{step.failed:,}",
                    f"{step.output_tokens_per_s:,.1f}", f"{step.total_tokens_per_s:,.1f}", ms(step.ttft_p50_s),
                    ms(step.ttft_p99_s), ms(step.e2e_p99_s),
                    Text(ms(step.backend_queue_mean_s), style="yellow" if engine_full(step) else ""),
                    Text(f"{verdict}{mark}", style=_STYLE[verdict]),
                    style="bold" if mark else None)
    return out


def report(calibration: Calibration) -> RenderableType:
    """The table, the notes, then the proposed ``perReplica`` snippet (if a step met the target)."""
    parts: list[RenderableType] = [table(calibration)]
    parts += [Text(f"note: {note}") for note in calibration.notes()]
    text = calibration.snippet()
    if text is not None:
        parts.append(Syntax(text, "yaml", theme="ansi_dark", background_color="default"))
    return Group(*parts)
