"""A lean HTTP/1.1 server for the proxy: ``asyncio.Protocol`` connections parsed by httptools (llhttp).

Why not aiohttp's server: on this project's 2-vCPU machines it cost ~160 µs of CPU per request, a third of the
whole proxy (``benchmarks/proxy_overhead.py``; py-spy of the proxy process). This one does what the proxy needs and
nothing else, with one ``transport.write`` per plain response:

- **Messages** (``messages.py``): ``Request``, ``Response``, ``StreamResponse``.
- **Keep-alive and pipelining:** each connection has one worker task that answers its requests strictly in order.
  Requests that arrive while one is being answered are parsed and queued; reading pauses while two are waiting.
- **Bodies:** ``Content-Length`` or chunked, buffered up to ``max_body_bytes``. Past the cap ``read`` raises
  ``BodyTooLarge`` and nothing more is kept; a request whose body was not read to its end closes the connection
  after its response (a ``Content-Length`` above the cap is refused before any body byte is read).
  ``Expect: 100-continue`` gets its ``100 Continue`` only when the handler reads the body.
- **Bad input:** a malformed request line or header, or a head above ``max_head_bytes``, gets an OpenAI-shaped
  400 (431 for the size) and the connection closes; the server keeps serving everyone else.
- **Streaming:** ``StreamResponse`` writes chunked transfer encoding chunk by chunk, no buffering; a write waits
  while the transport's buffer is above its high-water mark (``pause_writing``/``resume_writing``).
- **Client gone:** ``connection_lost`` cancels the connection's worker, so a handler talking to a backend stops
  there (the proxy's handlers turn that into a client abort and close the backend connection).
- **Shutdown:** ``close`` stops listening, closes idle connections, lets requests in progress finish for up to
  ``grace_s`` (their responses say ``Connection: close``), then cancels what is left.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

import httptools

from tokenpools.proxy.messages import (BodyTooLarge, ClientGone, Date, Handler, Request, Response, StreamResponse,
                                       error_response, header_lines, status_line)

__all__ = ["HttpServer", "MAX_HEAD_BYTES", "KEEPALIVE_TIMEOUT_S"]

log = logging.getLogger("tokenpools.proxy.server")

MAX_HEAD_BYTES = 64 * 1024
KEEPALIVE_TIMEOUT_S = 75.0


class _BadHead:
    __slots__ = ("status", "message")

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message


class _Connection(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
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
        self.idle_since_s = time.monotonic()
        self._url: list[bytes] = []
        self._headers: dict[str, str] = {}
        self._in_head = True
        self._head_fresh = True
        self._head_bytes = self._head_seen = 0

    # ---- asyncio.Protocol --------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server.connections.add(self)
        self.task = asyncio.get_running_loop().create_task(self._serve())

    def data_received(self, data: bytes) -> None:
        if self.broken:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._bad(400, "protocol upgrades are not supported")
            return
        except httptools.HttpParserError as exc:
            self._bad(400, f"malformed HTTP request: {exc}")
            return
        if self._in_head:  # a head still incomplete: bound what it may take (httptools would buffer it all)
            if self._head_fresh:  # it began in this read: only its parsed parts are known to be its own
                self._head_fresh = False
                self._head_bytes = self._head_seen
            else:
                self._head_bytes += len(data)
            if max(self._head_bytes, self._head_seen) > self.server.max_head_bytes:
                self._bad(431, f"request line and headers exceed {self.server.max_head_bytes} bytes")

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.server.connections.discard(self)
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
        self._in_head = True
        self._head_fresh = True
        self._head_bytes = self._head_seen = 0

    def on_url(self, url: bytes) -> None:
        self._url.append(url)
        self._head_seen += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_seen += len(name) + len(value) + 4
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers = self._headers
        if key in headers:
            headers[key] = f"{headers[key]}, {text}"
        else:
            headers[key] = text

    def on_headers_complete(self) -> None:
        self._in_head = False
        p = self.parser
        url = self._url[0] if len(self._url) == 1 else b"".join(self._url)
        length = self._headers.get("content-length")
        if length is not None and "," in length:
            raise httptools.HttpParserError("conflicting Content-Length values")
        request = Request(self, p.get_method().decode("latin-1"), url, self._headers, p.get_http_version(),
                          p.should_keep_alive())
        self.parsing = request
        self._enqueue(request)

    def on_body(self, body: bytes) -> None:
        request = self.parsing
        if request is not None:
            request._feed(body, self.server.max_body_bytes)

    def on_message_complete(self) -> None:
        request, self.parsing = self.parsing, None
        self._in_head = True
        self._head_fresh = True
        self._head_bytes = self._head_seen = 0
        if request is not None:
            request._complete = True
            request._wake()

    # ---- the connection's worker ---------------------------------------------------------------------------------
    def _enqueue(self, item: Request | _BadHead) -> None:
        self.queue.append(item)
        if len(self.queue) > 2 and not self.read_paused and self.transport is not None:
            self.read_paused = True  # a pipelining client: stop reading until the queue is answered
            self.transport.pause_reading()
        w = self.next_waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _bad(self, status: int, message: str) -> None:
        self.broken = self.closing = True
        self.parsing = None
        self._in_head = False
        self._enqueue(_BadHead(status, message))

    async def _serve(self) -> None:
        server = self.server
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
                                                           "bad_request"), keep=False)
                    return
                self.busy = True
                keep = await self._answer(item, server)
                self.busy = False
                self.queue.popleft()
                if self.read_paused and len(self.queue) <= 1 and self.transport is not None and not self.lost:
                    self.read_paused = False
                    self.transport.resume_reading()
                if not keep or self.lost:
                    return
                self.idle_since_s = time.monotonic()
        except (asyncio.CancelledError, ClientGone):
            pass  # the client went away, or the server is shutting down
        except Exception:  # a bug in the server itself: this connection ends, the others go on
            log.exception("HTTP connection failed")
        finally:
            self.busy = False
            self.close()

    async def _answer(self, request: Request, server: HttpServer) -> bool:
        """Run the handler and write its response; whether the connection may carry another request."""
        try:
            response = await server.handler(request)
        except (ClientGone, BodyTooLarge) as exc:
            if isinstance(exc, ClientGone) or self.lost:
                return False
            response = error_response(413, f"request body exceeds {server.max_body_bytes} bytes",
                                      "invalid_request_error", "body_too_large")
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            if self.lost:
                return False
            if request.streaming:
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
        return keep and await self._body_done(request)

    def _body_expected(self, request: Request) -> bool:
        """A body not read yet but small enough to drain, so the connection can stay open."""
        if request._too_large:
            return False
        if request.headers.get("expect", "").lower() == "100-continue" and not request._continued:
            return False  # the client waits for a 100 Continue that will not come: it may never send the body
        length = request.content_length
        return length is not None and length <= self.server.max_body_bytes

    async def _body_done(self, request: Request) -> bool:
        """Wait (at most the keep-alive timeout) for the rest of a body the handler did not read."""
        deadline = time.monotonic() + self.server.keepalive_timeout_s
        while not request._complete:
            remaining = deadline - time.monotonic()
            if request._too_large or self.lost or remaining <= 0:
                return False
            request._waiter = waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait({waiter}, timeout=remaining)
            finally:
                request._waiter = None
        return True

    def _write_plain(self, request: Request | None, response: Response, keep: bool) -> None:
        body = response.body
        head = status_line(response.status) + header_lines(response.headers)
        head += b"Content-Length: %d\r\n" % len(body)
        if not keep:
            head += b"Connection: close\r\n"
        head += self.server.date.header() + b"\r\n"
        if request is not None and request.method == "HEAD":
            body = b""
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
        while self.write_paused:
            self.check_open()
            self.drain_waiter = asyncio.get_running_loop().create_future()
            try:
                await self.drain_waiter
            finally:
                self.drain_waiter = None
        self.check_open()

    def close(self) -> None:
        self.closing = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class HttpServer:
    """Serves ``handler`` on one listening socket. ``start`` → (host, port); ``close`` drains and stops."""

    def __init__(self, handler: Handler, *, max_body_bytes: int, max_head_bytes: int = MAX_HEAD_BYTES,
                 keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S) -> None:
        if max_body_bytes <= 0:
            raise ValueError(f"`max_body_bytes` must be positive, got {max_body_bytes}")
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.max_head_bytes = max_head_bytes
        self.keepalive_timeout_s = keepalive_timeout_s
        self.connections: set[_Connection] = set()
        self.date = Date()
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int, *, backlog: int = 2048) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port, backlog=backlog,
                                                reuse_address=True)
        self._sweeper = loop.create_task(self._sweep())
        sockname = self._server.sockets[0].getsockname()
        return sockname[0], sockname[1]

    async def _sweep(self) -> None:
        """Close keep-alive connections idle for longer than ``keepalive_timeout_s``."""
        while True:
            await asyncio.sleep(min(5.0, self.keepalive_timeout_s / 2))
            cutoff = time.monotonic() - self.keepalive_timeout_s
            for conn in [c for c in self.connections if not c.busy and not c.queue and c.idle_since_s < cutoff]:
                conn.close()

    async def close(self, grace_s: float = 10.0) -> None:
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        for conn in list(self.connections):
            conn.closing = True  # responses in progress say Connection: close
            if not conn.busy and not conn.queue:
                conn.close()
        tasks = [c.task for c in list(self.connections) if c.task is not None and not c.task.done()]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s)
            for task in pending:
                task.cancel()
            if pending:
                log.warning("%d requests still in progress after %.1f s; cancelled", len(pending), grace_s)
                await asyncio.wait(pending, timeout=1.0)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()
        await asyncio.sleep(0)  # let the transports close
