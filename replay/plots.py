"""PNG figures in the spirit of the paper's Figs. 2–6 (matplotlib, Agg backend, byte-identical across runs).

Every figure is a pure function of replay results; binned series use 5-s bins of event time. PNGs are written
without a Software/creation-time chunk, so the same results give the same bytes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenpools.replay import metrics as m
from tokenpools.replay.replayer import ReplayResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

BIN_S = 5.0
LAYOUT = "constrained"
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
TITLES = {"token-pools": "token pools", "none": "no admission control"}
OPEN_LOOP = "open loop"  # the default load model: its figures keep the plain names
RC = {"font.size": 8, "axes.titlesize": 9, "figure.dpi": 100, "savefig.dpi": 110}


def _pyplot() -> Any:
    """pyplot on the Agg backend, imported when the first figure is drawn (nothing happens at import time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, format="png", metadata={"Software": None})
    _pyplot().close(fig)
    return path


def _shade(ax: Axes, result: ReplayResult) -> None:
    for i, phase in enumerate(result.scenario.phases):
        if i % 2:
            ax.axvspan(phase.start_s, phase.end_s, color="#000000", alpha=0.05, lw=0)
    ax.set_xlim(0, result.scenario.duration_s)


def _names(result: ReplayResult) -> list[str]:
    return [e.name for e in result.scenario.entitlements]


def _color(result: ReplayResult, name: str) -> str:
    return COLORS[_names(result).index(name) % len(COLORS)]


def _bins(duration: float) -> list[float]:
    return [i * BIN_S for i in range(int(math.ceil(duration / BIN_S)))]


