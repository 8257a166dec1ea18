"""One entitlement's budget and usage ledger in the agents (docs/budgets.md#the-ledger-in-the-agents): pure.

A ``Ledger`` holds, for one (pool, entitlement):

- per budget a ``BudgetBook``: the account of the current period (``core.budgets.account_at``) and of the one
  before it (late completions), the alert thresholds already reached in each, and the version of its
  ``BudgetStatus`` key;
- per (UTC day, model) a ``Day``: the day's ``Usage`` and the version of its ``UsageRecord`` key, for at most
  ``retention_days`` days back from the newest completion folded;
- the alerts reached and not yet sent (``outbox``);
- its OWN last position per source (``"<topic>/<partition>"``), so it skips re-delivered events by itself;
- per proxy process that sent it completions with an identity, the sequence numbers seen (``seen``,
  ``core.resends``), so a completion the broker holds twice (a spool re-send: two offsets, one event) counts once.
  At most ``max_ahead`` numbers per process wait above a gap; a process whose newest completion is older than the
  retention is forgotten (a re-send of it would be late).

Why its own positions: the pool's state and a ledger are separate changelog records, and a worker can die between
the two writes. With its own positions each ledger is exact on its own after any crash: the re-delivered events
are skipped by the record that has them and applied by the one that lacks them.

Lateness is judged on event time against the newest completion the ledger folded (not the wall clock), so a
replay of the same log gives the same ledger whatever its batches: a completion of a UTC day more than
``retention_days - 1`` days before the newest one's is counted nowhere (``Folded.LATE``, the shell dead-letters
it). A completion of a budget period older than the previous one is counted in its day only.

Publishing (``publish`` then ``sent``): every key changed since its last version gets the next version, and the
ledger with the new versions must be stored (and on the broker) before the records are sent, so a crash can skip
a version but never reuse one; a key is due again until ``sent`` confirms its version, so a crash between the
write and the send re-publishes it under a newer version. When a budget's period ends with changes not yet
published, or a late completion changes the ended period, its final account goes out first (``previous_due``,
cleared once a record of it is confirmed sent as it is), then the current one: the budget's key carries every
period's final account, followed at once by the next period's. Alerts stay in the outbox until ``sent``: a crash in
between re-sends the same alert under the same key.

Time is an argument everywhere (event times, integer ms since the epoch); no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

import orjson

from tokenpools.core import resends
from tokenpools.core.budgets import Account, BudgetScope, BudgetSpec, Usage, account_at, iso_ms
from tokenpools.streams.table.pool_state import Position
from tokenpools.topics.budget_keys import budget_key
from tokenpools.topics.records import BudgetAlert, BudgetStatus, RequestCompleted, UsageRecord

DAY_MS = 86_400_000
LEDGER_VERSION = 1
_PREFIX = b"ledger/"


class Folded(StrEnum):
    """What the ledger did with one completion event."""

    APPLIED = "applied"  # counted in its day and in each budget's account of its period (if still kept)
    DUPLICATE = "duplicate"  # at or before the ledger's position of its source: counted already
    RESENT = "resent"  # a new position, but its identity was counted already: the broker holds the event twice
    LATE = "late"  # its UTC day is older than the retention: counted nowhere


@dataclass(frozen=True, slots=True)
class LedgerParams:
    """The ``budgets`` settings the ledger and its shell use, in their units."""

    retention_days: int = 3
    publish_interval_ms: int = 1_000
    billing_labels: tuple[str, ...] = ()
    max_ahead: int = resends.MAX_AHEAD  # per proxy process: sequence numbers kept above a gap (core.resends)

    def __post_init__(self) -> None:
        if self.max_ahead < 0:
            raise ValueError(f"`max_ahead` must be >= 0, got {self.max_ahead}")
        if self.retention_days < 1:
            raise ValueError(f"`retention_days` must be >= 1, got {self.retention_days}")
        if self.publish_interval_ms <= 0:
            raise ValueError(f"`publish_interval_ms` must be positive, got {self.publish_interval_ms}")


def params_from_settings(budgets: Any) -> LedgerParams:
    """``budgets`` is a ``tokenpools.config.BudgetsSettings`` (typed loosely: this module stays import-light)."""
    return LedgerParams(retention_days=budgets.usage_retention_days,
                        publish_interval_ms=max(1, round(budgets.publish_interval_s * 1000)),
                        billing_labels=tuple(budgets.billing_labels))


@dataclass(frozen=True, slots=True)
class Published:
    """A published key's versions: ``version`` is the newest given (stored before its record is sent), ``sent``
    the newest known sent; ``dirty``: changed since ``version`` was given."""

    version: int = 0
    sent: int = 0
    dirty: bool = False

    @property
    def due(self) -> bool:
        return self.dirty or self.sent < self.version


CHANGED = Published(dirty=True)


@dataclass(frozen=True, slots=True)
class BudgetBook:
    current: Account
    previous: Account | None = None  # the period just before ``current`` (late events), while retained
    alerted: tuple[float, ...] = ()  # thresholds reached in ``current``'s period
    previous_alerted: tuple[float, ...] = ()
    published: Published = CHANGED
    previous_due: bool = False  # ``previous`` changed since a record of it was confirmed sent (its final account)
    covered_ms: int = 0  # the ``through_ms`` of the newest version given (``publish``: ``behind``)

    @property
    def due(self) -> bool:
        return self.published.due or self.previous_due


@dataclass(frozen=True, slots=True)
class Day:
    usage: Usage
    t_ms: int  # the newest event time folded into it
    published: Published = CHANGED


@dataclass(frozen=True, slots=True)
class PendingAlert:
    budget: str
    period_start_ms: int
    period_end_ms: int
    threshold: float
    allowance: float
    spent_units: float
    t_ms: int  # the event time that reached it

    @property
    def ident(self) -> tuple[str, int, float]:
        return self.budget, self.period_start_ms, self.threshold


@dataclass(frozen=True, slots=True)
class Context:
    """What the catalogue says of the entitlement at fold time. ``known`` False: no spec (not read yet, or
    deleted): its budget accounts are left as they are, its usage is still counted."""

    budgets: tuple[BudgetSpec, ...] = ()
    tenant: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    model: str = ""
    known: bool = True


@dataclass(frozen=True, slots=True)
class Ledger:
    pool: str
    entitlement: str
    home: str  # the state key its events fold into: the pool, or for a sharded pool the shard (``<pool>#<k>``)
    partition: int  # the Kafka partition of its events: its changelog record goes there
    tenant: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    offsets: Mapping[str, int] = field(default_factory=dict)  # source → the last position folded
    newest_ms: int | None = None  # the newest event time folded
    budgets: Mapping[str, BudgetBook] = field(default_factory=dict)
    days: Mapping[tuple[str, str], Day] = field(default_factory=dict)  # (UTC day YYYY-MM-DD, model) → its usage
    outbox: tuple[PendingAlert, ...] = ()
    seen: Mapping[str, resends.Seen] = field(default_factory=dict)  # proxy process → its sequence numbers seen


@dataclass(frozen=True, slots=True)
class Publication:
    statuses: tuple[BudgetStatus, ...] = ()
    usage: tuple[UsageRecord, ...] = ()
    alerts: tuple[BudgetAlert, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.statuses or self.usage or self.alerts)


# ---- keys ------------------------------------------------------------------------------------------------------

def ledger_key(pool: str, entitlement: str) -> bytes:
    """The table key of an entitlement's ledger (beside the pool states' ``v2/...`` keys)."""
    return _PREFIX + f"{pool}/{entitlement}".encode()


def is_ledger_key(key: bytes) -> bool:
    return key.startswith(_PREFIX)


def status_key(record: BudgetStatus) -> str:
    """The budgets topic's key: the account and its scope (``topics.budget_keys``)."""
    return budget_key(record.pool, record.entitlement, record.budget, record.scope, record.tenant)


