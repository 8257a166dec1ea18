"""A lean HTTP/1.1 client for the backends: keep-alive connections on ``asyncio.Protocol``, parsed by httptools.

Why not aiohttp's client: on this project's 2-vCPU machines it costs ~360 µs of CPU per request, more than the
rest of the proxy together (measured by ``benchmarks/proxy_overhead.py``). This one writes a request in one
``transport.write`` and hands body bytes to the caller as llhttp delivers them — ~5× cheaper. It does only what
the proxy needs: POST/GET with a known body, ``Content-Length`` or chunked responses, streaming reads, abort.

- ``http://`` and ``https://`` backends: an ``https`` endpoint is reached over TLS with the pool's client context
  (built once at start-up from the ``proxy`` settings' ``upstream_ssl_*``: the CA bundle, an optional client
  certificate, the host-name check; ``runtime.tls``); a certificate that does not verify fails the connection like
  a refused connect (``UpstreamError``, 502 to the client). Connections are pooled per (host, port, TLS or not).

- A connection carries one request at a time and goes back to the pool only when its response was read to the
  end and both sides allow keep-alive; anything else closes it (``abort`` is how eviction frees the backend's KV).
- A request that fails on a *reused* connection before any response byte arrived (the backend closed an idle
  keep-alive) is retried once on a fresh connection; nothing else is retried.
- Read timeout: a sweeper closes a connection that received nothing for ``read_timeout_s`` while busy.
- Backpressure: when more than ``HIGH_WATER_BYTES`` of a body wait for the caller (a slow client downstream), the
  connection stops reading from the backend until they are below ``LOW_WATER_BYTES``; the backend's own socket
  then fills and it slows down, instead of the proxy's memory growing.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools


HIGH_WATER_BYTES = 1 << 20
LOW_WATER_BYTES = 256 << 10


class UpstreamError(ConnectionError):
    """The backend connection failed or closed before the response was complete."""


class UpstreamTimeout(TimeoutError):
    """No byte from the backend for longer than the read timeout (or the connect timeout)."""


class _Connection(asyncio.Protocol):
    def __init__(self, pool: UpstreamPool, key: tuple[str, int, bool]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.reused = False
        self.last_io_s = 0.0
        self.lost = False

    # -- asyncio.Protocol --------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.last_io_s = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"bad response from backend: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.pool.forget(self)
        self._fail(UpstreamError("backend closed the connection" + (f": {exc}" if exc else "")))

    # -- httptools callbacks -------------------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.response is not None:
            self.response.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        r = self.response
        if r is not None:
            r.status = self.parser.get_status_code()
            r.started = True
            r._wake()

    def on_body(self, body: bytes) -> None:
        r = self.response
        if r is not None:
            r._chunks.append(body)
            r.buffered += len(body)
            if r.buffered > HIGH_WATER_BYTES and not r.paused and self.transport is not None:
                r.paused = True
                self.transport.pause_reading()
            r._wake()

    def on_message_complete(self) -> None:
        r = self.response
        if r is None:
            return
        r.complete = True
        if r.paused:  # nothing more of this response will come: the next one must be read
            r.paused = False
            if self.transport is not None:
                self.transport.resume_reading()
        keep = self.parser.should_keep_alive() and r.headers.get("connection", "").lower() != "close"
        self.response = None
        r._wake()
        if keep and not self.lost:
            self.pool.release(self)
        else:
            self.close()

    # -- helpers ---------------------------------------------------------------------------------------------
    def _fail(self, exc: BaseException) -> None:
        r, self.response = self.response, None
        if r is not None and not r.complete:
            r.error = exc
            r._wake()

    def close(self) -> None:
        self.lost = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    """Status and headers once they arrived; the body through ``read`` or ``chunks``."""

    __slots__ = ("status", "headers", "started", "complete", "error", "buffered", "paused", "_chunks", "_waiter",
                 "_conn")

    def __init__(self, conn: _Connection) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.started = False
        self.complete = False
        self.error: BaseException | None = None
        self.buffered = 0  # body bytes received and not yet taken by the caller
        self.paused = False  # reading from the backend is paused (too much is buffered)
        self._chunks: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._conn = conn

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def _headers(self) -> None:
        while not self.started:
            if self.error is not None:
                raise self.error
            await self._wait()

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive; raises UpstreamError if the backend goes away before the end."""
        while True:
            while self._chunks:
                chunk = self._chunks.popleft()
                self.buffered -= len(chunk)
                if self.paused and self.buffered <= LOW_WATER_BYTES:
                    self.paused = False
                    transport = self._conn.transport
                    if transport is not None and not self._conn.lost:
                        transport.resume_reading()
                yield chunk
            if self.complete:
                return
            if self.error is not None:
                raise self.error
            await self._wait()

    async def read(self) -> bytes:
        parts = [c async for c in self.chunks()]
        return b"".join(parts)

    def abort(self) -> None:
        """Drop the connection (the backend sees the client go away and stops the request)."""
        if not self.complete:
            self._conn.close()


