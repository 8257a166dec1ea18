"""A counting relay: an HTTP hop between the proxy and a real backend that forwards everything unchanged and counts
the requests in flight through it, so a test can say how many requests the backend had at once from the proxy
(exactly, at every instant, where the backend's own gauge is a sample).

Responses are streamed back chunk by chunk. When the proxy drops its connection (a client went away), the handler
is cancelled at once (``handler_cancellation``: aiohttp's default waits for a write to fail) and the upstream
connection is closed: the backend sees the disconnect as it would without the relay. When the backend cannot be
reached (it is gone), the relay drops the proxy's connection without an answer: the proxy sees a failed backend, as
it would without the relay, rather than a 500 the relay wrote. Nothing happens at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

_HOP_BY_HOP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive"}


@dataclass
class CountingRelay:
    """Forwards to ``upstream`` (``http://host:port``); ``in_flight`` now, ``peak`` since :meth:`reset`."""

    upstream: str
    in_flight: int = 0
    peak: int = 0
    total: int = 0
    paths: list[str] = field(default_factory=list)
    _session: aiohttp.ClientSession | None = None

    def reset(self) -> None:
        self.peak = self.in_flight
        self.total = 0
        self.paths.clear()

    async def wait_idle(self, timeout_s: float = 10.0) -> None:
        """Until nothing is in flight through the relay (an upstream request ends shortly after its client's)."""
        async with asyncio.timeout(timeout_s):
            while self.in_flight:
                await asyncio.sleep(0.02)

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.total += 1
        self.paths.append(request.path)
        try:
            try:
                upstream = await self._session.request(request.method, self.upstream + request.path_qs, data=body,
                                                       headers=headers)
            except aiohttp.ClientConnectorError:  # no backend: the client must see a failed connection, not our 500
                if request.transport is not None:
                    request.transport.abort()
                return web.Response()  # never sent
            try:
                response = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP})
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
            except BaseException:
                upstream.close()  # closes the connection: releasing an unfinished answer could keep it open
                raise
            finally:
                upstream.release()
        finally:
            self.in_flight -= 1

    @contextlib.asynccontextmanager
    async def running(self, host: str = "127.0.0.1") -> AsyncIterator[str]:
        """Serve on a free port of ``host``; yields the relay's base URL."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            self._session = session
            runner = web.AppRunner(app, handle_signals=False, handler_cancellation=True)
            await runner.setup()
            site = web.TCPSite(runner, host, 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            try:
                yield f"http://{host}:{port}"
            finally:
                await runner.cleanup()
                self._session = None
