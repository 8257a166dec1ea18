"""The ``tokenpools usage`` table laid out for a width: no name and no number is ever cut.

Every column has a priority. Numbers never wrap: a number column is at least as wide as its widest cell. Names
(tenants, entitlements, models, labels) wrap onto more lines when their column is narrow, after a ``-``, ``_``,
``/``, ``.`` or ``:`` where they can, so every character stays. Headers are the CSV's column names, broken after an
underscore when the column is narrow. When even the narrowest layout of every column is wider than the width,
columns are dropped, least important first, and the caption names them. Pure: a frame and a width in, a ``rich``
table out (printing is the caller's).

Why not ``tokenpools.tables.fit``: it wraps text at spaces only, so a name without any (``elastic-team-research``,
``org/qwen3-8b``) keeps its whole length and the numbers are dropped first; a bill needs its counts and prices
shown before long names on one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

import polars as pl
from rich.table import Table
from rich.text import Text

NAME_MIN_WIDTH = 10  # a name column narrower than this folds names into unreadable slivers
TOTAL = "total"


class Kind(StrEnum):
    NAME = "name"  # folds onto more lines when narrow
    NUMBER = "number"  # never wraps; right-aligned


@dataclass(frozen=True, slots=True)
class Column:
    name: str  # as in the CSV
    kind: Kind
    priority: int  # 0 is kept longest
    cells: tuple[str, ...]  # the rows' cells, then the total row's

    @property
    def natural_width(self) -> int:
        return max(len(self.name), *(len(c) for c in self.cells)) if self.cells else len(self.name)

    def cells_width(self) -> int:
        """Wide enough for every cell on one line (and the header's widest piece)."""
        return max(self.min_width, *(len(c) for c in self.cells)) if self.cells else self.min_width

    @property
    def min_width(self) -> int:
        widest_part = max(len(part) for part in header_parts(self.name))
        widest_cell = max((len(c) for c in self.cells), default=0)
        if self.kind is Kind.NUMBER:
            return max(widest_part, widest_cell)
        return max(widest_part, min(widest_cell, NAME_MIN_WIDTH))


PRIORITY = {"tenant": 0, "entitlement": 0, "day": 0, "month": 0, "prompt_tokens": 0, "completion_tokens": 0,
            "cost_units": 0, "model": 1, "requests": 1, "cached_prompt_tokens": 2, "labels": 3}


def header_parts(name: str) -> list[str]:
    """A column name in the pieces a narrow header breaks it into: after each underscore."""
    return re.findall(r"[^_]+_?|_", name) or [name]


def wrap(text: str, width: int, breaks: str = "-_/.:") -> str:
    """``text`` on lines of at most ``width`` characters, broken after one of ``breaks`` where it can be and
    within a piece only where a piece alone is wider. Every character is kept, in order."""
    pieces = re.findall(rf"[^{re.escape(breaks)}]+[{re.escape(breaks)}]?|[{re.escape(breaks)}]", text) or [text]
    lines = [""]
    for piece in pieces:
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            lines.append("")
        while len(lines[-1]) + len(piece) > width:
            cut = width - len(lines[-1])
            lines[-1] += piece[:cut]
            piece = piece[cut:]
            lines.append("")
        lines[-1] += piece
    return "\n".join(line for line in lines if line) or text


def header(name: str, width: int) -> str:
    """A column name on as few lines of at most ``width`` as its pieces allow, broken after underscores."""
    return wrap(name, width, breaks="_")


def overhead(columns: int) -> int:
    """The characters a table of ``columns`` columns spends on padding (a space each side) and the rules between
    them (no outer edge)."""
    return 3 * columns - 1 if columns else 0


def columns_of(table: pl.DataFrame, counts: tuple[str, ...], show_labels: bool) -> list[Column]:
    """The table's columns with their cells as shown (thousands separators; a cost with two decimals; "—" for a
    missing one) and a total row under the counts."""
    key = [c for c in table.columns if c not in counts and c not in ("labels", "cost_units")]
    numbers = list(counts) + (["cost_units"] if "cost_units" in table.columns else [])
    out = []
    for i, name in enumerate(key):
        total = (TOTAL if i == 0 else "",) if table.height else ()
        out.append(Column(name, Kind.NAME, PRIORITY.get(name, 1), (*(str(v) for v in table[name]), *total)))
    for name in numbers:
        cells = [_number(v) for v in table[name]]
        known = table[name].drop_nulls()
        total = (_number(known.sum() if len(known) else None),) if table.height else ()
        out.append(Column(name, Kind.NUMBER, PRIORITY.get(name, 1), (*cells, *total)))
    if show_labels:
        total = ("",) if table.height else ()
        out.append(Column("labels", Kind.NAME, PRIORITY["labels"], (*table["labels"].to_list(), *total)))
    return out


def _number(value: object) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return f"{value:,}"


def fit(columns: list[Column], width: int) -> tuple[list[tuple[Column, int]], list[Column]]:
    """The columns kept, in their order, each with its width, and the columns dropped: the columns, most important
    first, as long as they fit at their narrowest, then the spare width shared out, most important first, up to each
    column's natural width."""
    order = sorted(range(len(columns)), key=lambda i: columns[i].priority)  # stable: table order within a priority
    kept: set[int] = set()
    for i in order:  # the first column that does not fit ends it: no column shows while a more important one drops
        trial = kept | {i}
        if sum(columns[j].min_width for j in trial) + overhead(len(trial)) > width:
            break
        kept.add(i)
    widths = {i: columns[i].min_width for i in kept}
    spare = width - sum(widths.values()) - overhead(len(kept))
    for target in (Column.cells_width, Column.natural_width.fget):  # cells on fewer lines first, then headers
        while spare > 0:  # one character at a time to each column still narrower than the target
            short = [i for i in sorted(kept) if widths[i] < target(columns[i])][:spare]
            if not short:
                break
            for i in short:
                widths[i] += 1
            spare -= len(short)
    return [(columns[i], widths[i]) for i in sorted(kept)], [columns[i] for i in order if i not in kept]


def render(table: pl.DataFrame, counts: tuple[str, ...], show_labels: bool, title: str, width: int) -> Table:
    """The table for a console ``width`` characters wide."""
    columns = columns_of(table, counts, show_labels)
    kept, dropped = fit(columns, width)
    left_out = ", ".join(c.name for c in dropped)
    caption = f"left out at {width} columns: {left_out} (a wider terminal or --csv shows them)" if dropped else None
    out = Table(title=title, title_justify="left", caption=caption, caption_justify="left", show_edge=False)
    for column, w in kept:
        number = column.kind is Kind.NUMBER
        out.add_column(Text(header(column.name, w), justify="right" if number else "left"), width=w,
                       justify="right" if number else "left", no_wrap=number, overflow="fold")
    rows = table.height
    def cell(column: Column, w: int, r: int) -> Text:
        return Text(column.cells[r] if column.kind is Kind.NUMBER else wrap(column.cells[r], w), overflow="fold")

    for r in range(rows):
        out.add_row(*(cell(column, w, r) for column, w in kept))
    if rows:
        out.add_section()
        out.add_row(*(cell(column, w, rows) for column, w in kept))
    return out