def usage_key(record: UsageRecord) -> str:
    return f"{record.tenant}/{record.entitlement}/{record.model}/{record.day}"


def alert_key(record: BudgetAlert) -> str:
    return f"{record.pool}/{record.entitlement}/{record.budget}/{record.period_start_ms}/{record.threshold!r}"


def utc_day(t_ms: int) -> str:
    """The UTC date (YYYY-MM-DD) holding ``t_ms``."""
    return iso_ms(t_ms // DAY_MS * DAY_MS)[:10]


# ---- the fold --------------------------------------------------------------------------------------------------

def new(pool: str, entitlement: str, home: str, partition: int) -> Ledger:
    return Ledger(pool, entitlement, home, partition)


def fold(ledger: Ledger, events: Iterable[tuple[RequestCompleted, Position]], context: Context,
         retention_days: int, max_ahead: int = resends.MAX_AHEAD) -> tuple[Ledger, list[Folded]]:
    """Fold the entitlement's completion events, in the order given (their sources' offset order), into the
    ledger. Returns the very ``ledger`` when nothing changed."""
    offsets = dict(ledger.offsets)
    seen = dict(ledger.seen)
    newest = ledger.newest_ms
    budgets = dict(ledger.budgets) if context.known else ledger.budgets
    if context.known:
        specs = {b.name: b for b in context.budgets}
        for name in [n for n in budgets if n not in specs]:  # a budget removed from the spec
            del budgets[name]
    days = dict(ledger.days)
    outbox = list(ledger.outbox)
    outcomes: list[Folded] = []
    changed = budgets != ledger.budgets
    for record, at in events:
        last = offsets.get(at.source)
        if last is not None and at.offset <= last:
            outcomes.append(Folded.DUPLICATE)
            continue
        offsets[at.source] = at.offset
        changed = True
        t = record.t_ms
        stream = resends.stream_key(record.proxy_id, record.proxy_start_ms, record.sequence)
        if stream is not None:
            seen[stream], sighting = resends.sight(seen.get(stream), record.sequence, t,  # type: ignore[arg-type]
                                                   max_ahead)
            if sighting is resends.Sighting.AGAIN:
                outcomes.append(Folded.RESENT)
                continue
        newest = t if newest is None else max(newest, t)
        cutoff_ms = (newest // DAY_MS - retention_days + 1) * DAY_MS  # the oldest retained day's start
        if t < cutoff_ms:
            outcomes.append(Folded.LATE)
            continue
        used = Usage(record.prompt_tokens, min(record.cached_prompt_tokens, record.prompt_tokens),
                     record.completion_tokens, 1)
        key = (utc_day(t), context.model)
        day = days.get(key)
        days[key] = Day(used if day is None else day.usage + used, t if day is None else max(day.t_ms, t),
                        replace(day.published, dirty=True) if day is not None else CHANGED)
        if context.known:
            for spec in context.budgets:
                budgets[spec.name] = _spend(spec, budgets.get(spec.name), used, t, outbox)
        outcomes.append(Folded.APPLIED)
    if not changed:
        return ledger, outcomes
    if newest is not None:
        cutoff_ms = (newest // DAY_MS - retention_days + 1) * DAY_MS
        cutoff_day = utc_day(cutoff_ms)
        days = {k: d for k, d in days.items() if k[0] >= cutoff_day or d.published.due}  # publish, then forget
        budgets = {n: _retain(b, cutoff_ms) for n, b in budgets.items()}
        seen = resends.forget(seen, cutoff_ms)
    tenant, labels = (context.tenant, context.labels) if context.known else (ledger.tenant, ledger.labels)
    return replace(ledger, tenant=tenant, labels=labels, offsets=offsets, newest_ms=newest, budgets=budgets,
                   days=dict(sorted(days.items())), outbox=tuple(outbox), seen=seen), outcomes


def _spend(spec: BudgetSpec, book: BudgetBook | None, used: Usage, t_ms: int,
           outbox: list[PendingAlert]) -> BudgetBook:
    """``used`` at ``t_ms`` into the budget's account of that period: the current one, the next (opened with
    its rollover), or the previous one (a late event; the current's allowance follows its new carry)."""
    if book is None or spec.period_at(book.current.start_ms) != (book.current.start_ms, book.current.end_ms):
        # new, or its period or time zone changed: afresh, its versions going on growing
        book = BudgetBook(account_at(spec, None, t_ms), published=book.published if book is not None else CHANGED)
    start, _ = spec.period_at(t_ms)
    current = book.current
    if start > current.start_ms:  # a later period: the current one becomes the previous
        before_start = spec.period_at(start - 1)[0]
        if before_start == current.start_ms:  # its final account is due unless a record of it went out already
            previous, previous_alerted, previous_due = current, book.alerted, book.published.due
        else:  # idle periods in between: the one just before, unspent, with its carry
            previous, previous_alerted, previous_due = account_at(spec, current, start - 1), (), False
        book = BudgetBook(account_at(spec, previous, t_ms), previous, (), previous_alerted, book.published,
                          previous_due)
        current = book.current
    if start == current.start_ms:
        current = replace(current, spent=current.spent + used)
        alerted = _alert(spec, current, book.alerted, t_ms, outbox)
        return replace(book, current=current, alerted=alerted, published=replace(book.published, dirty=True))
    previous = book.previous
    if previous is None or start != previous.start_ms:
        return book  # an older period than the ones kept: counted in its day only
    previous = replace(previous, spent=previous.spent + used)
    previous_alerted = _alert(spec, previous, book.previous_alerted, t_ms, outbox)
    current = replace(current, allowance=account_at(spec, previous, current.start_ms).allowance)
    alerted = _alert(spec, current, book.alerted, t_ms, outbox)  # less carried over: the fraction may rise
    return BudgetBook(current, previous, alerted, previous_alerted, replace(book.published, dirty=True), True)


def _alert(spec: BudgetSpec, account: Account, alerted: tuple[float, ...], t_ms: int,
           outbox: list[PendingAlert]) -> tuple[float, ...]:
    """Each threshold the account's spending has reached and that has not alerted in its period, into ``outbox``.

    A tenant budget's account here is one entitlement's part: its fraction is not the tenant's, so a part never
    alerts: the tenant's sum does, in ``streams.tenant_alerts`` (docs/budgets.md#tenant-budgets)."""
    if not spec.alert_thresholds or spec.scope is BudgetScope.TENANT:
        return alerted
    fraction = account.fraction(spec.weights)
    reached = [t for t in spec.alert_thresholds if t <= fraction and t not in alerted]
    for threshold in reached:
        outbox.append(PendingAlert(spec.name, account.start_ms, account.end_ms, threshold, account.allowance,
                                   account.spent.cost(spec.weights), t_ms))
    return tuple(sorted((*alerted, *reached))) if reached else alerted


def _retain(book: BudgetBook, cutoff_ms: int) -> BudgetBook:
    """The previous account is kept while any of its days is retained."""
    if book.previous is not None and book.previous.end_ms <= cutoff_ms:
        return replace(book, previous=None, previous_alerted=(), previous_due=False)
    return book


# ---- publishing ------------------------------------------------------------------------------------------------

def publish(ledger: Ledger, budgets: tuple[BudgetSpec, ...], through_ms: int,
            reserved: Mapping[str, int] | None = None, reserved_changed: bool = False) -> tuple[Ledger, Publication]:
    """The records due (each changed key under its next version, the outbox's alerts) and the ledger with those
    versions given: store it, and have it on the broker, before sending the records; then ``sent``.

    ``reserved``: the entitlement's reservations in flight per proxy (``streams.fleet_counts``), which each budget's
    current account carries (docs/budgets.md#the-others-reservations-in-flight); ``reserved_changed``: they differ
    from those last sent, so every budget's current account is due again even with no completion folded since."""
    specs = {b.name: b for b in budgets}
    books = dict(ledger.budgets)
    statuses = []
    levels = dict(reserved or {})
    for name, book in ledger.budgets.items():
        spec = specs.get(name)
        if spec is None or not (book.due or reserved_changed or behind(ledger, book, through_ms)):
            continue  # (a budget without a spec now is dropped at the next fold)
        # the ended period's final account first, then the current one: the key's two newest versions
        accounts = [book.previous] if book.previous_due and book.previous is not None else []
        version = book.published.version
        for account in [*accounts, book.current]:
            version += 1
            statuses.append(BudgetStatus(
                pool=ledger.pool, entitlement=ledger.entitlement, tenant=ledger.tenant, budget=name,
                scope=spec.scope, period=spec.period, time_zone=spec.time_zone, period_start_ms=account.start_ms,
                period_end_ms=account.end_ms, allowance=account.allowance, spent=_tokens(account.spent),
                spent_units=account.spent.cost(spec.weights), version=version, t_ms=ledger.newest_ms or 0,
                through_ms=through_ms, reserved_tokens=levels if account is book.current else {}))
        books[name] = replace(book, published=replace(book.published, version=version, dirty=False),
                              covered_ms=through_ms)
    days = dict(ledger.days)
    usage = []
    labels = dict(ledger.labels)
    for (day, model), entry in ledger.days.items():
        if not entry.published.due:
            continue
        version = entry.published.version + 1
        days[(day, model)] = replace(entry, published=replace(entry.published, version=version, dirty=False))
        usage.append(UsageRecord(tenant=ledger.tenant, entitlement=ledger.entitlement, pool=ledger.pool, model=model,
                                 day=day, labels=labels, usage=_tokens(entry.usage), version=version,
                                 t_ms=entry.t_ms))
    alerts = tuple(BudgetAlert(pool=ledger.pool, entitlement=ledger.entitlement, tenant=ledger.tenant,
                               budget=a.budget, scope=specs[a.budget].scope if a.budget in specs else BudgetScope.ENTITLEMENT,
                               period_start_ms=a.period_start_ms, period_end_ms=a.period_end_ms,
                               threshold=a.threshold, allowance=a.allowance, spent_units=a.spent_units, t_ms=a.t_ms)
                   for a in ledger.outbox)
    publication = Publication(tuple(statuses), tuple(usage), alerts)
    if not statuses and not usage:
        return ledger, publication
    return replace(ledger, budgets=books, days=days), publication


def behind(ledger: Ledger, book: BudgetBook, through_ms: int) -> bool:
    """Whether ``book`` is due again with nothing folded since: its last record's ``through_ms`` is at or before the
    newest completion folded, and ``through_ms`` has moved on. A record counts every completion folded, those at or
    after its ``through_ms`` too, while a proxy adds its own completions from that ``through_ms`` on: until a record
    with a later one, the proxy counts those twice. Republished, the proxies drop them; without it a ledger gone
    quiet (an entitlement refused by that very double count) would leave them counted twice until the reset."""
    newest = ledger.newest_ms
    return newest is not None and book.covered_ms <= newest and through_ms > book.covered_ms


def sent(ledger: Ledger, publication: Publication) -> Ledger:
    """The ledger once ``publication``'s records are sent (it may have folded more events meanwhile): their
    versions are confirmed, their alerts leave the outbox. The very ``ledger`` when nothing changes."""
    books = dict(ledger.budgets)
    for status in publication.statuses:
        book = books.get(status.budget)
        if book is None:
            continue
        if book.published.sent < status.version:
            book = replace(book, published=replace(book.published, sent=status.version))
        if (book.previous_due and book.previous is not None and status.period_start_ms == book.previous.start_ms
                and status.spent.model_dump() == _tokens(book.previous.spent)):  # its final account went out as it is
            book = replace(book, previous_due=False)
        books[status.budget] = book
    days = dict(ledger.days)
    for record in publication.usage:
        entry = days.get((record.day, record.model))
        if entry is not None and entry.published.sent < record.version:
            days[(record.day, record.model)] = replace(entry, published=replace(entry.published, sent=record.version))
    gone = {(a.budget, a.period_start_ms, a.threshold) for a in publication.alerts}
    outbox = tuple(a for a in ledger.outbox if a.ident not in gone)
    if books == ledger.budgets and days == ledger.days and outbox == ledger.outbox:
        return ledger
    return replace(ledger, budgets=books, days=days, outbox=outbox)


def _tokens(usage: Usage) -> dict[str, int]:
    return {"prompt_tokens": usage.prompt, "cached_prompt_tokens": usage.cached_prompt,
            "completion_tokens": usage.completion, "requests": usage.requests}


# ---- the table value -------------------------------------------------------------------------------------------

def _usage_out(u: Usage) -> list[int]:
    return [u.prompt, u.cached_prompt, u.completion, u.requests]


def _account_out(a: Account | None) -> list[Any] | None:
    return None if a is None else [a.start_ms, a.end_ms, a.allowance, _usage_out(a.spent)]


def _account_in(data: list[Any] | None) -> Account | None:
    return None if data is None else Account(data[0], data[1], data[2], Usage(*data[3]))


def _published_out(p: Published) -> list[Any]:
    return [p.version, p.sent, p.dirty]


def encode(ledger: Ledger) -> bytes:
    """The ledger as JSON (floats survive the round trip exactly)."""
    return orjson.dumps({
        "version": LEDGER_VERSION, "pool": ledger.pool, "entitlement": ledger.entitlement, "home": ledger.home,
        "partition": ledger.partition, "tenant": ledger.tenant, "labels": [list(kv) for kv in ledger.labels],
        "offsets": dict(ledger.offsets), "newest_ms": ledger.newest_ms,
        "budgets": {name: {"current": _account_out(b.current), "previous": _account_out(b.previous),
                           "alerted": list(b.alerted), "previous_alerted": list(b.previous_alerted),
                           "published": _published_out(b.published), "previous_due": b.previous_due,
                           "covered_ms": b.covered_ms}
                    for name, b in ledger.budgets.items()},
        "days": [[day, model, _usage_out(d.usage), d.t_ms, _published_out(d.published)]
                 for (day, model), d in ledger.days.items()],
        "outbox": [[a.budget, a.period_start_ms, a.period_end_ms, a.threshold, a.allowance, a.spent_units, a.t_ms]
                   for a in ledger.outbox],
        "seen": {stream: resends.encode_seen(s) for stream, s in ledger.seen.items()},
    })


def decode(value: bytes) -> Ledger:
    """A stored ledger; ``ValueError`` for a value of another layout version (the shell starts it afresh)."""
    data = orjson.loads(value)
    if data.get("version") != LEDGER_VERSION:
        raise ValueError(f"ledger layout version {data.get('version')!r}, this worker reads {LEDGER_VERSION}")
    budgets = {name: BudgetBook(_account_in(b["current"]), _account_in(b["previous"]),  # type: ignore[arg-type]
                                tuple(b["alerted"]), tuple(b["previous_alerted"]), Published(*b["published"]),
                                b.get("previous_due", False),  # (absent in a value written before it existed)
                                b.get("covered_ms", 0))  # (likewise)
               for name, b in data["budgets"].items()}
    days = {(day, model): Day(Usage(*usage), t_ms, Published(*pub)) for day, model, usage, t_ms, pub in data["days"]}
    return Ledger(pool=data["pool"], entitlement=data["entitlement"], home=data["home"], partition=data["partition"],
                  tenant=data["tenant"], labels=tuple(tuple(kv) for kv in data["labels"]),  # type: ignore[misc]
                  offsets=data["offsets"], newest_ms=data["newest_ms"], budgets=budgets, days=days,
                  outbox=tuple(PendingAlert(*a) for a in data["outbox"]),
                  seen={stream: resends.decode_seen(s)  # (absent in a value written before it existed)
                        for stream, s in data.get("seen", {}).items()})
