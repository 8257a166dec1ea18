"""calibration.png: throughput and P99 TTFT against concurrency, the target line and the chosen point (matplotlib).

A ``Figure`` drawn and saved on its own canvas (Agg): no pyplot, so no global backend or figure registry.
"""

from __future__ import annotations

from pathlib import Path

from tokenpools.calibrate.result import Calibration


def write_png(calibration: Calibration, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    plan, chosen = calibration.plan, calibration.chosen()
    steps = calibration.steps
    xs = [s.concurrency for s in steps]
    fig = Figure(figsize=(7, 6), dpi=110)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.plot(xs, [s.total_tokens_per_s for s in steps], "o-", label="total (prompt + completion)")
    top.plot(xs, [s.output_tokens_per_s for s in steps], "s--", label="output")
    top.set_ylabel("tokens/s")
    top.set_title(f"{plan.model} at {plan.base_url}", fontsize=9)
    bottom.plot(xs, [_ms(s.ttft_p99_s) for s in steps], "o-", color="tab:red", label="P99 TTFT")
    bottom.plot(xs, [_ms(s.ttft_p50_s) for s in steps], ".:", color="tab:gray", label="P50 TTFT")
    bottom.axhline(plan.ttft_p99_target_s * 1000, color="black", linestyle="--", linewidth=1,
                   label=f"target {plan.ttft_p99_target_s * 1000:g} ms")
    if chosen is not None:
        top.plot([chosen.concurrency], [chosen.total_tokens_per_s], "*", color="tab:green", markersize=16,
                 label=f"chosen: concurrency {chosen.concurrency}")
        bottom.plot([chosen.concurrency], [_ms(chosen.ttft_p99_s)], "*", color="tab:green", markersize=16)
    bottom.set_ylabel("TTFT ms")
    bottom.set_xlabel("concurrency (requests in flight)")
    bottom.set_xscale("log", base=2)
    bottom.set_xticks(xs, [str(x) for x in xs])
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
    return path


def _ms(seconds: float | None) -> float:
    return float("nan") if seconds is None else seconds * 1000
