"""The proxy's view of its budget accounts and the check (proxy/admission/budgets.py; docs/budgets.md#enforcement)."""

from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.budgets import BudgetScope, BudgetSpec, OnStale, Period, Usage, Weights
from tokenpools.proxy.admission.budgets import BudgetBook, RecordResult, StaleRule
from tokenpools.topics.records import BudgetStatus

ENT = "gold"
DAY = BudgetSpec("daily", Period.DAY, 1000)


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


NOW = _ms("2026-12-04T12:00:00+00:00")
START, END = DAY.period_at(NOW)


def status(version: int, through_ms: int, prompt: int = 0, completion: int = 0, *, cached: int = 0,
           allowance: float = 1000, spec: BudgetSpec = DAY, start: int = START, end: int = END) -> BudgetStatus:
    return BudgetStatus(pool="pool-a", entitlement=ENT, tenant="acme", budget=spec.name, scope=BudgetScope.ENTITLEMENT,
                        period=spec.period, time_zone=spec.time_zone, period_start_ms=start, period_end_ms=end,
                        allowance=allowance, spent={"prompt_tokens": prompt, "cached_prompt_tokens": cached,
                                                    "completion_tokens": completion, "requests": 1},
                        spent_units=prompt + completion, version=version, t_ms=through_ms, through_ms=through_ms)


def test_no_record_yet_the_bare_amount_and_own_spending_only() -> None:
    book = BudgetBook()
    assert book.check(ENT, (DAY,), Usage(600, 0, 400), NOW, 3_600_000) is None  # exactly fits
    book.reserve(ENT, "r1", Usage(600, 0, 400))
    refused = book.check(ENT, (DAY,), Usage(1, 0, 0), NOW, 3_600_000)
    assert refused is not None and refused.state.spec is DAY and refused.units == 1
    book.settle(ENT, (DAY,), "r1", NOW + 1, Usage(300, 0, 100, 1))  # used less than it reserved
    assert book.state(ENT, DAY, NOW + 2).remaining_units == 600
    assert book.check(ENT, (DAY,), Usage(500, 0, 100), NOW + 2, 3_600_000) is None


def test_a_record_replaces_the_own_spending_it_covers_and_keeps_the_rest() -> None:
    book = BudgetBook()
    book.settle(ENT, (DAY,), "a", NOW - 100, Usage(100, 0, 0, 1))
    book.settle(ENT, (DAY,), "b", NOW - 10, Usage(50, 0, 0, 1))
    assert book.state(ENT, DAY, NOW).remaining_units == 850
    # the agents counted everything before NOW - 50 (the first completion, plus 200 of other proxies)
    assert book.apply(status(1, NOW - 50, prompt=300)) is RecordResult.APPLIED
    assert book.state(ENT, DAY, NOW).remaining_units == 1000 - 300 - 50
    # a newer record covering the second too: counted once, in the record
    assert book.apply(status(2, NOW, prompt=350)) is RecordResult.APPLIED
    assert book.state(ENT, DAY, NOW).remaining_units == 650


def test_versions_out_of_order_are_ignored() -> None:
    book = BudgetBook()
    assert book.apply(status(5, NOW, prompt=500)) is RecordResult.APPLIED
    assert book.apply(status(4, NOW, prompt=10)) is RecordResult.STALE
    assert book.apply(status(5, NOW, prompt=10)) is RecordResult.STALE
    assert book.state(ENT, DAY, NOW).remaining_units == 500


def test_weights_price_reservations_and_spending_cached_prompts_apart() -> None:
    spec = BudgetSpec("eur", Period.MONTH, 100.0, weights=Weights(prompt=0.01, cached_prompt=0.001, completion=0.04))
    book = BudgetBook()
    book.settle(ENT, (spec,), "a", NOW, Usage(1000, 800, 100, 1))
    assert book.state(ENT, spec, NOW).remaining_units == pytest.approx(100 - (200 * 0.01 + 800 * 0.001 + 100 * 0.04))
    refused = book.check(ENT, (spec,), Usage(2000, 0, 2000), NOW, 10_000)  # 20 + 80 > 93.2 left
    assert refused is not None and refused.units == pytest.approx(100.0)