def _binned_p99(result: ReplayResult, names: Sequence[str], e2e: bool = False) -> tuple[list[float], list[float]]:
    by_bin: dict[int, list[float]] = defaultdict(list)
    c = result.completions
    wanted = set(names)
    for ent, admitted, ttft, total in zip(c.entitlement, c.admitted_s, c.ttft_s, c.e2e_s):
        if ent in wanted and admitted < result.scenario.duration_s:
            by_bin[int(admitted // BIN_S)].append(total if e2e else ttft)
    xs = sorted(by_bin)
    return [x * BIN_S + BIN_S / 2 for x in xs], [m.p99(by_bin[x]) for x in xs]


def _rates(result: ReplayResult, name: str, admitted: bool) -> tuple[list[float], list[float]]:
    counts: dict[int, int] = defaultdict(int)
    d = result.decisions
    for t, ent, outcome in zip(d.t_s, d.entitlement, d.outcome):
        if ent == name and (outcome == "admitted") == admitted:
            counts[int(t // BIN_S)] += 1
    xs = _bins(result.scenario.duration_s)
    return [x + BIN_S / 2 for x in xs], [counts.get(int(x // BIN_S), 0) / BIN_S for x in xs]


def _running(result: ReplayResult, name: str) -> tuple[list[float], list[int]]:
    rows = [(t, running) for t, ent, running, _, _ in result.samples.by_entitlement if ent == name]
    return [r[0] for r in rows], [r[1] for r in rows]


def queue_depth(runs: Mapping[str, ReplayResult], path: Path, title: str) -> Path:
    """Fig. 2: backend running and waiting over time, one panel per policy."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 3.0), sharey=True, squeeze=False, layout=LAYOUT)
    for ax, (policy, result) in zip(axes[0], runs.items()):
        pool = result.samples.pool
        ts = [p[0] for p in pool]
        ax.step(ts, [p[1] for p in pool], where="post", label="running", color="#1f77b4")
        ax.step(ts, [p[2] for p in pool], where="post", label="waiting", color="#d62728")
        ax.step(ts, [p[3] for p in pool], where="post", label="slots", color="#555555", ls="--", lw=0.8)
        ax.set_title(f"{TITLES.get(policy, policy)} (max waiting {m.max_waiting(result)})")
        ax.set_xlabel("time (s)")
        _shade(ax, result)
    axes[0][0].set_ylabel("requests")
    axes[0][0].legend(loc="upper left")
    fig.suptitle(title)
    return _save(fig, path)


def latency(runs: Mapping[str, ReplayResult], groups: Mapping[str, Sequence[str]], path: Path, title: str,
            slo_s: Mapping[str, float] | None = None) -> Path:
    """Fig. 3 / 6a: P99 TTFT and P99 end-to-end latency per 5-s bin of admission time, per group and policy."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 3.2), squeeze=False, layout=LAYOUT)
    styles = {"token-pools": "-", "none": ":"}
    for col, e2e in enumerate((False, True)):
        ax = axes[0][col]
        for gi, (group, names) in enumerate(groups.items()):
            for policy, result in runs.items():
                xs, ys = _binned_p99(result, names, e2e)
                ax.plot(xs, ys, styles.get(policy, "-"), color=COLORS[gi % len(COLORS)], marker=".", ms=3,
                        label=f"{group}, {TITLES.get(policy, policy)}")
            if slo_s and group in slo_s and not e2e:
                ax.axhline(slo_s[group], color=COLORS[gi % len(COLORS)], lw=0.6, ls="--")
        ax.set_yscale("log")
        ax.set_xlabel("admission time (s)")
        ax.set_ylabel("P99 end-to-end (s)" if e2e else "P99 TTFT (s)")
        _shade(ax, next(iter(runs.values())))
    axes[0][0].legend(loc="upper left", fontsize=6)
    fig.suptitle(title)
    return _save(fig, path)


def slot_share(runs: Mapping[str, ReplayResult], path: Path, title: str) -> Path:
    """Fig. 4: running sequences by entitlement, stacked."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 3.0), sharey=True, squeeze=False, layout=LAYOUT)
    for ax, (policy, result) in zip(axes[0], runs.items()):
        names = _names(result)
        series = [_running(result, n) for n in names]
        if series and series[0][0]:
            ax.stackplot(series[0][0], *[s[1] for s in series], labels=names, step="post",
                         colors=[_color(result, n) for n in names], alpha=0.8)
        pool = result.samples.pool
        ax.step([p[0] for p in pool], [p[3] for p in pool], where="post", color="#555555", ls="--", lw=0.8, label="slots")
        ax.set_title(TITLES.get(policy, policy))
        ax.set_xlabel("time (s)")
        _shade(ax, result)
    axes[0][0].set_ylabel("running sequences")
    axes[0][0].legend(loc="upper left", fontsize=6)
    fig.suptitle(title)
    return _save(fig, path)


def admissions(result: ReplayResult, path: Path, title: str) -> Path:
    """Admitted and refused attempts per second, by entitlement (refusals dashed)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.0), layout=LAYOUT)
    for name in _names(result):
        xs, ys = _rates(result, name, True)
        ax.plot(xs, ys, color=_color(result, name), label=f"{name} admitted")
        xs, ys = _rates(result, name, False)
        ax.plot(xs, ys, color=_color(result, name), ls="--", label=f"{name} refused")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("attempts / s")
    ax.legend(fontsize=6, ncol=2)
    _shade(ax, result)
    ax.set_title(title)
    return _save(fig, path)


REASON_GROUPS: tuple[tuple[str, str], ...] = (("low_priority", "-"), ("concurrency", "--"), ("other", ":"))
"""The refusals-by-reason panel's groups and their line styles: low priority (the paper's refusal for the squeezed
tenant), concurrency, and every other reason together (token budget, KV, budget, not bound, ...)."""


def refusal_rates(result: ReplayResult, name: str) -> dict[str, tuple[list[float], list[float]]]:
    """First refusals of ``name`` per second by reason group (``REASON_GROUPS``) in 5-s bins: what a proxy without a
    queue would have refused (``metrics.refusal_events``: a wait counts once, at its start, with its reason)."""
    counts: dict[str, dict[int, int]] = {group: defaultdict(int) for group, _ in REASON_GROUPS}
    for t, ent, reason in m.refusal_events(result):
        if ent == name:
            counts[reason if reason in counts else "other"][int(t // BIN_S)] += 1
    xs = _bins(result.scenario.duration_s)
    return {group: ([x + BIN_S / 2 for x in xs], [c.get(int(x // BIN_S), 0) / BIN_S for x in xs])
            for group, c in counts.items()}


def priority_dynamics(result: ReplayResult, path: Path, title: str) -> Path:
    """Fig. 5: in flight vs capacity; debt; priority; admission and refusal rates; refusals by reason; admission
    delay."""
    plt = _pyplot()
    fig, axes = plt.subplots(6, 1, figsize=(7.0, 12.5), sharex=True, layout=LAYOUT)
    names = _names(result)
    for name in names:
        color = _color(result, name)
        rows = [(t, n) for t, ent, _, _, n in result.samples.by_entitlement if ent == name]
        axes[0].step([r[0] for r in rows], [r[1] for r in rows], where="post", color=color, label=name)
        ticks = m.ticks_of(result, name)
        axes[1].plot([t.t_s for t in ticks], [t.debt for t in ticks], color=color, marker=".", ms=3, label=name)
        axes[2].plot([t.t_s for t in ticks], [t.priority for t in ticks], color=color, marker=".", ms=3, label=name)
        for admitted, ls in ((True, "-"), (False, "--")):
            xs, ys = _rates(result, name, admitted)
            axes[3].plot(xs, ys, color=color, ls=ls)
        by_reason = refusal_rates(result, name)
        for group, ls in REASON_GROUPS:
            xs, ys = by_reason[group]
            if any(ys):
                axes[4].plot(xs, ys, color=color, ls=ls, label=f"{name} {group}")
        delays = _admission_delay(result, name)
        axes[5].plot(delays[0], delays[1], color=color, marker=".", ms=3)
    pool = result.samples.pool
    axes[0].step([p[0] for p in pool], [p[3] for p in pool], where="post", color="#555555", ls="--", label="slots")
    axes[0].set_ylabel("in flight (admission)")
    axes[1].axhline(0.05, color="#999999", lw=0.6, ls=":")
    axes[1].set_ylabel("debt d_e")
    axes[2].set_ylabel("priority w_e")
    axes[2].set_yscale("log")
    axes[3].set_ylabel("admitted — / refused -- per s")
    axes[4].set_ylabel("first refusals / s by reason")
    axes[4].set_title("refusals by reason: low priority —, concurrency --, other ··· (a wait counts at its start)",
                      fontsize=7)
    if axes[4].lines:
        axes[4].legend(fontsize=6, ncol=2, loc="upper right")
    axes[5].set_ylabel("P99 admission delay (s)")
    axes[5].set_xlabel("time (s)")
    axes[0].legend(fontsize=6, loc="upper right")
    for ax in axes:
        _shade(ax, result)
    fig.suptitle(title)
    return _save(fig, path)


def _admission_delay(result: ReplayResult, name: str) -> tuple[list[float], list[float]]:
    by_bin: dict[int, list[float]] = defaultdict(list)
    c = result.completions
    for ent, first, admitted in zip(c.entitlement, c.first_attempt_s, c.admitted_s):
        if ent == name and first < result.scenario.duration_s:
            by_bin[int(first // BIN_S)].append(admitted - first)
    xs = sorted(by_bin)
    return [x * BIN_S + BIN_S / 2 for x in xs], [m.p99(by_bin[x]) for x in xs]


def throughput(runs: Mapping[str, ReplayResult], path: Path, title: str) -> Path:
    """Fig. 6b: output tokens/s per entitlement (5-s bins of completion time), one panel per policy."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 3.0), sharey=True, squeeze=False, layout=LAYOUT)
    for ax, (policy, result) in zip(axes[0], runs.items()):
        xs = _bins(result.scenario.duration_s)
        for name in _names(result):
            ys = [m.output_tokens_per_s(result, name, x, x + BIN_S) for x in xs]
            ax.plot([x + BIN_S / 2 for x in xs], ys, color=_color(result, name), label=name)
        ax.set_title(TITLES.get(policy, policy))
        ax.set_xlabel("time (s)")
        _shade(ax, result)
    axes[0][0].set_ylabel("output tokens / s")
    axes[0][0].legend(fontsize=6)
    fig.suptitle(title)
    return _save(fig, path)


def experiment_figures(name: str, runs: Mapping[str, ReplayResult], out_dir: Path,
                       mode: str | None = None) -> list[Path]:
    """All figures of one experiment; returns their paths (relative names are what report.md links). ``mode``: the
    load model to name in the titles, and in the file names unless it is the default one ("closed loop":
    ``exp1_closed_loop_latency.png``; "open loop" or None: ``exp1_latency.png``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with _pyplot().rc_context(RC):
        return _figures(name, runs, out_dir, mode)


def _figures(name: str, runs: Mapping[str, ReplayResult], out_dir: Path, mode: str | None) -> list[Path]:
    tp = runs.get("token-pools")
    stem = name if mode in (None, OPEN_LOOP) else f"{name}_{mode.replace(' ', '_')}"
    label = name if mode is None else f"{name}, {mode}"
    paths = [
        queue_depth(runs, out_dir / f"{stem}_queue_depth.png", f"{label}: backend queue depth (Fig. 2)"),
        slot_share(runs, out_dir / f"{stem}_slot_share.png", f"{label}: slots by entitlement (Fig. 4)"),
    ]
    result = next(iter(runs.values()))
    if name == "exp1":
        groups = {"guaranteed": [e.name for e in result.scenario.entitlements if e.service_class.protected],
                  "spot": ["spot-b"]}
        paths.append(latency(runs, groups, out_dir / f"{stem}_latency.png",
                             f"{label}: P99 TTFT and end-to-end latency (Fig. 3)"))
        if tp is not None:
            paths.append(admissions(tp, out_dir / f"{stem}_admissions.png", f"{label} token pools: admit / refuse rates"))
    else:
        groups = {e.name: [e.name] for e in result.scenario.entitlements}
        slo = {e.name: e.slo_ms / 1000 for e in result.scenario.entitlements}
        paths.append(latency(runs, groups, out_dir / f"{stem}_latency.png", f"{label}: P99 TTFT and end-to-end (Fig. 6a)",
                             slo))
        paths.append(throughput(runs, out_dir / f"{stem}_throughput.png", f"{label}: output tokens/s (Fig. 6b)"))
        if tp is not None:
            paths.append(priority_dynamics(tp, out_dir / f"{stem}_priority_dynamics.png",
                                           f"{label} token pools: priority dynamics (Fig. 5)"))
    return paths
