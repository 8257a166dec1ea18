"""Malformed and ambiguous HTTP/1.1 framing against the real proxy on raw sockets: every case gets a clean 400 (an
OpenAI-shaped body, ``Connection: close``) and the connection closes, in one packet or byte by byte; nothing
reaches the backend; request-smuggling shapes never yield a second request; pipelining stays in order."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from tokenpools.proxy.http.http_limits import CloseReason

from http_support import BODY, Env, bystander, closed, post, replies, serving

pytestmark = pytest.mark.component

AUTH = b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer sk-gold\r\n"
CHUNKED = AUTH + b"Transfer-Encoding: chunked\r\n\r\n"
FIRST = b"%x\r\n%s\r\n" % (len(BODY), BODY)  # the whole body as one valid chunk

MALFORMED = {
    "chunk size not hex": CHUNKED + b"zz\r\n" + BODY + b"\r\n0\r\n\r\n",
    "chunk size overflows": CHUNKED + b"ffffffffffffffffffff\r\n" + BODY + b"\r\n0\r\n\r\n",
    "negative chunk size": CHUNKED + b"-5\r\nhello\r\n0\r\n\r\n",
    "chunk size with a space inside": CHUNKED + b"1 0\r\n" + BODY[:16] + b"\r\n0\r\n\r\n",
    "chunk data longer than its size": CHUNKED + b"5\r\nhello, world\r\n0\r\n\r\n",
    "missing CRLF after chunk data": CHUNKED + b"%x\r\n%s0\r\n\r\n" % (len(BODY), BODY),
    "bad chunk after a good one": CHUNKED + FIRST + b"xyz\r\n",
    "chunk extension with a bad character": CHUNKED + b"5;a\x00b\r\nhello\r\n0\r\n\r\n",
    "bad last-chunk trailer": CHUNKED + FIRST + b"0\r\nBad Trailer\r\n\r\n",
    "Content-Length and Transfer-Encoding": AUTH + b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
                                            + FIRST + b"0\r\n\r\n",
    "Transfer-Encoding then Content-Length": AUTH + b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n"
                                             + FIRST + b"0\r\n\r\n",
    "chunked not last": AUTH + b"Transfer-Encoding: chunked, identity\r\n\r\n" + FIRST + b"0\r\n\r\n",
    "unknown transfer coding only": AUTH + b"Transfer-Encoding: xchunked\r\n\r\n" + FIRST + b"0\r\n\r\n",
    "space before the colon": AUTH + b"Transfer-Encoding : chunked\r\n\r\n" + FIRST + b"0\r\n\r\n",
    "duplicate Content-Length, same value": AUTH + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n%s"
                                            % (len(BODY), len(BODY), BODY),
    "duplicate Content-Length, other value": AUTH + b"Content-Length: %d\r\nContent-Length: 1\r\n\r\n%s"
                                             % (len(BODY), BODY),
    "Content-Length list": AUTH + b"Content-Length: %d, %d\r\n\r\n%s" % (len(BODY), len(BODY), BODY),
    "negative Content-Length": AUTH + b"Content-Length: -5\r\n\r\nhello",
    "Content-Length with a sign": AUTH + b"Content-Length: +5\r\n\r\nhello",
    "Content-Length overflows": AUTH + b"Content-Length: 99999999999999999999999\r\n\r\nhello",
    "Content-Length not a number": AUTH + b"Content-Length: 0x10\r\n\r\nhello",
    "obsolete line folding": AUTH + b"Content-Length: %d\r\nX-Folded: a\r\n b\r\n\r\n%s" % (len(BODY), BODY),
    "NUL in a header value": AUTH + b"X-Nul: a\x00b\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY),
    "NUL in a header name": AUTH + b"X-N\x00ul: ab\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY),
    "NUL in the path": b"POST /v1/chat\x00/completions HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
    "CR alone ends a header": AUTH + b"X-A: a\rContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY),
    "header name with a space": AUTH + b"X A: a\r\n\r\n",
    "empty header name": AUTH + b": a\r\n\r\n",
    "unknown HTTP version": b"POST /v1/chat/completions HTTP/1.7\r\n\r\n",
    "HTTP/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
}

TOLERATED = {  # what llhttp accepts, unambiguous: answered as plain HTTP, never a 5xx, never a hang
    "request line with two spaces": (b"POST  /v1/chat/completions HTTP/1.1\r\n\r\n", 401),
    "upgrade to websocket": (b"GET /healthz HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", 200),
    "tab before a header value": (AUTH + b"Content-Length:\t%d\r\n\r\n%s" % (len(BODY), BODY), 200),
    "chunked in upper case": (AUTH + b"Transfer-Encoding: CHUNKED\r\n\r\n" + FIRST + b"0\r\n\r\n", 200),
}


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with serving(tmp_path) as env:
        yield env


async def refused_with_400(env: Env, data: bytes, *, byte_by_byte: bool = False) -> None:
    reader, writer = await env.connect()
    if byte_by_byte:
        for i in range(len(data)):
            if reader.at_eof():
                break
            writer.write(data[i:i + 1])
            await writer.drain()
    else:
        writer.write(data)
    got = await replies(reader, 2)
    assert [r.status for r in got] == [400], [(r.status, r.body) for r in got]
    (reply,) = got
    assert reply.headers["connection"] == "close"
    error = orjson.loads(reply.body)["error"]
    assert error["code"] == "bad_request" and error["type"] == "invalid_request_error" and error["message"]
    assert await closed(reader)
    writer.close()


@pytest.mark.parametrize("case", sorted(MALFORMED))
async def test_malformed_framing_gets_400_and_a_close(env: Env, case: str) -> None:
    async with bystander(env) as seen:
        await refused_with_400(env, MALFORMED[case])
    seen.report(case)
    assert env.backend.started == len(seen.latencies_ms)  # only the bystander's requests reached the backend
    for _ in range(500):  # counted once the connection is gone (it lingers until the client closes)
        if env.proxy.metrics.connections.closed[CloseReason.BAD_REQUEST] == 1:
            break
        await asyncio.sleep(0.01)
    assert env.proxy.metrics.connections.closed[CloseReason.BAD_REQUEST] == 1


@pytest.mark.parametrize("case", sorted(TOLERATED))
async def test_tolerated_shapes_get_a_plain_answer(env: Env, case: str) -> None:
    data, status = TOLERATED[case]
    reader, writer = await env.connect()
    writer.write(data)
    (reply,) = await replies(reader, 1)
    assert reply.status == status
    if reply.headers.get("connection") != "close":  # still usable
        writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
        assert [r.status for r in await replies(reader, 1)] == [200]
    writer.close()


@pytest.mark.parametrize("case", ["chunk size not hex", "missing CRLF after chunk data", "obsolete line folding",
                                  "Content-Length and Transfer-Encoding", "NUL in a header value"])
async def test_malformed_framing_byte_by_byte_gets_400(env: Env, case: str) -> None:
    await refused_with_400(env, MALFORMED[case], byte_by_byte=True)
    assert env.backend.started == 0


async def test_a_chunked_body_that_breaks_off_mid_read_gets_400(env: Env) -> None:
    reader, writer = await env.connect()
    writer.write(CHUNKED + b"%x\r\n%s\r\n" % (10, BODY[:10]))  # the handler is reading by now
    await asyncio.sleep(0.1)
    writer.write(b"not a chunk size\r\n")
    (reply,) = await replies(reader, 1)
    assert reply.status == 400 and reply.headers["connection"] == "close"
    assert await closed(reader)
    writer.close()
    assert env.backend.started == 0


async def test_chunk_extensions_are_ignored_and_bounded(tmp_path: Path) -> None:
    async with serving(tmp_path, body_timeout_s=0.5) as env:
        reader, writer = await env.connect()
        writer.write(CHUNKED + b"%x;name=value;other\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY))
        (ok,) = await replies(reader, 1)
        assert ok.status == 200
        t0 = time.monotonic()  # an endless extension: the body deadline ends it (nothing is buffered meanwhile)
        writer.write(CHUNKED + b"5;" + b"a" * 100_000)
        (reply,) = await replies(reader, 1)
        assert reply.status == 408 and reply.headers["connection"] == "close"
        assert await closed(reader)
        print(f"an endless chunk extension ended after {time.monotonic() - t0:.2f} s with {reply.status}")
        writer.close()


@pytest.mark.parametrize("smuggled", [
    # CL.TE and TE.CL: a front end that picks the other length would see a second request here
    AUTH + b"Content-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n",
    AUTH + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
    AUTH + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n",
    AUTH + b"Transfer-Encoding:\x0bchunked\r\n\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n",
    AUTH + b"Content-Length: 0\r\nContent-Length: 44\r\n\r\nGET /healthz HTTP/1.1\r\n\r\n",
])
async def test_smuggling_shapes_never_yield_a_second_request(env: Env, smuggled: bytes) -> None:
    reader, writer = await env.connect()
    writer.write(smuggled)
    got = await replies(reader, 3)
    assert [r.status for r in got] == [400], [(r.status, r.body) for r in got]
    assert await closed(reader)
    writer.close()


async def test_pipelined_requests_are_answered_in_order_across_packet_boundaries(env: Env) -> None:
    chunked = CHUNKED + b"".join(b"%x\r\n%s\r\n" % (len(BODY[i:i + 9]), BODY[i:i + 9])
                                 for i in range(0, len(BODY), 9)) + b"0\r\n\r\n"
    sent = [post(), b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n", chunked, post(key="sk-wrong"),
            b"GET /nowhere HTTP/1.1\r\n\r\n", post()] * 3
    data = b"".join(sent)
    reader, writer = await env.connect()
    for i in range(0, len(data), 37):  # boundaries fall anywhere: inside heads, lengths, chunks
        writer.write(data[i:i + 37])
        await writer.drain()
    got = await replies(reader, len(sent), timeout_s=10)
    assert [r.status for r in got] == [200, 200, 200, 401, 404, 200] * 3
    assert all("connection" not in r.headers for r in got)
    writer.close()
