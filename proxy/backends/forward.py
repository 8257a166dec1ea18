"""The upstream half of a request: one call to a backend of the pool, streamed or not, filling a ``Result``.

A ``Flight`` is an admitted request in progress. ``evict`` cancels its task while it talks to the backend:
leaving the ``async with`` closes the backend connection (vLLM aborts the sequence and frees its KV), and the
handler turns the cancellation into an error for the client — an SSE error event if the stream has started, an
OpenAI-shaped JSON error otherwise. Backend 429/503 are passed through, marked ``X-TokenPools-Refused-By:
backend`` and recorded as backend refusals, never as the proxy's.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from tokenpools.core.admission import Ticket
from tokenpools.proxy.admission.responses import EVICTED_CODE, error_response, sse_error
from tokenpools.proxy.http.messages import Request, Response, StreamResponse
from tokenpools.runtime.sse import SseScanner, cached_tokens, usage_tokens
from tokenpools.proxy.backends.upstream import UpstreamError, UpstreamPool, UpstreamResponse, UpstreamTimeout
from tokenpools.runtime.clock import Clock
from tokenpools.topics.records import CompletionStatus

BACKEND_REFUSAL_STATUSES = frozenset({429, 503})
REFUSED_BY = "X-TokenPools-Refused-By"


class Flight:
    """An admitted request between admission and release."""

    __slots__ = ("ticket", "task", "evicted", "cancellable", "charge_above", "on_tokens")

    def __init__(self, ticket: Ticket, task: asyncio.Task[object] | None) -> None:
        self.ticket = ticket
        self.task = task
        self.evicted = False
        self.cancellable = False  # only while talking to the backend
        self.charge_above = 0
        self.on_tokens: Callable[[int], None] | None = None

    def watch(self, reserved_output_tokens: int, on_tokens: Callable[[int], None]) -> None:
        """Call ``on_tokens(chunks so far)`` on every backend read once a stream has more chunks than the output
        tokens it reserved (the handler charges the excess: a long stream is not unseen until it ends)."""
        self.charge_above = reserved_output_tokens
        self.on_tokens = on_tokens

    def evict(self) -> bool:
        if self.evicted or not self.cancellable or self.task is None:
            return False
        self.evicted = True
        self.task.cancel()
        return True


@dataclass(slots=True)
class Result:
    backend: str = ""
    status: CompletionStatus = CompletionStatus.OK
    http_status: int = 0
    usage: tuple[int, int] | None = None  # (prompt, completion) from the backend's usage
    cached_prompt_tokens: int = 0  # the part of the prompt the backend's prefix cache served (its usage; 0: none given)
    ttft_s: float | None = None
    chunks: int = 0
    response: StreamResponse | None = None
    error_kind: str = ""  # for the backend-errors metric: connect, timeout, http_5xx, stream
    headers: dict[str, str] = field(default_factory=dict)  # what every answer to the client carries (rate limits)


class Upstream:
    def __init__(self, pool: UpstreamPool, endpoints: dict[str, tuple[str, ...]], clock: Clock,
                 authorization: str | None = None) -> None:
        self.pool = pool
        self._auth = {"Authorization": authorization} if authorization else {}  # the proxy's own key (auth.py)
        self._cycle = {pool: itertools.cycle(urls) for pool, urls in endpoints.items()}
        self._endpoints = dict(endpoints)
        self._clock = clock

    def set_endpoints(self, endpoints: dict[str, tuple[str, ...]]) -> None:
        """The pools' backends from now on (live specs): a pool whose list is unchanged keeps its rotation."""
        current = self._endpoints
        self._cycle = {pool: self._cycle[pool] if current.get(pool) == urls and pool in self._cycle
                       else itertools.cycle(urls) for pool, urls in endpoints.items()}
        self._endpoints = dict(endpoints)

    def pick(self, pool: str) -> str:
        return next(self._cycle[pool])

    async def get(self, pool: str, path: str) -> Response:
        base = self.pick(pool)
        try:
            up = await self.pool.request("GET", base + path, headers=self._auth or None)
            raw = await up.read()
            return Response(status=up.status, body=raw,
                                headers={"Content-Type": up.headers.get("content-type", "application/json")})
        except (UpstreamError, UpstreamTimeout) as exc:
            return error_response(502, f"backend {base} unavailable: {type(exc).__name__}", "backend_error",
                                  "backend_unavailable")

    async def call(self, request: Request, res: Result, path: str, body: bytes, request_id: str,
                   flight: Flight, t0: float, stream: bool, strip_usage: bool) -> Response | StreamResponse:
        """Forward and answer the client. ``res`` is filled as things happen, so it is right even when this raises
        (a client abort cancels the handler)."""
        headers = {"Content-Type": "application/json", "X-Request-Id": request_id, **self._auth}
        flight.cancellable = True
        up: UpstreamResponse | None = None
        try:
            up = await self.pool.request("POST", res.backend + path, body, headers)
            res.http_status = up.status
            if up.status != 200:
                return await self._backend_status(up, res, request_id)
            if not stream:
                raw = await up.read()
                flight.cancellable = False
                usage = _json_usage(raw)
                res.usage, res.cached_prompt_tokens = usage_tokens(usage), cached_tokens(usage)
                return Response(status=200, body=raw, headers={
                    "Content-Type": up.headers.get("content-type", "application/json"), "X-Request-Id": request_id,
                    **res.headers})
            return await self._stream(request, up, res, request_id, t0, strip_usage, flight)
        except asyncio.CancelledError:
            if not flight.evicted:
                if res.status is CompletionStatus.OK:  # a client that leaves after a backend failure: the backend's
                    res.status = CompletionStatus.CLIENT_ABORT
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            res.status = CompletionStatus.EVICTED
            if up is not None:
                up.abort()
            return await self._end(res, request_id, 503, "request evicted: its slot was needed by protected work",
                                   "preempted", EVICTED_CODE)
        except UpstreamTimeout:
            res.status, res.error_kind = CompletionStatus.TIMEOUT, "timeout"
            return await self._end(res, request_id, 504, "backend timed out", "backend_error", "backend_timeout")
        except UpstreamError as exc:
            res.status, res.error_kind = CompletionStatus.BACKEND_ERROR, "connect" if not res.http_status else "stream"
            return await self._end(res, request_id, 502, f"backend failed: {exc}", "backend_error",
                                   "backend_unavailable")
        finally:
            flight.cancellable = False
            if up is not None:
                up.abort()  # a no-op once the response was read to the end; otherwise the backend stops

    async def _stream(self, request: Request, up: UpstreamResponse, res: Result, request_id: str,
                      t0: float, strip_usage: bool, flight: Flight) -> Response | StreamResponse:
        out = StreamResponse(status=200, headers={
            "Content-Type": up.headers.get("content-type", "text/event-stream"), "Cache-Control": "no-cache",
            "X-Request-Id": request_id, **res.headers})
        res.response = out
        if not await _to_client(out.prepare(request), res):
            return out  # the caller aborts the backend request
        scanner = SseScanner(strip_usage)
        try:
            async for data in up.chunks():
                chunk = scanner.feed(data)
                if scanner.error is not None:  # the backend failed the stream, whatever the client does next
                    res.status, res.error_kind = CompletionStatus.BACKEND_ERROR, "stream"
                if scanner.chunks > flight.charge_above and flight.on_tokens is not None:
                    flight.on_tokens(scanner.chunks)
                if res.ttft_s is None and scanner.content_started:
                    res.ttft_s = self._clock.now_s() - t0
                if chunk and not await _to_client(out.write(chunk), res):
                    return out  # the client is gone: the caller drops the backend connection
            tail = scanner.flush()
        finally:
            res.chunks = scanner.chunks
            res.usage, res.cached_prompt_tokens = usage_tokens(scanner.usage), cached_tokens(scanner.usage)
        if tail and not await _to_client(out.write(tail), res):
            return out
        if scanner.error is not None:
            res.status, res.error_kind = CompletionStatus.BACKEND_ERROR, "stream"
        await _to_client(out.write_eof(), res)
        return out

    async def _backend_status(self, up: UpstreamResponse, res: Result, request_id: str) -> Response:
        raw = await up.read()
        headers = {"Content-Type": up.headers.get("content-type", "application/json"), "X-Request-Id": request_id,
                   **res.headers}
        if up.status in BACKEND_REFUSAL_STATUSES:
            res.status = CompletionStatus.BACKEND_REFUSED
            headers[REFUSED_BY] = "backend"
            if "retry-after" in up.headers:
                headers["Retry-After"] = up.headers["retry-after"]
        else:
            res.status = CompletionStatus.BACKEND_ERROR
            res.error_kind = "http_5xx" if up.status >= 500 else ""
        return Response(status=up.status, body=raw, headers=headers)

    async def _end(self, res: Result, request_id: str, status: int, message: str, type_: str,
                   code: str) -> Response | StreamResponse:
        """End the client's request with an error: an SSE error event once streaming, else a JSON error naming the
        request (``X-Request-Id``, as every other answer does)."""
        out = res.response
        if out is None or not out.prepared:
            headers = {**res.headers, "X-Request-Id": request_id}
            if status == 503:
                headers["Retry-After"] = "1"
            return error_response(status, message, type_, code, None, headers)
        try:
            await out.write(sse_error(message, type_, code))
            await out.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client went away as well
        return out


def _json_usage(raw: bytes) -> dict[str, Any] | None:
    """The ``usage`` object of a JSON answer, if it has one."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    usage = body.get("usage") if isinstance(body, dict) else None
    return usage if isinstance(usage, dict) else None


async def _to_client(write: Awaitable[object], res: Result) -> bool:
    """Await a write to the client; False (and CLIENT_ABORT, unless the backend failed first) when the client has
    gone away."""
    try:
        await write
    except ConnectionResetError:
        if res.status is CompletionStatus.OK:  # (after a backend failure the failure is what ended the request)
            res.status = CompletionStatus.CLIENT_ABORT
        return False
    return True
