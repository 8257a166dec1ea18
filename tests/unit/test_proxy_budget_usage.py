"""The cached prompt tokens budgets price apart, read from the backend's usage on every endpoint's shape
(tokenpools/runtime/sse.py ``cached_tokens``; docs/budgets.md)."""

from __future__ import annotations

from typing import Any

import pytest

from tokenpools.runtime.sse import SseScanner, cached_tokens


@pytest.mark.parametrize(("usage", "cached"), [
    ({"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 64}}, 64),  # chat
    ({"input_tokens": 100, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 32}}, 32),  # responses
    ({"prompt_tokens": 100, "completion_tokens": 5}, 0),  # no details: none cached
    ({"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": None}, 0),  # vLLM without caching stats
    ({"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": "64"}}, 0),
    ({"prompt_tokens": 100, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": -1}}, 0),
    ({"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 64}}, 10),  # ≤ prompt
    ({"prompt_tokens": "x", "prompt_tokens_details": {"cached_tokens": 4}}, 0),  # a malformed usage: nothing
    (None, 0),
])
def test_cached_tokens_reads_every_shape_and_is_0_when_absent(usage: dict[str, Any] | None, cached: int) -> None:
    assert cached_tokens(usage) == cached


def test_a_streams_final_usage_chunk_carries_the_cached_tokens() -> None:
    scanner = SseScanner(strip_usage=True)
    scanner.feed(b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
                 b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1,'
                 b'"prompt_tokens_details":{"cached_tokens":8}}}\n\ndata: [DONE]\n\n')
    assert cached_tokens(scanner.usage) == 8
