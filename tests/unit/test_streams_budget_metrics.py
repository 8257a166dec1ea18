"""The agents' budget metrics (streams.metrics, set by streams.processor.publish_ledgers): the spent ratio of every
budget the worker's ledgers hold, its series gone with the budget, and a count of the alerts sent by pool and
threshold. Same scripted completions and budgets as test_streams_ledger_processor."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from test_streams_ledger_processor import BUDGETS, LOADED, RAW, TOPICS, WithBudgets, processor, run

from tokenpools.core.spec import EntitlementSpec
from tokenpools.streams.metrics import StreamMetrics, threshold_label
from tokenpools.streams.processor import DictStore


def sample(metrics: StreamMetrics, name: str, labels: dict[str, str]) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def ratio_labels(metrics: StreamMetrics) -> set[tuple[str, str, str]]:
    return {(s.labels["pool"], s.labels["entitlement"], s.labels["budget"])
            for family in metrics.registry.collect() if family.name == "tokenpools_agents_budget_spent_ratio"
            for s in family.samples}


def test_the_spent_ratio_is_the_published_accounts_and_alerts_are_counted_by_threshold():
    proc, sent = processor(DictStore())
    run(proc, cuts=list(range(0, len(RAW), 53)), publish_at=set(range(0, len(RAW), 101)))
    statuses = {s.budget: s for s in sent.compacted(TOPICS.budgets.name).values()}
    assert set(statuses) == {"daily", "monthly"}
    for name, status in statuses.items():
        got = sample(proc.metrics, "tokenpools_agents_budget_spent_ratio",
                     {"pool": status.pool, "entitlement": status.entitlement, "budget": name})
        assert got == pytest.approx(status.spent_units / status.allowance)
    daily = statuses["daily"]
    assert daily.spent_units / daily.allowance > 1  # the daily budget is overspent (0.6 of the units): 1.0 reached
    alerts = sent.of(TOPICS.budget_alerts.name)
    assert sorted(a.threshold for a in alerts) == [0.5, 1.0]
    for threshold in ("0.5", "1"):
        assert sample(proc.metrics, "tokenpools_agents_budget_alerts_total",
                      {"pool": daily.pool, "threshold": threshold}) == 1
    assert ratio_labels(proc.metrics) == {(daily.pool, daily.entitlement, "daily"),
                                          (daily.pool, daily.entitlement, "monthly")}


def test_a_budget_removed_from_the_spec_loses_its_series():
    proc, _ = processor(DictStore())
    run(proc, cuts=[], publish_at=set())
    assert len(ratio_labels(proc.metrics)) == 2

    class OnlyMonthly(WithBudgets):
        def entitlements_of(self, pool: str) -> tuple[EntitlementSpec, ...]:
            return tuple(replace(e, budgets=BUDGETS[1:]) if e.budgets else e for e in super().entitlements_of(pool))

    proc.catalogue = OnlyMonthly.from_loaded(LOADED)  # the daily budget deleted from the spec
    asyncio.run(proc.publish_ledgers())
    assert {b for _, _, b in ratio_labels(proc.metrics)} == {"monthly"}


def test_threshold_labels_are_the_shortest_form():
    assert [threshold_label(t) for t in (0.8, 1.0, 1.5, 0.25)] == ["0.8", "1", "1.5", "0.25"]
