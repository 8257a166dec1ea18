"""One client connection of the proxy's HTTP server (``server.py``): an ``asyncio.Protocol`` parsed by httptools.

- **Parsing** runs in ``data_received`` (llhttp callbacks); each complete head becomes a ``Request`` queued for the
  connection's one worker task, which answers the requests strictly in order (keep-alive, pipelining). Reading
  pauses while two requests wait.
- **The head** is bounded by ``max_head_bytes`` (431) however it arrives: the parsed parts are counted as they
  come (a head in one packet), and every read that falls wholly inside a head is counted whole (a head in many
  packets, whose pieces httptools would buffer). Repeated headers are collected in a list and joined once, so a
  head of many repeats costs linear time.
- **Bad framing** (a malformed request line, header, chunk or length) gets a 400 and the connection closes. A body
  that turns malformed while its handler reads it fails that read (``BadBody``): the handler's request gets the 400.
- **Deadlines**: the server's sweeper closes a connection whose head is late (``overdue``; 408 when a head had
  begun); ``Request.read`` and the skip of an unread body have ``body_timeout_s`` (408); a write that waits for the
  client's socket buffer longer than ``write_timeout_s`` aborts the connection. Every close is counted by reason.
- **Caps**: the request that reaches ``max_requests_per_connection`` is answered with ``Connection: close``; a
  connection made while ``max_connections`` are open gets a 503 at once and a short lingering close.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import TYPE_CHECKING

import httptools

from tokenpools.proxy.http.http_limits import CloseReason
from tokenpools.proxy.http.messages import (BadBody, BodyTimeout, BodyTooLarge, ClientGone, Request, Response,
                                       StreamResponse, error_response, expire, header_lines, status_line)

if TYPE_CHECKING:
    from tokenpools.proxy.http.server import HttpServer

log = logging.getLogger("tokenpools.proxy.http.server")

REFUSED_LINGER_S = 2.0  # a refused connection reads (and drops) what its client still sends for at most this long


class _HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a head above the cap (the 431 is already queued)."""


class _BadHead:
    __slots__ = ("status", "message", "code")

    def __init__(self, status: int, message: str, code: str) -> None:
        self.status = status
        self.message = message
        self.code = code


class Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.limits = server.limits
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Request | _BadHead] = deque()
        self.parsing: Request | None = None
        self.task: asyncio.Task[None] | None = None
        self.next_waiter: asyncio.Future[None] | None = None
        self.drain_waiter: asyncio.Future[None] | None = None
        self.write_paused = False
        self.read_paused = False
        self.lost = False
        self.closing = False
        self.broken = False
        self.busy = False
        self.refused = False
        self.close_reason: CloseReason | None = None
        self.requests = 0  # heads begun on this connection
        self.answered = 0
        self.idle_since_s = time.monotonic()  # the accept, then the end of each response
        self.head_since_s: float | None = None  # a head in progress: when it began (the first: at the accept)
        self._url: list[bytes] = []
        self._headers: dict[str, str] = {}
        self._repeated: dict[str, list[str]] | None = None
        self._head_fresh = True
        self._head_bytes = self._head_seen = 0

    # ---- asyncio.Protocol --------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        server = self.server
        server.stats.open += 1
        if len(server.connections) >= self.limits.max_connections:
            self._refuse()
            return
        server.connections.add(self)
        self.task = asyncio.get_running_loop().create_task(self._serve())

    def data_received(self, data: bytes) -> None:
        if self.broken:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._bad(400, "protocol upgrades are not supported", CloseReason.BAD_REQUEST)
            return
        except httptools.HttpParserError as exc:
            if not self.broken:  # a callback refused it already (431)
                self._bad(400, f"malformed HTTP request: {exc}", CloseReason.BAD_REQUEST)
            return
        if self.head_since_s is not None:  # a head still incomplete: bound what it may take (httptools buffers it)
            if self._head_fresh:  # it began in this read: only its parsed parts are known to be its own
                self._head_fresh = False
                self._head_bytes = self._head_seen
            else:  # the whole read is inside the head
                self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_head_bytes:
                self._head_too_large()

    def eof_received(self) -> bool | None:
        return None  # the client has finished sending: the transport closes (a request in progress is cancelled)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        server = self.server
        server.connections.discard(self)
        server.refused.discard(self)
        server.stats.open -= 1
        server.stats.closed[self.close_reason or CloseReason.CLIENT] += 1
        for waiter in (self.next_waiter, self.drain_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        if self.parsing is not None:
            self.parsing._wake()
        if self.task is not None and not self.task.done():
            self.task.cancel()  # a handler in progress stops where it awaits (the proxy: client abort)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        w = self.drain_waiter
        if w is not None and not w.done():
            w.set_result(None)

    # ---- httptools callbacks -------------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = []
        self._headers = {}
        self._head_fresh = True
        self._head_bytes = self._head_seen = 0
        self.head_since_s = self.idle_since_s if self.requests == 0 else time.monotonic()
        self.requests += 1

    def on_url(self, url: bytes) -> None:
        self._url.append(url)
        self._head_seen += len(url)
        if self._head_seen > self.limits.max_head_bytes:
            self._head_too_large()
            raise _HeadTooLarge  # out of the callback: llhttp stops (feed_data raises, data_received moves on)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_seen += len(name) + len(value) + 4
        if self._head_seen > self.limits.max_head_bytes:
            self._head_too_large()
            raise _HeadTooLarge
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers = self._headers
        if key not in headers:
            headers[key] = text
            return
        repeated = self._repeated  # joined once the head is complete: linear in the head, however many repeats
        if repeated is None:
            repeated = self._repeated = {}
        parts = repeated.get(key)
        if parts is None:
            repeated[key] = [headers[key], text]
        else:
            parts.append(text)

    def on_headers_complete(self) -> None:
        self.head_since_s = None
        headers = self._headers
        if self._repeated is not None:
            for key, parts in self._repeated.items():
                headers[key] = ", ".join(parts)
            self._repeated = None
        length = headers.get("content-length")
        if length is not None and "," in length:
            raise httptools.HttpParserError("conflicting Content-Length values")
        p = self.parser
        url = self._url[0] if len(self._url) == 1 else b"".join(self._url)
        request = Request(self, p.get_method().decode("latin-1"), url, headers, p.get_http_version(),
                          p.should_keep_alive())
        self.parsing = request
        self._enqueue(request)

    def on_body(self, body: bytes) -> None:
        request = self.parsing
        if request is not None:
            request._feed(body, self.limits.max_body_bytes)

    def on_message_complete(self) -> None:
        request, self.parsing = self.parsing, None
        if request is not None:
            request._complete = True
            request._wake()

    # ---- refusals and deadlines ------------------------------------------------------------------------------------
    def _refuse(self) -> None:
        """Over ``max_connections``: a 503 at once, no request read; the client's bytes are dropped for a moment so
        that it reads the answer before the connection closes (no reset)."""
        self.refused = self.broken = self.closing = True
        self.close_reason = CloseReason.MAX_CONNECTIONS
        self.server.refused.add(self)
        transport = self.transport
        assert transport is not None
        n = self.limits.max_connections
        response = error_response(503, f"the proxy is serving its maximum of {n} connections; retry shortly",
                                  "server_error", "too_many_connections", headers={"Retry-After": "1"})
        transport.write(self._head_of(response, keep=False) + response.body)
        self.close()

    def _head_too_large(self) -> None:
        self._bad(431, f"request line and headers exceed {self.limits.max_head_bytes} bytes",
                  CloseReason.HEAD_TOO_LARGE)

    def _bad(self, status: int, message: str, reason: CloseReason, code: str = "bad_request") -> None:
        self.broken = self.closing = True
        self.head_since_s = None
        if self.close_reason is None:
            self.close_reason = reason
        request, self.parsing = self.parsing, None
        if request is not None:  # its body broke off: the handler reading it gets the error instead
            request._fail(message)
        self._enqueue(_BadHead(status, message, code))

    def expire(self, reason: CloseReason) -> None:
        """Past a deadline (the sweeper's ``overdue``): a late head gets a 408, a silent connection is closed."""
        if self.closing or self.lost:
            return
        if reason is CloseReason.HEADER_TIMEOUT and self.head_since_s is not None:
            self._bad(408, f"request head not received within {self.limits.header_timeout_s:g} s", reason,
                      "request_timeout")
        else:
            self.close(reason)

    # ---- the connection's worker ---------------------------------------------------------------------------------
    def _enqueue(self, item: Request | _BadHead) -> None:
        self.queue.append(item)
        if len(self.queue) > 2 and not self.read_paused and self.transport is not None:
            self.read_paused = True  # a pipelining client: stop reading until the queue is answered
            self.transport.pause_reading()
        w = self.next_waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _serve(self) -> None:
        try:
            while True:
                while not self.queue:
                    if self.lost or self.closing:
                        return
                    self.next_waiter = asyncio.get_running_loop().create_future()
                    try:
                        await self.next_waiter
                    finally:
                        self.next_waiter = None
                item = self.queue[0]
                if isinstance(item, _BadHead):
                    self._write_plain(None, error_response(item.status, item.message, "invalid_request_error",
                                                           item.code), keep=False)
                    return
                self.busy = True
                self.answered += 1
                if self.answered >= self.limits.max_requests_per_connection and not self.closing:
                    self.closing = True  # this response says Connection: close
                    self.close_reason = self.close_reason or CloseReason.MAX_REQUESTS
                keep = await self._answer(item)
                self.busy = False
                self.queue.popleft()
                if self.read_paused and len(self.queue) <= 1 and self.transport is not None and not self.lost:
                    self.read_paused = False
                    if self.head_since_s is not None:
                        self.head_since_s = time.monotonic()  # its deadline stood still while reading was paused
                    self.transport.resume_reading()
                if not keep or self.lost:
                    if self.close_reason is None:
                        self.close_reason = _ended(item, self.limits.max_body_bytes)
                    if not item._complete:
                        self.broken = True  # the rest of its body is dropped while the close lingers
                    return
                self.idle_since_s = time.monotonic()
        except (asyncio.CancelledError, ClientGone):
            pass  # the client went away, or the server is shutting down
        except Exception:  # a bug in the server itself: this connection ends, the others go on
            log.exception("HTTP connection failed")
            self.close_reason = self.close_reason or CloseReason.ERROR
        finally:
            self.busy = False
            self.close()

    async def _answer(self, request: Request) -> bool:
        """Run the handler and write its response; whether the connection may carry another request."""
        limits = self.limits
        try:
            response = await self.server.handler(request)
        except (ClientGone, BodyTooLarge, BodyTimeout, BadBody) as exc:
            if isinstance(exc, ClientGone) or self.lost:
                return False
            if isinstance(exc, BodyTimeout):
                self.closing = True  # the rest of the body may still come: the connection cannot go on
                self.close_reason = self.close_reason or CloseReason.BODY_TIMEOUT
                response = error_response(408, f"request body not received within {limits.body_timeout_s:g} s",
                                          "invalid_request_error", "request_timeout")
            elif isinstance(exc, BadBody):
                response = error_response(400, str(exc), "invalid_request_error", "bad_request")
            else:
                response = error_response(413, f"request body exceeds {limits.max_body_bytes} bytes",
                                          "invalid_request_error", "body_too_large")
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            if self.lost:
                return False
            if request.streaming:
                self.close_reason = self.close_reason or CloseReason.ERROR
                return False  # the head is out: all that can be done is to end the connection
            response = error_response(500, "internal error in the proxy", "server_error", "internal_error")
        if isinstance(response, StreamResponse):
            if not response.prepared:  # a handler that returned an unstarted stream: send its head and end it
                await response.prepare(request)
                await response.write_eof()
            return response.finished and response._chunked and request.response_keeps_alive and \
                await self._body_done(request)
        keep = request.keep_alive and not self.closing and (request._complete or self._body_expected(request))
        self._write_plain(request, response, keep)
        if self.write_paused:  # a large response the client is not taking: wait for it (write_timeout_s)
            await self.drain()
        return keep and await self._body_done(request)

    def _body_expected(self, request: Request) -> bool:
        """A body not read yet but small enough to drain, so the connection can stay open."""
        if request._too_large or request._error is not None:
            return False
        if request.headers.get("expect", "").lower() == "100-continue" and not request._continued:
            return False  # the client waits for a 100 Continue that will not come: it may never send the body
        length = request.content_length
        return length is not None and length <= self.limits.max_body_bytes

    async def _body_done(self, request: Request) -> bool:
        """Wait (at most ``body_timeout_s``) for the rest of a body the handler did not read."""
        if request._complete:
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.body_timeout_s
        while not request._complete:
            remaining = deadline - loop.time()
            if request._too_large or request._error is not None or self.lost:
                return False
            if remaining <= 0:
                self.close_reason = self.close_reason or CloseReason.BODY_TIMEOUT
                return False
            request._waiter = waiter = loop.create_future()
            timer = loop.call_later(remaining, expire, waiter)
            try:
                await waiter
            finally:
                request._waiter = None
                timer.cancel()
        return True

    def _head_of(self, response: Response, keep: bool) -> bytes:
        head = status_line(response.status) + header_lines(response.headers)
        head += b"Content-Length: %d\r\n" % len(response.body)
        if not keep:
            head += b"Connection: close\r\n"
        return head + self.server.date.header() + b"\r\n"

    def _write_plain(self, request: Request | None, response: Response, keep: bool) -> None:
        head = self._head_of(response, keep)
        body = b"" if request is not None and request.method == "HEAD" else response.body
        if len(body) < 65536:
            self.transport_write(head + body)  # one write, one syscall
        else:
            self.transport_write(head, body)  # do not copy a large body just to join it

    # ---- helpers -------------------------------------------------------------------------------------------------
    def transport_write(self, data: bytes, more: bytes | None = None) -> None:
        t = self.transport
        if t is None or self.lost or t.is_closing():
            raise ClientGone("the client closed the connection")
        t.write(data)
        if more is not None:
            t.write(more)

    def check_open(self) -> None:
        t = self.transport
        if t is None or self.lost or t.is_closing():
            raise ClientGone("the client closed the connection")

    async def drain(self) -> None:
        """Wait while the client's socket buffer is full; a client that takes nothing for ``write_timeout_s`` is
        disconnected (``ClientGone``: the handler stops as on any client abort)."""
        if not self.write_paused:
            self.check_open()
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.write_timeout_s
        while self.write_paused:
            self.check_open()
            remaining = deadline - loop.time()
            if remaining <= 0:
                self.close_reason = self.close_reason or CloseReason.WRITE_TIMEOUT
                assert self.transport is not None
                self.transport.abort()
                raise ClientGone(f"the client took no response bytes for {self.limits.write_timeout_s:g} s")
            self.drain_waiter = waiter = loop.create_future()
            timer = loop.call_later(remaining, expire, waiter)
            try:
                await waiter
            finally:
                self.drain_waiter = None
                timer.cancel()
        self.check_open()

    def close(self, reason: CloseReason | None = None) -> None:
        """Close once what was written is sent; a client that does not take it within ``write_timeout_s`` is cut.

        After a refusal (``broken``: what the client still sends is dropped) the close lingers: the write side ends
        (FIN) and the client's bytes are read and dropped until it closes too, for at most ``REFUSED_LINGER_S``. A
        client still sending would otherwise get a reset, which can destroy the answer before it is read."""
        self.closing = True
        if reason is not None and self.close_reason is None:
            self.close_reason = reason
        t = self.transport
        if t is None or t.is_closing():
            return
        loop = asyncio.get_running_loop()
        if self.broken and not self.lost and t.can_write_eof():
            if self.read_paused:
                t.resume_reading()
            t.write_eof()
            loop.call_later(REFUSED_LINGER_S, t.abort)
            return
        t.close()
        if t.get_write_buffer_size():
            loop.call_later(self.limits.write_timeout_s, t.abort)


def _ended(request: Request, max_body_bytes: int) -> CloseReason:
    """Why a connection ends after answering ``request``, when no deadline or cap said so first."""
    length = request.content_length
    if request._too_large or (length is not None and length > max_body_bytes):
        return CloseReason.BODY_TOO_LARGE
    if not request.keep_alive:
        return CloseReason.CLIENT
    if not request._complete:
        return CloseReason.UNREAD_BODY
    return CloseReason.ERROR
