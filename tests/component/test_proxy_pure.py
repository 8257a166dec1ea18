"""The request path's pure helpers: the SSE scanner (any split of the byte stream gives the same result), the n_in
estimator, body parsing and rewriting, key lookup. No sockets."""

from __future__ import annotations

import hashlib

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.access.auth import bearer_key
from tokenpools.proxy.admission.body import Kind, parse
from tokenpools.proxy.admission.estimate import chat_prompt_tokens, completion_prompt_tokens, text_tokens
from tokenpools.runtime.sse import SseScanner, usage_tokens
from tokenpools.proxy.access.tenancy import Tenancy

pytestmark = pytest.mark.component


def event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


ROLE = event({"choices": [{"index": 0, "delta": {"role": "assistant"}}], "usage": None})
CONTENT = [event({"choices": [{"index": 0, "delta": {"content": f"t{i} "}}], "usage": None}) for i in range(5)]
USAGE = event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}})
STREAM = ROLE + b"".join(CONTENT) + USAGE + b"data: [DONE]\n\n"


def run(data: bytes, cuts: list[int], strip: bool) -> tuple[bytes, SseScanner]:
    scanner = SseScanner(strip)
    out, last = [], 0
    for cut in sorted(set(cuts)) + [len(data)]:
        out.append(scanner.feed(data[last:cut]))
        last = cut
    out.append(scanner.flush())
    return b"".join(out), scanner


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=30), st.booleans())
def test_any_split_of_the_stream_gives_the_same_bytes_and_observations(cuts: list[int], strip: bool) -> None:
    out, scanner = run(STREAM, cuts, strip)
    assert out == (STREAM.replace(USAGE, b"") if strip else STREAM)
    assert scanner.content_started and scanner.chunks == 6
    assert usage_tokens(scanner.usage) == (7, 5)


def test_content_starts_at_the_first_content_chunk_not_the_role_chunk() -> None:
    scanner = SseScanner(True)
    scanner.feed(ROLE)
    assert not scanner.content_started
    scanner.feed(CONTENT[0][:10])
    assert not scanner.content_started  # half an event is not an event
    assert scanner.feed(CONTENT[0][10:]) == CONTENT[0] and scanner.content_started


def test_crlf_streams_comments_and_garbage_pass_through() -> None:
    crlf = STREAM.replace(b"\n", b"\r\n")
    out, scanner = run(crlf, [13, 200], strip=False)
    assert out == STREAM and usage_tokens(scanner.usage) == (7, 5)
    odd = b": keep-alive\n\nevent: ping\ndata: {}\n\ndata: not json\n\n"
    assert run(odd, [5], strip=True)[0] == odd


def test_usage_on_a_content_chunk_is_removed_when_not_asked_for() -> None:
    rider = event({"choices": [{"index": 0, "delta": {"content": "x"}}], "usage": {"prompt_tokens": 1,
                                                                                      "completion_tokens": 1}})
    out = SseScanner(True).feed(rider)
    assert orjson.loads(out[6:]) == {"choices": [{"index": 0, "delta": {"content": "x"}}]}
    assert SseScanner(False).feed(rider) == rider


def test_an_error_event_from_the_backend_is_noticed() -> None:
    scanner = SseScanner(True)
    scanner.feed(event({"error": {"message": "boom", "code": 500}}))
    assert scanner.error == {"message": "boom", "code": 500}


@pytest.mark.parametrize(("text", "tokens"), [("", 0), ("abcd", 1), ("abcde", 2), ("Hello there, how are you today?", 8),
                                               ("日本語", 3)])
def test_text_estimate(text: str, tokens: int) -> None:
    assert text_tokens(text) == tokens


def test_chat_and_completion_estimates() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [
        {"type": "text", "text": "What is in this image?"}, {"type": "image_url", "image_url": {"url": "x"}}]}]
    assert chat_prompt_tokens(messages) == 3 + 4 + 3 + 4 + 6 + 85
    assert completion_prompt_tokens([1, 2, 3]) == 3
    assert completion_prompt_tokens([[1, 2], [3]]) == 3
    assert completion_prompt_tokens(["abcd", "abcdabcd"]) == 3


def test_parse_and_rewrite() -> None:
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                        "stream_options": {"continuous_usage_stats": False}, "n": 2})
    parsed = parse(Kind.CHAT, raw)
    assert (parsed.stream, parsed.client_wants_usage, parsed.max_tokens, parsed.n) == (True, False, None, 2)
    body = orjson.loads(parsed.rewrite(64))
    assert body["max_tokens"] == 64
    assert body["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}


def test_keys_are_looked_up_by_digest_only() -> None:
    pool = PoolSpec("p", "m", Capacity(1, 1, 1))
    table = Tenancy.build(0, {"p": pool}, {"a": EntitlementSpec("a", "p", ServiceClass.SPOT, 100)},
                          {hashlib.sha256(b"sk-a").hexdigest(): "a"})
    found = table.lookup("Bearer sk-a")
    assert found is not None and found.entitlements == ("a",) and table.lookup("bearer   sk-a ") == found
    assert table.lookup("Bearer sk-b") is None and table.lookup("sk-a") is None and table.lookup(None) is None
    assert bearer_key("Token sk-a") is None
    assert "sk-a" not in repr(table._tenants)
