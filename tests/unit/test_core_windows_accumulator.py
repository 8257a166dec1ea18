"""``core.accumulator.Accumulator`` and ``add_many``: the in-place form of the window algebra equals folding ``add``.

Invariant 7 (one step or many gives the same result), for the hot-loop form: any events (late ones, ones out of
order, negative times) added one ``add`` at a time, through ``add_many`` in one call, or through one
``Accumulator`` with ``state()`` and ``close`` interleaved anywhere, give bit-for-bit the same states, the same
``accepted`` flags and the same samples.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.accumulator import Accumulator, add, add_many
from tokenpools.core.windows import UsageEvent, UsageKind, WindowState, close, empty

PROPERTY = settings(max_examples=200, deadline=None, database=None)

EVENTS = st.lists(
    st.builds(UsageEvent, kind=st.sampled_from(list(UsageKind)), t_ms=st.integers(-3_000, 30_000),
              cost_tokens=st.integers(0, 500), served_tokens=st.integers(0, 500), kv_bytes=st.integers(0, 10**9)),
    max_size=40,
)
# between events: nothing, a close at some time, or (for the accumulator) a look at its state
STEPS = st.lists(st.one_of(st.none(), st.integers(0, 40_000), st.just("state")), max_size=40)
WIDTH_MS = st.sampled_from([1000, 3000, 5000])
GRACE_MS = st.sampled_from([0, 500, 2000])


def fold(state: WindowState, events: list[UsageEvent]) -> tuple[WindowState, list[bool]]:
    flags = []
    for e in events:
        state, accepted = add(state, e)
        flags.append(accepted)
    return state, flags


@PROPERTY
@given(events=EVENTS, width=WIDTH_MS, start=st.integers(-1, 4))
def test_add_many_equals_folding_add(events: list[UsageEvent], width: int, start: int) -> None:
    state = empty(width, start)
    assert add_many(state, events) == fold(state, events)


@PROPERTY
@given(events=EVENTS, steps=STEPS, width=WIDTH_MS, grace=GRACE_MS)
def test_an_accumulator_with_closes_anywhere_equals_the_pure_functions(events: list[UsageEvent], steps: list,
                                                                      width: int, grace: int) -> None:
    pure, acc = empty(width), Accumulator(empty(width))
    pure_samples, acc_samples = [], []
    now = 0
    for i, e in enumerate(events):
        step = steps[i] if i < len(steps) else None
        if step == "state":
            assert acc.state() == pure
        elif step is not None:
            now = max(now, step)  # closes move forward, as a tick's horizon does
            pure, out = close(pure, now, grace)
            pure_samples += out
            acc_samples += acc.close(now, grace)
        pure, accepted = add(pure, e)
        assert acc.add(e) is accepted
    assert acc.state() == pure
    pure, out = close(pure, 100_000, grace)
    assert acc.close(100_000, grace) == out
    assert acc_samples == pure_samples
    assert acc.state() == pure


@PROPERTY
@given(events=EVENTS, width=WIDTH_MS)
def test_add_values_is_add_without_the_event_record(events: list[UsageEvent], width: int) -> None:
    by_event, by_values = Accumulator(empty(width)), Accumulator(empty(width))
    for e in events:
        assert by_values.add_values(e.kind, e.t_ms, e.cost_tokens, e.served_tokens, e.kv_bytes) is by_event.add(e)
    assert by_values.state() == by_event.state()


def test_the_state_is_the_same_object_until_an_event_is_accepted() -> None:
    state, _ = close(add(empty(1000), UsageEvent(UsageKind.REFUSED, 10, cost_tokens=5))[0], 3000, 0)
    acc = Accumulator(state)
    assert acc.state() is state and not acc.changed
    assert not acc.add(UsageEvent(UsageKind.ADMITTED, 1500, kv_bytes=1))  # window 1 is closed: late
    assert acc.state() is state and not acc.changed
    assert acc.add(UsageEvent(UsageKind.ADMITTED, 3500, kv_bytes=1))
    assert acc.changed
    after = acc.state()
    assert after == add(state, UsageEvent(UsageKind.ADMITTED, 3500, kv_bytes=1))[0]
    assert not acc.changed and acc.state() is after


def test_floats_are_summed_in_the_same_order_bit_for_bit() -> None:
    """Integrals are float sums; the accumulator must not regroup them (e.g. sum ints first), or floats drift."""
    events = [UsageEvent(UsageKind.ADMITTED, t, kv_bytes=10**15 + t) for t in range(0, 999, 7)]
    events += [UsageEvent(UsageKind.COMPLETED, t, kv_bytes=10**15 + t - 3) for t in range(3, 999, 7)]
    acc = Accumulator(empty(1000))
    for e in events:
        acc.add(e)
    (bucket,) = acc.state().buckets.values()
    (expected,) = fold(empty(1000), events)[0].buckets.values()
    assert bucket.kv_integral_ms.hex() == expected.kv_integral_ms.hex()
    assert bucket == expected
