"""A pass-through scanner for the backend's SSE stream (pure: bytes in, bytes out, observations on the side).

Each network read is split at event boundaries; complete events go out at once (only a partial trailing event is
held until its end arrives), so nothing is buffered beyond one event. While passing, it observes what the proxy
must know: whether content has started (TTFT), how many chunks carried output, and the ``usage`` the backend
reports. When the client did not ask for usage, the usage-only chunk (``choices: []``) the proxy requested is
dropped, and a ``usage`` riding on a content chunk is removed from it.

Two stream shapes are read. Chat and completions send ``data:`` lines of chunks with ``choices``, the usage on
the last. The Responses API sends typed events (``event: <type>`` then ``data: {"type": ...}``): every
``*.delta`` event is a chunk of output, the first non-empty one starts the content, ``response.completed`` (or
``.incomplete``, ``.failed``) carries the usage in ``response.usage``, and ``error`` or ``response.failed`` is a
backend error.
"""

from __future__ import annotations

from typing import Any

import orjson

_SEP = b"\n\n"
_DATA = b"data:"
_DONE = b"[DONE]"
_RESPONSE_ENDS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class SseScanner:
    __slots__ = ("_pending", "strip_usage", "content_started", "chunks", "usage", "error")

    def __init__(self, strip_usage: bool) -> None:
        self._pending = b""
        self.strip_usage = strip_usage
        self.content_started = False
        self.chunks = 0  # chunks with a non-empty ``choices``
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None  # an ``error`` event from the backend, if any

    def feed(self, data: bytes) -> bytes:
        """The bytes to send to the client now, for this read from the backend."""
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        if self._pending:
            data = self._pending + data
        end = data.rfind(_SEP)
        if end < 0:
            self._pending = data
            return b""
        end += 2
        self._pending = data[end:]
        complete = data[:end]
        out: list[bytes] = []
        changed = False
        for event in complete.split(_SEP)[:-1]:
            kept = self._event(event)
            if kept is not event:
                changed = True
            if kept:
                out.append(kept)
        if not changed:
            return complete
        return b"".join(e + _SEP for e in out)

    def flush(self) -> bytes:
        """Whatever is left when the backend closes the stream (a last event without its blank line)."""
        rest, self._pending = self._pending, b""
        if not rest:
            return b""
        kept = self._event(rest.rstrip(b"\n"))
        return kept + _SEP if kept else b""

    def _event(self, event: bytes) -> bytes:
        if event.startswith(_DATA):
            head, payload = b"", event[5:].strip()
        else:  # ``event:``/``id:`` lines before the data (the Responses API), comments, keep-alives
            at = event.find(b"\n" + _DATA)
            if at < 0:
                return event
            head, payload = event[:at + 1], event[at + 6:].strip()
        if payload == _DONE:
            return event
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return event
        if not isinstance(chunk, dict):
            return event
        choices = chunk.get("choices")
        if choices:
            self.chunks += 1
            if not self.content_started and _has_content(choices):
                self.content_started = True
        elif "type" in chunk:  # the Responses API (its usage is in ``response``: never stripped, the client has it)
            self._typed(chunk)
        if "error" in chunk and isinstance(chunk["error"], dict):
            self.error = chunk["error"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
            if self.strip_usage:
                if not choices:
                    return b""
                del chunk["usage"]
                return head + b"data: " + orjson.dumps(chunk)
        return event

    def _typed(self, chunk: dict[str, Any]) -> None:
        """One event of the Responses API's stream."""
        kind = chunk["type"]
        if not isinstance(kind, str):
            return
        if kind.endswith(".delta"):
            self.chunks += 1
            if not self.content_started and chunk.get("delta"):
                self.content_started = True
        elif kind in _RESPONSE_ENDS:
            response = chunk.get("response")
            if isinstance(response, dict):
                usage = response.get("usage")
                if isinstance(usage, dict):
                    self.usage = usage
                if kind == "response.failed":
                    error = response.get("error")
                    self.error = error if isinstance(error, dict) else {"message": "response failed"}
        elif kind == "error":
            self.error = chunk


def _has_content(choices: list[Any]) -> bool:
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict):
            if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                return True
        elif choice.get("text"):
            return True
    return False


def usage_tokens(usage: dict[str, Any] | None) -> tuple[int, int] | None:
    """(prompt tokens, completion tokens) from a usage object, or None when it is absent or malformed.

    Three shapes: chat and completions (``prompt_tokens``, ``completion_tokens``), embeddings (``prompt_tokens``,
    ``total_tokens``: nothing generated) and responses (``input_tokens``, ``output_tokens``)."""
    if not usage:
        return None
    prompt = usage.get("prompt_tokens")
    if prompt is None:
        prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
    else:
        completion = usage.get("completion_tokens")
        if completion is None and type(prompt) is int and type(usage.get("total_tokens")) is int:
            completion = usage["total_tokens"] - prompt
    if type(prompt) is not int or type(completion) is not int or prompt < 0 or completion < 0:
        return None
    return prompt, completion


def cached_tokens(usage: dict[str, Any] | None) -> int:
    """The prompt tokens the backend served from its prefix cache: ``prompt_tokens_details.cached_tokens`` (chat,
    completions) or ``input_tokens_details.cached_tokens`` (responses); 0 when absent or malformed, and never more
    than the prompt (``usage_tokens``) itself."""
    tokens = usage_tokens(usage)
    if tokens is None or usage is None:
        return 0
    details = usage.get("prompt_tokens_details")
    if details is None:
        details = usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if type(cached) is not int or cached < 0:
        return 0
    return min(cached, tokens[0])
