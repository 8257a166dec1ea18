"""The replay's budget ledger (docs/budgets.md#replay): one proxy that knows its entitlements' spending exactly.

The replay has one "proxy" and no Kafka hop, so the ledger the live proxy approximates from the ``budgets`` topic
plus its own unpublished spending is exact here: every completion is added to the account of the period holding
its event time as it happens, and every admitted request holds its reservation until it completes. The check is
the core's (``core.budgets``: ``account_at``, ``request_units``, ``admits``, ``retry_after_ms``), made before the
rate checks for every service class; a request it refuses gets ``budget_exhausted`` at once (no wait helps).

A tenant budget (``scope: tenant``, docs/budgets.md#tenant-budgets) is one book shared by the scenario's entitlements
of the tenant declaring it: their completions and reservations all go to its one account, reported under the
entitlement ``tenant/<tenant>``.

Event time: the scenario's ``origin_ms`` plus the replay's seconds, so the calendar (days, weeks, months in the
budget's time zone) is the one the live agents would have used.

Kept mypyc-friendly like the policy it serves: plain classes with typed attributes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tokenpools.core.admission import Decision
from tokenpools.core.budgets import (
    NEVER_END_MS, Account, BudgetScope, BudgetSpec, Usage, account_at, admits, iso_ms, request_units, retry_after_ms,
)
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.spec import EntitlementSpec

_REFUSED_BUDGET = AdmissionOutcome.REFUSED_BUDGET


@dataclass(frozen=True, slots=True)
class BudgetPeriod:
    """One budget's period as the replay saw it: its account at the end, when it ran out, what it refused.

    ``exhausted_ms`` is the event time of the period's first ``budget_exhausted`` refusal (the moment the account
    could no longer take a request's reservation); None: it never ran out."""

    entitlement: str
    budget: str
    time_zone: str
    start_ms: int
    end_ms: int
    allowance: float
    spent_units: float
    spent: Usage
    exhausted_ms: int | None
    refused: int


class _Book:
    """One (entitlement, budget): the current account, the units reserved by requests in flight, the past periods."""

    def __init__(self, entitlement: str, spec: BudgetSpec) -> None:
        self.entitlement = entitlement
        self.spec = spec
        self.account: Account | None = None
        self.pending_units = 0.0  # reservations of admitted (or waiting) requests not completed yet
        self.exhausted_ms: int | None = None  # of the current account
        self.refused = 0  # of the current account
        self.closed: list[BudgetPeriod] = []

    def at(self, t_ms: int) -> Account:
        """The account of the period holding ``t_ms``; a new period closes the current one (kept for the report)."""
        account = account_at(self.spec, self.account, t_ms)
        if account is not self.account:
            if self.account is not None:
                self.closed.append(self.period())
            self.account = account
            self.exhausted_ms = None
            self.refused = 0
        return account

    def late(self, t_ms: int, used: Usage) -> None:
        """A completion in a period already closed: into that period's row (its allowance stays what it was)."""
        for i, p in enumerate(self.closed):
            if p.start_ms <= t_ms < p.end_ms:
                spent = p.spent + used
                self.closed[i] = BudgetPeriod(p.entitlement, p.budget, p.time_zone, p.start_ms, p.end_ms, p.allowance,
                                              spent.cost(self.spec.weights), spent, p.exhausted_ms, p.refused)
                return

    def period(self) -> BudgetPeriod:
        account = self.account
        assert account is not None
        return BudgetPeriod(self.entitlement, self.spec.name, self.spec.time_zone, account.start_ms, account.end_ms,
                            account.allowance, account.spent.cost(self.spec.weights), account.spent,
                            self.exhausted_ms, self.refused)


