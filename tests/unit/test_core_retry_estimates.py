"""The retry estimates on their own (core.retry_estimates); the refusals that carry them are in
test_core_admission_retry.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tokenpools.core.retry_estimates import (
    budget_wait_ms,
    bucket_fits,
    learn_service_s,
    never_fits_wait_s,
    slot_estimate_ms,
    slot_wait_ms,
    whole_seconds,
)

rates = st.floats(0.01, 1e6, allow_nan=False)
levels = st.floats(-1e6, 1e6, allow_nan=False)
times = st.floats(0.0, 1e6, allow_nan=False)


@given(st.integers(0, 10**6), levels, times, st.floats(0.0, 1e3), rates, st.floats(0.0, 1e3))
def test_a_budget_wait_is_the_first_whole_ms_at_which_the_bucket_holds_the_cost(
        cost: int, level: float, updated_s: float, since_s: float, rate: float, depth_extra: float) -> None:
    depth = cost + depth_extra  # a cost the bucket can hold
    now_s = updated_s + since_s
    wait_ms = budget_wait_ms(cost, level, updated_s, depth, rate, now_s)
    assert wait_ms >= 1 and bucket_fits(cost, level, updated_s, depth, rate, now_s, wait_ms)
    assert wait_ms == 1 or not bucket_fits(cost, level, updated_s, depth, rate, now_s, wait_ms - 1)


def test_a_cost_that_never_fits_waits_the_window_or_a_minute_at_a_zero_rate() -> None:
    assert never_fits_wait_s(10.0, 5.0) == 10 and never_fits_wait_s(0.2, 5.0) == 1
    assert never_fits_wait_s(10.0, 0.0) == 60


@given(st.floats(0.0, 100.0), st.floats(0.0, 100.0), st.integers(0, 1000), st.integers(-5, 1000),
       st.integers(1, 1000), st.integers(1000, 60_000))
def test_a_slot_wait_stays_within_the_floor_and_the_ceiling(service_s: float, pool_service_s: float, in_flight: int,
                                                            releases: int, floor_ms: int, ceiling_ms: int) -> None:
    wait_ms = slot_wait_ms(service_s, pool_service_s, in_flight, releases, floor_ms, ceiling_ms)
    assert floor_ms <= wait_ms <= ceiling_ms
    if (service_s == 0 and pool_service_s == 0) or in_flight == 0:
        assert wait_ms == ceiling_ms  # nothing to estimate from: the longest wait


def test_a_slot_wait_is_k_times_s_over_n_and_uses_the_pools_service_time_until_its_own_is_learned() -> None:
    assert slot_wait_ms(2.0, 9.0, 4, 1, 50, 10_000) == 500  # 1 × 2 s ÷ 4
    assert slot_wait_ms(0.0, 2.0, 4, 3, 50, 10_000) == 1500  # the pool's: 3 × 2 s ÷ 4
    assert slot_wait_ms(2.0, 0.0, 400, 1, 50, 10_000) == 50  # the floor
    assert slot_estimate_ms(2.0, 4, 30, 50) == 15_000  # the queue's: no ceiling
    assert slot_estimate_ms(0.0, 4, 1, 50) is None and slot_estimate_ms(2.0, 0, 1, 50) is None


def test_service_times_start_at_the_first_sample_then_move_by_alpha() -> None:
    assert learn_service_s(0.0, 3.0, 0.2) == 3.0
    assert learn_service_s(3.0, 1.0, 0.2) == 3.0 + 0.2 * (1.0 - 3.0)


@given(st.integers(0, 10**7))
def test_whole_seconds_round_up_and_are_at_least_one(wait_ms: int) -> None:
    s = whole_seconds(wait_ms)
    assert s >= 1 and s * 1000 >= wait_ms and (s == 1 or (s - 1) * 1000 < wait_ms)
