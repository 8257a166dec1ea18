"""This proxy's view of its entitlements' budget accounts, and the budget check (docs/budgets.md#enforcement).

Per (entitlement, budget) the view holds the agents' latest account (a ``BudgetStatus`` from the budgets topic: the
highest version wins, an older one is ignored) and this proxy's own spending that record may not include yet: its
completions with an event time at or after the record's ``through_ms``, dropped once a newer record's
``through_ms`` passes them. Per entitlement it holds the reservations of its requests in flight (each request's
n_in and output estimate, priced at each budget's weights when compared). The check admits a request while

    allowance - published spending - own spending - reservations >= the request's reservation

(``core.budgets.admits``), for every budget of the entitlement.

Which account is in force at ``now``:
- the record's, while ``now`` is in its period (and the spec's period and time zone are the record's);
- after the record's period ended, the next period's account (``core.budgets.account_at``): its rollover is
  computed from the record's spending, an estimate until the agents publish the new period's account (the other
  proxies' spending after ``through_ms`` is unknown here; the agents' record corrects it);
- with no record yet (or none of the spec's period and time zone, after a spec change), a fresh account of the
  current period (``account_at(spec, None, now)``: the bare amount) and this proxy's own spending in it. Without
  Kafka that is all a proxy ever knows.

A spec change is in force at the next check (the specs are read at each call): a budget added is checked at once, a
removed one no more; new weights reprice the spending at once; a new period or time zone starts from own spending
until the agents' record of it; a new amount is in the allowance when the agents publish it (a record's allowance
includes a rollover the proxy cannot recompute).

Only entitlement-scoped budgets are checked here; a tenant's shared budget (``BudgetScope.TENANT``) needs the sum of
its entitlements' parts and is not enforced yet (records of it are kept, by the same key).

Pure: time is an argument (wall-clock ms, the events' time base); no I/O. Lives on the event loop.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from tokenpools.core.budgets import (
    NEVER_END_MS, Account, BudgetScope, BudgetSpec, Period, Usage, account_at, admits, iso_ms, retry_after_ms)
from tokenpools.topics.records import BudgetStatus

MAX_OWN_ENTRIES = 65_536
"""Own completions kept per account between two records. Past it the two oldest merge into one at the later time:
counted until a record covers the later one (at worst a little longer than needed, never less)."""


class RecordResult(StrEnum):
    APPLIED = "applied"
    STALE = "stale"  # a version not newer than the one held for the key


@dataclass(frozen=True, slots=True)
class Published:
    """The agents' latest account of one budget, as the check uses it."""

    version: int
    period: Period
    time_zone: str
    account: Account
    through_ms: int

    @classmethod
    def of(cls, record: BudgetStatus) -> Published:
        spent = Usage(record.spent.prompt_tokens, record.spent.cached_prompt_tokens, record.spent.completion_tokens,
                      record.spent.requests)
        return cls(record.version, record.period, record.time_zone,
                   Account(record.period_start_ms, record.period_end_ms, record.allowance, spent), record.through_ms)


@dataclass(frozen=True, slots=True)
class BudgetState:
    """One budget at one instant as this proxy sees it: the account in force and what the proxy adds to it."""

    spec: BudgetSpec
    account: Account  # published spending (or none) in the period in force
    pending: Usage  # own spending the account does not include, plus the reservations in flight

    @property
    def remaining_units(self) -> float:
        return self.account.remaining(self.spec.weights) - self.pending.cost(self.spec.weights)


@dataclass(frozen=True, slots=True)
class BudgetRefusal:
    """A request the budget ``state`` cannot take: it needed ``units``."""

    entitlement: str
    state: BudgetState
    units: float
    retry_after_ms: int

    @property
    def resets_at(self) -> str | None:
        """The reset as RFC 3339 in the budget's time zone; None for a budget that never resets."""
        end = self.state.account.end_ms
        return None if end >= NEVER_END_MS else iso_ms(end, self.state.spec.time_zone)

    @property
    def retry_after_s(self) -> int:
        return max(1, math.ceil(self.retry_after_ms / 1000))

    @property
    def reason(self) -> str:
        spec, state = self.state.spec, self.state
        left = max(0.0, state.remaining_units)
        reset = f"it resets at {self.resets_at}" if self.resets_at is not None else "it does not reset"
        return (f"budget {spec.name} of entitlement {self.entitlement} is exhausted: {_units(left)} of "
                f"{_units(state.account.allowance)} units left this {spec.period.value} period, the request reserves "
                f"{_units(self.units)}; {reset}")

    def detail(self) -> dict[str, object]:
        """What the 429's body says of the budget (``error.budget``)."""
        spec, state = self.state.spec, self.state
        return {"name": spec.name, "period": spec.period.value, "time_zone": spec.time_zone,
                "resets_at": self.resets_at, "allowance": state.account.allowance,
                "remaining": max(0.0, state.remaining_units), "request": self.units}


def _units(x: float) -> str:
    return f"{x:.6g}"


