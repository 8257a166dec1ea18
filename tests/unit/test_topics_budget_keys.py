"""The budgets topic's key (topics/budget_keys.py; docs/budgets.md#tenant-budgets): it carries the scope and the
tenant, and the form before it (no scope) still reads as the same account."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tokenpools.core.budgets import BudgetScope
from tokenpools.topics.budget_keys import BudgetKey, budget_key, parse_budget_key

names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)


@given(names, names, names, st.sampled_from(BudgetScope), names)
def test_a_key_reads_back_as_its_account_scope_and_tenant(pool: str, entitlement: str, budget: str,
                                                          scope: BudgetScope, tenant: str) -> None:
    parsed = parse_budget_key(budget_key(pool, entitlement, budget, scope, tenant).encode())
    assert parsed == BudgetKey(pool, entitlement, budget, scope, tenant if scope is BudgetScope.TENANT else "")
    assert parsed.account == f"{pool}/{entitlement}/{budget}"  # the old form's key: one account under both


def test_the_old_form_has_no_scope_and_other_keys_are_not_budget_keys() -> None:
    assert parse_budget_key(b"pool-a/gold/daily") == BudgetKey("pool-a", "gold", "daily", None)
    assert parse_budget_key(b"pool-a/gold/daily/shared") is None
    assert parse_budget_key(b"pool-a/gold") is None
    assert parse_budget_key(b"pool-a/gold/daily/entitlement/acme") is None
