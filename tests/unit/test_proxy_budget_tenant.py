"""A tenant budget in the proxy's view (proxy/admission/budgets.py; docs/budgets.md#tenant-budgets): the parts of every
entitlement of the tenant summed, each counted once, plus this proxy's own spending and reservations."""

from __future__ import annotations

from datetime import datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.budgets import BudgetScope, BudgetSpec, Period, Usage
from tokenpools.proxy.admission.budgets import BudgetBook, RecordResult
from tokenpools.topics.records import BudgetStatus

TENANT = "acme"
SHARED = BudgetSpec("shared", Period.DAY, 1000, scope=BudgetScope.TENANT)
NOW = int(datetime.fromisoformat("2026-12-04T12:00:00+00:00").timestamp() * 1000)
START, END = SHARED.period_at(NOW)
CAP_MS = 3_600_000


def part(entitlement: str, version: int, through_ms: int, prompt: int, *, pool: str = "pool-a", tenant: str = TENANT,
         start: int = START, end: int = END, scope: BudgetScope = BudgetScope.TENANT) -> BudgetStatus:
    return BudgetStatus(pool=pool, entitlement=entitlement, tenant=tenant, budget=SHARED.name, scope=scope,
                        period=SHARED.period, time_zone=SHARED.time_zone, period_start_ms=start, period_end_ms=end,
                        allowance=1000, spent={"prompt_tokens": prompt, "cached_prompt_tokens": 0,
                                               "completion_tokens": 0, "requests": 1},
                        spent_units=prompt, version=version, t_ms=through_ms, through_ms=through_ms)


def test_parts_own_spending_and_reservations_of_every_entitlement_add_up() -> None:
    book = BudgetBook()
    book.apply(part("gold", 1, NOW - 100, 200))  # this proxy's entitlement on pool-a
    book.apply(part("batch", 3, NOW - 100, 300, pool="pool-b"))  # another pool's: only its part is known here
    assert book.check("gold", (SHARED,), Usage(100, 0, 0), NOW, CAP_MS, TENANT) is None
    book.reserve("gold", "r1", Usage(100, 0, 0))
    book.settle("silver", (SHARED,), "none", NOW - 10, Usage(50, 0, 0, 1))  # own, after silver's (absent) part
    state = book.state("gold", SHARED, NOW, TENANT)
    assert state.account.allowance == 1000 and state.account.spent.prompt == 500
    assert state.remaining_units == 1000 - 500 - 100  # silver declares nothing yet: its own 50 is not counted
    assert book.check("silver", (SHARED,), Usage(1, 0, 0), NOW, CAP_MS, TENANT) is None  # silver declares it now
    assert book.state("gold", SHARED, NOW, TENANT).remaining_units == 1000 - 500 - 50 - 100
    # the tenant's sum is spent for every entitlement: 350 left
    for entitlement in ("gold", "silver"):
        refused = book.check(entitlement, (SHARED,), Usage(351, 0, 0), NOW, CAP_MS, TENANT)
        assert refused is not None and refused.tenant == TENANT and refused.state.remaining_units == 350
        assert book.check(entitlement, (SHARED,), Usage(350, 0, 0), NOW, CAP_MS, TENANT) is None


def test_a_part_is_counted_once_its_latest_version_and_only_of_the_current_period() -> None:
    book = BudgetBook()
    assert book.apply(part("batch", 2, NOW, 300, pool="pool-b")) is RecordResult.APPLIED
    assert book.apply(part("batch", 2, NOW, 300, pool="pool-b")) is RecordResult.STALE
    assert book.apply(part("batch", 1, NOW, 900, pool="pool-b")) is RecordResult.STALE
    assert book.apply(part("batch", 3, NOW, 400, pool="pool-b")) is RecordResult.APPLIED
    assert book.state("gold", SHARED, NOW, TENANT).remaining_units == 600
    previous = SHARED.period_at(START - 1)
    book.apply(part("old", 7, START - 1, 999, start=previous[0], end=previous[1]))  # yesterday's part: 0 today
    book.apply(part("other", 1, NOW, 999, tenant="globex"))  # another tenant's
    book.apply(part("own", 1, NOW, 999, scope=BudgetScope.ENTITLEMENT))  # an entitlement budget of the same name
    assert book.state("gold", SHARED, NOW, TENANT).remaining_units == 600
    assert book.state("gold", SHARED, END + 1, TENANT).remaining_units == 1000  # the next day: nothing spent yet


def test_an_entitlement_leaving_the_budget_no_longer_adds_its_reservations() -> None:
    book = BudgetBook()
    assert book.check("gold", (SHARED,), Usage(400, 0, 0), NOW, CAP_MS, TENANT) is None
    book.reserve("gold", "r1", Usage(400, 0, 0))
    assert book.state("silver", SHARED, NOW, TENANT).remaining_units == 600
    assert book.check("gold", (), Usage(1, 0, 0), NOW, CAP_MS, TENANT) is None  # the spec dropped the budget
    assert book.state("silver", SHARED, NOW, TENANT).remaining_units == 1000
    book.settle("gold", (), "r1", NOW, Usage(400, 0, 0, 1))  # settled as of its spec now: not the tenant's
    assert book.state("silver", SHARED, NOW, TENANT).remaining_units == 1000