def test_the_refusal_names_the_budget_its_reset_in_its_zone_and_caps_the_retry() -> None:
    spec = BudgetSpec("monthly", Period.MONTH, 10, time_zone="Europe/Berlin")
    book = BudgetBook()
    assert book.check(ENT, (DAY, spec), Usage(8, 0, 0), NOW, 3_600_000) is None  # fits both
    refused = book.check(ENT, (DAY, BudgetSpec("tiny", Period.DAY, 5), spec), Usage(11, 0, 0), NOW, 3_600_000)
    assert refused is not None and refused.state.spec.name == "tiny"  # the first budget that cannot take it
    book2 = BudgetBook()
    refused = book2.check(ENT, (spec,), Usage(11, 0, 0), NOW, 3_600_000)
    assert refused is not None
    assert refused.resets_at == "2027-01-01T00:00:00+01:00"
    assert refused.retry_after_ms == 3_600_000 and refused.retry_after_s == 3600
    detail = refused.detail()
    assert detail["name"] == "monthly" and detail["period"] == "month" and detail["remaining"] == 10
    assert "monthly" in refused.reason and "2027-01-01T00:00:00+01:00" in refused.reason
    near = book2.check(ENT, (spec,), Usage(11, 0, 0), _ms("2026-12-31T23:59:58.500+01:00"), 3_600_000)
    assert near is not None and near.retry_after_ms == 1500 and near.retry_after_s == 2  # rounded up


def test_a_never_budget_has_no_reset() -> None:
    spec = BudgetSpec("trial", Period.NEVER, 5)
    refused = BudgetBook().check(ENT, (spec,), Usage(6, 0, 0), NOW, 60_000)
    assert refused is not None and refused.resets_at is None and refused.retry_after_ms == 60_000
    assert "does not reset" in refused.reason


def test_after_the_period_the_next_account_with_the_records_rollover() -> None:
    spec = BudgetSpec("daily", Period.DAY, 1000, rollover_max=500)
    book = BudgetBook()
    book.apply(status(1, END - 1, prompt=900, spec=spec))
    book.settle(ENT, (spec,), "late", END - 1, Usage(50, 0, 0, 1))  # own, of the ended period
    tomorrow = END + 3_600_000
    state = book.state(ENT, spec, tomorrow)
    assert (state.account.start_ms, state.account.allowance) == (END, 1100)  # 1000 + (1000 - 900) carried
    assert state.pending == Usage()  # the ended period's own spending is not this period's
    book.settle(ENT, (spec,), "x", tomorrow, Usage(10, 0, 0, 1))
    assert book.state(ENT, spec, tomorrow).remaining_units == 1090


def test_a_spec_change_of_period_starts_from_own_spending() -> None:
    book = BudgetBook()
    book.apply(status(1, NOW, prompt=900))
    weekly = BudgetSpec("daily", Period.WEEK, 1000)  # same name, another period: the day's record does not apply
    book.settle(ENT, (weekly,), "a", NOW + 1, Usage(10, 0, 0, 1))
    state = book.state(ENT, weekly, NOW + 2)
    assert state.account.allowance == 1000 and state.remaining_units == 990


def test_a_tenant_budget_is_enforced_on_the_tenants_sum() -> None:
    """(tests/unit/test_proxy_budget_tenant.py has the tenant budget's own tests.)"""
    spec = BudgetSpec("shared", Period.DAY, 1, scope=BudgetScope.TENANT)
    refused = BudgetBook().check(ENT, (spec,), Usage(100, 0, 0), NOW, 1000, tenant="acme")
    assert refused is not None and refused.tenant == "acme" and "tenant acme" in refused.reason


def test_release_gives_the_reservation_back_and_settle_releases() -> None:
    book = BudgetBook()
    book.reserve(ENT, "a", Usage(400, 0, 0))
    book.reserve(ENT, "b", Usage(500, 0, 0))
    with pytest.raises(ValueError):
        book.reserve(ENT, "a", Usage(1, 0, 0))
    book.release(ENT, "a")
    book.release(ENT, "a")  # twice: nothing more
    assert book.reserved(ENT) == Usage(500, 0, 0)
    book.settle(ENT, (DAY,), "b", NOW, Usage())  # used nothing
    assert book.reserved(ENT) == Usage() and book.state(ENT, DAY, NOW).remaining_units == 1000


def test_own_entries_past_the_cap_merge_late_never_early() -> None:
    book = BudgetBook(max_own_entries=4)
    for i in range(10):
        book.settle(ENT, (DAY,), f"r{i}", NOW + i, Usage(1, 0, 0, 1))
    assert book.state(ENT, DAY, NOW + 10).remaining_units == 990
    book.apply(status(1, NOW + 5, prompt=5))  # covers r0..r4; what is kept of them merged, counted at later times
    remaining = book.state(ENT, DAY, NOW + 10).remaining_units
    assert 985 - 5 <= remaining <= 985  # never more left than the truth (985)


# ---- properties ------------------------------------------------------------------------------------------------

Event = tuple[str, int, int, int]  # (kind, t offset, tokens, version or request index)

events = st.lists(st.one_of(
    st.tuples(st.just("reserve"), st.integers(0, 50), st.integers(0, 400), st.integers(0, 20)),
    st.tuples(st.just("settle"), st.integers(0, 50), st.integers(0, 400), st.integers(0, 20)),
    st.tuples(st.just("record"), st.integers(0, 60), st.integers(0, 0), st.integers(1, 30)),
), max_size=60)


