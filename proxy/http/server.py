"""A lean HTTP/1.1 server for the proxy: ``asyncio.Protocol`` connections parsed by httptools (llhttp).

Why not aiohttp's server: on this project's 2-vCPU machines it cost ~160 µs of CPU per request, a third of the
whole proxy (``benchmarks/proxy_overhead.py``; py-spy of the proxy process). This one does what the proxy needs and
nothing else, with one ``transport.write`` per plain response:

- **Messages** (``messages.py``): ``Request``, ``Response``, ``StreamResponse``.
- **Connections** (``connection.py``): one worker task each, answering its requests strictly in order (keep-alive
  and pipelining; reading pauses while two requests wait).
- **Limits** (``http_limits.py``, the ``proxy`` settings): the head (431) and body (413) caps, the head, body and
  write deadlines (408, or a cut connection), ``max_connections`` (503) and ``max_requests_per_connection``
  (``Connection: close``). This module's sweeper enforces the deadlines of connections that wait on their client
  (a late head, an idle keep-alive); ``Request.read`` and the writes keep their own. Every close is counted by
  reason in ``ConnectionStats`` (``tokenpools_proxy_connections_closed_total{reason}``).
- **Bodies:** ``Content-Length`` or chunked, buffered up to ``max_body_bytes``. Past the cap ``read`` raises
  ``BodyTooLarge`` and nothing more is kept; a request whose body was not read to its end closes the connection
  after its response (a ``Content-Length`` above the cap is refused before any body byte is read).
  ``Expect: 100-continue`` gets its ``100 Continue`` only when the handler reads the body.
- **Bad input:** a malformed request line, header or chunk, conflicting lengths, or a head above
  ``max_head_bytes``, gets an OpenAI-shaped 400 (431 for the size) and the connection closes; the server keeps
  serving everyone else.
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

from tokenpools.proxy.http.connection import Connection
from tokenpools.proxy.http.http_limits import CloseReason, ConnectionStats, HttpLimits, overdue
from tokenpools.proxy.http.messages import Date, Handler

__all__ = ["HttpServer"]

log = logging.getLogger("tokenpools.proxy.http.server")


class HttpServer:
    """Serves ``handler`` on one listening socket within ``limits``. ``start`` → (host, port); ``close`` drains and
    stops. ``stats``: the counters to keep (the proxy's metrics own them), else a fresh set."""

    def __init__(self, handler: Handler, limits: HttpLimits, stats: ConnectionStats | None = None) -> None:
        self.handler = handler
        self.limits = limits
        self.stats = stats if stats is not None else ConnectionStats()
        self.connections: set[Connection] = set()
        self.refused: set[Connection] = set()  # answered 503 (max_connections), lingering a moment
        self.date = Date()
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int, *, backlog: int = 2048) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: Connection(self), host, port, backlog=backlog,
                                                reuse_address=True)
        self._sweeper = loop.create_task(self._sweep())
        sockname = self._server.sockets[0].getsockname()
        return sockname[0], sockname[1]

    async def _sweep(self) -> None:
        """Close connections past a deadline while they wait on their client (``overdue``): a head that is late
        (408; a new connection that sent nothing is just closed), a keep-alive connection idle for too long."""
        limits = self.limits
        while True:
            await asyncio.sleep(limits.sweep_interval_s)
            now = time.monotonic()
            for conn in list(self.connections):
                waiting = not conn.busy and not conn.queue
                reason = overdue(limits, now, head_since_s=None if conn.read_paused else conn.head_since_s,
                                 idle_since_s=conn.idle_since_s if waiting else None, requests=conn.requests)
                if reason is not None:
                    conn.expire(reason)

    async def close(self, grace_s: float = 10.0) -> None:
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        for conn in list(self.connections):
            conn.closing = True  # responses in progress say Connection: close
            conn.close_reason = conn.close_reason or CloseReason.SHUTDOWN
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
        for conn in [*self.connections, *self.refused]:
            if conn.transport is not None:
                conn.transport.abort()
        await asyncio.sleep(0)  # let the transports close
