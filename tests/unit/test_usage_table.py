"""The ``tokenpools usage`` table at any width. Invariants: nothing is cut (every kept column's cells read whole,
top to bottom, and no ellipsis appears); the table fits the width; a column is dropped only if every column at
least as important that fits is shown (dropped ones are never more important than a shown one), and the caption
names them."""

from __future__ import annotations

import io

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from tokenpools.core.budgets import Weights
from tokenpools.replay import usage
from tokenpools.replay.usage_table import PRIORITY, Column, Kind, columns_of, fit, header, render, wrap

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-./", min_size=1, max_size=40)


def _table(names: list[tuple[str, str, str]], counts: list[tuple[int, int, int, int]], priced: bool) -> pl.DataFrame:
    rows = [{"tenant": t, "entitlement": e, "model": m, "month": "2026-11",
             **dict(zip(usage.COUNTS, c, strict=True)), "labels": '{"team":"x"}'}
            for (t, e, m), c in zip(names, counts, strict=True)]
    frame = pl.DataFrame(rows, schema={"tenant": pl.String, "entitlement": pl.String, "model": pl.String,
                                       "month": pl.String, **{c: pl.Int64 for c in usage.COUNTS}, "labels": pl.String})
    if priced:
        frame = usage.price(frame, {e: Weights(0.37, 0.37, 0.0) for _, e, _ in names})  # 0.37 a prompt token
    return frame


def _shown(table: pl.DataFrame, width: int, show_labels: bool = True) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(render(table, usage.COUNTS, show_labels, "usage by month", width))
    return console.file.getvalue()  # type: ignore[attr-defined]


def _column_texts(text: str, columns: int) -> list[str]:
    """Each column's cell text read top to bottom (header excluded), whitespace removed."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "╇" in line or set(line.strip()) == {"━"}) + 1
    body = [line for line in lines[start:] if "│" in line or (columns == 1 and line.startswith(" "))]
    body = [line for line in body if not set(line.strip()) <= set("─┼")]
    out = [""] * columns
    for line in body:
        cells = line.split("│")
        assert len(cells) == columns, line
        for j, cell in enumerate(cells):
            out[j] += "".join(cell.split())
    return out


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.tuples(NAMES, NAMES, NAMES),
                               st.tuples(*[st.integers(0, 10**12)] * 4)), min_size=1, max_size=4),
       width=st.integers(40, 220), priced=st.booleans())
def test_nothing_is_cut_at_any_width(rows: list, width: int, priced: bool) -> None:
    table = _table([r[0] for r in rows], [r[1] for r in rows], priced)
    columns = columns_of(table, usage.COUNTS, show_labels=True)
    kept, dropped = fit(columns, width)
    text = _shown(table, width)
    assert "…" not in text
    assert all(len(line) <= width for line in text.splitlines())
    assert _column_texts(text, len(kept)) == ["".join("".join(c.cells).split()) for c, _ in kept]
    if dropped:
        assert max(c.priority for c, _ in kept) <= min(c.priority for c in dropped)
        assert "left out at" in text and all(c.name in "".join(text.split()) for c in dropped)


def test_eighty_columns_tell_long_names_apart() -> None:
    """The issue's case: at 80 columns two rows must not both read ``elasti… │ elasti… │ qwen3-…``."""
    names = [("elastic-team-research", "elastic-team-research-batch", "qwen3-8b-instruct-awq"),
             ("elastic-team-research", "elastic-team-research-online", "qwen3-8b-instruct-awq")]
    table = _table(names, [(123_456_789, 1_000, 98_765_432, 4_321), (5, 0, 7, 1)], priced=True)
    text = _shown(table, 80)
    columns = [c for c, _ in fit(columns_of(table, usage.COUNTS, True), 80)[0]]
    read = dict(zip([c.name for c in columns], _column_texts(text, len(columns)), strict=True))
    assert "elastic-team-research-batch" in read["entitlement"]
    assert "elastic-team-research-online" in read["entitlement"]
    assert "123,456,789" in text and "45,679,011.93" in text  # numbers whole: the count and the cost with its cents


def test_a_wide_console_shows_every_column_with_the_csv_names() -> None:
    table = _table([("a", "b", "c")], [(1, 2, 3, 4)], priced=True)
    text = _shown(table, 200)
    head = next(line for line in text.splitlines() if "tenant" in line)
    assert [c.strip() for c in head.split("┃")] == [c for c in table.columns]
    assert "left out" not in text


def test_headers_break_after_underscores() -> None:
    assert header("cached_prompt_tokens", 7) == "cached_\nprompt_\ntokens"
    assert header("cached_prompt_tokens", 14) == "cached_prompt_\ntokens"
    narrow = Column("cached_prompt_tokens", Kind.NUMBER, 2, ("0", "1"))
    assert narrow.min_width == len("cached_")  # a header's piece is never split: the column is at least that wide
    assert set(PRIORITY) >= {*usage.COUNTS, usage.COST, "labels", "tenant", "entitlement", "model"}


@given(text=NAMES, width=st.integers(1, 30))
def test_wrap_keeps_every_character_within_the_width(text: str, width: int) -> None:
    lines = wrap(text, width).split("\n")
    assert "".join(lines) == text and all(1 <= len(line) <= width for line in lines)


def test_wrap_breaks_names_after_their_separators() -> None:
    assert wrap("elastic-team-research", 10) == "elastic-\nteam-\nresearch"
    assert wrap("org/qwen3-8b-instruct", 12) == "org/qwen3-\n8b-instruct"
    assert wrap("abcdefghijkl", 5) == "abcde\nfghij\nkl"  # one piece wider than the column: cut within it