class BudgetLedger:
    """Every entitlement's budget accounts at the replay's one proxy, with its reservations in flight."""

    def __init__(self, origin_ms: int, retry_after_max_s: int) -> None:
        self.origin_ms = origin_ms
        self.retry_after_max_ms = retry_after_max_s * 1000
        self.books: dict[str, list[_Book]] = {}  # entitlement -> its budgets' books (absent: no budget)
        self.reserved: dict[str, tuple[list[_Book], list[float]]] = {}  # request id -> its books and units there
        self.all_books: list[_Book] = []
        self.tenant_books: dict[tuple[str, str], _Book] = {}  # (tenant, budget) -> the book its entitlements share

    def join(self, spec: EntitlementSpec, now_s: float) -> None:
        """Track ``spec``'s budgets from ``now_s`` on (an entitlement that joins again keeps its accounts: the ledger
        outlives its membership)."""
        if spec.name in self.books or not spec.budgets:
            return
        t_ms = self.t_ms(now_s)
        books: list[_Book] = []
        for budget in spec.budgets:
            shared = budget.scope is BudgetScope.TENANT
            book = self.tenant_books.get((spec.tenant, budget.name)) if shared else None
            if book is None:
                book = _Book(f"tenant/{spec.tenant}" if shared else spec.name, budget)
                book.at(t_ms)  # its first account, so a budget nobody spent is reported too
                self.all_books.append(book)
                if shared:
                    self.tenant_books[(spec.tenant, budget.name)] = book
            books.append(book)
        self.books[spec.name] = books

    def t_ms(self, now_s: float) -> int:
        return self.origin_ms + round(now_s * 1000)

    def check(self, entitlement: str, request_id: str, prompt_tokens: int, output_tokens: int,
              now_s: float) -> Decision | None:
        """None when every budget of ``entitlement`` takes the request's reservation (then reserved under
        ``request_id`` until ``settle`` or ``release``); else the ``budget_exhausted`` refusal of the first that
        cannot, with the time until its reset (capped) as the retry hint."""
        books = self.books.get(entitlement)
        if books is None:
            return None
        t_ms = self.t_ms(now_s)
        units: list[float] = []
        for book in books:
            account = book.at(t_ms)
            weights = book.spec.weights
            cost = request_units(prompt_tokens, output_tokens, weights)
            if not admits(account, weights, book.pending_units, cost):
                book.refused += 1
                if book.exhausted_ms is None:
                    book.exhausted_ms = t_ms
                wait_ms = retry_after_ms(account, t_ms, self.retry_after_max_ms)
                until = (": it never resets" if account.end_ms >= NEVER_END_MS
                         else f" until {iso_ms(account.end_ms, book.spec.time_zone)}")
                whose = book.entitlement if book.entitlement == entitlement else f"{book.entitlement} ({entitlement})"
                return Decision(_REFUSED_BUDGET, f"budget {book.spec.name} of {whose} is spent{until}",
                                retry_after_s=max(1, math.ceil(wait_ms / 1000)), retry_after_ms=max(1, wait_ms))
            units.append(cost)
        for book, cost in zip(books, units):
            book.pending_units += cost
        self.reserved[request_id] = (books, units)
        return None

    def release(self, request_id: str) -> None:
        """A request that reserved and was then refused (by a rate check, or its wait): its reservation goes back."""
        entry = self.reserved.pop(request_id, None)
        if entry is not None:
            for book, cost in zip(entry[0], entry[1]):
                book.pending_units -= cost

    def settle(self, request_id: str, prompt_tokens: int, completion_tokens: int, now_s: float) -> None:
        """A request ended at ``now_s``: its reservation is released and what it used is added to the account of the
        period holding its end (the completion's event time, as the agents fold it)."""
        entry = self.reserved.pop(request_id, None)
        if entry is None:
            return
        t_ms = self.t_ms(now_s)
        used = Usage(prompt_tokens, 0, completion_tokens, 1)  # the simulated backend has no prefix cache
        for book, cost in zip(entry[0], entry[1]):
            book.pending_units -= cost
            if book.account is not None and t_ms < book.account.start_ms:
                book.late(t_ms, used)  # (the loop's time only grows; kept exact should that ever change)
                continue
            account = book.at(t_ms)
            book.account = Account(account.start_ms, account.end_ms, account.allowance, account.spent + used)

    def periods(self) -> list[BudgetPeriod]:
        """Every budget's periods seen so far, the current one last, in the order the budgets were declared."""
        out: list[BudgetPeriod] = []
        for book in self.all_books:
            out.extend(book.closed)
            if book.account is not None:
                out.append(book.period())
        return out
