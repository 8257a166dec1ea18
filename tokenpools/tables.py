"""Terminal tables that fit the console: numbers are never cut, text wraps, and columns that still do not fit are
left out by priority (every command's table: ``validate``, ``demo``, ``replay --sweep``, ``fleet``).

``Column`` says how a column may give way: a ``number`` column never wraps and is never shortened (its cells are
numbers, or numbers joined by spaces when ``wrap`` is set: they wrap between the numbers, never inside one); a text
column wraps at spaces, and a word longer than the column folds rather than ending in "…". ``fit(columns, rows,
width)`` builds the rich ``Table`` and, while its narrowest rendering is wider than ``width``, drops the column of
lowest ``keep`` (ties: the rightmost), and says in the caption which were left out. ``console_for(stream)`` is the
console these tables print on: a terminal's width, ``COLUMNS`` when set, and in a pipe without ``COLUMNS`` wide
enough that nothing is dropped.

No printing here: the commands print what ``fit`` returns.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TextIO

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

PIPE_WIDTH = 200  # a pipe without COLUMNS: wide enough for every table here, so that none is trimmed


@dataclass(frozen=True, slots=True)
class Column:
    header: str
    number: bool = False  # right-aligned; a cell is never cut
    keep: int = 0  # the higher, the later it is dropped when the table does not fit
    wrap: bool = False  # a number column whose cells are several numbers: may wrap between them

    @property
    def justify(self) -> Literal["left", "right"]:
        return "right" if self.number else "left"


def fit(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int, *, title: str | None = None,
        caption: str | None = None) -> Table:
    """A table of ``rows`` (one cell per column, rich markup allowed) no wider than ``width`` when it can be: the
    columns of lowest ``keep`` are dropped until its narrowest rendering fits (never the last one left), and the
    room left is shared so that as many columns as possible keep their cells on one line."""
    kept = list(range(len(columns)))
    plain = [[Text.from_markup(cell).plain for cell in row] for row in rows]
    narrowest = [max([_narrowest(c.header, False), *(_narrowest(r[i], c.number and not c.wrap) for r in plain)])
                 for i, c in enumerate(columns)]  # (a list: a table of no rows has the header alone)
    natural = [max(cell_len(text) for text in [c.header, *(r[i] for r in plain)]) for i, c in enumerate(columns)]
    while True:
        table = _table(columns, kept, rows, title, [narrowest[i] for i in kept])
        overhead = _minimum(table) - sum(narrowest[i] for i in kept)
        if len(kept) == 1 or _minimum(table) <= width:
            break
        kept.remove(min(kept, key=lambda i: (columns[i].keep, -i)))
    if sum(natural[i] for i in kept) + overhead > width:  # rich's own collapse would cut cells: share it here
        widths = share(width - overhead, [narrowest[i] for i in kept], [natural[i] for i in kept],
                       [columns[i].keep for i in kept])
        for column, w in zip(table.columns, widths):
            column.width = w
    dropped = [columns[i].header for i in range(len(columns)) if i not in kept]
    notes = [caption] if caption else []
    if dropped:
        notes.append(f"left out at {width} columns: {', '.join(dropped)} (a wider terminal shows them)")
    if notes:
        table.caption = "\n".join(notes)
        table.caption_justify = "left"
    return table


def share(room: int, narrowest: Sequence[int], natural: Sequence[int], keep: Sequence[int]) -> list[int]:
    """Column widths, each at least its narrowest, summing to at most ``room`` when the narrowest do: the room left
    goes to the columns by ``keep``, highest first (among equals, to those that need the least to be whole), each
    up to its natural width."""
    widths = list(narrowest)
    left = room - sum(widths)
    for i in sorted(range(len(widths)), key=lambda i: (-keep[i], natural[i] - narrowest[i])):
        give = max(0, min(natural[i] - widths[i], left))
        widths[i] += give
        left -= give
    return widths


def _table(columns: Sequence[Column], kept: Sequence[int], rows: Sequence[Sequence[str]], title: str | None,
           min_widths: Sequence[int]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for i, min_width in zip(kept, min_widths):
        c = columns[i]
        # no no_wrap: it would keep the header on one line too; a number column is never narrower than its
        # longest cell, so its cells stay whole
        table.add_column(c.header, justify=c.justify, overflow="fold", min_width=min_width)
    for row in rows:
        table.add_row(*(row[i] for i in kept))
    return table


def _narrowest(text: str, whole: bool) -> int:
    """The fewest cells ``text`` takes: all of it when it may not wrap, else its longest word."""
    if whole:
        return cell_len(text)
    return max((cell_len(word) for word in text.split()), default=0)


def _minimum(table: Table) -> int:
    """The narrowest the table renders without cutting a cell (measured with room to spare: rich clamps a
    measurement to the width it is given)."""
    console = Console(width=100_000, file=_Null(), color_system=None)
    return Measurement.get(console, console.options, table).minimum


class _Null:
    def write(self, _: str) -> int:
        return 0

    def flush(self) -> None:
        pass


def console_width(is_terminal: bool, terminal_columns: int, environ: dict[str, str] | os._Environ[str]) -> int:
    """``COLUMNS`` when set to a positive number; else the terminal's width; else (a pipe) ``PIPE_WIDTH``."""
    text = environ.get("COLUMNS", "")
    if text.isdigit() and int(text) > 0:
        return int(text)
    return terminal_columns if is_terminal else PIPE_WIDTH


def console_for(stream: TextIO | None = None) -> Console:
    """A rich console on ``stream`` (stdout by default) as wide as ``console_width`` says."""
    file = stream or sys.stdout
    probe = Console(file=file)
    return Console(file=file, width=console_width(probe.is_terminal, probe.size.width, os.environ))
