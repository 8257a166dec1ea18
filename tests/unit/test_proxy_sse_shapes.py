"""The SSE scanner on the Responses API's typed events, on a chat stream vLLM sent with a usage on every chunk, and
``usage_tokens`` on every endpoint's usage shape: any split of the stream gives the same bytes and observations; the
usage of ``response.completed`` settles, and of several usages the last; errors are seen. (The other chat and
completion shapes are in tests/component/test_proxy_pure.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenpools.runtime.sse import SseScanner, usage_tokens


def typed(obj: dict[str, Any]) -> bytes:
    return b"event: " + obj["type"].encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


USAGE = {"input_tokens": 11, "output_tokens": 3, "total_tokens": 14}
CREATED = typed({"type": "response.created", "sequence_number": 0, "response": {"id": "r", "usage": None}})
PART = typed({"type": "response.content_part.added", "sequence_number": 1, "part": {"type": "output_text",
                                                                                     "text": ""}})
EMPTY = typed({"type": "response.output_text.delta", "sequence_number": 2, "delta": ""})
DELTAS = [typed({"type": "response.output_text.delta", "sequence_number": 3 + i, "delta": f"t{i}"}) for i in range(3)]
DONE = typed({"type": "response.output_text.done", "sequence_number": 6, "text": "t0t1t2"})
COMPLETED = typed({"type": "response.completed", "sequence_number": 7, "response": {"id": "r", "usage": USAGE}})
STREAM = CREATED + PART + EMPTY + b"".join(DELTAS) + DONE + COMPLETED


def run(data: bytes, cuts: list[int], strip: bool = False) -> tuple[bytes, SseScanner]:
    scanner = SseScanner(strip)
    out, last = [], 0
    for cut in sorted(set(cuts)) + [len(data)]:
        out.append(scanner.feed(data[last:cut]))
        last = cut
    out.append(scanner.flush())
    return b"".join(out), scanner


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=30), st.booleans())
def test_any_split_of_a_responses_stream_gives_the_same_bytes_and_observations(cuts: list[int], strip: bool) -> None:
    out, scanner = run(STREAM, cuts, strip)
    assert out == STREAM  # its usage is the client's too: never stripped
    assert scanner.content_started and scanner.chunks == 4  # every delta is a chunk of output, the empty one too
    assert usage_tokens(scanner.usage) == (11, 3) and scanner.error is None


def test_content_starts_at_the_first_non_empty_delta() -> None:
    scanner = SseScanner(False)
    scanner.feed(CREATED + PART + EMPTY)
    assert not scanner.content_started and scanner.chunks == 1
    scanner.feed(DELTAS[0])
    assert scanner.content_started


@pytest.mark.parametrize("end", ["response.incomplete", "response.failed"])
def test_the_other_ends_of_a_response_carry_its_usage(end: str) -> None:
    error = {"code": "server_error", "message": "boom"} if end == "response.failed" else None
    _, scanner = run(CREATED + DELTAS[0] + typed({"type": end, "response": {"usage": USAGE, "error": error}}), [])
    assert usage_tokens(scanner.usage) == (11, 3)
    assert (scanner.error is not None) == (end == "response.failed")


def test_an_error_event_is_a_backend_error() -> None:
    _, scanner = run(CREATED + typed({"type": "error", "code": "server_error", "message": "boom"}), [5])
    assert scanner.error is not None and scanner.error["message"] == "boom" and scanner.usage is None


def test_a_chat_chunk_after_an_event_line_is_read_and_stripped_keeping_the_line() -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": "x"}}], "usage": {"prompt_tokens": 2,
                                                                            "completion_tokens": 1}}
    raw = b"event: message\ndata: " + orjson.dumps(chunk) + b"\n\n"
    out, scanner = run(raw, [3], strip=True)
    assert out.startswith(b"event: message\ndata: ") and b"usage" not in out and scanner.chunks == 1
    assert usage_tokens(scanner.usage) == (2, 1)


@pytest.mark.parametrize(("usage", "tokens"), [
    ({"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}, (7, 5)),  # chat, completions
    ({"prompt_tokens": 7, "total_tokens": 7}, (7, 0)),  # embeddings: nothing generated
    ({"input_tokens": 9, "output_tokens": 4, "total_tokens": 13}, (9, 4)),  # responses
    ({"prompt_tokens": 7, "total_tokens": 5}, None),  # a total below the prompt: malformed
    ({"prompt_tokens": 7}, None),
    ({"input_tokens": 9}, None),
    ({"input_tokens": -1, "output_tokens": 4}, None),
    ({"input_tokens": 9.0, "output_tokens": 4}, None),
    ({}, None),
    (None, None),
])
def test_usage_tokens_reads_every_endpoints_shape(usage: dict[str, Any] | None, tokens: tuple[int, int] | None) -> None:
    assert usage_tokens(usage) == tokens


# vLLM 0.32's answer to a chat stream with ``stream_options: {include_usage: true, continuous_usage_stats: true}``
# (4 tokens, the tiny model of docs/vllm.md), as it wrote it: a running total on every chunk, the role chunk's
# saying 0 tokens made, then the final usage alone (``choices: []``), then ``[DONE]``.
CONTINUOUS = (Path(__file__).parent / "data" / "vllm-chat-continuous-usage.sse").read_bytes()


@given(st.lists(st.integers(min_value=0, max_value=len(CONTINUOUS)), max_size=30))
def test_of_a_running_total_on_every_chunk_the_last_is_settled(cuts: list[int]) -> None:
    out, scanner = run(CONTINUOUS, cuts)
    assert out == CONTINUOUS  # the client asked for them: every usage passes
    assert CONTINUOUS.count(b'"usage":{') == 6 and b'"completion_tokens":0' in CONTINUOUS  # the first total: 0 made
    assert usage_tokens(scanner.usage) == (9, 4) and scanner.chunks == 5 and scanner.content_started


@given(st.lists(st.integers(min_value=0, max_value=len(CONTINUOUS)), max_size=30))
def test_running_totals_the_client_did_not_ask_for_are_all_removed(cuts: list[int]) -> None:
    out, scanner = run(CONTINUOUS, cuts, strip=True)
    assert b"usage" not in out and out.endswith(b"data: [DONE]\n\n")
    assert out.count(b"data: ") == 6  # the five chunks and [DONE]: the usage-only chunk is dropped
    assert usage_tokens(scanner.usage) == (9, 4)  # still seen, and the last one
