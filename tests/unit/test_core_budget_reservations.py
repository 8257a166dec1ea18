"""The fleet's reservations in flight on the budget records (tokenpools.core.budget_reservations;
docs/budgets.md#the-others-reservations-in-flight): the levels' fold and the rule a proxy applies to them."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from tokenpools.core.budget_reservations import others_reserved_tokens, pending_units, reserve, reserved_units
from tokenpools.core.budgets import Weights, request_units

PROXIES = st.sampled_from(("p0", "p1", "p2", "p3"))
LEVELS = st.dictionaries(PROXIES, st.integers(1, 10**7), max_size=4)
WEIGHTS = st.builds(Weights, st.sampled_from((0.0, 0.5, 1.0, 4.0)), st.sampled_from((0.1, 1.0)),
                    st.sampled_from((0.0, 1.0, 4.0)))


@given(st.lists(st.tuples(PROXIES, st.integers(1, 100_000)), max_size=40), st.randoms(use_true_random=False))
def test_the_level_is_what_each_proxy_admitted_and_has_not_completed(requests, rnd) -> None:
    """Invariant *levels are in flight*: whatever the interleaving (each completion after its admission), after every
    event a proxy's level is the tokens of its requests admitted and not completed, and no proxy is kept at 0."""
    order: list[tuple[int, int]] = []
    for i in range(len(requests)):  # each admission anywhere, its completion somewhere after it
        order.insert(rnd.randint(0, len(order)), (i, +1))
        order.insert(rnd.randint(order.index((i, +1)) + 1, len(order)), (i, -1))
    levels: dict[str, int] = {}
    open_: set[int] = set()
    for i, sign in order:
        proxy, tokens = requests[i]
        reserve(levels, proxy, sign * tokens)
        (open_.add if sign > 0 else open_.discard)(i)
        expected: dict[str, int] = {}
        for j in open_:
            expected[requests[j][0]] = expected.get(requests[j][0], 0) + requests[j][1]
        assert levels == expected


def test_a_completion_the_levels_never_saw_admitted_does_not_go_below_zero() -> None:
    """A worker that took a partition over sees completions of requests admitted before it started."""
    levels: dict[str, int] = {}
    reserve(levels, "p0", -500)
    assert levels == {}
    levels = {"p0": 100, "p1": 7}
    reserve(levels, "p0", -500)
    assert levels == {"p1": 7}


@given(st.floats(0, 1e6, allow_nan=False), LEVELS, PROXIES, st.integers(0, 10**7), WEIGHTS)
def test_a_proxys_view_never_counts_its_own_reservation_twice(own: float, levels: dict[str, int], me: str,
                                                              mine_in_record: int, weights: Weights) -> None:
    """Invariant *own counted once*: the proxy counts its own reservations as it holds them (in ``own``), so the
    record's level for it changes nothing, and what is added is exactly the others' levels, each once."""
    with_mine = {**levels, me: mine_in_record} if mine_in_record else {k: v for k, v in levels.items() if k != me}
    without = {k: v for k, v in levels.items() if k != me}
    assert pending_units(own, with_mine, me, weights) == pending_units(own, without, me, weights)
    others = sum(without.values())
    assert others_reserved_tokens(with_mine, me) == others
    assert math.isclose(pending_units(own, with_mine, me, weights), own + reserved_units(others, weights),
                        rel_tol=1e-12)


@given(st.integers(0, 10**6), st.integers(0, 10**5), WEIGHTS)
def test_the_others_reservations_are_never_priced_below_what_they_reserve(prompt: int, estimate: int,
                                                                         weights: Weights) -> None:
    """Invariant *errs towards refusing*: a level carries tokens, not the prompt/estimate split, so it is priced at
    the higher weight: at least the reservation's own price, and exactly it when the two weights are equal."""
    units = reserved_units(prompt + estimate, weights)
    assert units >= request_units(prompt, estimate, weights)
    if weights.prompt == weights.completion:
        assert units == request_units(prompt, estimate, weights)


@given(LEVELS, WEIGHTS)
def test_every_request_in_flight_at_through_is_counted_by_every_proxys_view(levels: dict[str, int],
                                                                           weights: Weights) -> None:
    """Invariant *nothing in flight is invisible*: a proxy whose own reservations are those the record counted for
    it (nothing admitted or completed since) sees the whole fleet's reservations at ``through``, whichever it is."""
    total = reserved_units(sum(levels.values()), weights)
    for me in ("p0", "p1", "p2", "p3"):
        own = reserved_units(levels.get(me, 0), weights)
        assert math.isclose(pending_units(own, levels, me, weights), total, rel_tol=1e-12, abs_tol=1e-9)
