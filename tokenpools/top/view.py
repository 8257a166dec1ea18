"""``tokenpools top``'s screen: the model's rows as rich tables (pure: the time is an argument, nothing is printed).

Two tables: the pools (version in force, its age, contended, capacity) and the entitlements, one section per pool.
A value not known yet is ``-``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from tokenpools.top.model import Applied, PoolRow, Row

DASH = "-"


def frame(pools: Sequence[PoolRow], rows: Sequence[Row], now_ms: int, today: str,
          applied: Mapping[Applied, int], missing_topics: Sequence[str] = ()) -> RenderableType:
    """The whole screen at ``now_ms``: the pools, the entitlements and a line of what was read."""
    if not pools:
        waiting = Text("no limit update yet: waiting for the agents' first tick (or no pool matches --pool)")
        return Group(waiting, _footer(applied, missing_topics))
    return Group(pools_table(pools, now_ms), entitlements_table(rows, today), _footer(applied, missing_topics))


def pools_table(pools: Sequence[PoolRow], now_ms: int) -> Table:
    table = Table(title="pools", title_justify="left", expand=False)
    for name, justify in (("pool", "left"), ("version", "right"), ("age s", "right"), ("contended", "left"),
                          ("capacity tok/s", "right"), ("capacity slots", "right"), ("entitlements", "right")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for p in pools:
        table.add_row(p.pool, str(p.version), f"{max(0, now_ms - p.t_ms) / 1000:.1f}", "yes" if p.contended else "no",
                      f"{p.capacity_tokens_per_s:,.0f}", str(p.capacity_slots), str(p.entitlements))
    return table


def entitlements_table(rows: Sequence[Row], today: str) -> Table:
    table = Table(title="entitlements", title_justify="left", expand=False)
    for name, justify in (("pool", "left"), ("entitlement", "left"), ("class", "left"), ("priority", "right"),
                          ("debt", "right"), ("limit tok/s", "right"), ("limit slots", "right"),
                          ("in flight", "right"), ("refused", "right"), (f"tokens {today}", "right"),
                          ("requests", "right")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    pool = None
    for r in rows:
        if pool is not None and r.pool != pool:
            table.add_section()
        pool = r.pool
        table.add_row(r.pool, r.entitlement, r.service_class or DASH, f"{r.priority:.3g}", f"{r.debt:+.2f}",
                      f"{r.limit_tokens_per_s:,.1f}", str(r.limit_slots), _maybe(r.in_flight), _maybe(r.refused),
                      f"{r.today_tokens:,}", f"{r.today_requests:,}")
    return table


def _maybe(value: int | None) -> str:
    return DASH if value is None else str(value)


def _footer(applied: Mapping[Applied, int], missing_topics: Sequence[str]) -> Text:
    read = sum(applied.values())
    parts = [f"{read} records read"] + [f"{applied[a]} {a.value}" for a in Applied if applied.get(a)]
    if missing_topics:
        parts.append("not found (yet): " + ", ".join(missing_topics))
    return Text("; ".join(parts), style="dim")
