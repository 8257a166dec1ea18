"""Budgets' calendar and accounts (tokenpools.core.budgets; docs/budgets.md)."""

from __future__ import annotations

import ast
import calendar
import inspect
from datetime import datetime

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tokenpools.core import budgets
from tokenpools.core.budgets import Account, BudgetScope, BudgetSpec, OnStale, Period, Usage, is_stale, refuses_stale


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def test_the_module_reads_no_clock() -> None:
    tree = ast.parse(inspect.getsource(budgets))
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
    start, end = budgets.period_bounds(Period.DAY, zone, _ms(day))
    assert (end - start) == hours * 3_600_000
    assert start <= _ms(day) < end


@pytest.mark.parametrize(("t", "days"), [("2028-02-29T23:59:59+00:00", 29), ("2026-02-10T00:00:00+00:00", 28),
                                         ("2026-12-31T23:00:00+00:00", 31), ("2026-04-30T12:00:00+00:00", 30)])
def test_months_end_where_the_calendar_says(t: str, days: int) -> None:
    start, end = budgets.period_bounds(Period.MONTH, "UTC", _ms(t))
    assert end - start == days * 86_400_000 and budgets.iso_ms(start).endswith("-01T00:00:00+00:00")


def test_a_week_starts_on_monday_local_midnight() -> None:
    start, end = budgets.period_bounds(Period.WEEK, "Asia/Kolkata", _ms("2026-12-03T20:00:00+00:00"))  # Fri 01:30 IST
    assert budgets.iso_ms(start, "Asia/Kolkata") == "2026-11-30T00:00:00+05:30" and end - start == 7 * 86_400_000


def test_rollover_is_capped_and_an_idle_stretch_stops_at_the_cap() -> None:
    spec = BudgetSpec("d", Period.DAY, 100, rollover_max=250)
    first = Account(*spec.period_at(_ms("2026-01-01T10:00:00+00:00")), 100, Usage(30, 0, 10, 1))
    assert budgets.account_at(spec, first, _ms("2026-01-02T10:00:00+00:00")).allowance == 160
    assert budgets.account_at(spec, first, _ms("2026-03-02T10:00:00+00:00")).allowance == 350
    assert budgets.account_at(BudgetSpec("n", Period.DAY, 100), first, _ms("2026-03-02T10:00:00+00:00")).allowance == 100


def test_cost_prices_cached_prompt_tokens_apart() -> None:
    weights = budgets.Weights(prompt=2.0, cached_prompt=0.5, completion=4.0)
    assert Usage(prompt=100, cached_prompt=40, completion=10).cost(weights) == 60 * 2 + 40 * 0.5 + 10 * 4


def test_a_bad_budget_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        BudgetSpec("x", Period.DAY, 1, time_zone="Mars/Olympus")
    with pytest.raises(ValueError, match="budget x: `alert_thresholds`"):
        BudgetSpec("x", Period.DAY, 1, alert_thresholds=(1.0, 0.8))


# ---- properties: the calendar, over zones with every kind of daylight-saving change -----------------------------

ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Havana", "Asia/Kolkata")
"""Lord Howe moves its clocks by 30 minutes; Havana skips midnight in spring and repeats it in autumn; Kolkata has
no DST and a half-hour offset."""
CALENDAR = (Period.DAY, Period.WEEK, Period.MONTH)
T_MS = st.integers(_ms("2000-01-01T00:00:00+00:00"), _ms("2100-01-01T00:00:00+00:00"))
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
PROPERTY = settings(max_examples=200, deadline=None)


def _local(t_ms: int, zone: str) -> datetime:
    return datetime.fromtimestamp(t_ms / 1000, budgets.zone(zone))


@PROPERTY
@given(st.sampled_from(Period), st.sampled_from(ZONES), T_MS)
@example(Period.DAY, "America/Havana", _ms("2026-03-08T05:00:00+00:00"))  # 01:00 CDT: the first instant of the day
@example(Period.DAY, "America/Havana", _ms("2026-11-01T04:30:00+00:00"))  # 00:30 CDT, before midnight repeats
@example(Period.DAY, "America/Havana", _ms("2026-11-01T05:30:00+00:00"))  # 00:30 CST, the repeated half hour
@example(Period.DAY, "Australia/Lord_Howe", _ms("2026-10-03T15:10:00+00:00"))  # 02:10 → 02:40 half-hour jump
def test_the_period_holding_t_contains_it_and_its_neighbours_touch_it(period: Period, zone: str, t: int) -> None:
    """Periods tile time: the period holding t contains t, and the one holding its end starts there (and the one
    holding the instant before its start ends there): no gap, no overlap, whatever the zone's clocks do."""
    start, end = budgets.period_bounds(period, zone, t)
    assert start <= t < end
    assert budgets.period_bounds(period, zone, start) == (start, end) == budgets.period_bounds(period, zone, end - 1)
    if period is Period.NEVER:
        assert (start, end) == (0, budgets.NEVER_END_MS)
        return
    assert budgets.period_bounds(period, zone, end)[0] == end == budgets.next_start_ms(period, zone, start)
    assert budgets.period_bounds(period, zone, start - 1)[1] == start


