"""Long-window token budgets (docs/budgets.md): periods on a calendar, what a request costs, what is left.

A budget grants ``amount`` units per period: tokens, or currency when its ``weights`` price the token classes
(prompt, cached prompt, completion). Periods are calendar ones in the budget's time zone — a day from local
midnight, a week from Monday's, a month from the first's — or ``never`` (one period for ever). Unused units may
roll over to the next period, at most ``rollover_max`` of them.

Spending is kept as whole tokens per class (``Usage``), so a ledger is exact to the token whatever the weights;
its cost in units is computed when it is compared with the allowance.

Pure: time is an argument (integer ms since the epoch), no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

NEVER_END_MS = 2**63 - 1
"""The end of the one period of a ``never`` budget (no reset)."""


class Period(StrEnum):
    DAY = "day"
    WEEK = "week"  # from Monday 00:00 local
    MONTH = "month"
    NEVER = "never"  # one period from the epoch on: a budget that never resets


class BudgetScope(StrEnum):
    ENTITLEMENT = "entitlement"  # spent by one entitlement
    TENANT = "tenant"  # shared by every entitlement of one tenant


class OnStale(StrEnum):
    """What a proxy does with a budget's requests while its view of the budget is stale (docs/budgets.md#stale-views)."""

    SPEND = "spend"  # admit on its own view, as when fresh (the overshoot this allows is stated in the docs)
    REFUSE = "refuse"  # refuse with budget_unavailable (503) until the agents' record catches up


@lru_cache(maxsize=256)
def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``; a clear ``ValueError`` for one this machine does not know."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r} (an IANA name such as UTC or Europe/Berlin)") from None


@dataclass(frozen=True, slots=True)
class Weights:
    """Units per token of each class. All 1: the budget is in tokens."""

    prompt: float = 1.0
    cached_prompt: float = 1.0
    completion: float = 1.0

    def __post_init__(self) -> None:
        for name in ("prompt", "cached_prompt", "completion"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"budget weight `{name}` must be a finite number >= 0, got {value}")


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens spent, by class. ``prompt`` counts every prompt token, cached or not; ``cached_prompt`` is the part of
    them the backend served from its prefix cache (so the uncached part is ``prompt - cached_prompt``)."""

    prompt: int = 0
    cached_prompt: int = 0
    completion: int = 0
    requests: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.prompt + other.prompt, self.cached_prompt + other.cached_prompt,
                     self.completion + other.completion, self.requests + other.requests)

    @property
    def tokens(self) -> int:
        return self.prompt + self.completion

    def cost(self, weights: Weights) -> float:
        """Units: uncached prompt, cached prompt and completion tokens, each at its weight."""
        uncached = self.prompt - self.cached_prompt
        return uncached * weights.prompt + self.cached_prompt * weights.cached_prompt + self.completion * weights.completion


@dataclass(frozen=True, slots=True)
class BudgetSpec:
    """One budget as the core sees it (validated; the YAML/CRD form converts into this)."""

    name: str
    period: Period
    amount: float  # units per period
    time_zone: str = "UTC"  # where the period's midnight is
    scope: BudgetScope = BudgetScope.ENTITLEMENT
    weights: Weights = field(default_factory=Weights)
    rollover_max: float = 0.0  # unused units carried into the next period, at most this many; 0: none
    alert_thresholds: tuple[float, ...] = ()  # fractions of the allowance, ascending, each in (0, 10]
    on_stale: OnStale | None = None  # None: the settings' budgets.on_stale

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("budget `name` must not be empty")
        if not math.isfinite(self.amount) or self.amount <= 0:
            raise ValueError(f"budget {self.name}: `amount` must be a finite number > 0, got {self.amount}")
        if not math.isfinite(self.rollover_max) or self.rollover_max < 0:
            raise ValueError(f"budget {self.name}: `rollover_max` must be a finite number >= 0, got {self.rollover_max}")
        if self.period is Period.NEVER and self.rollover_max:
            raise ValueError(f"budget {self.name}: a `never` budget has no next period to roll over into")
        if self.scope is BudgetScope.TENANT and self.rollover_max:
            raise ValueError(f"budget {self.name}: a tenant budget has no rollover (docs/budgets.md#tenant-budgets)")
        zone(self.time_zone)
        if any(not 0 < t <= 10 for t in self.alert_thresholds) or list(self.alert_thresholds) != sorted(
                set(self.alert_thresholds)):
            raise ValueError(f"budget {self.name}: `alert_thresholds` must be distinct fractions in (0, 10], ascending, "
                             f"got {list(self.alert_thresholds)}")

    def period_at(self, t_ms: int) -> tuple[int, int]:
        """(start, end) in ms of the period holding ``t_ms``; end is exclusive."""
        return period_bounds(self.period, self.time_zone, t_ms)


# ---------------------------------------------------------------- calendar


def period_bounds(period: Period, time_zone: str, t_ms: int) -> tuple[int, int]:
    """(start, end) in ms since the epoch of the ``period`` holding ``t_ms`` in ``time_zone``; end exclusive.

    A boundary is local midnight (Monday's for a week, the first's for a month). Where a DST change skips local
    midnight, the period starts at the first instant after the gap (what local midnight maps to with the offset
    before the change); where it repeats midnight, at its first occurrence. A ``never`` period is [0, ``NEVER_END_MS``)."""
    if period is Period.NEVER:
        return 0, NEVER_END_MS
    tz = zone(time_zone)
    local = datetime.fromtimestamp(t_ms / 1000, tz)
    day = local.date()
    if period is Period.DAY:
        first, following = day, day + timedelta(days=1)
    elif period is Period.WEEK:
        first = day - timedelta(days=day.weekday())
        following = first + timedelta(days=7)
    else:
        first = day.replace(day=1)
        following = (first + timedelta(days=32)).replace(day=1)
    start, end = _midnight_ms(first, tz), _midnight_ms(following, tz)
    if t_ms < start:  # t is in a repeated hour before the (first) midnight: the previous period
        return period_bounds(period, time_zone, start - 1)
    if t_ms >= end:
        return period_bounds(period, time_zone, end)
    return start, end


def _midnight_ms(day: object, tz: ZoneInfo) -> int:
    local = datetime(day.year, day.month, day.day, tzinfo=tz, fold=0)  # type: ignore[attr-defined]
    return int(round(local.astimezone(UTC).timestamp() * 1000))


def next_start_ms(period: Period, time_zone: str, start_ms: int) -> int:
    """The start of the period after the one starting at ``start_ms``."""
    return period_bounds(period, time_zone, start_ms)[1]


def iso_ms(t_ms: int, time_zone: str = "UTC") -> str:
    """``t_ms`` as RFC 3339 in ``time_zone`` (for error bodies and reports); ``"never"`` for the end of a ``never``
    period (``NEVER_END_MS`` is past any calendar)."""
    if t_ms >= NEVER_END_MS:
        return "never"
    return datetime.fromtimestamp(t_ms / 1000, zone(time_zone)).isoformat(timespec="seconds")


# ---------------------------------------------------------------- a period's account


@dataclass(frozen=True, slots=True)
class Account:
    """One budget's current period: its bounds, its allowance (amount + what rolled over) and what was spent."""

    start_ms: int
    end_ms: int
    allowance: float
    spent: Usage = field(default_factory=Usage)

    def remaining(self, weights: Weights) -> float:
        """Units left; negative when spending overshot the allowance (requests admitted before the ledger knew)."""
        return self.allowance - self.spent.cost(weights)

    def fraction(self, weights: Weights) -> float:
        return self.spent.cost(weights) / self.allowance if self.allowance > 0 else math.inf


