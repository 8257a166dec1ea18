"""InsertionOrder: positions of keys in a set edited in place, as a dict orders them, in O(log n)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.config.order import InsertionOrder

operations = st.lists(st.tuples(st.booleans(), st.integers(0, 150)), max_size=1500)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_positions_and_ranks_follow_a_dicts_order(steps: list[tuple[bool, int]]) -> None:
    order: InsertionOrder[int] = InsertionOrder()
    model: dict[int, None] = {}  # the reference: a dict keeps a replaced key's place
    for add, key in steps:
        if add:
            order.add(key)
            model[key] = None
        elif key in model:
            order.remove(key)
            del model[key]
        assert len(order) == len(model) and (key in order) == (key in model)
    keys = list(model)
    assert [order.position(k) for k in keys] == list(range(1, len(keys) + 1))
    assert sorted(keys, key=order.rank) == keys


def test_renumbering_keeps_the_tree_within_twice_the_set() -> None:
    order: InsertionOrder[int] = InsertionOrder(range(10))
    for key in range(10, 100_000):  # a churning set: one key in, the oldest out
        order.add(key)
        order.remove(key - 10)
    assert len(order) == 10 and [order.position(k) for k in range(99_990, 100_000)] == list(range(1, 11))
    assert len(order._tree) <= 2 * 10 + 64 + 1