@dataclass(slots=True)
class _Own:
    """One account's own completions not yet covered by a record, oldest first, and their sum."""

    entries: deque[tuple[int, Usage]] = field(default_factory=deque)
    total: Usage = field(default_factory=Usage)

    def add(self, t_ms: int, usage: Usage, max_entries: int) -> None:
        entries = self.entries
        if not entries or entries[-1][0] <= t_ms:
            entries.append((t_ms, usage))
        else:  # a clock step back: keep the order
            entries.insert(bisect.bisect_right(entries, t_ms, key=lambda e: e[0]), (t_ms, usage))
        self.total = self.total + usage
        if len(entries) > max_entries:
            (_, first), (t_second, second) = entries.popleft(), entries.popleft()
            entries.appendleft((t_second, first + second))

    def drop_before(self, cut_ms: int) -> None:
        entries = self.entries
        while entries and entries[0][0] < cut_ms:
            self.total = _minus(self.total, entries.popleft()[1])


def _minus(a: Usage, b: Usage) -> Usage:
    return Usage(a.prompt - b.prompt, a.cached_prompt - b.cached_prompt, a.completion - b.completion,
                 a.requests - b.requests)


class BudgetBook:
    """The proxy's budget accounts (module doc). Keys are (entitlement, budget name)."""

    def __init__(self, max_own_entries: int = MAX_OWN_ENTRIES) -> None:
        if max_own_entries < 2:
            raise ValueError(f"`max_own_entries` must be >= 2, got {max_own_entries}")
        self.max_own_entries = max_own_entries
        self._published: dict[tuple[str, str], Published] = {}
        self._own: dict[tuple[str, str], _Own] = {}
        self._reserved: dict[str, dict[str, Usage]] = {}  # entitlement → request id → its reservation
        self._reserved_total: dict[str, Usage] = {}

    # ---- the agents' records ------------------------------------------------------------------------------------
    def apply(self, record: BudgetStatus) -> RecordResult:
        """Hold ``record`` if its version is newer than the one held for its key; own spending it covers (event time
        before its ``through_ms``) is dropped at the next look at the account."""
        key = (record.entitlement, record.budget)
        held = self._published.get(key)
        if held is not None and record.version <= held.version:
            return RecordResult.STALE
        self._published[key] = Published.of(record)
        return RecordResult.APPLIED

    def published(self, entitlement: str, budget: str) -> Published | None:
        return self._published.get((entitlement, budget))

    # ---- the check ----------------------------------------------------------------------------------------------
    def state(self, entitlement: str, spec: BudgetSpec, now_ms: int) -> BudgetState:
        """The account of ``spec`` in force at ``now_ms`` and what this proxy adds to it (module doc)."""
        key = (entitlement, spec.name)
        published = self._published.get(key)
        if published is not None and published.period is spec.period and published.time_zone == spec.time_zone:
            if now_ms < published.account.end_ms:
                account, cut_ms = published.account, published.through_ms
            else:  # the period ended: the next one's account, its rollover an estimate until the agents publish it
                account = account_at(spec, published.account, now_ms)
                cut_ms = account.start_ms
        else:
            account = account_at(spec, None, now_ms)
            cut_ms = account.start_ms
        own = self._own.get(key)
        spent = Usage()
        if own is not None:
            own.drop_before(cut_ms)
            spent = own.total
        return BudgetState(spec, account, spent + self._reserved_total.get(entitlement, Usage()))

    def check(self, entitlement: str, budgets: tuple[BudgetSpec, ...], request: Usage, now_ms: int,
              retry_cap_ms: int) -> BudgetRefusal | None:
        """The first of ``budgets`` that cannot take ``request`` (its n_in and output estimate), or None: admit."""
        for spec in budgets:
            if spec.scope is not BudgetScope.ENTITLEMENT:
                continue  # a tenant's shared budget: not enforced yet (module doc)
            state = self.state(entitlement, spec, now_ms)
            units = request.cost(spec.weights)
            if not admits(state.account, spec.weights, state.pending.cost(spec.weights), units):
                return BudgetRefusal(entitlement, state, units, retry_after_ms(state.account, now_ms, retry_cap_ms))
        return None

    # ---- reservations and settlement ----------------------------------------------------------------------------
    def reserve(self, entitlement: str, request_id: str, request: Usage) -> None:
        """Hold ``request`` against every budget of ``entitlement`` until it is released or settled."""
        held = self._reserved.setdefault(entitlement, {})
        if request_id in held:
            raise ValueError(f"request {request_id} already holds a budget reservation")
        held[request_id] = request
        self._reserved_total[entitlement] = self._reserved_total.get(entitlement, Usage()) + request

    def release(self, entitlement: str, request_id: str) -> None:
        """Give back ``request_id``'s reservation (refused after all, or settled); nothing if it holds none."""
        held = self._reserved.get(entitlement)
        request = held.pop(request_id, None) if held is not None else None
        if request is None:
            return
        total = _minus(self._reserved_total[entitlement], request)
        if held:
            self._reserved_total[entitlement] = total
        else:
            del self._reserved[entitlement], self._reserved_total[entitlement]

    def settle(self, entitlement: str, budgets: tuple[BudgetSpec, ...], request_id: str, t_ms: int,
               used: Usage) -> None:
        """A request ended at ``t_ms`` (its completion's event time) having used ``used``: its reservation is
        released and its usage is own spending of every budget of the entitlement (as of its spec now) until a
        record covers ``t_ms``."""
        self.release(entitlement, request_id)
        if used == Usage():
            return
        for spec in budgets:
            own = self._own.get((entitlement, spec.name))
            if own is None:
                own = self._own[(entitlement, spec.name)] = _Own()
            own.add(t_ms, used, self.max_own_entries)

    def reserved(self, entitlement: str) -> Usage:
        return self._reserved_total.get(entitlement, Usage())