def carried(spec: BudgetSpec, previous: Account) -> float:
    """What ``previous`` leaves to the period after it: its unused units, at most ``rollover_max``."""
    return min(spec.rollover_max, max(0.0, previous.remaining(spec.weights)))


def account_at(spec: BudgetSpec, previous: Account | None, t_ms: int) -> Account:
    """The account of the period holding ``t_ms``, given the last account kept (``None``: none yet).

    The same period: ``previous`` itself. A later one: a fresh account whose allowance carries over from the
    periods in between, each of them unspent (an idle period carries its whole allowance, capped), so a gap of many
    periods costs at most ``rollover_max / amount + 2`` steps (the carry then is at its fixed point). An earlier one (a late event): a fresh account with
    the bare amount — the caller keeps accounts it may still need (see ``Ledger``)."""
    start, end = spec.period_at(t_ms)
    if previous is None:
        return Account(start, end, spec.amount)
    if previous.start_ms == start:
        return previous
    if start < previous.start_ms:
        return Account(start, end, spec.amount)
    account = previous
    while True:
        allowance = spec.amount + carried(spec, account)
        if account.end_ms == start:
            return Account(start, end, allowance)
        if account.spent == Usage() and allowance == account.allowance:
            return Account(start, end, allowance)  # the carry's fixed point: every idle period from here on has it
        account = Account(account.end_ms, next_start_ms(spec.period, spec.time_zone, account.end_ms), allowance)


def request_units(prompt_tokens: int, output_tokens: int, weights: Weights) -> float:
    """What a request is expected to cost at admission: its prompt at the (uncached) prompt weight — the cache hit is
    known only at completion — and its output estimate at the completion weight."""
    return prompt_tokens * weights.prompt + output_tokens * weights.completion


def admits(account: Account, weights: Weights, pending_units: float, units: float) -> bool:
    """The budget check (docs/budgets.md#enforcement): a request costing ``units`` fits what the account has left
    after ``pending_units`` (this proxy's spending the account does not include yet, and its reservations)."""
    return account.remaining(weights) - pending_units >= units


def crossed(thresholds: tuple[float, ...], before: float, after: float) -> tuple[float, ...]:
    """The thresholds a spent fraction going from ``before`` to ``after`` reaches for the first time."""
    return tuple(t for t in thresholds if before < t <= after)


def retry_after_ms(account: Account, now_ms: int, cap_ms: int) -> int:
    """How long a client refused for an exhausted budget should wait: until the reset, at most ``cap_ms``."""
    return max(0, min(cap_ms, account.end_ms - now_ms))


def is_stale(unacknowledged_since_ms: int | None, now_ms: int, stale_after_ms: int) -> bool:
    """Whether a proxy's view of a budget is stale at ``now_ms``: some of its own spending (the oldest at
    ``unacknowledged_since_ms``; None: none) has waited longer than ``stale_after_ms`` for a record of the budget
    to arrive after it. A budget nobody spends here is never stale: an idle view has nothing to be late about."""
    if stale_after_ms <= 0:
        raise ValueError(f"`stale_after_ms` must be positive, got {stale_after_ms}")
    return unacknowledged_since_ms is not None and now_ms - unacknowledged_since_ms > stale_after_ms


def refuses_stale(on_stale: OnStale, unacknowledged_since_ms: int | None, now_ms: int, stale_after_ms: int) -> bool:
    """Whether a budget's requests are refused as unavailable: its policy is ``refuse`` and its view is stale."""
    return on_stale is OnStale.REFUSE and is_stale(unacknowledged_since_ms, now_ms, stale_after_ms)
