"""Raw-socket helpers for the tests of the proxy's HTTP server (``test_proxy_http*.py``): a real proxy app in front
of the in-process fake backend, requests as bytes, a response parser, and a bystander that measures how a
well-behaved client fares while another one misbehaves."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httptools
import orjson

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.app import Proxy, build_app
from tokenpools_dev.proxy.doubles import FakeBackend, ProducerHub, offline_options, proxy_config, running

CAP = 4096
POOL = PoolSpec("pool-a", "fake-model", Capacity(10_000, 1e12, 8))
GOLD = EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(1000, 1e11, 4))
BODY = orjson.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
STREAM_BODY = orjson.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                            "max_tokens": 50})


@dataclasses.dataclass
class Env:
    host: str
    port: int
    backend: FakeBackend
    proxy: Proxy

    async def connect(self, **kwargs: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(self.host, self.port, **kwargs)


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, **settings: Any) -> AsyncIterator[Env]:
    """The proxy (``proxy`` settings: ``settings``, the body cap ``CAP`` unless given) before a fake backend."""
    backend = FakeBackend()
    async with running(backend.app()) as backend_url:
        config = proxy_config({"pool-a": (backend_url,)}, [POOL], [GOLD], {"gold": "sk-gold"})
        options = offline_options(tmp_path, **{"max_body_bytes": CAP, **settings})
        app = build_app(config, options, producer_factory=ProducerHub().factory)
        async with running(app) as url:
            host, port = url.removeprefix("http://").split(":")
            yield Env(host, int(port), backend, app.proxy)


def post(body: bytes = BODY, *, key: str = "sk-gold", path: str = "/v1/chat/completions",
         extra: bytes = b"") -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n%s\r\n%s" % (path.encode(), key.encode(), len(body), extra, body))


@dataclasses.dataclass
class Reply:
    status: int = 0
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    body: bytes = b""
    complete: bool = False


class _Replies:
    """Parses any number of responses from one connection (httptools), in order."""

    def __init__(self) -> None:
        self.done: list[Reply] = []
        self.current = Reply()
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.current.headers[name.decode().lower()] = value.decode()

    def on_headers_complete(self) -> None:
        self.current.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.current.body += body

    def on_message_complete(self) -> None:
        self.current.complete = True
        self.done.append(self.current)
        self.current = Reply()


async def replies(reader: asyncio.StreamReader, n: int, timeout_s: float = 5.0, read: bytes = b"") -> list[Reply]:
    """Read until ``n`` complete responses arrived (or the connection closed); ``read``: bytes already read."""
    parsed = _Replies()
    if read:
        parsed.parser.feed_data(read)
    async with asyncio.timeout(timeout_s):
        while len(parsed.done) < n:
            try:
                data = await reader.read(65536)
            except ConnectionResetError:
                break
            if not data:
                break
            parsed.parser.feed_data(data)
    return parsed.done


async def closed(reader: asyncio.StreamReader, timeout_s: float = 5.0) -> bool:
    """True if the server closes the connection (EOF) within ``timeout_s`` once any pending bytes are read."""
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                if not await reader.read(65536):
                    return True
            except ConnectionResetError:
                return True


def error_code(reply: Reply) -> str:
    return str(orjson.loads(reply.body)["error"]["code"])


@dataclasses.dataclass
class Bystander:
    """A well-behaved client: chat completions one after another on its own keep-alive connection."""

    latencies_ms: list[float] = dataclasses.field(default_factory=list)
    statuses: list[int] = dataclasses.field(default_factory=list)

    def p(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def unhurt(self, limit_ms: float) -> bool:
        """Every request answered 200, and none slower than ``limit_ms`` but one in fifty (at least one): with some
        twenty requests a p99 is the slowest, and one scheduler stall of a shared machine is not the attack's
        doing, while an attack that holds the server delays every request that comes after it."""
        slow = sum(ms >= limit_ms for ms in self.latencies_ms)
        return bool(self.latencies_ms) and set(self.statuses) == {200} and slow <= max(1, len(self.latencies_ms) // 50)

    def report(self, attack: str) -> str:
        line = (f"bystander during {attack}: {len(self.latencies_ms)} requests, p50 {self.p(0.5):.2f} ms, "
                f"p99 {self.p(0.99):.2f} ms, max {max(self.latencies_ms):.2f} ms, "
                f"mean {statistics.fmean(self.latencies_ms):.2f} ms")
        print(line)
        return line


@contextlib.asynccontextmanager
async def bystander(env: Env, pause_s: float = 0.005) -> AsyncIterator[Bystander]:
    """Runs a ``Bystander`` for the block (its connection is open before the block starts)."""
    seen = Bystander()
    reader, writer = await env.connect()
    request = post()
    stop = asyncio.Event()

    async def loop() -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            writer.write(request)
            (reply,) = await replies(reader, 1, timeout_s=10)
            seen.latencies_ms.append((time.perf_counter() - t0) * 1000)
            seen.statuses.append(reply.status)
            await asyncio.sleep(pause_s)

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.05)
    try:
        yield seen
    finally:
        stop.set()
        await task
        writer.close()
    assert seen.latencies_ms and set(seen.statuses) == {200}, seen.statuses