@settings(max_examples=300, deadline=None)
@given(events, st.integers(1, 500))
def test_the_check_never_admits_past_the_allowance_nor_counts_own_spending_twice(ops: list[Event],
                                                                                   request: int) -> None:
    """A model of the truth: every completion this proxy sent, by event time; the reservations in flight; records
    arriving in any version order, each counting exactly the completions before its through_ms. The view's
    remaining units are exactly allowance - (the held record's spending + own after its through_ms + reserved), and
    the check admits a request only if it fits them."""
    book = BudgetBook()
    completions: list[tuple[int, int]] = []  # (t, tokens)
    reserved: dict[str, int] = {}
    held: tuple[int, int] | None = None  # (version, through_ms) of the newest version applied
    t = NOW
    for kind, dt, tokens, n in ops:
        t += dt
        if kind == "reserve":
            rid = f"r{n}"
            if rid not in reserved:
                book.reserve(ENT, rid, Usage(tokens, 0, 0))
                reserved[rid] = tokens
        elif kind == "settle":
            rid = f"r{n}"
            reserved.pop(rid, None)
            book.settle(ENT, (DAY,), rid, t, Usage(tokens, 0, 0, 1) if tokens else Usage())
            if tokens:
                completions.append((t, tokens))
        else:
            through = t - dt  # the agents' watermark lags the proxy's clock
            result = book.apply(status(n, through, prompt=sum(k for tc, k in completions if tc < through),
                                       allowance=5000))
            assert (result is RecordResult.APPLIED) == (held is None or n > held[0])
            if held is None or n > held[0]:
                held = (n, through)
        allowance, cut = (5000, held[1]) if held is not None else (1000, START)
        published = sum(k for tc, k in completions if tc < cut) if held is not None else 0
        own = sum(k for tc, k in completions if tc >= cut)
        truth = allowance - (published + own + sum(reserved.values()))
        assert book.state(ENT, DAY, t).remaining_units == truth
        refused = book.check(ENT, (DAY,), Usage(request, 0, 0), t, 3_600_000)
        assert (refused is None) == (truth >= request)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 100)), min_size=1, max_size=40),
       st.lists(st.integers(0, 1200), min_size=1, max_size=10))
def test_own_spending_is_counted_exactly_once_whatever_records_arrive(sends: list[tuple[int, int]],
                                                                      cuts: list[int]) -> None:
    """Records of growing versions whose through_ms only grows: remaining = allowance - everything sent, exactly
    (each completion counted by the record once it is covered, by the proxy before)."""
    book = BudgetBook()
    sent: list[tuple[int, int]] = []
    t = NOW
    for i, (dt, tokens) in enumerate(sends):
        t += dt
        book.settle(ENT, (DAY,), f"r{i}", t, Usage(tokens, 0, 0, 1))
        sent.append((t, tokens))
    total = sum(k for _, k in sent)
    for version, cut in enumerate(sorted(cuts), start=1):
        through = NOW + cut
        book.apply(status(version, through, prompt=sum(k for tc, k in sent if tc < through), allowance=10_000))
        assert book.state(ENT, DAY, t).remaining_units == 10_000 - total


def test_the_retry_cap_comes_from_the_budgets_settings() -> None:
    import argparse

    from tokenpools.config import load_settings
    from tokenpools.proxy.main import add_arguments, proxy_options

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    got = proxy_options(load_settings({}, ["budgets.retry_after_max_s=60"]), parser.parse_args(["--config", "x"]))
    assert got.budgets.retry_after_max_s == 60


# ---- stale views (docs/budgets.md#stale-views) ------------------------------------------------------------------

def test_own_spending_waits_from_the_latest_record_s_arrival_and_unavailable_follows_the_policy() -> None:
    refuse = BudgetSpec("daily", Period.DAY, 1000, on_stale=OnStale.REFUSE)
    book = BudgetBook()
    assert book.unacknowledged_since(ENT, "daily") is None
    book.settle(ENT, (refuse,), "r1", NOW, Usage(prompt=5))  # no record yet: waits from its own time
    assert book.unacknowledged_since(ENT, "daily") == NOW
    assert book.unavailable(ENT, (refuse,), NOW + 5_000, 5_000, OnStale.SPEND) is None  # not longer than the bound
    assert book.unavailable(ENT, (refuse,), NOW + 5_001, 5_000, OnStale.SPEND) is refuse
    plain = BudgetSpec("daily", Period.DAY, 1000)  # the default policy decides
    assert book.unavailable(ENT, (plain,), NOW + 9_000, 5_000, OnStale.SPEND) is None
    assert book.unavailable(ENT, (plain,), NOW + 9_000, 5_000, OnStale.REFUSE) is plain
    assert book.apply(status(1, NOW - 10), received_ms=NOW + 100) is RecordResult.APPLIED  # answered (not covered)
    assert book.unacknowledged_since(ENT, "daily") is None
    book.settle(ENT, (refuse,), "r2", NOW + 200, Usage(prompt=5))
    assert book.unacknowledged_since(ENT, "daily") == NOW + 200
    assert book.apply(status(1, NOW), received_ms=NOW + 300) is RecordResult.STALE  # an old version answers nothing
    assert book.unacknowledged_since(ENT, "daily") == NOW + 200
    with pytest.raises(ValueError, match="`stale_after_ms` must be positive, got 0"):
        StaleRule(stale_after_ms=0)


