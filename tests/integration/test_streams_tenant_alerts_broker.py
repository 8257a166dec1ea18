"""Tenant-budget alerts on a real broker: two entitlements of one tenant on two pools share a tenant budget; the
agents worker folds their completions into their parts, publishes them on the budgets topic, reads them back and,
owning the tenant budget's key, alerts each threshold the sum crossed exactly once (neither part alone reaches the
top one), keyed by tenant."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tokenpools.config import KafkaSettings
from tokenpools.core.budgets import BudgetScope, Period, period_bounds
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.streams.admin import ensure_topics
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.records import BudgetAlert, BudgetStatus, RequestCompleted
from tokenpools_dev import builders
from tokenpools_dev.streams import harness

pytestmark = [pytest.mark.integration, pytest.mark.slow]

AMOUNT = 2000  # units (tokens): each entitlement spends 1200, the tenant 2400


def _pool(name: str) -> dict[str, Any]:
    return builders.pool_doc(name, max_replicas=4, model=f"test/{name}", backend={"name": f"{name}-vllm"},
                             kv_bytes_per_token=147456, scaling={"minReplicas": 1, "maxReplicas": 4, "replicas": 1})


def _entitlement(name: str, pool: str) -> dict[str, Any]:
    budget = {"name": "acme-day", "scope": "tenant", "period": "day", "amount": AMOUNT, "alertThresholds": [0.5, 1.0]}
    return builders.entitlement_doc(name, pool, slots=4, service_class="elastic", slo_ms=500, tenantId="acme",
                                    resources={"tokensPerSecond": 100, "kvCacheGiB": 1, "concurrency": 4},
                                    budgets=[budget])


CONFIG_YAML = builders.config_text(_pool("big"), _pool("small"), _entitlement("chat", "big"),
                                   _entitlement("batch", "small"))


def _completions(base_ms: int) -> list[tuple[RequestCompleted, int]]:
    out = []
    for i in range(6):
        for pool, entitlement in (("big", "chat"), ("small", "batch")):
            t = base_ms + i * 300
            out.append((builders.completed(f"{entitlement}-{i}", t, pool=pool, entitlement=entitlement,
                                           admitted_t_ms=t - 100, prompt_tokens=100, completion_tokens=100,
                                           reserved_tokens=200, kv_bytes=0, ttft_s=0.05, e2e_s=0.1), t))
    return out


async def test_a_tenant_budget_spent_on_two_pools_alerts_once_per_threshold(kafka_bootstrap: str,
                                                                           tmp_path: Path) -> None:
    uid = uuid.uuid4().hex[:8]
    topics = topics_for(f"tal-{uid}.", partitions=2)
    await ensure_topics(KafkaClients(KafkaSettings(bootstrap_servers=kafka_bootstrap)), topics)
    config = tmp_path / "pool.yaml"
    config.write_text(CONFIG_YAML)
    group = f"agents-tal-{uid}"
    overrides = [*harness.worker_overrides(kafka_bootstrap, topics, group, topics.requests.partitions),
                 "budgets.publish_interval_s=0.3"]
    base_ms = (int(time.time()) + 3) * 1000
    await harness.publish_specs(kafka_bootstrap, topics.specs.name, CONFIG_YAML, base_ms)
    parts = harness.Collector(kafka_bootstrap, topics.budgets.name, BudgetStatus, partitions=topics.budgets.partitions)
    alerts = harness.Collector(kafka_bootstrap, topics.budget_alerts.name, BudgetAlert,
                         partitions=topics.budget_alerts.partitions)
    worker = harness.start_worker(config, overrides, tmp_path / "agents.log")
    try:
        await parts.start()
        await alerts.start()
        await harness.produce(kafka_bootstrap, [topics], _completions(base_ms), live=True)
        await alerts.wait_for(lambda r: len(r) >= 2, 60)
        await asyncio.sleep(3.0)  # ten more publications: nothing alerts again
    finally:
        harness.stop(worker)
        await parts.stop()
        await alerts.stop()
        log = (tmp_path / "agents.log").read_text(errors="replace")[-3000:]

    newest = {}
    for record in parts.records:
        newest[(record.pool, record.entitlement)] = record
    assert {k: (p.scope, p.spent_units) for k, p in newest.items()} == {
        ("big", "chat"): (BudgetScope.TENANT, 1200.0), ("small", "batch"): (BudgetScope.TENANT, 1200.0)}, log
    start, end = period_bounds(Period.DAY, "UTC", base_ms)
    assert sorted(k.decode() for k in alerts.keys) == [f"tenant/acme/acme-day/{start}/0.5",
                                                       f"tenant/acme/acme-day/{start}/1.0"], log
    for alert in alerts.records:
        assert (alert.tenant, alert.scope, alert.allowance, alert.period_end_ms) == \
            ("acme", BudgetScope.TENANT, AMOUNT, end)
        assert (alert.pool, alert.entitlement) in {("big", "chat"), ("small", "batch")}
    top = next(a for a in alerts.records if a.threshold == 1.0)
    assert top.spent_units >= AMOUNT


