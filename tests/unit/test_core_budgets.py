"""Budgets' calendar and accounts (tokenpools.core.budgets; docs/budgets.md)."""

from __future__ import annotations

import ast
import inspect
from datetime import datetime

import pytest

from tokenpools.core import budgets as B
from tokenpools.core.budgets import Account, BudgetSpec, Period, Usage


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def test_the_module_reads_no_clock() -> None:
    tree = ast.parse(inspect.getsource(B))
    calls = {node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute)}
    assert not calls & {"now", "utcnow", "today", "time", "monotonic", "time_ns"}


@pytest.mark.parametrize(("zone", "day", "hours"), [
    ("Europe/Berlin", "2026-03-29T12:00:00+02:00", 23),  # spring forward
    ("Europe/Berlin", "2026-10-25T12:00:00+01:00", 25),  # fall back
    ("America/New_York", "2026-06-01T12:00:00-04:00", 24),
    ("America/Havana", "2026-03-08T12:00:00-04:00", 23),  # midnight itself is skipped: from 01:00
])
def test_a_local_day_is_23_24_or_25_hours_across_dst(zone: str, day: str, hours: int) -> None:
    start, end = B.period_bounds(Period.DAY, zone, _ms(day))
    assert (end - start) == hours * 3_600_000
    assert start <= _ms(day) < end


@pytest.mark.parametrize(("t", "days"), [("2028-02-29T23:59:59+00:00", 29), ("2026-02-10T00:00:00+00:00", 28),
                                         ("2026-12-31T23:00:00+00:00", 31), ("2026-04-30T12:00:00+00:00", 30)])
def test_months_end_where_the_calendar_says(t: str, days: int) -> None:
    start, end = B.period_bounds(Period.MONTH, "UTC", _ms(t))
    assert end - start == days * 86_400_000 and B.iso_ms(start).endswith("-01T00:00:00+00:00")


def test_a_week_starts_on_monday_local_midnight() -> None:
    start, end = B.period_bounds(Period.WEEK, "Asia/Kolkata", _ms("2026-12-03T20:00:00+00:00"))  # Fri 01:30 IST
    assert B.iso_ms(start, "Asia/Kolkata") == "2026-11-30T00:00:00+05:30" and end - start == 7 * 86_400_000


def test_rollover_is_capped_and_an_idle_stretch_stops_at_the_cap() -> None:
    spec = BudgetSpec("d", Period.DAY, 100, rollover_max=250)
    first = Account(*spec.period_at(_ms("2026-01-01T10:00:00+00:00")), 100, Usage(30, 0, 10, 1))
    assert B.account_at(spec, first, _ms("2026-01-02T10:00:00+00:00")).allowance == 160
    assert B.account_at(spec, first, _ms("2026-03-02T10:00:00+00:00")).allowance == 350
    assert B.account_at(BudgetSpec("n", Period.DAY, 100), first, _ms("2026-03-02T10:00:00+00:00")).allowance == 100


def test_cost_prices_cached_prompt_tokens_apart() -> None:
    weights = B.Weights(prompt=2.0, cached_prompt=0.5, completion=4.0)
    assert Usage(prompt=100, cached_prompt=40, completion=10).cost(weights) == 60 * 2 + 40 * 0.5 + 10 * 4


def test_a_bad_budget_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        BudgetSpec("x", Period.DAY, 1, time_zone="Mars/Olympus")
    with pytest.raises(ValueError, match="budget x: `alert_thresholds`"):
        BudgetSpec("x", Period.DAY, 1, alert_thresholds=(1.0, 0.8))
