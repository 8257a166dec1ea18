"""The budgets topic's key: which account a record is, and its scope, readable without decoding the value.

    <pool>/<entitlement>/<budget>/entitlement          an entitlement's own budget
    <pool>/<entitlement>/<budget>/tenant/<tenant>      one entitlement's part of its tenant's budget

A reader can then skip what it does not enforce without parsing the record (a proxy reads every record of the
topic from the beginning). The form before scopes were keyed, ``<pool>/<entitlement>/<budget>``, stays readable:
its scope is unknown (None) and a reader decodes the value to learn it. Both forms name the same account
(``BudgetKey.account``), so the compacted topic may hold one account under both keys after an upgrade: a reader
keeps the record of the highest ``version`` per account, whatever its key.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenpools.core.budgets import BudgetScope


@dataclass(frozen=True, slots=True)
class BudgetKey:
    pool: str
    entitlement: str
    budget: str
    scope: BudgetScope | None  # None: an old-form key (decode the value to know)
    tenant: str = ""

    @property
    def account(self) -> str:
        """The account's identity, the same in both key forms."""
        return f"{self.pool}/{self.entitlement}/{self.budget}"


def budget_key(pool: str, entitlement: str, budget: str, scope: BudgetScope, tenant: str) -> str:
    if scope is BudgetScope.TENANT:
        return f"{pool}/{entitlement}/{budget}/{scope.value}/{tenant}"
    return f"{pool}/{entitlement}/{budget}/{scope.value}"


def parse_budget_key(key: bytes) -> BudgetKey | None:
    """The key's parts; None for a key of neither form (the value says what it is, if anything)."""
    parts = key.decode("utf-8", "replace").split("/", 4)
    if len(parts) == 3:
        return BudgetKey(parts[0], parts[1], parts[2], None)
    if len(parts) == 4 and parts[3] == BudgetScope.ENTITLEMENT.value:
        return BudgetKey(parts[0], parts[1], parts[2], BudgetScope.ENTITLEMENT)
    if len(parts) == 5 and parts[3] == BudgetScope.TENANT.value:
        return BudgetKey(parts[0], parts[1], parts[2], BudgetScope.TENANT, parts[4])
    return None
