"""What-if budgets for one replay: ``--budget ENTITLEMENT[.NAME]=AMOUNT/PERIOD[/TIME_ZONE]`` (docs/budgets.md#replay).

The operator's question — had this tenant had a budget of X last month, when would it have run out? — is a replay
of the month's log with a budget added to (or changed on) an entitlement. ``--budget`` (``tokenpools replay``)
and ``--set replay.budget=...`` (both ``replay`` and ``experiment``) take the same item:

- ``copilot=5e6/month`` adds (or replaces) the budget named ``month`` of ``copilot``: 5,000,000 units a calendar
  month in UTC, weights 1 (tokens), no rollover;
- ``copilot.monthly=5e6/month/Europe/Berlin`` changes the amount, period and time zone of ``copilot``'s budget
  ``monthly`` and keeps its weights, rollover and alert thresholds (a new budget of that name when it has none).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tokenpools.core.budgets import BudgetSpec, Period
from tokenpools.core.spec import EntitlementSpec
from tokenpools.replay.scenario import ReplayUsageError

BUDGET_KEY = "replay.budget"
FORMAT = "ENTITLEMENT[.NAME]=AMOUNT/PERIOD[/TIME_ZONE], e.g. copilot=5e6/month/Europe/Berlin"


def split_budget_items(items: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the ``replay.budget=...`` items' values, the other items) of ``--set`` items."""
    budgets = [i.strip().partition("=")[2] for i in items if i.strip().startswith(BUDGET_KEY + "=")]
    return budgets, [i for i in items if not i.strip().startswith(BUDGET_KEY + "=")]


def parse(item: str) -> tuple[str, str | None, float, Period, str]:
    """(entitlement, budget name or None, amount, period, time zone) of one item; ``ReplayUsageError`` if malformed."""
    target, sep, value = item.strip().partition("=")
    entitlement, _, name = target.strip().partition(".")
    parts = value.strip().split("/", 2)
    if not sep or not entitlement or len(parts) < 2 or (not name and _ == "."):
        raise ReplayUsageError(f"--budget expects {FORMAT}; got {item!r}")
    try:
        amount = float(parts[0])
        period = Period(parts[1].strip().lower())
    except ValueError:
        raise ReplayUsageError(f"--budget expects {FORMAT} (PERIOD one of day, week, month, never); got {item!r}") from None
    time_zone = parts[2].strip() if len(parts) == 3 else "UTC"
    return entitlement.strip(), name.strip() or None, amount, period, time_zone


def with_budgets(entitlements: Sequence[EntitlementSpec], items: Sequence[str]) -> tuple[EntitlementSpec, ...]:
    """``entitlements`` with the items' budgets added or changed, in order (a later item on the same budget wins)."""
    by_name = {e.name: e for e in entitlements}
    for item in items:
        ent, name, amount, period, time_zone = parse(item)
        spec = by_name.get(ent)
        if spec is None:
            raise ReplayUsageError(f"--budget {item!r}: no entitlement {ent!r} in this replay; known: {sorted(by_name)}")
        name = name or period.value
        old = next((b for b in spec.budgets if b.name == name), None)
        try:
            if old is None:
                budget = BudgetSpec(name=name, period=period, amount=amount, time_zone=time_zone)
            else:
                rollover = 0.0 if period is Period.NEVER else old.rollover_max
                budget = replace(old, period=period, amount=amount, time_zone=time_zone, rollover_max=rollover)
        except ValueError as exc:
            raise ReplayUsageError(f"--budget {item!r}: {exc}") from None
        budgets = tuple(budget if b.name == name else b for b in spec.budgets) if old else (*spec.budgets, budget)
        by_name[ent] = replace(spec, budgets=budgets)
    return tuple(by_name[e.name] for e in entitlements)
