"""The OpenAI request body: validated just enough to admit it, then rewritten for the backend.

Validation is deliberately shallow (the backend validates the rest and its 400 is passed through): a JSON object,
a ``model``, and what drives admission, by endpoint (``Kind``):

- chat: ``messages``; completions: ``prompt``; both with well-typed ``stream``, ``stream_options``,
  ``max_tokens``/``max_completion_tokens`` and ``n``;
- embeddings: ``input`` (a string, an array of strings, of token ids, or of arrays of token ids). It costs its
  input tokens only: nothing is generated, so nothing is reserved for output, and it never streams;
- responses: ``input`` (a string or an array of items), ``instructions``, ``max_output_tokens`` and ``stream``.
  It costs like chat: the input estimate plus the output cap (the pool default when absent).

The rewrite writes the output cap the cost was computed with (the pool default when absent; embeddings have
none), for chat and completion streams ``stream_options.include_usage = true`` so the final chunk carries the
real usage that settles the bucket (a Responses stream always ends with its usage), and the engine's
``priority``: the one the proxy computed when the pool has ``enginePriority`` on, else none at all. A client's
own ``priority`` never reaches the backend: a tenant does not pick its engine priority.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from tokenpools.proxy.admission.estimate import chat_prompt_tokens, completion_prompt_tokens, responses_input_tokens


DEEP_BRACKETS = 200  # a body with fewer opening brackets nests less deeply than orjson.dumps can write (254)


class Kind(StrEnum):
    """The endpoint a request came to; the value labels it in docs and tests."""

    CHAT = "chat"
    COMPLETION = "completion"
    EMBEDDING = "embedding"
    RESPONSES = "responses"

    @property
    def path(self) -> str:
        """The backend path that serves it (the proxy serves the same one)."""
        return _PATHS[self]

    @property
    def operation(self) -> str:
        """Its ``gen_ai.operation.name``: the GenAI semantic conventions' well-known value (the Responses API
        generates chat)."""
        return _OPERATIONS[self]


_PATHS = {Kind.CHAT: "/v1/chat/completions", Kind.COMPLETION: "/v1/completions", Kind.EMBEDDING: "/v1/embeddings",
          Kind.RESPONSES: "/v1/responses"}
_OPERATIONS = {Kind.CHAT: "chat", Kind.COMPLETION: "text_completion", Kind.EMBEDDING: "embeddings",
               Kind.RESPONSES: "chat"}


class BadRequest(Exception):
    """A 4xx the proxy answers itself. ``code`` is a closed set: it labels the bad-request metric."""

    CODES = ("invalid_json", "invalid_type", "missing_field", "invalid_value", "body_too_large", "model_not_found")

    def __init__(self, message: str, code: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        assert code in self.CODES, code
        self.message = message
        self.code = code
        self.param = param
        self.status = status


@dataclass(slots=True)
class ParsedRequest:
    kind: Kind
    body: dict[str, Any]
    model: str
    stream: bool
    client_wants_usage: bool
    max_tokens: int | None  # per sequence, as the client sent it; 0 for embeddings (no output)
    max_tokens_field: str  # where the client put it (max_tokens, max_completion_tokens, max_output_tokens; "": none)
    n: int
    prompt_tokens_est: int

    def rewrite(self, max_tokens: int, engine_priority: int | None = None) -> bytes:
        """The body to forward: ``max_tokens`` (per sequence) written, usage requested for chat and completion
        streams, ``priority`` set to ``engine_priority`` (None: removed)."""
        body = self.body
        if self.max_tokens_field:
            body[self.max_tokens_field] = max_tokens
        if self.stream and self.kind is not Kind.RESPONSES:
            options = body.get("stream_options")
            body["stream_options"] = {**options, "include_usage": True} if isinstance(options, dict) else {"include_usage": True}
        if engine_priority is None:
            body.pop("priority", None)
        else:
            body["priority"] = engine_priority
        return orjson.dumps(body)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _optional_int(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if type(value) is not int:
        raise BadRequest(f"`{name}` must be an integer, got {_type_name(value)}", "invalid_type", name)
    if value < minimum:
        raise BadRequest(f"`{name}` must be >= {minimum}, got {value}", "invalid_value", name)
    return value


def parse(kind: Kind, raw: bytes) -> ParsedRequest:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}", "invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got {_type_name(body)}", "invalid_type")
    if raw.count(b"[") + raw.count(b"{") > DEEP_BRACKETS:  # perhaps too deep to write back: try (rare, C speed)
        try:
            orjson.dumps(body)
        except TypeError:
            raise BadRequest("request body nests too deeply (orjson writes at most 254 levels)", "invalid_json") \
                from None
    model = body.get("model")
    if model is None:
        raise BadRequest("`model` is required", "missing_field", "model")
    if not isinstance(model, str) or not model:
        raise BadRequest(f"`model` must be a non-empty string, got {_type_name(model)}", "invalid_type", "model")
    if kind is Kind.EMBEDDING:
        return _embedding(body, model)
    stream = body.get("stream")
    if stream is None:
        stream = False
    elif type(stream) is not bool:
        raise BadRequest(f"`stream` must be a boolean, got {_type_name(stream)}", "invalid_type", "stream")
    if kind is Kind.RESPONSES:
        return _responses(body, model, stream)
    options = body.get("stream_options")
    wants_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise BadRequest(f"`stream_options` must be an object, got {_type_name(options)}", "invalid_type",
                             "stream_options")
        usage = options.get("include_usage")
        if usage is not None and type(usage) is not bool:
            raise BadRequest("`stream_options.include_usage` must be a boolean", "invalid_type",
                             "stream_options.include_usage")
        wants_usage = bool(usage)
    field = "max_tokens"
    max_tokens = _optional_int(body, "max_tokens", 1)
    if kind is Kind.CHAT and body.get("max_completion_tokens") is not None:
        field = "max_completion_tokens"
        max_tokens = _optional_int(body, "max_completion_tokens", 1)
    n = _optional_int(body, "n", 1) or 1
    if kind is Kind.CHAT:
        messages = body.get("messages")
        if messages is None:
            raise BadRequest("`messages` is required", "missing_field", "messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest(f"`messages` must be a non-empty array, got {_type_name(messages)}", "invalid_type",
                             "messages")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise BadRequest(f"`messages[{i}]` must be an object with a string `role`", "invalid_type",
                                 f"messages[{i}]")
            content = message.get("content")
            if content is not None and not isinstance(content, (str, list)):
                raise BadRequest(f"`messages[{i}].content` must be a string or an array, got {_type_name(content)}",
                                 "invalid_type", f"messages[{i}].content")
        estimate = chat_prompt_tokens(messages, body.get("tools"))
    else:
        estimate = completion_prompt_tokens(_prompt_field(body, "prompt"))
    return ParsedRequest(kind, body, model, stream, wants_usage, max_tokens, field, n, estimate)


def _embedding(body: dict[str, Any], model: str) -> ParsedRequest:
    """``input`` as for a completion's ``prompt``; no output, no stream (the endpoint has neither)."""
    value = _prompt_field(body, "input")
    return ParsedRequest(Kind.EMBEDDING, body, model, False, False, 0, "", 1, completion_prompt_tokens(value))


