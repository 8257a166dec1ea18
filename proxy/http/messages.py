"""HTTP/1.1 messages of the proxy's server (``server.py``): the parsed ``Request`` and the two kinds of response.

- ``Response``: complete, written by the server in one ``transport.write`` (head and body together);
- ``StreamResponse``: ``prepare`` sends the head, each ``write`` one chunk of chunked transfer encoding (the bytes
  go out at once, nothing is buffered), ``write_eof`` the last chunk; writes wait while the client's socket buffer
  is above its high-water mark;
- ``error_response``: the OpenAI-shaped error ``{"error": {"message", "type", "code", "param"}}``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from tokenpools.proxy.http.connection import Connection

class BodyTooLarge(Exception):
    """The request body is larger than the server's ``max_body_bytes``."""


class ClientGone(ConnectionResetError):
    """The client closed the connection (or it failed) before the response was written."""


class BodyTimeout(Exception):
    """The request body did not arrive whole within the server's ``body_timeout_s``."""


class BadBody(Exception):
    """The request body's framing broke off (a malformed chunk): the connection cannot carry anything more."""


def expire(waiter: asyncio.Future[None]) -> None:
    """A deadline's timer: wakes ``waiter``, whose loop then sees the deadline has passed."""
    if not waiter.done():
        waiter.set_result(None)


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode("latin-1")
    except ValueError:
        return b"Unknown"


_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode("latin-1")) for s in HTTPStatus}


def status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d %s\r\n" % (status, _reason(status))


class Date:
    """The ``Date`` header, formatted once per second."""

    __slots__ = ("_second", "_value")

    def __init__(self) -> None:
        self._second = -1
        self._value = b""

    def header(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = b"Date: " + formatdate(now, usegmt=True).encode("latin-1") + b"\r\n"
        return self._value


def header_lines(headers: dict[str, str] | None) -> bytes:
    if not headers:
        return b""
    return "".join(f"{name}: {value}\r\n" for name, value in headers.items()).encode("latin-1")


class Response:
    """A complete response, written in one ``write`` by the server once the handler returns it."""

    __slots__ = ("status", "body", "headers")

    def __init__(self, status: int = 200, body: bytes = b"", headers: dict[str, str] | None = None,
                 content_type: str | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = dict(headers) if headers else {}
        if content_type is not None:
            self.headers["Content-Type"] = content_type


class StreamResponse:
    """A response written as it goes: ``prepare`` sends the head, ``write`` one chunk, ``write_eof`` the end."""

    __slots__ = ("status", "headers", "prepared", "finished", "_conn", "_chunked")

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = dict(headers) if headers else {}
        self.prepared = False
        self.finished = False
        self._conn: Connection | None = None
        self._chunked = True

    async def prepare(self, request: Request) -> None:
        conn = request._conn
        conn.check_open()
        self._conn = conn
        self._chunked = request.http_version != "1.0"  # HTTP/1.0: the end of the body is the end of the connection
        keep = request.keep_alive and self._chunked and not conn.closing
        framing = b"Transfer-Encoding: chunked\r\n" if self._chunked else b""
        request.response_keeps_alive = keep
        request.streaming = True
        conn.transport_write(status_line(self.status) + header_lines(self.headers) + framing
                             + (b"" if keep else b"Connection: close\r\n") + conn.server.date.header() + b"\r\n")
        self.prepared = True
        await conn.drain()

    async def write(self, data: bytes) -> None:
        conn = self._conn
        assert conn is not None and self.prepared and not self.finished, "write before prepare or after write_eof"
        if not data:
            return
        conn.check_open()
        conn.transport_write(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)
        await conn.drain()

    async def write_eof(self) -> None:
        conn = self._conn
        if conn is None or self.finished:
            return
        conn.check_open()
        self.finished = True
        if self._chunked:
            conn.transport_write(b"0\r\n\r\n")
        await conn.drain()


Handler = Callable[["Request"], Awaitable["Response | StreamResponse"]]


class Request:
    """One parsed request. ``headers`` keys are lower case; repeated headers are joined with ", "."""

    __slots__ = ("method", "path", "query", "headers", "http_version", "keep_alive", "content_length",
                 "response_keeps_alive", "streaming", "_conn", "_parts", "_size", "_complete", "_too_large", "_waiter",
                 "_continued", "_error")

    def __init__(self, conn: Connection, method: str, url: bytes, headers: dict[str, str], http_version: str,
                 keep_alive: bool) -> None:
        self._conn = conn
        self.method = method
        path, _, query = url.partition(b"?")
        self.path = path.decode("latin-1")
        self.query = query.decode("latin-1")
        self.headers = headers
        self.http_version = http_version
        self.keep_alive = keep_alive
        length = headers.get("content-length")
        self.content_length = int(length) if length is not None and "transfer-encoding" not in headers else None
        self.response_keeps_alive = keep_alive
        self.streaming = False
        self._parts: list[bytes] = []
        self._size = 0
        self._complete = False
        self._too_large = False
        self._waiter: asyncio.Future[None] | None = None
        self._continued = False
        self._error: str | None = None

    async def read(self) -> bytes:
        """The whole body. Raises ``BodyTooLarge`` past the server's cap, ``BodyTimeout`` if it is not all in
        within the server's ``body_timeout_s``, ``BadBody`` if its framing broke, ``ClientGone`` if the client left."""
        conn = self._conn
        limits = conn.limits
        limit = limits.max_body_bytes
        if self.content_length is not None and self.content_length > limit:
            raise BodyTooLarge(limit)
        if not self._complete and not self._continued and self.headers.get("expect", "").lower() == "100-continue":
            self._continued = True
            conn.transport_write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not (self._complete or self._too_large or self._error is not None):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + limits.body_timeout_s
            while not (self._complete or self._too_large or self._error is not None):
                conn.check_open()
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise BodyTimeout(limits.body_timeout_s)
                self._waiter = waiter = loop.create_future()
                timer = loop.call_later(remaining, expire, waiter)
                try:
                    await waiter
                finally:
                    self._waiter = None
                    timer.cancel()
        if self._error is not None:
            raise BadBody(self._error)
        if self._too_large:
            raise BodyTooLarge(limit)
        parts = self._parts
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, message: str) -> None:
        self._error = message
        self._parts = []
        self._wake()

    def _feed(self, data: bytes, limit: int) -> None:
        if self._too_large:
            return
        self._size += len(data)
        if self._size > limit:
            self._too_large = True
            self._parts = []
            self._wake()
            return
        self._parts.append(data)


def error_body(message: str, type_: str, code: str, param: str | None = None) -> bytes:
    """An OpenAI-shaped error: ``{"error": {"message", "type", "code", "param"}}``."""
    return orjson.dumps({"error": {"message": message, "type": type_, "code": code, "param": param}})


def error_response(status: int, message: str, type_: str, code: str, param: str | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    return Response(status, error_body(message, type_, code, param), headers, "application/json")
