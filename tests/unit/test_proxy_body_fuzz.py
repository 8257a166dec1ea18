"""Property-based fuzzing of the proxy's body parsing (``proxy/admission/body.py``) and prompt estimate
(``proxy/admission/estimate.py``): any bytes, any JSON value, any JSON-ish structure in the fields admission reads. The
outcome is always clear: a ``ParsedRequest`` with a non-negative estimate, or a ``BadRequest`` with a code from its
closed set; never another exception (which the proxy would answer with a 500). Deterministic (derandomized)."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.proxy.admission.body import BadRequest, Kind, ParsedRequest, parse
from tokenpools.proxy.admission.estimate import chat_prompt_tokens, completion_prompt_tokens, responses_input_tokens, text_tokens

FUZZ = settings(max_examples=400, deadline=None, derandomize=True, database=None)

leaves = st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats(allow_nan=False,
                                                                                allow_infinity=False) | st.text()
json_values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=30)
roles = st.sampled_from(["user", "system", "assistant", "tool"]) | json_values
parts = st.fixed_dictionaries({}, optional={"type": st.sampled_from(["text", "image_url", "input_image", "x"]) | json_values,
                                             "text": st.text() | json_values, "image_url": json_values})
messages = st.lists(st.fixed_dictionaries({"role": roles}, optional={
    "content": st.text() | st.lists(parts | st.text() | json_values, max_size=4) | json_values,
    "name": st.text() | json_values, "tool_calls": json_values}) | json_values, max_size=5)
bodies = st.fixed_dictionaries({}, optional={
    "model": st.just("fake-model") | json_values, "messages": messages | json_values,
    "prompt": st.text() | st.lists(st.integers(0, 2**31)) | st.lists(st.lists(st.integers(0, 2**31), max_size=3))
              | st.lists(st.text(), max_size=3) | json_values,
    "stream": st.booleans() | json_values, "stream_options": st.fixed_dictionaries(
        {}, optional={"include_usage": st.booleans() | json_values}) | json_values,
    "max_tokens": st.integers(-5, 2**40) | json_values, "max_completion_tokens": st.integers(-5, 100) | json_values,
    "n": st.integers(-2, 8) | json_values, "tools": json_values,
    # embeddings and responses
    "input": st.text() | st.lists(st.text(), max_size=3) | st.lists(st.integers(0, 2**31), max_size=3)
             | st.lists(st.lists(st.integers(0, 2**31), max_size=3), max_size=3) | messages | json_values,
    "instructions": st.text() | json_values, "max_output_tokens": st.integers(-5, 2**40) | json_values,
    "priority": st.integers(-2**63, 2**63) | json_values})


def clear_outcome(kind: Kind, raw: bytes) -> None:
    try:
        parsed = parse(kind, raw)
    except BadRequest as exc:
        assert exc.code in BadRequest.CODES and exc.message and 400 <= exc.status < 500
        return
    assert isinstance(parsed, ParsedRequest) and parsed.prompt_tokens_est >= 0 and parsed.n >= 1
    assert orjson.loads(parsed.rewrite(parsed.max_tokens or 16))["model"] == parsed.model
    assert "priority" not in orjson.loads(parsed.rewrite(16)) and orjson.loads(parsed.rewrite(16, 7))["priority"] == 7


@FUZZ
@given(kind=st.sampled_from(Kind), raw=st.binary(max_size=300))
def test_any_bytes_get_a_clear_outcome(kind: Kind, raw: bytes) -> None:
    clear_outcome(kind, raw)


@FUZZ
@given(kind=st.sampled_from(Kind), value=json_values)
def test_any_json_value_gets_a_clear_outcome(kind: Kind, value: Any) -> None:
    clear_outcome(kind, orjson.dumps(value))


@FUZZ
@given(kind=st.sampled_from(Kind), body=bodies)
def test_any_request_shaped_body_gets_a_clear_outcome(kind: Kind, body: dict[str, Any]) -> None:
    clear_outcome(kind, orjson.dumps(body))


@given(depth=st.integers(1, 1100), kind=st.sampled_from(Kind))
@settings(max_examples=30, deadline=None, derandomize=True, database=None)
def test_deep_nesting_gets_a_clear_outcome(depth: int, kind: Kind) -> None:
    nested = b"[" * depth + b'{"a": "text"}' + b"]" * depth
    clear_outcome(kind, b'{"model": "m", "messages": [{"role": "user", "content": "x", "tool_calls": %s}], '
                        b'"tools": %s, "prompt": %s, "input": %s}' % (nested, nested, nested, nested))


@FUZZ
@given(messages=st.lists(json_values, max_size=5), tools=json_values, prompt=json_values, text=st.text())
def test_the_estimates_take_anything(messages: list[Any], tools: Any, prompt: Any, text: str) -> None:
    assert chat_prompt_tokens(messages, tools) >= 3
    assert completion_prompt_tokens(prompt) >= 0
    assert responses_input_tokens(prompt, text, tools) >= 3 and responses_input_tokens(messages) >= 3
    assert 0 <= text_tokens(text) <= len(text.encode("utf-8", "surrogatepass"))
