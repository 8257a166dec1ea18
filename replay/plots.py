"""PNG figures in the spirit of the paper's Figs. 2–6 (matplotlib, Agg backend, byte-identical across runs).

Every figure is a pure function of replay results; binned series use 5-s bins of event time, and the noisy rate
panels (throughput, admissions and refusals) are drawn as a trailing moving mean over ``SMOOTH_S`` that their axis
label states. Shaded bands mark the scenario's events, told apart by colour and named in the legend (``bands``): an
outage (the slots per replica drop) and a tenant joining. Legends sit outside the data; log axes read as plain numbers.
Exp 2's tenants are named as report.md names them (``results.short``: copilot, not elastic-copilot).
PNGs are written without a Software/creation-time chunk, so the same results give the same bytes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenpools.replay import metrics as m
from tokenpools.replay.replayer import ReplayResult
from tokenpools.replay.results import short

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

BIN_S = 5.0
SMOOTH_S = 20.0  # the rate panels' trailing moving-mean window: 4 bins of BIN_S
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


class BandKind(StrEnum):
    """What a shaded band of a figure marks."""

    OUTAGE = "outage"  # the slots per replica drop at its start
    JOIN = "join"  # a tenant joins the pool at its start


BAND_COLORS = {BandKind.OUTAGE: "#7f7f7f", BandKind.JOIN: "#e6b800"}
BAND_ALPHA = {BandKind.OUTAGE: 0.22, BandKind.JOIN: 0.16}


@dataclass(frozen=True, slots=True)
class Band:
    start_s: float
    end_s: float
    kind: BandKind
    label: str


def bands(result: ReplayResult) -> list[Band]:
    """The scenario's phases that begin with an event a reader must see: a capacity drop (an outage, labelled with its
    slots per replica before and after) or tenants joining (labelled with their names). Other phases are not shaded."""
    scenario = result.scenario
    slots = int(scenario.pool.per_replica.concurrency)
    drops: dict[float, tuple[int, int]] = {}
    for change in sorted(scenario.capacity_changes, key=lambda c: c.t_s):
        if change.slots_per_replica < slots:
            drops[change.t_s] = (slots, change.slots_per_replica)
        slots = change.slots_per_replica
    out = []
    for phase in scenario.phases:
        joining = [n for n, m in scenario.membership.items() if m.join_s == phase.start_s and m.join_s > 0]
        if phase.start_s in drops:
            before, after = drops[phase.start_s]
            out.append(Band(phase.start_s, phase.end_s, BandKind.OUTAGE,
                            f"outage: {before} → {after} slots per replica"))
        elif joining:
            out.append(Band(phase.start_s, phase.end_s, BandKind.JOIN,
                            f"{', '.join(sorted(short(n) for n in joining))} joins"))
    return out


def _shade(ax: Axes, result: ReplayResult) -> None:
    for band in bands(result):
        ax.axvspan(band.start_s, band.end_s, color=BAND_COLORS[band.kind], alpha=BAND_ALPHA[band.kind], lw=0,
                   label=band.label, zorder=0)  # behind the data: it must not tint a stacked area
    ax.set_xlim(0, result.scenario.duration_s)


def moving_mean(ys: Sequence[float], n: int) -> list[float]:
    """Trailing moving mean over ``n`` points: point i is the mean of points i-n+1..i (fewer at the start, never
    padded with zeros). Trailing, so a change never shows before the event that caused it (it lags instead)."""
    out: list[float] = []
    total = 0.0
    for i, y in enumerate(ys):
        total += y
        if i >= n > 0:
            total -= ys[i - n]
        out.append(total / min(i + 1, max(n, 1)))
    return out


def _smooth(ys: Sequence[float]) -> list[float]:
    return moving_mean(ys, int(round(SMOOTH_S / BIN_S)))


SMOOTHED = f"mean of the last {SMOOTH_S:g} s"


def _plain_log(ax: Axes) -> None:
    """The y axis in log scale, labelled 0.1, 1, 10 (not 10^-1): 1, 2, 5 in each decade, and 1 to 8 when the data
    span less than about one decade (else it would show one or two labels). Call it after the data are drawn."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    low, high = ax.get_ylim()
    narrow = low > 0 and high / low < 15
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0) if narrow
                                          else (1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _legend_outside(ax: Axes, **kwargs: Any) -> None:
    """The legend of one panel, to the right of its data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=6, **kwargs)


def _figure_legend(fig: Figure, axes: Sequence[Axes]) -> None:
    """One legend for a row of panels, outside them on the right: every label once, in the order first drawn."""
    seen: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            if not label.startswith("_"):
                seen.setdefault(label, handle)
    fig.legend(list(seen.values()), list(seen), loc="outside right upper", fontsize=6)


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
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs) + 1.6, 3.0), sharey=True, squeeze=False,
                             layout=LAYOUT)
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
    _figure_legend(fig, axes[0])
    fig.suptitle(title)
    return _save(fig, path)


def latency(runs: Mapping[str, ReplayResult], groups: Mapping[str, Sequence[str]], path: Path, title: str,
            slo_s: Mapping[str, float] | None = None) -> Path:
    """Fig. 3 / 6a: P99 TTFT and P99 end-to-end latency per 5-s bin of admission time, per group and policy; each
    group's TTFT SLO (``slo_s``) as a dashed line in its colour, named in the legend."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12.0, 3.2), squeeze=False, layout=LAYOUT)
    styles = {"token-pools": "-", "none": ":"}
    for col, e2e in enumerate((False, True)):
        ax = axes[0][col]
        for gi, (group, names) in enumerate(groups.items()):
            for policy, result in runs.items():
                xs, ys = _binned_p99(result, names, e2e)
                ax.plot(xs, ys, styles.get(policy, "-"), color=COLORS[gi % len(COLORS)], marker=".", ms=3,
                        label=f"{group}, {TITLES.get(policy, policy)}")
            if slo_s and group in slo_s and not e2e:
                ax.axhline(slo_s[group], color=COLORS[gi % len(COLORS)], lw=0.8, ls="--",
                           label=f"{group} TTFT SLO {slo_s[group]:g} s")
        _plain_log(ax)
        ax.set_xlabel("admission time (s)")
        ax.set_ylabel("P99 end-to-end (s)" if e2e else "P99 TTFT (s)")
        _shade(ax, next(iter(runs.values())))
    _figure_legend(fig, axes[0])
    fig.suptitle(title)
    return _save(fig, path)


def slot_share(runs: Mapping[str, ReplayResult], path: Path, title: str) -> Path:
    """Fig. 4: running sequences by entitlement, stacked."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs) + 1.6, 3.0), sharey=True, squeeze=False,
                             layout=LAYOUT)
    for ax, (policy, result) in zip(axes[0], runs.items()):
        names = _names(result)
        series = [_running(result, n) for n in names]
        if series and series[0][0]:
            ax.stackplot(series[0][0], *[s[1] for s in series], labels=[short(n) for n in names], step="post",
                         colors=[_color(result, n) for n in names], alpha=0.8)
        pool = result.samples.pool
        ax.step([p[0] for p in pool], [p[3] for p in pool], where="post", color="#555555", ls="--", lw=0.8, label="slots")
        ax.set_title(TITLES.get(policy, policy))
        ax.set_xlabel("time (s)")
        _shade(ax, result)
    axes[0][0].set_ylabel("running sequences")
    _figure_legend(fig, axes[0])
    fig.suptitle(title)
    return _save(fig, path)


def admissions(result: ReplayResult, path: Path, title: str) -> Path:
    """Admitted and refused attempts per second, by entitlement (refusals dashed)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.6, 3.0), layout=LAYOUT)
    for name in _names(result):
        xs, ys = _rates(result, name, True)
        ax.plot(xs, _smooth(ys), color=_color(result, name), label=f"{short(name)} admitted")
        xs, ys = _rates(result, name, False)
        ax.plot(xs, _smooth(ys), color=_color(result, name), ls="--", label=f"{short(name)} refused")
    ax.set_xlabel("time (s)")
    ax.set_ylabel(f"attempts / s ({SMOOTHED})")
    _shade(ax, result)
    _legend_outside(ax)
    ax.set_title(title)
    return _save(fig, path)


