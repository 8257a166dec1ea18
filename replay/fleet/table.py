"""A comparison (``compare``) as plain text: what ``tokenpools fleet`` and ``benchmarks/fleet.py`` print.

``table`` has the exact enforcer's row first (P and balancer "-": they do not matter to it), then one row per design
run: refusals as a share of attempts, their ratio to the exact enforcer's, false refusals, refusals by outcome
(concurrency, token budget, low priority), overshoot (the most slots any entitlement had in flight above its limit,
and ∫(N−L)⁺dt ÷ ∫L dt) and the KB one proxy reads per update ("-": the design sends nothing measured).
Percentages are of attempts. A caller appends columns of its own (the benchmark: decode + apply ms, run s).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.replay.fleet.compare import EXACT, Row
from tokenpools.replay.fleet.metrics import FleetFigures
from tokenpools.replay.fleet.model import FleetConfig
from tokenpools.replay.fleet.trace import Trace, TraceConfig
from tokenpools.tables import Column, fit

BY_OUTCOME = (("conc%", AdmissionOutcome.REFUSED_CONCURRENCY), ("tok%", AdmissionOutcome.REFUSED_TOKEN_BUDGET),
              ("prio%", AdmissionOutcome.REFUSED_LOW_PRIORITY))
HEADERS = ("P", "balancer", "design", "refused%", "ratio", "false%", *(h for h, _ in BY_OUTCOME), "over max", "over%",
           "KB/upd")
LEFT = frozenset({"balancer", "design"})


def pct(n: int, d: int) -> str:
    return f"{100 * n / d:.1f}" if d else "-"


def kb(n_bytes: float) -> str:
    return f"{n_bytes / 1000:.1f}" if n_bytes else "-"


def figure_cells(figures: FleetFigures, ratio: float) -> list[str]:
    """The cells after P, balancer and design, in ``HEADERS`` order."""
    refused = figures.refused
    return [pct(figures.refusals, figures.attempts), f"{ratio:.2f}", pct(figures.false_refusals, figures.attempts),
            *(pct(refused.get(outcome, 0), figures.attempts) for _, outcome in BY_OUTCOME),
            str(figures.overshoot_max_slots), f"{100 * figures.overshoot_fraction:.2f}",
            kb(figures.update_bytes_mean)]


def row_cells(exact: FleetFigures, rows: Sequence[Row]) -> list[list[str]]:
    """One line of cells per row, in ``HEADERS`` order, the exact enforcer's first."""
    lines = [["-", "-", EXACT, *figure_cells(exact, 1.0)]]
    return lines + [[str(r.proxies), r.balancer, r.design, *figure_cells(r.figures, r.ratio)] for r in rows]


def table(exact: FleetFigures, rows: Sequence[Row],
          extra: Sequence[tuple[str, Sequence[str]]] = ()) -> list[str]:
    """Header, rule and one line per row, the exact enforcer's first; each ``extra`` column is (header, one cell
    per line: the exact enforcer's, then each row's), right-aligned after the figures."""
    lines = row_cells(exact, rows)
    headers = list(HEADERS)
    for header, cells in extra:
        if len(cells) != len(lines):
            raise ValueError(f"column {header!r} has {len(cells)} cells for {len(lines)} lines")
        headers.append(header)
        for line, cell in zip(lines, cells):
            line.append(cell)
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]

    def join(cells: Sequence[str]) -> str:
        return " ".join(c.ljust(w) if h in LEFT else c.rjust(w) for h, c, w in zip(headers, cells, widths)).rstrip()

    header = join(headers)
    return [header, "-" * len(header), *(join(line) for line in lines)]


TERMINAL_KEEP = {"P": 1, "balancer": 2, "design": 12, "refused%": 11, "ratio": 10, "false%": 9, "conc%": 5, "tok%": 4,
                 "prio%": 3, "over max": 8, "over%": 7, "KB/upd": 6}


def terminal_table(exact: FleetFigures, rows: Sequence[Row], width: int) -> Table:
    """``table`` for a terminal of ``width`` columns (``tokenpools fleet``): P and the balancer, said in the lines
    above it, go first when it does not fit, then the refusals by outcome; a number is never cut."""
    columns = [Column(h, number=h not in LEFT, keep=TERMINAL_KEEP[h]) for h in HEADERS]
    return fit(columns, row_cells(exact, rows), width)


def exact_line(exact: FleetFigures) -> str:
    """The exact enforcer in a sentence: attempts, refusals by outcome, false refusals, overshoot."""
    outcomes = ", ".join(f"{o.value} {n:,}" for o, n in exact.refused.items()) or "none"
    return (f"exact enforcer: {exact.attempts:,} attempts, {pct(exact.refusals, exact.attempts)} % refused "
            f"({outcomes}), {exact.false_refusals} false, overshoot {exact.overshoot_max_slots} slots")


def settings_line(trace_config: TraceConfig, trace: Trace, seed: int, fleet: FleetConfig) -> str:
    """What was run: the trace and the fleet's timings."""
    return (f"trace: E = {trace_config.entitlements}, {trace_config.duration_s:g} s of event time, load "
            f"{trace_config.load:.0%} of every limit, {len(trace.requests):,} requests, seed {seed}; tick "
            f"{fleet.tick_s:g} s, counts every {fleet.counts_interval_s:g} s, updates and counts in force "
            f"{fleet.propagation_delay_s:g} s later")
