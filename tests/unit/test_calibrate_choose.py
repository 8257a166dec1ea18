"""A step's statistics and the chosen step (pure): worked cases and the named invariants.

Invariants (hypothesis): the chosen step's P99 TTFT is within the target; a larger target never chooses a smaller
concurrency; no step with a failed request is chosen; no larger UNDER_TARGET step is passed over.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.calibrate.choose import StepVerdict, choose, verdict
from tokenpools.calibrate.stats import RequestOutcome, RequestResult, StepStats, summarize

PROPERTY = settings(max_examples=300, deadline=None)


def ok(start_s: float, ttft_s: float, end_s: float, prompt: int = 10, completion: int = 5) -> RequestResult:
    return RequestResult(RequestOutcome.OK, start_s, end_s, ttft_s, prompt, completion)


def step(concurrency: int, ttft_p99_s: float | None, failed: int = 0) -> StepStats:
    answered = 0 if ttft_p99_s is None else 10
    return StepStats(concurrency=concurrency, requests=answered + failed, answered=answered, elapsed_s=1.0,
                     prompt_tokens=100, completion_tokens=50, ttft_p50_s=ttft_p99_s, ttft_p99_s=ttft_p99_s,
                     e2e_p99_s=ttft_p99_s, failures={RequestOutcome.TIMED_OUT: failed} if failed else {})


def test_summarize_counts_the_answered_requests_tokens_over_the_steps_time() -> None:
    results = [ok(10.0, 0.1, 10.5), ok(10.0, 0.3, 11.0, prompt=20, completion=15),
               RequestResult(RequestOutcome.HTTP_ERROR, 10.5, 10.6, status=503, detail="HTTP 503: busy"),
               ok(10.5, 0.2, 12.0)]
    s = summarize(2, 10.0, results)
    assert (s.concurrency, s.requests, s.answered, s.failed) == (2, 4, 3, 1)
    assert s.elapsed_s == 2.0  # from the step's start to its last request's end
    assert (s.prompt_tokens, s.completion_tokens) == (40, 25)  # the failed request's (unknown) tokens: none
    assert (s.output_tokens_per_s, s.total_tokens_per_s) == (12.5, 32.5)
    assert (s.ttft_p50_s, s.ttft_p99_s, s.e2e_p99_s) == (0.2, 0.3, 1.5)  # nearest rank, answered requests only
    assert s.failures == {RequestOutcome.HTTP_ERROR: 1} and s.failure_detail == "HTTP 503: busy"
    assert s.backend_queue_mean_s is None  # not known
    assert summarize(2, 10.0, results, backend_queue_s=0.6).backend_queue_mean_s == pytest.approx(0.2)  # 3 answered


def test_a_step_with_nothing_answered_has_no_percentiles_and_no_throughput() -> None:
    s = summarize(1, 0.0, [RequestResult(RequestOutcome.BROKEN, 0.0, 0.0, detail="refused")])
    assert (s.ttft_p99_s, s.e2e_p99_s, s.total_tokens_per_s) == (None, None, 0.0)
    assert verdict(s, 1.0) is StepVerdict.FAILED


@pytest.mark.parametrize(("s", "expected"), [
    (step(1, 0.5), StepVerdict.UNDER_TARGET),
    (step(1, 1.0), StepVerdict.UNDER_TARGET),  # "stays under" includes the target itself
    (step(1, 1.0001), StepVerdict.OVER_TARGET),
    (step(1, 0.1, failed=1), StepVerdict.FAILED),
    (step(1, None), StepVerdict.FAILED),
    (StepStats(1, 10, 10, 1.0, 0, 0, 0.1, 0.1, 0.2), StepVerdict.FAILED),  # answered, but no token counted
])
def test_verdicts(s: StepStats, expected: StepVerdict) -> None:
    assert verdict(s, 1.0) is expected


def test_the_largest_concurrency_under_target_is_chosen_even_after_a_noisy_step() -> None:
    steps = [step(1, 0.2), step(2, 1.3), step(4, 0.9), step(8, 2.0), step(16, 0.5, failed=2)]
    chosen = choose(steps, 1.0)
    assert chosen is not None and chosen.concurrency == 4
    assert choose(steps, 0.1) is None


STEPS = st.lists(
    st.tuples(st.one_of(st.none(), st.floats(0.0, 10.0, allow_nan=False)), st.integers(0, 2)),
    min_size=1, max_size=8,
).map(lambda rows: [step(2**i, p99, failed) for i, (p99, failed) in enumerate(rows)])
TARGET = st.floats(0.0, 12.0, allow_nan=False)


@PROPERTY
@given(STEPS, TARGET)
def test_the_chosen_step_meets_the_target_and_no_larger_one_does(steps: list[StepStats], target_s: float) -> None:
    chosen = choose(steps, target_s)
    if chosen is None:
        assert all(verdict(s, target_s) is not StepVerdict.UNDER_TARGET for s in steps)
        return
    assert chosen.ttft_p99_s is not None and chosen.ttft_p99_s <= target_s
    assert chosen.failed == 0
    assert all(s.concurrency <= chosen.concurrency for s in steps if verdict(s, target_s) is StepVerdict.UNDER_TARGET)


@PROPERTY
@given(STEPS, TARGET, TARGET)
def test_a_larger_target_never_chooses_a_smaller_concurrency(steps: list[StepStats], a: float, b: float) -> None:
    low, high = sorted((a, b))
    chosen_low, chosen_high = choose(steps, low), choose(steps, high)
    if chosen_low is not None:
        assert chosen_high is not None and chosen_high.concurrency >= chosen_low.concurrency
