"""A tenant budget's kept sum (proxy/admission/budgets.py ``_PartSum``): the parts are summed as their records arrive,
so a check does not walk them. Invariant: after any sequence of records, reservations, settlements and spec changes,
the kept sum equals the sum walked over the parts (the check's former rule, kept here as the reference)."""

from __future__ import annotations

from datetime import datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.budgets import Account, BudgetScope, BudgetSpec, Period, Usage
from tokenpools.proxy.admission.budgets import BudgetBook
from tokenpools.topics.records import BudgetStatus

TENANT = "acme"
SHARED = BudgetSpec("shared", Period.DAY, 1000, scope=BudgetScope.TENANT)
NOW = int(datetime.fromisoformat("2026-12-04T12:00:00+00:00").timestamp() * 1000)
TODAY = SHARED.period_at(NOW)
YESTERDAY = SHARED.period_at(TODAY[0] - 1)
ENTITLEMENTS = ("gold", "silver", "batch", "spot")
PROXIES = ("p1", "p2", "p3")


def walked(book: BudgetBook, spec: BudgetSpec, tenant: str, now_ms: int) -> tuple[Account, Usage, dict[str, int]]:
    """The tenant budget's account, pending spending and levels by walking every part (the rule before the sum)."""
    start, end = spec.period_at(now_ms)
    group = (tenant, spec.name)
    parts = book._parts.get(group, {})
    members = book._members.get(group, {})
    spent, pending = Usage(), Usage()
    levels: dict[str, int] = {}
    for entitlement in {**parts, **members, **book._former.get(group, {})}:
        cut_ms = start
        part = book._published.get((entitlement, spec.name)) if entitlement in parts else None
        if (part is not None and part.period is spec.period and part.time_zone == spec.time_zone
                and part.account.start_ms == start):
            spent = spent + part.account.spent
            cut_ms = max(start, part.through_ms)
            for proxy, tokens in part.reserved_tokens.items():
                levels[proxy] = levels.get(proxy, 0) + tokens
        own = book._own.get((entitlement, spec.name))
        if own is not None:
            own.drop_before(cut_ms)
            pending = pending + own.total
        if entitlement in members:
            pending = pending + book._reserved_total.get(entitlement, Usage())
    return Account(start, end, spec.amount, spent), pending, {p: n for p, n in levels.items() if n}


def record(entitlement: str, version: int, through_ms: int, prompt: int, completion: int, yesterday: bool,
           scope: BudgetScope, tenant: str, reserved: dict[str, int]) -> BudgetStatus:
    start, end = YESTERDAY if yesterday else TODAY
    return BudgetStatus(pool="pool-a", entitlement=entitlement, tenant=tenant, budget=SHARED.name, scope=scope,
                        period=SHARED.period, time_zone=SHARED.time_zone, period_start_ms=start, period_end_ms=end,
                        allowance=1000, spent={"prompt_tokens": prompt, "cached_prompt_tokens": 0,
                                               "completion_tokens": completion, "requests": 1},
                        spent_units=prompt + completion, version=version, t_ms=through_ms, through_ms=through_ms,
                        reserved_tokens=reserved)


entitlements = st.sampled_from(ENTITLEMENTS)
records = st.tuples(st.just("record"), entitlements, st.integers(1, 6), st.integers(NOW - 5000, NOW + 5000),
                    st.integers(0, 500), st.integers(0, 500), st.booleans(),
                    st.sampled_from([BudgetScope.TENANT, BudgetScope.TENANT, BudgetScope.ENTITLEMENT]),
                    st.sampled_from([TENANT, TENANT, "globex"]),
                    st.dictionaries(st.sampled_from(PROXIES), st.integers(0, 300), max_size=3))
reserves = st.tuples(st.just("reserve"), entitlements, st.integers(0, 9), st.integers(0, 300))
releases = st.tuples(st.just("release"), entitlements, st.integers(0, 9))
settles = st.tuples(st.just("settle"), entitlements, st.integers(0, 9), st.integers(NOW - 5000, NOW + 5000),
                    st.integers(0, 300), st.booleans())
declares = st.tuples(st.just("declare"), entitlements, st.booleans())
ops = st.lists(st.one_of(records, reserves, releases, settles, declares), max_size=60)


@settings(max_examples=400, deadline=None)
@given(ops, st.sampled_from(["p1", "p2", ""]))
def test_the_kept_sum_of_parts_equals_the_walked_sum(trace: list[tuple], proxy_id: str) -> None:
    book = BudgetBook(proxy_id=proxy_id)
    for op in trace:
        kind, entitlement = op[0], op[1]
        if kind == "record":
            _, _, version, through, prompt, completion, yesterday, scope, tenant, reserved = op
            book.apply(record(entitlement, version, through, prompt, completion, yesterday, scope, tenant, reserved),
                       through)
        elif kind == "reserve":
            rid = f"r{op[2]}"
            if rid not in book._reserved.get(entitlement, {}):
                book.reserve(entitlement, rid, Usage(op[3], 0, 0))
        elif kind == "release":
            book.release(entitlement, f"r{op[2]}")
        elif kind == "settle":
            _, _, rid, t_ms, prompt, declares_it = op
            book.settle(entitlement, (SHARED,) if declares_it else (), f"r{rid}", t_ms, Usage(prompt, 0, 0, 1))
        else:
            book.declare(entitlement, TENANT, (SHARED,) if op[2] else ())
        for tenant in (TENANT, "globex"):
            for now_ms in (NOW, TODAY[1] + 1):
                account, pending, levels = walked(book, SHARED, tenant, now_ms)
                kept = book.state("gold", SHARED, now_ms, tenant)
                assert kept.account == account
                assert kept.pending == pending
                assert dict(kept.levels) == levels
