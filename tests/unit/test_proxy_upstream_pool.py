"""The proxy's keep-alive pool (proxy/backends/upstream.py) against a backend that closes idle connections, as uvicorn does
after its keep-alive timeout: a request that met a stale connection is sent again, once, on a new connection."""

from __future__ import annotations

import asyncio

from tokenpools.proxy.backends.upstream import UpstreamPool

RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


async def _serve(expired: asyncio.Event) -> tuple[asyncio.base_events.Server, list[asyncio.StreamWriter], list[int]]:
    """A backend answering every request with {}; once ``expired`` is set, a connection it served before is closed
    when the next request comes on it, unanswered (the keep-alive timeout's race: the close and the request cross).
    ``writers`` are the connections it accepted, ``served`` counts the answers."""
    writers: list[asyncio.StreamWriter] = []
    served = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        answered = False
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if answered and expired.is_set():
                    writer.transport.abort()
                    return
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                served[0] += 1
                answered = True
                writer.write(RESPONSE)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, writers, served


def test_a_request_that_meets_stale_idle_connections_is_sent_again_on_a_new_one() -> None:
    async def scenario() -> None:
        expired = asyncio.Event()
        server, writers, served = await _serve(expired)
        port = server.sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        pool = UpstreamPool()
        try:
            first, second = await asyncio.gather(pool.request("POST", url, b"{}"), pool.request("POST", url, b"{}"))
            assert (await first.read(), await second.read()) == (b"{}", b"{}")  # two idle connections now
            expired.set()  # both idle connections are past the backend's keep-alive: each closes when next used
            third = await pool.request("POST", url, b"{}")
            assert await third.read() == b"{}"
            assert served[0] == 3 and len(writers) == 3  # the retry opened a connection of its own
        finally:
            await pool.close()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())