REASON_GROUPS: tuple[tuple[str, str], ...] = (("low_priority", "--"), ("concurrency", ":"), ("other", "-."))
"""The refusals-by-reason groups and their line styles in Fig. 5's admissions panel (admissions are solid): low
priority (the paper's refusal for the squeezed tenant), concurrency, and every other reason together (token budget,
KV, budget, not bound, ...)."""


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


FIG5_PANELS = ("in flight", "debt and priority", "admissions and refusals", "admission delay")
"""Fig. 5's four panels, top to bottom, as in the paper."""


def priority_dynamics(result: ReplayResult, path: Path, title: str) -> Path:
    """Fig. 5, the paper's four panels (``FIG5_PANELS``): (a) in flight per tenant against the pool's capacity;
    (b) debt d_e (solid, left axis) and priority w_e (dashed, right log axis); (c) admissions (solid) and first
    refusals by reason group (``REASON_GROUPS``) per second, smoothed; (d) P99 admission delay, first attempt to
    admission (the wait in the proxy's queue plus the client's retries), per 5-s bin of first attempt."""
    from matplotlib.lines import Line2D

    plt = _pyplot()
    fig, axes = plt.subplots(4, 1, figsize=(8.6, 10.0), sharex=True, layout=LAYOUT)
    flight, debt, rates, delay = axes
    priority = debt.twinx()
    names = _names(result)
    for name in names:
        color = _color(result, name)
        rows = [(t, n) for t, ent, _, _, n in result.samples.by_entitlement if ent == name]
        flight.step([r[0] for r in rows], [r[1] for r in rows], where="post", color=color, label=short(name))
        ticks = m.ticks_of(result, name)
        debt.plot([t.t_s for t in ticks], [t.debt for t in ticks], color=color, marker=".", ms=3, label=short(name))
        priority.plot([t.t_s for t in ticks], [t.priority for t in ticks], color=color, ls="--", lw=0.9)
        xs, ys = _rates(result, name, True)
        rates.plot(xs, _smooth(ys), color=color, lw=1.6, label=short(name))
        by_reason = refusal_rates(result, name)
        for group, ls in REASON_GROUPS:
            xs, ys = by_reason[group]
            if any(ys):
                rates.plot(xs, _smooth(ys), color=color, ls=ls, label=f"{short(name)} {group}")
        delays = _admission_delay(result, name)
        delay.plot(delays[0], delays[1], color=color, marker=".", ms=3, label=short(name))
    pool = result.samples.pool
    flight.step([p[0] for p in pool], [p[3] for p in pool], where="post", color="#555555", ls="--",
                label="capacity (slots)")
    flight.set_ylabel("in flight (admitted, not ended)")
    flight.set_title("(a) in flight per tenant and the pool's capacity", fontsize=8, loc="left")
    debt.axhline(0.05, color="#999999", lw=0.6, ls=":", label="debt 0.05 (decay threshold)")
    debt.set_ylabel("debt d_e (solid)")
    priority.set_ylabel("priority w_e (dashed)")
    _plain_log(priority)
    debt.set_title("(b) debt and priority per tenant", fontsize=8, loc="left")
    rates.set_ylabel(f"per s ({SMOOTHED})")
    rates.set_title("(c) admissions and first refusals by reason (a wait in the queue counts once, at its start)",
                    fontsize=8, loc="left")
    delay.set_ylabel("P99 admission delay (s)")
    delay.set_title("(d) admission delay: first attempt to admission (queue wait + retries), by first attempt",
                    fontsize=8, loc="left")
    delay.set_xlabel("time (s)")
    for ax in axes:
        _shade(ax, result)
    tenants = [Line2D([], [], color=_color(result, n), label=short(n)) for n in names]
    band_labels = {b.label for b in bands(result)}
    band_handles = [h for h, lab in zip(*debt.get_legend_handles_labels()) if lab in band_labels]
    _legend_outside(flight)
    debt_keys = [Line2D([], [], color="#333333", label="debt d_e"),
                 Line2D([], [], color="#333333", ls="--", lw=0.9, label="priority w_e"),
                 *[h for h, lab in zip(*debt.get_legend_handles_labels()) if lab.startswith("debt ")]]
    debt.legend(handles=tenants + debt_keys + band_handles, loc="upper left", bbox_to_anchor=(1.08, 1.0),
                borderaxespad=0.0, fontsize=6)  # beyond the priority axis' tick labels
    rate_keys = [Line2D([], [], color="#333333", lw=1.6, label="admitted")] + [
        Line2D([], [], color="#333333", ls=ls, label=f"refused: {group.replace('_', ' ')}")
        for group, ls in REASON_GROUPS]
    _legend_outside(rates, handles=tenants + rate_keys + band_handles)
    _legend_outside(delay)
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
    """Fig. 6b: output tokens/s per entitlement (5-s bins of completion time, trailing mean over ``SMOOTH_S``), one
    panel per policy."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs) + 1.6, 3.0), sharey=True, squeeze=False,
                             layout=LAYOUT)
    for ax, (policy, result) in zip(axes[0], runs.items()):
        xs = _bins(result.scenario.duration_s)
        for name in _names(result):
            ys = [m.output_tokens_per_s(result, name, x, x + BIN_S) for x in xs]
            ax.plot([x + BIN_S / 2 for x in xs], _smooth(ys), color=_color(result, name), label=short(name))
        ax.set_title(TITLES.get(policy, policy))
        ax.set_xlabel("time (s)")
        _shade(ax, result)
    axes[0][0].set_ylabel(f"output tokens / s ({SMOOTHED})")
    _figure_legend(fig, axes[0])
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
        queue_depth(runs, out_dir / f"{stem}_queue_depth.png", f"{label}: backend queue depth (paper's Fig. 2)"),
        slot_share(runs, out_dir / f"{stem}_slot_share.png", f"{label}: slots by entitlement (paper's Fig. 4)"),
    ]
    result = next(iter(runs.values()))
    if name == "exp1":
        groups = {"guaranteed": [e.name for e in result.scenario.entitlements if e.service_class.protected],
                  "spot": ["spot-b"]}
        paths.append(latency(runs, groups, out_dir / f"{stem}_latency.png",
                             f"{label}: P99 TTFT and end-to-end latency (paper's Fig. 3)", group_slo_s(result, groups)))
        if tp is not None:
            paths.append(admissions(tp, out_dir / f"{stem}_admissions.png", f"{label} token pools: admit / refuse rates"))
    else:
        groups = {short(e.name): [e.name] for e in result.scenario.entitlements}
        paths.append(latency(runs, groups, out_dir / f"{stem}_latency.png",
                             f"{label}: P99 TTFT and end-to-end (paper's Fig. 6a)", group_slo_s(result, groups)))
        paths.append(throughput(runs, out_dir / f"{stem}_throughput.png",
                                f"{label}: output tokens/s (paper's Fig. 6b)"))
        if tp is not None:
            paths.append(priority_dynamics(tp, out_dir / f"{stem}_priority_dynamics.png",
                                           f"{label} token pools: priority dynamics (paper's Fig. 5)"))
    return paths


def group_slo_s(result: ReplayResult, groups: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """Each group's TTFT SLO in seconds, for the groups whose entitlements share one (the others get no line)."""
    slo_ms = {e.name: e.slo_ms for e in result.scenario.entitlements}
    out = {}
    for group, names in groups.items():
        values = {slo_ms[n] for n in names if n in slo_ms}
        if len(values) == 1:
            out[group] = values.pop() / 1000
    return out