def _prompt_field(body: dict[str, Any], name: str) -> Any:
    """``body[name]``, required and shaped as a completion's prompt (``_valid_prompt``)."""
    value = body.get(name)
    if value is None:
        raise BadRequest(f"`{name}` is required", "missing_field", name)
    if not _valid_prompt(value):
        raise BadRequest(f"`{name}` must be a string, an array of strings, or an array of token ids (or of such "
                         "arrays)", "invalid_type", name)
    return value


def _responses(body: dict[str, Any], model: str, stream: bool) -> ParsedRequest:
    """``input``: a string or a non-empty array of items (objects: messages, tool outputs...), ``instructions``: a
    string, ``max_output_tokens``: the output cap. Its stream always ends with the usage (``response.completed``),
    so the client gets it and nothing is stripped."""
    value = body.get("input")
    if value is None:
        raise BadRequest("`input` is required", "missing_field", "input")
    if isinstance(value, list):
        if not value:
            raise BadRequest("`input` must not be an empty array", "invalid_value", "input")
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                raise BadRequest(f"`input[{i}]` must be an object, got {_type_name(item)}", "invalid_type",
                                 f"input[{i}]")
            content = item.get("content")
            if content is not None and not isinstance(content, (str, list)):
                raise BadRequest(f"`input[{i}].content` must be a string or an array, got {_type_name(content)}",
                                 "invalid_type", f"input[{i}].content")
    elif not isinstance(value, str):
        raise BadRequest(f"`input` must be a string or an array of items, got {_type_name(value)}", "invalid_type",
                         "input")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest(f"`instructions` must be a string, got {_type_name(instructions)}", "invalid_type",
                         "instructions")
    max_tokens = _optional_int(body, "max_output_tokens", 1)
    estimate = responses_input_tokens(value, instructions, body.get("tools"))
    return ParsedRequest(Kind.RESPONSES, body, model, stream, True, max_tokens, "max_output_tokens", 1, estimate)


def _valid_prompt(prompt: Any) -> bool:
    if isinstance(prompt, str):
        return True
    if not isinstance(prompt, list) or not prompt:
        return False
    first = prompt[0]
    if isinstance(first, str):
        return all(isinstance(p, str) for p in prompt)
    if type(first) is int:
        return all(type(p) is int for p in prompt)
    if isinstance(first, list):
        return all(isinstance(p, list) and p and all(type(t) is int for t in p) for p in prompt)
    return False