@PROPERTY
@given(st.sampled_from(CALENDAR), st.sampled_from(ZONES), T_MS)
def test_a_period_starts_at_the_first_instant_of_its_first_local_day(period: Period, zone: str, t: int) -> None:
    """Local midnight, or the first instant after a gap that skips it; Monday for a week, the 1st for a month; and
    its length is the calendar's, give or take the hour (or half hour) a DST change adds or removes."""
    start, end = budgets.period_bounds(period, zone, t)
    first, before = _local(start, zone), _local(start - 1, zone)
    assert first.date() != before.date()  # nothing of that local day lies before the start
    assert first.hour <= 1  # midnight, or just after a skipped one
    if period is Period.WEEK:
        assert first.weekday() == 0
    if period is Period.MONTH:
        assert first.day == 1
    days = {Period.DAY: (1,), Period.WEEK: (7,), Period.MONTH: (28, 29, 30, 31)}[period]
    assert any(abs((end - start) - n * DAY_MS) <= HOUR_MS for n in days), (end - start) / HOUR_MS


@PROPERTY
@given(st.sampled_from(ZONES), st.integers(1972, 2199))
@example("Europe/Berlin", 2000)  # divisible by 400: a leap year
@example("America/New_York", 2100)  # divisible by 100 only: not one
@example("Australia/Lord_Howe", 2028)
@example("America/New_York", 1975)  # clocks went forward on 23 February: a 28-day February 1 hour short
def test_february_has_29_days_exactly_in_leap_years(zone: str, year: int) -> None:
    """February runs from local Feb 1 to local Mar 1, 29 calendar days in leap years, 28 otherwise. Counted in local
    dates, not milliseconds: a zone may change its clocks in February (New York did on 23 February 1975)."""
    feb_10 = int(datetime(year, 2, 10, 12, tzinfo=budgets.zone(zone)).timestamp() * 1000)
    start, end = budgets.period_bounds(Period.MONTH, zone, feb_10)
    first, following = (datetime.fromtimestamp(t / 1000, budgets.zone(zone)).date() for t in (start, end))
    assert (first.month, first.day, following.month, following.day) == (2, 1, 3, 1)
    assert (following - first).days == (29 if calendar.isleap(year) else 28)
    if calendar.isleap(year):
        leap_day = int(datetime(year, 2, 29, 23, 59, tzinfo=budgets.zone(zone)).timestamp() * 1000)
        day_start, day_end = budgets.period_bounds(Period.DAY, zone, leap_day)
        assert budgets.iso_ms(day_start, zone).startswith(f"{year}-02-29T00:00:00")
        assert budgets.iso_ms(day_end, zone).startswith(f"{year}-03-01T00:00:00")


def test_the_repeated_midnight_belongs_to_the_day_it_starts() -> None:
    """Havana falls back from 01:00 to 00:00 on 2026-11-01: the day starts at the first midnight, and the repeated
    hour (the second 00:00-01:00) is in the same day, 25 hours long."""
    first_midnight = _ms("2026-11-01T00:00:00-04:00")
    repeated = _ms("2026-11-01T00:30:00-05:00")
    assert budgets.period_bounds(Period.DAY, "America/Havana", repeated) == (first_midnight, first_midnight + 25 * HOUR_MS)


# ---- properties: accounts and rollover ------------------------------------------------------------------------

@st.composite
def _usage(draw: st.DrawFn) -> Usage:
    prompt = draw(st.integers(0, 10**7))
    return Usage(prompt, draw(st.integers(0, prompt)), draw(st.integers(0, 10**7)), draw(st.integers(0, 100)))


@st.composite
def _specs(draw: st.DrawFn) -> BudgetSpec:
    return BudgetSpec(
        "b", draw(st.sampled_from(CALENDAR)), float(draw(st.integers(1, 10**8))), time_zone=draw(st.sampled_from(ZONES)),
        weights=budgets.Weights(*(draw(st.sampled_from((0.0, 0.1, 1.0, 4.0))) for _ in range(3))),
        rollover_max=float(draw(st.sampled_from((0, 1, 10**6, 10**8, 10**9)))),
    )


