"""What a finished request is settled at (core.settlement): the backend's usage wins; without it, the rule by how
the request ended, and its invariants."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenpools.core.settlement import Ending, Used, used_tokens

tokens = st.integers(min_value=0, max_value=1_000_000)
reported = st.none() | st.tuples(tokens, tokens)


@pytest.mark.parametrize(("ending", "stream", "chunks", "expected"), [
    (Ending.RAN, False, 0, Used(100, 256)),  # answered, count unknown: the cap
    (Ending.RAN, True, 40, Used(100, 40)),  # a stream: the chunks it delivered
    (Ending.BACKEND_FAILED, False, 0, Used(0, 0)),  # refused or failed before any output: no work
    (Ending.BACKEND_FAILED, True, 0, Used(0, 0)),
    (Ending.BACKEND_FAILED, True, 7, Used(100, 7)),  # failed mid-stream: what it streamed
    (Ending.CUT, False, 0, Used(100, 0)),  # the client left, evicted, timed out: the prompt only
    (Ending.CUT, True, 12, Used(100, 12)),
])
def test_without_usage_the_rule_by_ending(ending: Ending, stream: bool, chunks: int, expected: Used) -> None:
    assert used_tokens(None, ending, stream, chunks, 100, 256) == expected


@given(reported=st.tuples(tokens, tokens), ending=st.sampled_from(Ending), stream=st.booleans(), chunks=tokens,
       prompt_est=tokens, max_tokens=tokens)
def test_reported_usage_always_wins(reported: tuple[int, int], ending: Ending, stream: bool, chunks: int,
                                    prompt_est: int, max_tokens: int) -> None:
    assert used_tokens(reported, ending, stream, chunks, prompt_est, max_tokens) == reported


@given(ending=st.sampled_from(Ending), stream=st.booleans(), chunks=tokens, prompt_est=tokens, max_tokens=tokens)
def test_unreported_use_is_never_negative_and_bounded(ending: Ending, stream: bool, chunks: int, prompt_est: int,
                                                      max_tokens: int) -> None:
    """Never negative; the prompt is never charged above its estimate; a non-stream never above its reservation's
    cap (n_in estimate + max_tokens), a stream never above what it streamed."""
    prompt, completion = used_tokens(None, ending, stream, chunks, prompt_est, max_tokens)
    assert 0 <= prompt <= prompt_est
    assert 0 <= completion <= (chunks if stream else max_tokens)
    if not stream:
        assert prompt + completion <= prompt_est + max_tokens