class UpstreamPool:
    """Keep-alive connections to any number of ``http(s)://host:port`` backends. ``tls`` is the client context an
    ``https`` endpoint is reached with (default: Python's verifying default context, the system's CAs)."""

    def __init__(self, connect_timeout_s: float = 5.0, read_timeout_s: float = 600.0, max_idle: int = 256,
                 tls: ssl.SSLContext | None = None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_idle = max_idle
        self.tls = tls
        self._idle: dict[tuple[str, int, bool], deque[_Connection]] = {}
        self._busy: set[_Connection] = set()
        self._targets: dict[tuple[str, str], tuple[str, int, bool, bytes]] = {}
        self._sweeper: asyncio.Task[None] | None = None

    def _ensure_sweeper(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep(), name="upstream-sweeper")

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(1.0, self.read_timeout_s / 4))
            cutoff = time.monotonic() - self.read_timeout_s
            for conn in [c for c in self._busy if c.response is not None and c.last_io_s < cutoff]:
                conn._fail(UpstreamTimeout(f"no data from the backend for {self.read_timeout_s:g} s"))
                conn.close()

    async def request(self, method: str, url: str, body: bytes = b"", headers: dict[str, str] | None = None
                      ) -> UpstreamResponse:
        """Send a request; returns once the response's status and headers have arrived."""
        self._ensure_sweeper()
        target = self._targets.get((method, url))
        if target is None:
            target = self._targets[(method, url)] = _target(method, url)
        host, port, tls, head = target
        if headers:
            extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items()).encode("latin-1")
        else:
            extra = b""
        data = b"%sContent-Length: %d\r\n%s\r\n%s" % (head, len(body), extra, body)
        for attempt in (0, 1):
            conn = await self._acquire(host, port, tls, reuse=attempt == 0)
            response = UpstreamResponse(conn)
            conn.response = response
            conn.last_io_s = time.monotonic()
            self._busy.add(conn)
            assert conn.transport is not None
            conn.transport.write(data)
            try:
                await response._headers()
                return response
            except UpstreamError:
                conn.close()
                if attempt == 0 and conn.reused and not response.started:
                    continue  # a stale keep-alive connection: the backend never saw this request; again, on a new one
                raise
            except BaseException:  # cancelled (eviction, client gone) while waiting: the backend must stop
                conn.close()
                raise
        raise AssertionError("unreachable")

    async def _acquire(self, host: str, port: int, tls: bool, reuse: bool = True) -> _Connection:
        """An idle keep-alive connection to the target (the most recently used), or a new one; ``reuse=False``: a new
        one (the retry after a stale connection: the other idle ones may have been closed by the backend too)."""
        key = (host, port, tls)
        idle = self._idle.get(key) if reuse else None
        while idle:
            conn = idle.pop()
            if not conn.lost and conn.transport is not None and not conn.transport.is_closing():
                conn.reused = True
                return conn
        loop = asyncio.get_running_loop()
        context = None
        if tls:
            if self.tls is None:
                self.tls = ssl.create_default_context()
            context = self.tls
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(self, key), host, port, ssl=context,
                                       server_hostname=host if tls else None),
                self.connect_timeout_s)
        except asyncio.TimeoutError:
            raise UpstreamTimeout(f"connect to {host}:{port} timed out") from None
        except ssl.SSLError as exc:  # (an OSError too: caught first, to say it was TLS)
            raise UpstreamError(f"TLS to {host}:{port} failed: {exc.reason or exc}") from None
        except OSError as exc:
            raise UpstreamError(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from None
        return conn

    def release(self, conn: _Connection) -> None:
        self._busy.discard(conn)
        conn.parser = httptools.HttpResponseParser(conn)
        idle = self._idle.setdefault(conn.key, deque())
        if len(idle) >= self.max_idle:
            conn.close()
            return
        idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        self._busy.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        for conn in [c for idle in self._idle.values() for c in idle] + list(self._busy):
            conn.close()
        self._idle.clear()
        self._busy.clear()
        await asyncio.sleep(0)  # let the transports close


def _target(method: str, url: str) -> tuple[str, int, bool, bytes]:
    """(host, port, TLS or not, request line + Host header) of a URL, computed once per URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise UpstreamError(f"not an http(s) URL: {url!r}")
    tls = parts.scheme == "https"
    host, port = parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return host, port, tls, f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\n".encode("latin-1")
