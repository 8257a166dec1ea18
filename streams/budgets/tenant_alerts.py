"""Tenant-budget alerts: the tenant's spending (the sum of its entitlements' parts) against its thresholds, each
alerted once per period and threshold (docs/budgets.md#tenant-budgets).

A part is one entitlement's ``BudgetStatus`` with ``scope`` tenant, read by every worker from the compacted
``budgets`` topic (``Parts``). One worker owns each (tenant, budget): the one owning the partition of the pool-keyed
topics that ``owner_key`` maps to, with the producers' partitioner. It keeps an ``AlertBook`` in the table under
``book_key``, on that partition's changelog: the period, the thresholds alerted in it and the alerts not yet
confirmed sent. ``evaluate`` is the pure step (parts and spec in, new book out); the processor writes the book and
awaits the changelog before it sends the outbox, and ``sent`` clears what went out, so a crash in between re-sends
the same alert under the same key (the alert topic is compacted).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson

from tokenpools.core.budgets import BudgetScope, BudgetSpec
from tokenpools.topics.codec import decode as decode_record
from tokenpools.topics.codec import encode as encode_record
from tokenpools.topics.records import BudgetAlert, BudgetStatus

BOOK_VERSION = 1
_PREFIX = b"tenantalerts/"


# ---- keys ------------------------------------------------------------------------------------------------------

def owner_key(tenant: str, budget: str) -> str:
    """The key whose partition (on the pool-keyed topics) names the worker that alerts the tenant's budget."""
    return f"tenant/{tenant}/{budget}"


def book_key(tenant: str, budget: str) -> bytes:
    """The table key of the tenant budget's ``AlertBook`` (beside the pool states and the ledgers)."""
    return _PREFIX + f"{tenant}/{budget}".encode()


def is_book_key(key: bytes) -> bool:
    return key.startswith(_PREFIX)


def alert_key(alert: BudgetAlert) -> str:
    """``tenant/<tenant>/<budget>/<period start>/<threshold>`` on ``budget-alerts``: one key per tenant budget,
    period and threshold whichever entitlement's part crossed it (an entitlement alert's key starts with its pool)."""
    return f"tenant/{alert.tenant}/{alert.budget}/{alert.period_start_ms}/{alert.threshold!r}"


# ---- the parts -------------------------------------------------------------------------------------------------

class Parts:
    """The newest tenant-budget part of every ``budgets`` key (highest version: a re-read or a stale record does not
    go back), grouped by (tenant, budget). A tombstone, or a newer record of the key whose budget became an entitlement
    budget, drops the key's part. The key is the account's (``topics.budget_keys.BudgetKey.account``), the same under
    both key forms."""

    def __init__(self) -> None:
        self._by_key: dict[str, BudgetStatus] = {}

    def apply(self, key: str, status: BudgetStatus | None) -> bool:
        """Keep ``status`` as ``key``'s part; False when it was older than the part held (ignored)."""
        held = self._by_key.get(key)
        if status is None:
            self._by_key.pop(key, None)
            return True
        if held is not None and held.version >= status.version:
            return False  # older (say under the account's other key form, read after the newer one)
        if status.scope is not BudgetScope.TENANT:
            self._by_key.pop(key, None)
            return True
        self._by_key[key] = status
        return True

    def forget(self, key: str) -> None:
        self._by_key.pop(key, None)

    def groups(self) -> dict[tuple[str, str], list[BudgetStatus]]:
        out: dict[tuple[str, str], list[BudgetStatus]] = {}
        for status in self._by_key.values():
            out.setdefault((status.tenant, status.budget), []).append(status)
        return out


# ---- the book --------------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class AlertBook:
    """One tenant budget's alerting: the period it is in, the thresholds alerted in it, the alerts not yet sent."""

    period_start_ms: int
    alerted: tuple[float, ...] = ()
    outbox: tuple[BudgetAlert, ...] = ()


def evaluate(spec: BudgetSpec, parts: Sequence[BudgetStatus], book: AlertBook | None) -> AlertBook | None:
    """The book after looking at the tenant budget's parts (``book`` itself when nothing changed).

    The period is the newest any part is in; the tenant's spending is the sum of the parts of that period (an
    entitlement whose part is still of an earlier period has spent nothing in it), against the spec's ``amount``
    (a tenant budget has no rollover). A newer period than the book's re-arms every threshold; an older one (a
    partial view) changes nothing. Each threshold reached and not alerted in the period goes to the outbox as a
    ``BudgetAlert`` naming the pool and entitlement of the part last changed (the newest ``t_ms``: the spending that
    crossed it), its ``spent_units`` the sum and ``t_ms`` that part's."""
    if not parts or not spec.alert_thresholds:
        return book
    start = max(p.period_start_ms for p in parts)
    if book is not None and start < book.period_start_ms:
        return book
    current = [p for p in parts if p.period_start_ms == start]
    alerted = book.alerted if book is not None and book.period_start_ms == start else ()
    spent = sum(p.spent_units for p in current)
    fraction = spent / spec.amount
    reached = [t for t in spec.alert_thresholds if t <= fraction and t not in alerted]
    if not reached:
        return book
    last = max(current, key=lambda p: (p.t_ms, p.pool, p.entitlement))
    alerts = tuple(BudgetAlert(pool=last.pool, entitlement=last.entitlement, tenant=last.tenant, budget=spec.name,
                               scope=BudgetScope.TENANT, period_start_ms=start, period_end_ms=last.period_end_ms,
                               threshold=t, allowance=spec.amount, spent_units=spent, t_ms=last.t_ms)
                   for t in reached)
    outbox = book.outbox if book is not None else ()
    return AlertBook(start, tuple(sorted((*alerted, *reached))), (*outbox, *alerts))


def sent(book: AlertBook, alerts: Iterable[BudgetAlert]) -> AlertBook:
    """The book once ``alerts`` are on the broker: they leave the outbox (alerts queued meanwhile stay)."""
    gone = {alert_key(a) for a in alerts}
    kept = tuple(a for a in book.outbox if alert_key(a) not in gone)
    return book if len(kept) == len(book.outbox) else AlertBook(book.period_start_ms, book.alerted, kept)


# ---- the stored form -------------------------------------------------------------------------------------------

def encode(book: AlertBook) -> bytes:
    return orjson.dumps({"v": BOOK_VERSION, "period_start_ms": book.period_start_ms, "alerted": list(book.alerted),
                         "outbox": [encode_record(a).decode() for a in book.outbox]})


def decode(value: bytes) -> AlertBook:
    data = orjson.loads(value)
    if data.get("v") != BOOK_VERSION:
        raise ValueError(f"tenant alert book version {data.get('v')!r}, expected {BOOK_VERSION}")
    return AlertBook(int(data["period_start_ms"]), tuple(float(t) for t in data["alerted"]),
                     tuple(decode_record(BudgetAlert, a) for a in data["outbox"]))
