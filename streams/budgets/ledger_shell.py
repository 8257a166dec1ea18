"""The agents' shell of the budget and usage ledger (docs/budgets.md#the-ledger-in-the-agents): a batch's completions
into their entitlements' ledgers, the ledgers' publication (budgets, usage, alerts) and the tenant budgets' alerts.

``Ledgers`` owns the ledgers' keys in the agents' table (``ledger/<pool>/<entitlement>``, and the tenant budgets'
alert books) and what it keeps of them in memory; it reads the pools' states only through the ``PoolTable``
(``streams.pool_table``: how far a pool's windows are closed). The processor (``streams.processor``) hands it each
batch's completions of a pool, calls ``forget`` on a rebalance, and passes the agents' publisher task's calls on to
``publish_ledgers`` and ``publish_tenant_alerts``. The pure parts are ``streams.ledger`` and
``streams.tenant_alerts``. Its own idea — accounts and chargeback, not windows and limits — with its own keys in the
same table.

Concurrency: as the processor's (its module docstring): the reads and writes of one publication's table pass run
without awaiting; a ``forget`` during a later await (a rebalance) leaves the confirmation to the key's next owner.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace

from tokenpools.streams.budgets import tenant_alerts
from tokenpools.streams.decoding import Item, Rejected
from tokenpools.streams.table.pool_state import Outcome, Position
from tokenpools.streams.table.pool_table import PoolTable, StateStore
from tokenpools.streams.budgets.ledger import (Context, Folded, Ledger, LedgerParams, Publication, is_ledger_key, ledger_key,
                                       status_key, usage_key)
from tokenpools.streams.budgets.ledger import alert_key as ledger_alert_key
from tokenpools.streams.budgets.ledger import decode as decode_ledger
from tokenpools.streams.budgets.ledger import encode as encode_ledger
from tokenpools.streams.budgets.ledger import fold as fold_ledger
from tokenpools.streams.budgets.ledger import new as new_ledger
from tokenpools.streams.budgets.ledger import publish as publish_ledger
from tokenpools.streams.budgets.ledger import sent as ledger_sent
from tokenpools.streams.metrics import StreamMetrics
from tokenpools.topics.codec import encode
from tokenpools.topics.declarations import Topics
from tokenpools.topics.records import (
    BudgetAlert,
    BudgetStatus,
    DeadLetterReason,
    Record,
    RequestCompleted,
)
from tokenpools.topics.shards import parse_key

from tokenpools.core.budgets import BudgetScope, BudgetSpec, account_at
from tokenpools.runtime.deadletter import Send
from tokenpools.runtime.specs import Catalogue

log = logging.getLogger(__name__)


class Ledgers:
    """The entitlements' ledgers and the tenant budgets' alert books in ``store`` (the agents' table), folded from
    completions and published to ``topics``' budgets, usage and budget-alerts topics with ``send``.
    ``partition_of`` is a key's partition (a tenant budget's owner key: which worker alerts on it); ``width_ms``
    the pools' window width (a closed window's end); ``catalogue`` what the specs say now of each entitlement;
    ``reserved_of(home, entitlement)`` the entitlement's reservations in flight per proxy, which its budget records
    carry (the fleet counts', ``CountsPublisher.reserved``; None: none, records of completions only)."""

    def __init__(self, params: LedgerParams, width_ms: int, topics: Topics, catalogue: Catalogue, store: StateStore,
                 pool_table: PoolTable, send: Send, metrics: StreamMetrics, partition_of: Callable[[str], int],
                 reserved_of: Callable[[str, str], Mapping[str, int]] | None = None) -> None:
        self.params = params
        self.catalogue = catalogue
        self._width_ms = width_ms
        self._topics = topics
        self.store = store
        self._pool_table = pool_table
        self._send = send
        self._metrics = metrics
        self._partition_of = partition_of
        self._reserved_of = reserved_of
        self._ledgers: dict[bytes, tuple[bytes, Ledger]] = {}  # ledger key → the value stored, its ledger
        self._reserved_sent: dict[bytes, dict[str, int]] = {}  # ledger key → the reservations its records last carried
        self._generation = 0  # + 1 at every ``forget``: a publication that awaited across one confirms nothing

    def forget(self) -> None:
        """Drop the ledgers in memory (after a rebalance): each is decoded from the table when next read."""
        self._generation += 1
        self._ledgers.clear()
        self._reserved_sent.clear()

    def fold(self, home: str, partition: int, items: list[Item], positions: list[tuple[Record, Position]],
             outcomes: Sequence[Outcome]) -> list[Rejected]:
        """The batch's completions of ``home`` (a pool, or a sharded pool's shard) into their entitlements' ledgers,
        each a table key of its own on the events' partition, written only when changed. A completion too old for
        the ledger is dead-lettered as late, unless the pool's fold did so already."""
        by_entitlement: dict[str, list[int]] = {}
        for i, (record, _) in enumerate(positions):
            if type(record) is RequestCompleted:
                by_entitlement.setdefault(record.entitlement, []).append(i)
        rejected: list[Rejected] = []
        pool = parse_key(home).pool
        tally: Counter[Folded] = Counter()
        for entitlement, indices in by_entitlement.items():
            key = ledger_key(pool, entitlement)
            ledger = self._ledger(key) or new_ledger(pool, entitlement, home, partition)
            folded, results = fold_ledger(ledger, [positions[i] for i in indices],  # type: ignore[misc]
                                          self._ledger_context(pool, entitlement), self.params.retention_days,
                                          self.params.max_ahead)
            if folded is not ledger:
                self._put_ledger(key, replace(folded, home=home, partition=partition))
            tally.update(results)
            for i, folded_as in zip(indices, results):
                if folded_as is Folded.LATE and outcomes[i] is not Outcome.LATE:
                    raw, index, record = items[i]
                    rejected.append((raw, index, DeadLetterReason.LATE,
                                     f"t_ms {record.t_ms} is older than the ledger's retention "  # type: ignore[attr-defined]
                                     f"({self.params.retention_days} UTC days back from its newest completion)",
                                     raw.value if index is None else encode(record)))
        for folded_as, count in tally.items():
            self._metrics.ledger_events.labels(folded_as.value).inc(count)
        return rejected

    def _ledger_context(self, pool: str, entitlement: str) -> Context:
        """What the catalogue says now of the entitlement: budgets, tenant, billing labels, its pool's model."""
        pool_spec = self.catalogue.pool(pool)
        model = pool_spec.model if pool_spec is not None else ""
        spec = next((e for e in self.catalogue.entitlements_of(pool) if e.name == entitlement), None)
        if spec is None:
            return Context(model=model, known=False)
        wanted = self.params.billing_labels
        return Context(spec.budgets, spec.tenant, tuple(kv for kv in spec.labels if kv[0] in wanted), model)

    def _ledger(self, key: bytes) -> Ledger | None:
        """The stored ledger of ``key`` (the one in memory while the table holds the very value written), or None."""
        value = self.store.get(key)
        if value is None:
            return None
        cached = self._ledgers.get(key)
        if cached is not None and cached[0] is value:
            return cached[1]
        try:
            ledger = decode_ledger(value)
        except (ValueError, KeyError, TypeError, IndexError) as e:
            log.warning("ledger %r: stored value not usable (%s); starting it afresh", key, e)
            self._metrics.state_resets.inc()
            return None
        self._ledgers[key] = (value, ledger)
        return ledger

    def _put_ledger(self, key: bytes, ledger: Ledger) -> None:
        value = encode_ledger(ledger)
        self.store.put(key, value, ledger.partition)
        self._ledgers[key] = (value, ledger)

    def _through_ms(self, home: str) -> int:
        """Every completion of ``home`` with an event time before this has been folded: its closed windows' end."""
        closed = self._pool_table.held(home).state.closed_through
        return 0 if closed is None else (closed + 1) * self._width_ms

    async def publish_ledgers(self, written: Callable[[], Awaitable[None]] | None = None) -> list[Publication]:
        """Send what the ledgers have changed since their last publication: ``BudgetStatus`` per budget, a
        ``UsageRecord`` per day and model, the pending ``BudgetAlert``s. Each key's next version is written to the
        table first, and ``written`` (the changelog on the broker) awaited, before anything is sent; once sent, the
        versions are confirmed and the alerts leave the outbox (``streams.ledger``)."""
        generation = self._generation
        due: list[tuple[bytes, Publication, dict[str, int]]] = []
        ratios: dict[tuple[str, str, str], float] = {}
        for key, _ in self.store.items():  # no await in this loop (the module docstring)
            if not is_ledger_key(key):
                continue
            ledger = self._ledger(key)
            if ledger is None:
                continue
            context = self._ledger_context(ledger.pool, ledger.entitlement)
            through_ms = self._through_ms(ledger.home)
            ratios.update(_spent_ratios(ledger, context.budgets, through_ms))
            reserved = dict(self._reserved_of(ledger.home, ledger.entitlement)) if self._reserved_of else {}
            given, publication = publish_ledger(ledger, context.budgets, through_ms, reserved,
                                                reserved != self._reserved_sent.get(key, {}))
            if not publication:
                continue
            if given is not ledger:
                self._put_ledger(key, given)
            due.append((key, publication, reserved))
        self._pool_table.drop_index()
        self._metrics.set_budget_ratios(ratios)
        if not due:
            return []
        if written is not None:
            await written()  # the versions are on the broker before any record carries them
        topics = self._topics
        for _, publication, _ in due:
            for status in publication.statuses:
                await self._send(topics.budgets.name, status_key(status).encode(), encode(status))
            for record in publication.usage:
                await self._send(topics.usage.name, usage_key(record).encode(), encode(record))
            for alert in publication.alerts:
                await self._send(topics.budget_alerts.name, ledger_alert_key(alert).encode(), encode(alert))
            self._metrics.ledger_records.labels("budgets").inc(len(publication.statuses))
            self._metrics.ledger_records.labels("usage").inc(len(publication.usage))
            self._metrics.ledger_records.labels("budget_alerts").inc(len(publication.alerts))
            for alert in publication.alerts:
                self._metrics.count_budget_alert(alert.pool, alert.threshold)
        if self._generation != generation:
            return [p for _, p, _ in due]  # a rebalance meanwhile: whoever holds them now re-publishes what is unconfirmed
        for key, publication, reserved in due:
            ledger = self._ledger(key)  # as it is now: a batch may have folded into it meanwhile
            if ledger is not None and (done := ledger_sent(ledger, publication)) is not ledger:
                self._put_ledger(key, done)
            if publication.statuses:
                self._reserved_sent[key] = reserved
        return [p for _, p, _ in due]

    async def publish_tenant_alerts(self, parts: tenant_alerts.Parts, active: set[int] | None,
                                    written: Callable[[], Awaitable[None]] | None = None) -> list[BudgetAlert]:
        """The tenant-budget alerts of the (tenant, budget)s this worker owns (``active`` holds the partition of
        ``tenant_alerts.owner_key``; None: every one): each book is evaluated on the parts, written to the table on that
        partition and ``written`` awaited before its outbox is sent; once sent, the outbox is cleared
        (``streams.tenant_alerts``). Returns the alerts sent."""
        generation = self._generation
        due: list[tuple[bytes, int, tuple[BudgetAlert, ...]]] = []
        for (tenant, budget), group in parts.groups().items():  # no await in this loop (the module docstring)
            partition = self._partition_of(tenant_alerts.owner_key(tenant, budget))
            if active is not None and partition not in active:
                continue
            key = tenant_alerts.book_key(tenant, budget)
            book = self._tenant_book(key)
            spec = self._tenant_spec(group, budget)
            given = tenant_alerts.evaluate(spec, group, book) if spec is not None else book
            if given is not book and given is not None:
                self.store.put(key, tenant_alerts.encode(given), partition)
            if given is not None and given.outbox:
                due.append((key, partition, given.outbox))
        if not due:
            return []
        if written is not None:
            await written()  # the alerted thresholds are on the broker before any alert goes out
        out: list[BudgetAlert] = []
        topic = self._topics.budget_alerts.name
        for _, _, outbox in due:
            for alert in outbox:
                await self._send(topic, tenant_alerts.alert_key(alert).encode(), encode(alert))
                self._metrics.count_budget_alert(alert.pool, alert.threshold)
            self._metrics.ledger_records.labels("budget_alerts").inc(len(outbox))
            out.extend(outbox)
        if self._generation != generation:
            return out  # a rebalance meanwhile: whoever owns them now re-sends what is unconfirmed
        for key, partition, outbox in due:
            book = self._tenant_book(key)  # as it is now
            if book is not None and (done := tenant_alerts.sent(book, outbox)) is not book:
                self.store.put(key, tenant_alerts.encode(done), partition)
        return out

    def _tenant_book(self, key: bytes) -> tenant_alerts.AlertBook | None:
        value = self.store.get(key)
        if value is None:
            return None
        try:
            return tenant_alerts.decode(value)
        except (ValueError, KeyError, TypeError) as e:
            log.warning("tenant alert book %r: stored value not usable (%s); starting it afresh", key, e)
            self._metrics.state_resets.inc()
            return None

    def _tenant_spec(self, parts: Sequence[BudgetStatus], budget: str) -> BudgetSpec | None:
        """The tenant budget as the spec of an entitlement whose part is given declares it (they declare it alike);
        None when none of them does any more (its parts stay on the topic, but nothing alerts)."""
        for part in sorted(parts, key=lambda p: (p.pool, p.entitlement)):
            for spec in self._ledger_context(part.pool, part.entitlement).budgets:
                if spec.name == budget and spec.scope is BudgetScope.TENANT:
                    return spec
        return None


def _spent_ratios(ledger: Ledger, budgets: tuple[BudgetSpec, ...],
                  through_ms: int) -> dict[tuple[str, str, str], float]:
    """(pool, entitlement, budget) → spent ÷ allowance of each budget's period holding ``through_ms`` (a period that
    ended without a completion since reads 0, not its old spending), for the budgets the spec still has."""
    out = {}
    for spec in budgets:
        book = ledger.budgets.get(spec.name)
        if book is None:
            continue
        account = account_at(spec, book.current, through_ms) if through_ms >= book.current.end_ms else book.current
        out[(ledger.pool, ledger.entitlement, spec.name)] = account.fraction(spec.weights)
    return out
