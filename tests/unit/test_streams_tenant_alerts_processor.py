"""Tenant-budget alerts through the agents' shell (``PoolProcessor.publish_tenant_alerts``): only the owner of the
tenant budget's key alerts, once per threshold, its book written before the send; a send that fails after the write
(a crash) goes out again, same key and content, from the book in the table."""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.partitioner import DefaultPartitioner

from tokenpools.config import load_config_text
from tokenpools.core.budgets import BudgetScope, Period
from tokenpools.runtime.clock import FakeClock
from tokenpools.runtime.deadletter import DeadLetters
from tokenpools.runtime.specs import Catalogue
from tokenpools.streams.budgets import tenant_alerts
from tokenpools.streams.metrics import StreamMetrics
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.processor import DictStore, PoolProcessor, RawEvent
from tokenpools.streams.readers import apply_budget_part
from tokenpools.streams.views import ProxyBook
from tokenpools.topics.codec import decode, encode
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.records import BudgetAlert, BudgetStatus
from tokenpools_dev import builders
from tokenpools_dev.streams import scripted

DAY_MS = 86_400_000
START = 1_764_806_400_000
PARTITIONS = 4
TOPICS = topics_for("t.")
BUDGET = {"name": "acme-day", "scope": "tenant", "period": "day", "amount": 100, "alertThresholds": [0.5, 1.0]}


def pool(name: str) -> dict[str, Any]:
    return builders.pool_doc(name, max_replicas=4, model=f"test/{name}", backend={"name": f"{name}-vllm"},
                             kv_bytes_per_token=147456, scaling={"minReplicas": 1, "maxReplicas": 4, "replicas": 1})


def entitlement(name: str, pool_name: str) -> dict[str, Any]:
    return builders.entitlement_doc(name, pool_name, slots=4, service_class="elastic", slo_ms=500, tenantId="acme",
                                    resources={"tokensPerSecond": 100, "kvCacheGiB": 1, "concurrency": 4},
                                    budgets=[BUDGET])


CATALOGUE = Catalogue.from_loaded(load_config_text(builders.config_text(
    pool("big"), pool("small"), entitlement("chat", "big"), entitlement("batch", "small"))))


def partition_of(key: str) -> int:
    every = list(range(PARTITIONS))
    return DefaultPartitioner()(key.encode(), every, every)  # type: ignore[no-any-return]


OWNER = partition_of(tenant_alerts.owner_key("acme", "acme-day"))


class Failing(scripted.Sent):
    """Sends fail while ``down`` (the worker dies between the book's write and the send)."""

    down = False

    async def __call__(self, topic: str, key: bytes, value: bytes | None) -> None:
        if self.down:
            raise ConnectionError("broker away")
        await super().__call__(topic, key, value)


def processor(store: DictStore) -> tuple[PoolProcessor, Failing]:
    sent, metrics = Failing(), StreamMetrics()
    dead = DeadLetters(TOPICS.dead_letters.name, "tenant-alerts-test", FakeClock(START), send=sent,
                       count=metrics.count_dead_letter)
    return PoolProcessor(StreamParams(width_ms=1000, grace_ms=300), TOPICS, CATALOGUE, ProxyBook(), store, sent, dead,
                         metrics, partition_of=partition_of), sent


def part(pool_name: str, entitlement_name: str, spent: float, version: int) -> RawEvent:
    status = BudgetStatus(pool=pool_name, entitlement=entitlement_name, tenant="acme", budget="acme-day",
                          scope=BudgetScope.TENANT, period=Period.DAY, time_zone="UTC", period_start_ms=START,
                          period_end_ms=START + DAY_MS, allowance=100.0, spent={"prompt_tokens": int(spent)},
                          spent_units=spent, version=version, t_ms=START + version, through_ms=START + version)
    key = f"{pool_name}/{entitlement_name}/acme-day".encode()
    return RawEvent(TOPICS.budgets.name, 0, version, None, key, encode(status))


def alerts(sent: scripted.Sent) -> list[tuple[bytes, BudgetAlert]]:
    return [(k, decode(BudgetAlert, v)) for t, k, v in sent.records if t == TOPICS.budget_alerts.name and v]


def test_the_owner_alerts_the_sum_of_two_pools_once_per_threshold_and_others_do_not():
    store = DictStore()
    proc, sent = processor(store)
    parts = tenant_alerts.Parts()
    for raw in (part("big", "chat", 30.0, 1), part("small", "batch", 25.0, 1)):
        apply_budget_part(parts, raw)
    others = set(range(PARTITIONS)) - {OWNER}
    assert asyncio.run(proc.publish_tenant_alerts(parts, others)) == []  # not the owner: nothing, not even a book
    assert store.get(tenant_alerts.book_key("acme", "acme-day")) is None
    asyncio.run(proc.publish_tenant_alerts(parts, {OWNER}))
    asyncio.run(proc.publish_tenant_alerts(parts, {OWNER}))
    apply_budget_part(parts, part("small", "batch", 75.0, 2))
    apply_budget_part(parts, part("small", "batch", 5.0, 1))  # re-read of an older record: ignored
    asyncio.run(proc.publish_tenant_alerts(parts, None))
    asyncio.run(proc.publish_tenant_alerts(parts, None))
    got = alerts(sent)
    assert [(k.decode(), a.threshold, a.spent_units, a.entitlement) for k, a in got] == [
        (f"tenant/acme/acme-day/{START}/0.5", 0.5, 55.0, "batch"),
        (f"tenant/acme/acme-day/{START}/1.0", 1.0, 105.0, "batch")]
    book = tenant_alerts.decode(store.get(tenant_alerts.book_key("acme", "acme-day")))
    assert book.alerted == (0.5, 1.0) and book.outbox == ()
    assert store.data[tenant_alerts.book_key("acme", "acme-day")][1] == OWNER


def test_an_alert_whose_send_failed_after_the_write_goes_out_again_unchanged():
    store = DictStore()
    proc, sent = processor(store)
    parts = tenant_alerts.Parts()
    apply_budget_part(parts, part("big", "chat", 60.0, 1))
    sent.down = True
    try:
        asyncio.run(proc.publish_tenant_alerts(parts, None))
    except ConnectionError:
        pass
    written = tenant_alerts.decode(store.get(tenant_alerts.book_key("acme", "acme-day")))
    assert written.alerted == (0.5,) and len(written.outbox) == 1  # the book was on the changelog before the send
    restarted, resent = processor(store)  # a new owner restores the table; new parts arrived meanwhile
    apply_budget_part(parts, part("small", "batch", 10.0, 1))
    asyncio.run(restarted.publish_tenant_alerts(parts, None))
    assert [(k.decode(), a) for k, a in alerts(resent)] == [(tenant_alerts.alert_key(written.outbox[0]), written.outbox[0])]
    assert tenant_alerts.decode(store.get(tenant_alerts.book_key("acme", "acme-day"))).outbox == ()
