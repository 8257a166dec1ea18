"""Tenant-budget alerts (streams.tenant_alerts): the tenant's spending is the sum of its entitlements' parts of the
newest period, each threshold alerts once per period, a new period re-arms them, a stale part is ignored, and the
outbox survives a crash between the book's write and the send."""

from __future__ import annotations

from tokenpools.core.budgets import BudgetScope, BudgetSpec, Period
from tokenpools.streams.budgets import tenant_alerts
from tokenpools.topics.records import BudgetStatus

DAY_MS = 86_400_000
START = 1_764_806_400_000  # 2025-12-04T00:00Z
SPEC = BudgetSpec("acme-day", Period.DAY, 100.0, scope=BudgetScope.TENANT, alert_thresholds=(0.5, 0.8, 1.0))


def part(pool: str, entitlement: str, spent: float, version: int = 1, start: int = START, t_ms: int | None = None,
         tenant: str = "acme", scope: BudgetScope = BudgetScope.TENANT) -> BudgetStatus:
    return BudgetStatus(pool=pool, entitlement=entitlement, tenant=tenant, budget=SPEC.name, scope=scope,
                        period=Period.DAY, time_zone="UTC", period_start_ms=start, period_end_ms=start + DAY_MS,
                        allowance=100.0, spent={"prompt_tokens": int(spent), "requests": 1},
                        spent_units=spent, version=version, t_ms=t_ms if t_ms is not None else start + version,
                        through_ms=start + version)


def test_the_sum_of_parts_from_several_pools_alerts_where_no_part_alone_would():
    parts = [part("llama-70b", "chat", 50.0, t_ms=START + 10), part("llama-8b", "batch", 40.0, t_ms=START + 20)]
    book = tenant_alerts.evaluate(SPEC, parts, None)
    assert book is not None and book.period_start_ms == START and book.alerted == (0.5, 0.8)
    assert [(a.threshold, a.spent_units, a.allowance) for a in book.outbox] == [(0.5, 90.0, 100.0), (0.8, 90.0, 100.0)]
    crossing = book.outbox[0]  # named after the part last changed: the spending that crossed it
    assert (crossing.pool, crossing.entitlement, crossing.tenant, crossing.scope) == \
        ("llama-8b", "batch", "acme", BudgetScope.TENANT)
    assert crossing.t_ms == START + 20 and crossing.period_end_ms == START + DAY_MS
    assert tenant_alerts.alert_key(crossing) == f"tenant/acme/acme-day/{START}/0.5"


def test_each_threshold_alerts_once_per_period():
    parts = [part("p1", "chat", 50.0), part("p2", "batch", 40.0)]
    book = tenant_alerts.sent(tenant_alerts.evaluate(SPEC, parts, None), tenant_alerts.evaluate(SPEC, parts, None).outbox)
    assert book.outbox == () and book.alerted == (0.5, 0.8)
    assert tenant_alerts.evaluate(SPEC, parts, book) is book  # nothing new: the same book, nothing to write
    grown = [part("p1", "chat", 50.0), part("p2", "batch", 55.0, version=2)]
    after = tenant_alerts.evaluate(SPEC, grown, book)
    assert after.alerted == (0.5, 0.8, 1.0) and [a.threshold for a in after.outbox] == [1.0]
    assert tenant_alerts.evaluate(SPEC, grown, tenant_alerts.sent(after, after.outbox)).outbox == ()


def test_a_new_period_re_arms_the_thresholds_and_an_old_part_counts_nothing_in_it():
    old = [part("p1", "chat", 50.0), part("p2", "batch", 40.0)]
    book = tenant_alerts.evaluate(SPEC, old, None)
    book = tenant_alerts.sent(book, book.outbox)
    tomorrow = START + DAY_MS
    new = [part("p1", "chat", 55.0, version=5, start=tomorrow), part("p2", "batch", 40.0)]  # p2 still of yesterday
    after = tenant_alerts.evaluate(SPEC, new, book)
    assert after.period_start_ms == tomorrow and after.alerted == (0.5,)
    assert [(a.threshold, a.spent_units, a.period_start_ms) for a in after.outbox] == [(0.5, 55.0, tomorrow)]
    assert tenant_alerts.evaluate(SPEC, old, after) is after  # a partial view of an older period changes nothing


def test_a_stale_part_version_is_ignored_and_a_tombstone_or_scope_change_drops_the_part():
    parts = tenant_alerts.Parts()
    assert parts.apply("p1/chat/acme-day", part("p1", "chat", 60.0, version=3))
    assert not parts.apply("p1/chat/acme-day", part("p1", "chat", 10.0, version=2))  # an older record: ignored
    assert parts.apply("p2/batch/acme-day", part("p2", "batch", 30.0))
    assert parts.apply("p9/other/acme-day", part("p9", "other", 99.0, tenant="globex"))
    groups = parts.groups()
    assert sorted(p.spent_units for p in groups[("acme", "acme-day")]) == [30.0, 60.0]
    assert [p.spent_units for p in groups[("globex", "acme-day")]] == [99.0]
    parts.apply("p2/batch/acme-day", part("p2", "batch", 30.0, version=2, scope=BudgetScope.ENTITLEMENT))
    parts.forget("p9/other/acme-day")
    assert {k: [p.entitlement for p in v] for k, v in parts.groups().items()} == {("acme", "acme-day"): ["chat"]}


def test_the_outbox_survives_a_crash_and_goes_out_again_unchanged():
    parts = [part("p1", "chat", 85.0)]
    book = tenant_alerts.evaluate(SPEC, parts, None)
    restored = tenant_alerts.decode(tenant_alerts.encode(book))  # written before the send; the worker dies before ``sent``
    assert restored == book
    again = tenant_alerts.evaluate(SPEC, parts + [part("p2", "batch", 1.0, t_ms=START + 99)], restored)
    assert again is restored  # no threshold twice; the same alerts, same keys, same content, are still due
    assert [tenant_alerts.alert_key(a) for a in again.outbox] == [f"tenant/acme/acme-day/{START}/0.5",
                                                      f"tenant/acme/acme-day/{START}/0.8"]
    queued = tenant_alerts.evaluate(SPEC, [part("p1", "chat", 85.0), part("p2", "batch", 20.0)], again)
    assert [a.threshold for a in tenant_alerts.sent(queued, again.outbox).outbox] == [1.0]  # a later one is kept


def test_no_thresholds_or_no_parts_keep_the_book():
    assert tenant_alerts.evaluate(BudgetSpec("b", Period.DAY, 1.0, scope=BudgetScope.TENANT), [part("p", "e", 5.0)], None) is None
    assert tenant_alerts.evaluate(SPEC, [], None) is None
