"""A pass-through scanner for the backend's SSE stream (pure: bytes in, bytes out, observations on the side).

Each network read is split at event boundaries; complete events go out at once (only a partial trailing event is
held until its end arrives), so nothing is buffered beyond one event. While passing, it observes what the proxy
must know: whether content has started (TTFT), how many chunks carried choices, and the ``usage`` the backend
reports. When the client did not ask for usage, the usage-only chunk (``choices: []``) the proxy requested is
dropped, and a ``usage`` riding on a content chunk is removed from it.
"""

from __future__ import annotations

from typing import Any

import orjson

_SEP = b"\n\n"
_DATA = b"data:"
_DONE = b"[DONE]"


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
        if not event.startswith(_DATA):
            return event  # comments, ``event:`` lines, keep-alives: pass through untouched
        payload = event[5:].strip()
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
        if "error" in chunk and isinstance(chunk["error"], dict):
            self.error = chunk["error"]
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
            if self.strip_usage:
                if not choices:
                    return b""
                del chunk["usage"]
                return b"data: " + orjson.dumps(chunk)
        return event


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
    """(prompt_tokens, completion_tokens) from a usage object, or None when it is absent or malformed."""
    if not usage:
        return None
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    if type(prompt) is not int or type(completion) is not int or prompt < 0 or completion < 0:
        return None
    return prompt, completion
