"""The agents' tenant-budget parts (streams/readers.py ``apply_budget_part``, streams/budgets/tenant_alerts.py
``Parts``) under both key forms of the budgets topic: one account is one part, whatever key carried it, and the
newest version wins whichever key is read last."""

from __future__ import annotations

from tokenpools.core.budgets import BudgetScope, Period
from tokenpools.streams.budgets.tenant_alerts import Parts
from tokenpools.streams.decoding import RawEvent
from tokenpools.streams.readers import apply_budget_part
from tokenpools.topics.codec import encode
from tokenpools.topics.records import BudgetStatus

T_MS = 1_800_000_000_000


def status(version: int, prompt: int, scope: BudgetScope = BudgetScope.TENANT) -> BudgetStatus:
    return BudgetStatus(pool="pool-a", entitlement="gold", tenant="acme", budget="shared", scope=scope,
                        period=Period.DAY, time_zone="UTC", period_start_ms=T_MS - 1000, period_end_ms=T_MS + 1000,
                        allowance=1000, spent={"prompt_tokens": prompt, "requests": 1}, spent_units=prompt,
                        version=version, t_ms=T_MS, through_ms=T_MS)


def raw(key: bytes, record: BudgetStatus | None) -> RawEvent:
    return RawEvent("budgets", 0, 0, T_MS, key, encode(record) if record is not None else None)


def test_an_account_under_both_key_forms_is_one_part_of_its_newest_version() -> None:
    parts = Parts()
    apply_budget_part(parts, raw(b"pool-a/gold/shared/tenant/acme", status(7, 300)))
    apply_budget_part(parts, raw(b"pool-a/gold/shared", status(5, 100)))  # the old key's last record, read after
    (group,) = parts.groups().values()
    assert [p.version for p in group] == [7]
    apply_budget_part(parts, raw(b"pool-a/gold/shared", status(4, 0, BudgetScope.ENTITLEMENT)))  # older: ignored
    assert [p.version for p in parts.groups()[("acme", "shared")]] == [7]
    apply_budget_part(parts, raw(b"pool-a/gold/shared/entitlement", status(8, 0, BudgetScope.ENTITLEMENT)))
    assert parts.groups() == {}  # newer and no longer the tenant's: the part is dropped
