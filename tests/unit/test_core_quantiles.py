"""Nearest-rank percentiles (tokenpools.core.quantiles): always a sample, with at least a fraction q at or below."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.quantiles import p99, percentile

VALUES = st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=300)


def test_examples() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([3.0, 1.0, 2.0], 0.0) == 1.0
    assert p99([float(i) for i in range(1, 101)]) == 99.0
    assert p99([float(i) for i in range(1, 1001)]) == 990.0


@settings(max_examples=300, deadline=None)
@given(VALUES, st.floats(0.0, 1.0))
def test_the_percentile_is_a_sample_with_at_least_q_of_them_at_or_below(values: list[float], q: float) -> None:
    value = percentile(values, q)
    assert value in values
    at_or_below = sum(v <= value for v in values)
    assert at_or_below >= q * len(values) - 1e-9
    assert sum(v < value for v in values) < max(1, q * len(values) + 1e-9)  # and it is the smallest such