GAPS = st.integers(0, 100 * DAY_MS)


@PROPERTY
@given(_specs(), T_MS, st.lists(st.tuples(GAPS, _usage()), max_size=30))
def test_an_allowance_is_never_above_amount_plus_rollover_max_whatever_the_history(
        spec: BudgetSpec, t0: int, history: list[tuple[int, Usage]]) -> None:
    """Folding any sequence of completions (any spending, any gaps, idle stretches included) never yields an
    allowance above amount + rollover_max, nor below amount; and each account is the period holding its event."""
    account = None
    t = t0
    for gap, usage in history:
        t += gap
        account = budgets.account_at(spec, account, t)
        assert spec.amount <= account.allowance <= spec.amount + spec.rollover_max
        assert (account.start_ms, account.end_ms) == spec.period_at(t)
        account = Account(account.start_ms, account.end_ms, account.allowance, account.spent + usage)


@PROPERTY
@given(_specs(), T_MS, _usage(), st.integers(1, 40))
def test_idle_periods_carry_their_whole_allowance_up_to_the_cap(spec: BudgetSpec, t: int, spent: Usage, idle: int) -> None:
    """After an account with some spending, ``idle`` periods without traffic: each carries all it has, capped at
    rollover_max — account_at equals stepping through every period one at a time."""
    start, end = spec.period_at(t)
    account = Account(start, end, spec.amount, spent)
    expected = account
    for _ in range(idle):
        following = budgets.next_start_ms(spec.period, spec.time_zone, expected.start_ms)
        expected = Account(following, budgets.next_start_ms(spec.period, spec.time_zone, following),
                           spec.amount + budgets.carried(spec, expected))
    got = budgets.account_at(spec, account, expected.start_ms)
    assert got == expected
    assert budgets.carried(spec, Account(start, end, spec.amount)) == min(spec.rollover_max, spec.amount)  # an idle period


@PROPERTY
@given(_specs(), T_MS, _usage(), st.floats(0, 1, exclude_max=True))
def test_the_same_period_returns_the_account_unchanged(spec: BudgetSpec, t: int, spent: Usage, where: float) -> None:
    start, end = spec.period_at(t)
    account = Account(start, end, spec.amount + spec.rollover_max / 2, spent)
    assert budgets.account_at(spec, account, start + int((end - start) * where)) is account
    assert budgets.account_at(spec, account, end - 1) is account


@PROPERTY
@given(_specs(), T_MS, _usage())
def test_a_late_event_opens_its_own_period_with_the_bare_amount(spec: BudgetSpec, t: int, spent: Usage) -> None:
    start, end = spec.period_at(t)
    account = Account(start, end, spec.amount + spec.rollover_max, spent)
    late = budgets.account_at(spec, account, start - 1)
    assert (late.start_ms, late.end_ms, late.allowance, late.spent) == (*spec.period_at(start - 1), spec.amount, Usage())


def test_a_tenant_budget_has_no_rollover() -> None:
    """Its carry would need the tenant's total of the previous period, which no one part holds (docs/budgets.md)."""
    with pytest.raises(ValueError, match="tenant budget has no rollover"):
        BudgetSpec("shared", Period.DAY, 10, scope=BudgetScope.TENANT, rollover_max=1)
    assert BudgetSpec("shared", Period.DAY, 10, scope=BudgetScope.TENANT).rollover_max == 0


# ---- stale views (docs/budgets.md#stale-views) ------------------------------------------------------------------

@given(st.one_of(st.none(), st.integers(0, 10**6)), st.integers(0, 2 * 10**6), st.integers(1, 10**5))
def test_stale_only_when_own_spending_waited_longer_than_the_bound(since, now, after):
    """Invariant: nothing waiting is never stale; stale iff the wait exceeds the bound; and once stale, stale at
    every later time while nothing changes (monotone in time)."""
    stale = is_stale(since, now, after)
    assert stale == (since is not None and now - since > after)
    if stale:
        assert is_stale(since, now + 1, after)
    assert refuses_stale(OnStale.SPEND, since, now, after) is False
    assert refuses_stale(OnStale.REFUSE, since, now, after) == stale


def test_stale_bound_must_be_positive():
    with pytest.raises(ValueError, match="`stale_after_ms` must be positive, got 0"):
        is_stale(1, 2, 0)