def test_what_an_entitlement_spent_before_leaving_stays_the_tenants_until_the_reset() -> None:
    book = BudgetBook()
    book.declare("gold", TENANT, (SHARED,))
    book.settle("gold", (SHARED,), "r1", NOW, Usage(300, 0, 0, 1))
    book.declare("gold", TENANT, ())
    assert book.state("silver", SHARED, NOW + 1, TENANT).remaining_units == 700
    assert book.state("silver", SHARED, END, TENANT).remaining_units == 1000  # the reset


def test_a_budget_of_its_own_of_the_name_is_not_the_tenants() -> None:
    book = BudgetBook()
    book.declare("gold", TENANT, (SHARED,))
    book.declare("gold", TENANT, (BudgetSpec("shared", Period.DAY, 50),))  # from now on spends its own of the name
    book.settle("gold", (BudgetSpec("shared", Period.DAY, 50),), "r1", NOW, Usage(30, 0, 0, 1))
    assert book.state("silver", SHARED, NOW + 1, TENANT).remaining_units == 1000


# ---- properties ------------------------------------------------------------------------------------------------

LOCAL = ("gold", "silver")  # this proxy's entitlements of the tenant
ALL = (*LOCAL, "batch")  # batch is on another pool: its part arrives, its traffic never passes here

Op = tuple[str, int, int, int, int]  # (kind, t offset, tokens, entitlement index, version or request index)

ops = st.lists(st.one_of(
    st.tuples(st.just("reserve"), st.integers(0, 50), st.integers(0, 300), st.integers(0, 1), st.integers(0, 20)),
    st.tuples(st.just("settle"), st.integers(0, 50), st.integers(0, 300), st.integers(0, 1), st.integers(0, 20)),
    st.tuples(st.just("remote"), st.integers(0, 50), st.integers(0, 300), st.just(2), st.just(0)),
    st.tuples(st.just("record"), st.integers(0, 60), st.just(0), st.integers(0, 2), st.integers(1, 30)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(ops, st.integers(1, 400))
def test_never_admits_when_parts_own_reservations_and_request_exceed_the_allowance(trace: list[Op],
                                                                                  request: int) -> None:
    """The truth per entitlement: its completions by event time, its reservations; records of its part arriving in
    any version order, each counting exactly its completions before its through_ms. The view's remaining units are
    exactly amount - Σ_e (e's held part + e's own completions after its cut + e's reservations), and the check admits
    only if the request fits them, for every entitlement of the tenant."""
    book = BudgetBook()
    completions: dict[str, list[tuple[int, int]]] = {e: [] for e in ALL}
    reserved: dict[str, dict[str, int]] = {e: {} for e in ALL}
    held: dict[str, tuple[int, int]] = {}  # entitlement → (version, through_ms) of the newest part applied
    for e in LOCAL:
        book.declare(e, TENANT, (SHARED,))
    t = NOW
    for kind, dt, tokens, i, n in trace:
        t += dt
        e = ALL[i]
        rid = f"{e}-r{n}"
        if kind == "reserve" and rid not in reserved[e]:
            book.reserve(e, rid, Usage(tokens, 0, 0))
            reserved[e][rid] = tokens
        elif kind == "settle":
            reserved[e].pop(rid, None)
            book.settle(e, (SHARED,), rid, t, Usage(tokens, 0, 0, 1) if tokens else Usage())
            if tokens:
                completions[e].append((t, tokens))
        elif kind == "remote":
            completions[e].append((t, tokens))  # spent through another proxy: this one learns it from a part
        elif kind == "record":
            through = t - dt
            result = book.apply(part(e, n, through, sum(k for tc, k in completions[e] if tc < through)))
            newer = e not in held or n > held[e][0]
            assert (result is RecordResult.APPLIED) == newer
            if newer:
                held[e] = (n, through)
        truth = 1000.0
        for e in ALL:
            cut = held[e][1] if e in held else START
            if e in held:
                truth -= sum(k for tc, k in completions[e] if tc < cut)
            if e in LOCAL:  # what passed here after the cut: this proxy's own
                truth -= sum(k for tc, k in completions[e] if tc >= cut) + sum(reserved[e].values())
        for e in LOCAL:
            assert book.state(e, SHARED, t, TENANT).remaining_units == truth
            refused = book.check(e, (SHARED,), Usage(request, 0, 0), t, CAP_MS, TENANT)
            assert (refused is None) == (truth >= request)


def test_the_parts_reservations_in_flight_add_up_per_proxy_and_its_own_are_left_out() -> None:
    """docs/budgets.md#the-others-reservations-in-flight: each part carries its entitlement's levels; the tenant's
    are their sum, of which this proxy's own are counted as it holds them, not from the records."""
    book = BudgetBook(proxy_id="me")
    book.apply(part("gold", 1, NOW - 100, 200).model_copy(update={"reserved_tokens": {"me": 70, "other": 40}}))
    book.apply(part("batch", 1, NOW - 100, 300, pool="pool-b").model_copy(update={"reserved_tokens": {"other": 60}}))
    book.reserve("gold", "r1", Usage(10, 0, 0))
    assert book.check("gold", (SHARED,), Usage(1, 0, 0), NOW, CAP_MS, TENANT) is None
    assert book.state("gold", SHARED, NOW, TENANT).remaining_units == 1000 - 500 - 10 - (40 + 60)