# ---- the others' reservations in flight (docs/budgets.md#the-others-reservations-in-flight) ---------------------

ME = "proxy-a"


def test_the_records_reservations_of_the_other_proxies_are_spent_and_its_own_counted_as_held() -> None:
    book = BudgetBook(proxy_id=ME)
    book.reserve(ENT, "r1", Usage(100, 0, 50))  # this proxy's, held now
    book.apply(status(1, NOW - 50, prompt=200).model_copy(
        update={"reserved_tokens": {ME: 999, "proxy-b": 120, "proxy-c": 30}}))  # its own 999 is an older level
    state = book.state(ENT, DAY, NOW)
    assert state.remaining_units == 1000 - 200 - 150 - (120 + 30)
    assert book.check(ENT, (DAY,), Usage(500, 0, 0), NOW, 3_600_000) is None
    assert book.check(ENT, (DAY,), Usage(501, 0, 0), NOW, 3_600_000) is not None
    # the next record: proxy-b's requests completed (now in the spending), nothing in flight
    book.apply(status(2, NOW, prompt=320))
    assert book.state(ENT, DAY, NOW).remaining_units == 1000 - 320 - 150


def test_a_record_whose_period_ended_adds_no_reservations_of_it() -> None:
    """After the reset the next period's account is in force; the levels were the ended period's records'."""
    book = BudgetBook(proxy_id=ME)
    book.apply(status(1, END - 10, prompt=200).model_copy(update={"reserved_tokens": {"proxy-b": 400}}))
    assert book.state(ENT, DAY, END - 5).remaining_units == 1000 - 200 - 400
    assert book.state(ENT, DAY, END + 5).remaining_units == 1000


def test_the_record_without_levels_is_the_same_bytes_as_before_the_field() -> None:
    record = status(1, NOW)
    assert b"reserved_tokens" not in record.model_dump_json().encode()
    assert BudgetStatus.model_validate_json(record.model_copy(update={"reserved_tokens": {"p": 3}})
                                            .model_dump_json()).reserved_tokens == {"p": 3}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 300), max_size=8), st.lists(st.tuples(st.integers(-40, 40), st.integers(1, 300)),
                                                            max_size=10),
       st.dictionaries(st.sampled_from((ME, "proxy-b", "proxy-c")), st.integers(1, 2000), max_size=3),
       st.integers(0, 3000), st.integers(1, 500), st.sampled_from((1.0, 4.0)))
def test_a_proxys_view_never_counts_its_own_reservation_twice(held: list[int], completed: list[tuple[int, int]],
                                                              levels: dict[str, int], published: int, request: int,
                                                              completion_weight: float) -> None:
    """Invariant *own counted once*: remaining = allowance − (the record's spending + own completions at or after
    its through_ms + own reservations held now + the other proxies' levels on the record), whatever the record says
    of this proxy's own level; the check admits exactly what fits that."""
    weights = Weights(completion=completion_weight)
    spec = BudgetSpec("daily", Period.DAY, 10_000, weights=weights)
    through = NOW - 10
    book = BudgetBook(proxy_id=ME)
    for i, tokens in enumerate(held):
        book.reserve(ENT, f"h{i}", Usage(tokens // 2, 0, tokens - tokens // 2))
    for i, (dt, tokens) in enumerate(completed):
        book.settle(ENT, (spec,), f"c{i}", through + dt, Usage(tokens, 0, 0, 1))
    book.apply(status(1, through, prompt=published, allowance=10_000, spec=spec).model_copy(
        update={"reserved_tokens": levels}))
    own = sum(Usage(t // 2, 0, t - t // 2).cost(weights) for t in held) + sum(k for dt, k in completed if dt >= 0)
    others = sum(n for p, n in levels.items() if p != ME) * max(weights.prompt, weights.completion)
    truth = 10_000 - published - own - others
    assert book.state(ENT, spec, NOW).remaining_units == pytest.approx(truth)
    units = Usage(request, 0, 0).cost(weights)
    refused = book.check(ENT, (spec,), Usage(request, 0, 0), NOW, 3_600_000)
    if abs(truth - units) > 1e-6:
        assert (refused is None) == (truth >= units)
