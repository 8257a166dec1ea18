"""``core.rounding.round_half_even`` is the builtin ``round`` of a non-negative float, bit for bit."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tokenpools.core.rounding import round_half_even


@given(st.floats(min_value=0.0, max_value=2.0**70, allow_nan=False, allow_infinity=False))
def test_it_is_round_of_any_non_negative_float(x: float) -> None:
    assert round_half_even(x) == round(x)


@given(st.integers(0, 2**52), st.sampled_from([0.5, 0.25, 0.75, 0.4999999999999999, 0.5000000000000001]))
def test_ties_go_to_the_even_neighbour_and_near_ties_to_the_nearest(whole: int, fraction: float) -> None:
    x = whole + fraction
    assert round_half_even(x) == round(x)


@given(st.integers(0, 10**7), st.sampled_from([1000, 10**9]))
def test_event_times_in_ms_and_ns_round_as_before(ms: int, scale: int) -> None:
    """The replay's uses: a time in s (whole ms, or ms plus a fraction) to whole ms or ns."""
    for t in (ms / 1000, ms / 1000 + 0.0004, ms / 1000 + 0.0005, ms * 0.001):
        assert round_half_even(t * scale) == round(t * scale)


@given(st.floats(min_value=1.0, max_value=2.0**60, allow_nan=False, allow_infinity=False))
def test_a_whole_number_prints_as_format_0f_prints_it(x: float) -> None:
    """``core.admission`` prints a token-budget refusal's bucket level >= 1 this way."""
    assert str(round_half_even(x)) == format(x, ".0f")
