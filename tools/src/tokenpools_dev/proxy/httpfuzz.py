"""A fuzzer of the proxy's HTTP framing: request bytes, generated from a grammar of HTTP/1.1 and then mutated, sent
in random pieces to a real proxy (``ProxyThread``: the app and its server on a real socket, in a thread of its
own), and the answer judged (``exchange``): a valid response or a close, never a hang, never a 5xx, never an
exception out of the protocol (``Faults``). Used by the CI-sized test (tests/component/test_proxy_http_fuzz.py)
and the long run (benchmarks/fuzz_http.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import httptools
import orjson

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.app import build_app
from tokenpools_dev.proxy.doubles import FakeBackend, ProducerHub, offline_options, proxy_config, running

KEY = "sk-fuzz"
DEADLINE_S = 0.5  # the proxy's header, body, write and keep-alive deadlines under fuzzing
HANG_S = 3.0  # no answer and no close this long after the last byte: a hang


class Outcome(StrEnum):
    ANSWERED = "answered"  # valid responses, then a close
    CLOSED = "closed"  # closed without a response (or reset)
    SERVER_ERROR = "server_error"  # a 5xx
    HUNG = "hung"  # neither a close nor anything within HANG_S
    INVALID = "invalid"  # bytes that are not valid HTTP responses


@dataclass
class Faults:
    """Exceptions that escaped the protocol (the loop's exception handler) or were logged as errors by the server."""

    errors: list[str] = field(default_factory=list)

    def loop_handler(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        self.errors.append(f"loop: {context.get('message')}: {context.get('exception')!r}")

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        faults = self

        class Recorder(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                faults.errors.append(f"log {record.name}: {record.getMessage()} {record.exc_info and record.exc_info[1]!r}")

        handler = Recorder(logging.ERROR)
        logger = logging.getLogger("tokenpools.proxy")
        logger.addHandler(handler)
        try:
            yield
        finally:
            logger.removeHandler(handler)


class ProxyThread:
    """The proxy app (fake backend, Kafka off, short deadlines) served on 127.0.0.1 by a thread of its own."""

    def __init__(self, **settings: Any) -> None:
        self.settings = {"header_timeout_s": DEADLINE_S, "body_timeout_s": DEADLINE_S, "write_timeout_s": DEADLINE_S,
                         "keepalive_timeout_s": DEADLINE_S, "max_body_bytes": 16 * 1024, **settings}
        self.faults = Faults()
        self.address: tuple[str, int] | None = None
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="fuzzed-proxy", daemon=True)
        self._tmp = tempfile.TemporaryDirectory()

    def __enter__(self) -> ProxyThread:
        self._thread.start()
        if not self._ready.wait(30) or self.address is None:
            raise RuntimeError("the proxy did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self._tmp.cleanup()

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.set_exception_handler(self.faults.loop_handler)
        self._stop = asyncio.Event()
        pool = PoolSpec("pool-a", "fake-model", Capacity(1e9, 1e15, 10_000))
        gold = EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(1e9, 1e15, 10_000))
        backend = FakeBackend()
        with self.faults.watching():
            async with running(backend.app()) as backend_url:
                config = proxy_config({"pool-a": (backend_url,)}, [pool], [gold], {"gold": KEY})
                options = offline_options(Path(self._tmp.name), **self.settings)
                app = build_app(config, options, producer_factory=ProducerHub().factory)
                async with running(app) as url:
                    host, port = url.removeprefix("http://").split(":")
                    self.address = (host, int(port))
                    self._ready.set()
                    await self._stop.wait()


# ---- the grammar ------------------------------------------------------------------------------------------------
METHODS = [b"GET", b"POST", b"POST", b"POST", b"HEAD", b"PUT", b"DELETE", b"OPTIONS", b"CONNECT", b"PRI", b"G\x00T",
           b"get", b""]
PATHS = [b"/v1/chat/completions", b"/v1/chat/completions", b"/v1/completions", b"/v1/models", b"/healthz",
         b"/metrics", b"/", b"*", b"/v1/chat/completions?x=1", b"http://proxy/healthz", b"/%00", b"/" + b"a" * 300]
VERSIONS = [b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.1", b"HTTP/1.0", b"HTTP/0.9", b"HTTP/2.0", b"HTTP/1.10", b"HTTP/1.",
            b"http/1.1", b""]
NOISE = [b"\r", b"\n", b"\r\n", b"\x00", b" ", b"\t", b":", b";", b",", b"\xff", b"0", b"-", b"\x0b", b"\r\n\r\n"]


def _json_body(rng: random.Random) -> bytes:
    kind = rng.random()
    if kind < 0.5:
        body: Any = {"model": "fake-model", "messages": [{"role": "user", "content": "hi" * rng.randint(0, 50)}],
                     "max_tokens": rng.choice([1, 2, 3, 0, -1, "3", None, 2**63 - 1])}
        if rng.random() < 0.3:
            body["stream"] = rng.choice([True, False, "yes", None])
        if rng.random() < 0.2:
            body["n"] = rng.choice([1, 2, 0, 1.5])
        return orjson.dumps(body) if rng.random() < 0.99 else b"{"
    if kind < 0.7:
        return rng.choice([b"{}", b"[]", b"null", b"1", b'"x"', b'{"model": 1}', b'{"messages": {}}'])
    return rng.randbytes(rng.randint(0, 64))


def _chunked(body: bytes, rng: random.Random) -> bytes:
    out, i = [], 0
    while i < len(body):
        n = rng.randint(1, max(1, len(body) - i))
        size = b"%x" % n
        if rng.random() < 0.1:
            size = rng.choice([b"zz", b"-1", b"f" * 20, b"", b" %x" % n, b"%X" % n, b"0x%x" % n])
        ext = rng.choice([b"", b"", b"", b";a=b", b";" + b"e" * rng.randint(1, 200), b";\x00"])
        out.append(size + ext + b"\r\n" + body[i:i + n] + rng.choice([b"\r\n"] * 9 + [b"", b"\n", b"XX"]))
        i += n
    out.append(rng.choice([b"0\r\n\r\n"] * 8 + [b"0\r\nTrailer: x\r\n\r\n", b"0\r\n", b"", b"0;x\r\n\r\n"]))
    return b"".join(out)


def _request(rng: random.Random) -> bytes:
    method, path, version = rng.choice(METHODS), rng.choice(PATHS), rng.choice(VERSIONS)
    sep = b" " if rng.random() < 0.95 else rng.choice([b"  ", b"\t", b""])
    lines = [method + sep + path + (b" " + version if version else b"")]
    body = _json_body(rng) if method in (b"POST", b"PUT") or rng.random() < 0.1 else b""
    framing = rng.random()
    headers: list[bytes] = [b"Host: proxy"]
    if rng.random() < 0.8:
        headers.append(b"Authorization: Bearer " + (KEY.encode() if rng.random() < 0.8 else b"sk-wrong"))
    if framing < 0.55:
        length = len(body)
        value = (b"%d" % length if rng.random() < 0.85 else
                 rng.choice([b"%d" % (length + 1), b"%d" % max(0, length - 1), b"-1", b"99999999999999999999",
                             b"%d, %d" % (length, length), b"+%d" % length, b"0x10", b""]))
        headers.append(b"Content-Length: " + value)
    elif framing < 0.85:
        headers.append(b"Transfer-Encoding: " + rng.choice([b"chunked"] * 6 + [b"CHUNKED", b"gzip, chunked",
                                                                             b"chunked, identity", b"identity"]))
        if rng.random() < 0.1:
            headers.append(b"Content-Length: %d" % len(body))
        body = _chunked(body, rng)
    for _ in range(rng.randint(0, 6)):
        headers.append(rng.choice([b"Expect: 100-continue", b"Connection: close", b"Connection: keep-alive",
                                   b"Connection: Upgrade", b"Upgrade: websocket", b"X-Repeat: a",
                                   b"X-Folded: a\r\n b", b"Content-Type: application/json",
                                   b"X-%d: %s" % (rng.randint(0, 99), rng.randbytes(rng.randint(0, 20)))]))
    if rng.random() < 0.05:
        headers.extend([b"X-Repeat: r"] * rng.randint(100, 3000))
    rng.shuffle(headers)
    return b"\r\n".join(lines + headers) + b"\r\n\r\n" + body


def _mutate(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.choice([0, 0, 0, 1, 1, 2, 3, 8])):
        if not buf:
            buf.extend(rng.randbytes(4))
        i = rng.randrange(len(buf) + 1)
        op = rng.randrange(5)
        if op == 0 and i < len(buf):
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[i:i] = rng.choice(NOISE)
        elif op == 2:
            del buf[i:i + rng.randint(1, 16)]
        elif op == 3:
            j = rng.randrange(len(buf) + 1)
            buf[i:i] = buf[min(i, j):max(i, j)][:256]
        else:
            buf[i:i] = rng.randbytes(rng.randint(1, 8))
    return bytes(buf)


def generate(rng: random.Random) -> tuple[bytes, list[int], bool]:
    """One input: the bytes (1-3 requests, mutated), where the writes split them, and whether the client half-closes
    after sending (else the proxy's deadlines must end the connection)."""
    data = _mutate(b"".join(_request(rng) for _ in range(rng.choice([1, 1, 1, 2, 3]))), rng)
    splits = sorted(rng.randrange(len(data) + 1) for _ in range(rng.choice([0, 0, 1, 2, 4, 16])))
    return data, splits, rng.random() < 0.9


# ---- one exchange -----------------------------------------------------------------------------------------------
class _Responses:
    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.parser = httptools.HttpResponseParser(self)
        self.interim = False

    def on_headers_complete(self) -> None:
        self.statuses.append(self.parser.get_status_code())

    def on_message_complete(self) -> None:
        if self.statuses and self.statuses[-1] == 100:  # 100 Continue: an interim response, another follows
            self.parser = httptools.HttpResponseParser(self)


@dataclass
class Result:
    outcome: Outcome
    statuses: list[int]
    seconds: float


def exchange(address: tuple[str, int], data: bytes, splits: list[int], half_close: bool,
             hang_s: float = HANG_S) -> Result:
    """Send ``data`` in the pieces ``splits`` cut, then read until the proxy closes (or ``hang_s`` of silence)."""
    t0 = time.perf_counter()
    responses = _Responses()
    invalid = False
    with socket.create_connection(address, timeout=hang_s) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            start = 0
            for cut in [*splits, len(data)]:
                if cut > start:
                    sock.sendall(data[start:cut])
                start = max(start, cut)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the proxy closed first: what it answered is still read below
        outcome = Outcome.HUNG
        while True:
            try:
                got = sock.recv(65536)
            except TimeoutError:
                break
            except OSError:
                got = b""
            if not got:
                outcome = Outcome.ANSWERED if responses.statuses else Outcome.CLOSED
                break
            if not invalid:
                try:
                    responses.parser.feed_data(got)
                except httptools.HttpParserError:
                    invalid = True
    if invalid and b"HEAD" not in data:  # a HEAD's answer has a length and no body: it cannot be parsed blind
        outcome = Outcome.INVALID
    elif outcome is not Outcome.HUNG and any(s >= 500 for s in responses.statuses):
        outcome = Outcome.SERVER_ERROR
    return Result(outcome, responses.statuses, time.perf_counter() - t0)
