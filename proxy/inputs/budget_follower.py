"""The budgets topic into the proxy's ``BudgetBook`` (docs/budgets.md#enforcement).

The topic is compacted, one key per account, carrying its scope (``topics.budget_keys``); the proxy reads it from the
beginning with no group (``limits_consumer.consume``), so a restarted proxy holds every account at once. A tenant
budget's part is kept whatever its pool (the tenant's entitlements on other pools spend the same budget,
docs/budgets.md#tenant-budgets), an entitlement budget only of the pools this proxy serves (against the pools in
force: live specs may add one). The key says which is which, so another pool's entitlement budget is skipped without
decoding its value; a record under the old key form (no scope) is decoded to learn it. An undecodable record of a
pool it serves is dead-lettered like the limits' (another pool's is left to that pool's proxies) and the loop goes
on. Without Kafka nothing arrives and the proxy enforces from its own spending alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from tokenpools.core.budgets import BudgetScope
from tokenpools.proxy.admission.budgets import BudgetBook, RecordResult
from tokenpools.proxy.outbox.events import EventPipeline
from tokenpools.proxy.observability.metrics import ProxyMetrics
from tokenpools.runtime.clock import Clock
from tokenpools.runtime.deadletter import DeadLetters
from tokenpools.topics.budget_keys import parse_budget_key
from tokenpools.topics.codec import DecodeError, decode
from tokenpools.topics.records import BudgetStatus

log = logging.getLogger(__name__)


class BudgetFollower:
    """One budgets record in, the book maybe changed. ``pools``: the proxy's pools in force (read at each record)."""

    def __init__(self, book: BudgetBook, pools: Mapping[str, object], metrics: ProxyMetrics, clock: Clock,
                 events: EventPipeline | None = None, dead_letter_topic: str = "", consumer_name: str = "") -> None:
        self.book = book
        self.pools = pools
        self.metrics = metrics
        self.events = events
        self.clock = clock
        self.dead_letters = DeadLetters(dead_letter_topic, consumer_name, clock, logger=log)

    def handle(self, value: bytes | None, topic: str = "", partition: int = 0, offset: int = 0,
               key: bytes | None = None) -> RecordResult | None:
        if value is None:  # a tombstone on the compacted topic: nothing to apply
            return None
        parsed = parse_budget_key(key) if key is not None else None
        if parsed is not None and parsed.scope is BudgetScope.ENTITLEMENT and parsed.pool not in self.pools:
            return None  # another pool's own budget: not decoded
        pool = key.split(b"/", 1)[0].decode(errors="replace") if key is not None else ""
        try:
            record = decode(BudgetStatus, value)
        except DecodeError as exc:
            if key is not None and pool not in self.pools:
                return None  # another pool's: its own proxies dead-letter it (not every proxy of the fleet)
            dead = self.dead_letters.note(exc.reason, exc.detail, topic, partition, offset, key, value)
            if self.events is not None and self.dead_letters.topic:
                self.events.emit(self.dead_letters.topic, topic, dead)
            self.metrics.budget_records[(pool, "invalid")] += 1
            return None
        if record.pool not in self.pools and record.scope is not BudgetScope.TENANT:
            return None  # another pool's own budget (a tenant budget's part counts wherever it is spent)
        result = self.book.apply(record, self.clock.wall_ms())
        self.metrics.budget_records[(record.pool, result.value)] += 1
        return result
