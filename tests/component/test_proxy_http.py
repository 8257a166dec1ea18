"""The proxy's own HTTP/1.1 server (``proxy/http/server.py``) on raw sockets: malformed heads, body caps, keep-alive,
pipelining, ``Expect: 100-continue``, chunked bodies, client disconnects and a clean shutdown. Each test runs the
real proxy app in front of the in-process fake backend."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from tokenpools.proxy.app import build_app, listening
from tokenpools_dev.proxy.doubles import FakeBackend, ProducerHub, offline_options, proxy_config, running

from http_support import BODY, CAP, GOLD, POOL, STREAM_BODY, Env, closed, error_code, post, replies, serving

pytestmark = pytest.mark.component


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    async with serving(tmp_path) as env:
        yield env


@pytest.mark.parametrize("head", [
    b"GARBAGE\r\n\r\n",  # no method, path or version
    b"POST /v1/chat/completions HTTP/1.1\r\nHost proxy\r\n\r\n",  # a header without a colon
    b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: ten\r\n\r\n",  # a non-numeric length
    b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",  # smuggling
    b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
    b"POST /v1/chat/completions HTTP/9.9\r\n\r\n",
])
async def test_a_malformed_request_head_gets_400_and_the_connection_closes(env: Env, head: bytes) -> None:
    reader, writer = await env.connect()
    writer.write(head)
    (reply,) = await replies(reader, 1)
    assert reply.status == 400 and reply.headers["connection"] == "close"
    error = orjson.loads(reply.body)["error"]
    assert error["code"] == "bad_request" and error["type"] == "invalid_request_error" and error["message"]
    assert await closed(reader)
    writer.close()
    assert env.backend.started == 0
    reader, writer = await env.connect()  # the proxy keeps serving
    writer.write(post())
    (ok,) = await replies(reader, 1)
    assert ok.status == 200 and orjson.loads(ok.body)["choices"][0]["message"]["content"] == "tok " * 3
    writer.close()


async def test_an_oversize_head_gets_431(env: Env) -> None:
    reader, writer = await env.connect()
    writer.write(b"GET /healthz HTTP/1.1\r\n")
    for _ in range(40):  # 40 x 4 KiB of headers, never finished: the server must not buffer them all
        writer.write(b"X-Filler: " + b"a" * 4096 + b"\r\n")
        await writer.drain()
    (reply,) = await replies(reader, 1)
    assert reply.status == 431 and error_code(reply) == "bad_request"
    assert await closed(reader)
    writer.close()


async def test_an_oversize_length_gets_413_before_the_body_is_sent(env: Env) -> None:
    reader, writer = await env.connect()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer sk-gold\r\n"
                 b"Content-Length: 10000000\r\n\r\n" + b"x" * 1000)  # 1 kB of a declared 10 MB
    (reply,) = await replies(reader, 1)
    assert reply.status == 413 and error_code(reply) == "body_too_large" and str(CAP) in reply.body.decode()
    assert reply.headers["connection"] == "close"  # the unread body cannot be skipped: the connection ends
    assert await closed(reader)
    writer.close()
    assert env.backend.started == 0 and env.proxy.metrics.bad_requests["body_too_large"] == 1


async def test_an_oversize_chunked_body_gets_413_once_it_passes_the_cap(env: Env) -> None:
    reader, writer = await env.connect()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer sk-gold\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    for _ in range(5):  # 5 kB in chunks, no last chunk: the answer must not wait for the end of the body
        writer.write(b"400\r\n" + b"x" * 1024 + b"\r\n")
    (reply,) = await replies(reader, 1)
    assert reply.status == 413 and error_code(reply) == "body_too_large"
    assert await closed(reader)
    writer.close()


async def test_expect_100_continue(env: Env) -> None:
    reader, writer = await env.connect()
    head = post(b"", extra=b"Expect: 100-continue\r\n").replace(b"Content-Length: 0", b"Content-Length: %d" % len(BODY))
    writer.write(head)
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(BODY)
    (reply,) = await replies(reader, 1)
    assert reply.status == 200
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer sk-gold\r\nExpect: 100-continue\r\n"
                 b"Content-Length: 99999\r\n\r\n")
    (refused,) = await replies(reader, 1)  # too large: refused at once, no 100 Continue
    assert refused.status == 413
    writer.close()


async def test_a_chunked_body_is_read_whole(env: Env) -> None:
    reader, writer = await env.connect()
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer sk-gold\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    for i in range(0, len(BODY), 7):
        part = BODY[i:i + 7]
        writer.write(b"%x\r\n%s\r\n" % (len(part), part))
        await asyncio.sleep(0.001)
    writer.write(b"0\r\n\r\n")
    (reply,) = await replies(reader, 1)
    assert reply.status == 200 and env.backend.bodies[-1]["messages"] == [{"role": "user", "content": "hi"}]
    writer.close()


async def test_keep_alive_carries_several_requests_including_errors(env: Env) -> None:
    reader, writer = await env.connect()
    sent = [post(), post(key="sk-wrong"), post(b"{not json"), post(path="/v1/images/generations"),
            b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n", post()]
    got = []
    for request in sent:  # one after the other on the same connection
        writer.write(request)
        (reply,) = await replies(reader, 1)
        got.append(reply)
    assert [r.status for r in got] == [200, 401, 400, 404, 200, 200]
    assert [error_code(r) for r in got[1:4]] == ["unknown_key", "invalid_json", "not_found"]
    assert all("connection" not in r.headers for r in got)
    assert env.backend.started == 2
    writer.write(b"".join(sent))  # pipelined: all at once, answered in order
    again = await replies(reader, len(sent))
    assert [r.status for r in again] == [200, 401, 400, 404, 200, 200]
    ids = [r.headers.get("x-request-id") for r in again if r.status == 200 and "x-request-id" in r.headers]
    assert len(ids) == 2 and len(set(ids)) == 2
    writer.close()


async def test_an_unread_small_body_is_skipped_and_the_connection_stays_open(env: Env) -> None:
    reader, writer = await env.connect()
    # a 401 is decided before the body is read; the body (within the cap) still arrives afterwards
    writer.write(post(key="sk-wrong")[:-len(BODY)])
    (refused,) = await replies(reader, 1)
    assert refused.status == 401
    writer.write(BODY + post())
    (ok,) = await replies(reader, 1)
    assert ok.status == 200
    writer.close()


async def test_http_1_0_gets_an_answer_and_a_close(env: Env) -> None:
    reader, writer = await env.connect()
    writer.write(post().replace(b"HTTP/1.1", b"HTTP/1.0"))
    (reply,) = await replies(reader, 1)
    assert reply.status == 200 and reply.headers["connection"] == "close"
    assert await closed(reader)
    writer.close()


async def test_a_stream_is_chunked_and_keeps_the_connection(env: Env) -> None:
    env.backend.chunks = 3
    reader, writer = await env.connect()
    writer.write(post(STREAM_BODY) + post())
    stream, plain = await replies(reader, 2)
    assert stream.headers["transfer-encoding"] == "chunked"
    assert stream.headers["content-type"].startswith("text/event-stream")
    assert stream.body.count(b"tok") == 3 and stream.body.endswith(b"data: [DONE]\n\n")
    assert plain.status == 200
    writer.close()


async def test_a_client_gone_mid_stream_frees_the_backend_connection_and_the_slot(env: Env) -> None:
    env.backend.chunks, env.backend.chunk_delay_s = 50, 0.05
    reader, writer = await env.connect()
    writer.write(post(STREAM_BODY))
    await reader.readuntil(b"tok")  # the stream is flowing
    controller = env.proxy.pools["pool-a"].controller
    assert controller.in_flight == 1
    writer.close()  # the client goes away
    for _ in range(200):
        if env.backend.aborted and not controller.in_flight:
            break
        await asyncio.sleep(0.01)
    assert env.backend.aborted == 1 and env.backend.finished == 0
    assert controller.in_flight == 0
    handlers = env.proxy.handlers
    assert handlers is not None and not handlers.flights
    assert not handlers.upstream.pool._busy, "the backend connection was not released"


async def test_a_client_gone_while_the_backend_thinks_frees_the_slot(env: Env) -> None:
    env.backend.delay_s = 0.5
    reader, writer = await env.connect()
    writer.write(post())
    controller = env.proxy.pools["pool-a"].controller
    for _ in range(100):
        if controller.in_flight:
            break
        await asyncio.sleep(0.01)
    writer.close()
    for _ in range(200):
        if not controller.in_flight and env.backend.aborted:
            break
        await asyncio.sleep(0.01)
    assert controller.in_flight == 0 and env.backend.aborted == 1


async def test_shutdown_lets_a_request_in_progress_finish(tmp_path: Path) -> None:
    backend = FakeBackend(delay_s=0.4)
    async with running(backend.app()) as backend_url:
        config = proxy_config({"pool-a": (backend_url,)}, [POOL], [GOLD], {"gold": "sk-gold"})
        app = build_app(config, offline_options(tmp_path),
                        producer_factory=ProducerHub().factory)
        async with listening(app, "127.0.0.1", 0, grace_s=5.0) as url:
            host, port = url.removeprefix("http://").split(":")
            busy_r, busy_w = await asyncio.open_connection(host, int(port))
            idle_r, idle_w = await asyncio.open_connection(host, int(port))
            busy_w.write(post())
            idle_w.write(b"GET /healthz HTTP/1.1\r\n\r\n")
            assert [r.status for r in await replies(idle_r, 1)] == [200]
            await asyncio.sleep(0.1)  # the request is at the backend now
        # the block has ended: the server stopped, after answering the request in progress
        (reply,) = await replies(busy_r, 1)
        assert reply.status == 200 and reply.headers["connection"] == "close"
        assert await closed(idle_r) and await closed(busy_r)
        busy_w.close()
        idle_w.close()
        assert backend.finished == 1 and app.proxy.pools["pool-a"].controller.in_flight == 0
        with pytest.raises(OSError):
            await asyncio.open_connection(host, int(port))


@pytest.mark.slow
async def test_a_slow_client_slows_the_backend_instead_of_filling_the_proxy(env: Env) -> None:
    from tokenpools.proxy.backends.upstream import HIGH_WATER_BYTES

    chunks, size = 400, 64 * 1024  # ~26 MB of SSE: more than every socket buffer on the way can hold
    env.backend.chunks, env.backend.chunk_text = chunks, "x" * size
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)  # a small window, fixed (no autotuning)
    sock.connect((env.host, env.port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=16 * 1024)  # the reader pauses above 32 KiB
    writer.write(post(orjson.dumps({"model": "fake-model", "messages": [{"role": "user", "content": "hi"}],
                                    "stream": True, "max_tokens": chunks})))
    start = await reader.readuntil(b"xxxx")  # the stream has started; now the client stops reading for a while
    await asyncio.sleep(1.0)
    handlers = env.proxy.handlers
    assert handlers is not None
    (conn,) = handlers.upstream.pool._busy
    assert conn.response is not None and conn.response.paused
    assert conn.response.buffered <= HIGH_WATER_BYTES + 256 * 1024, "the proxy kept reading from the backend"
    assert env.backend.finished == 0, "the backend was never slowed down"
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # read the rest quickly
    (reply,) = await replies(reader, 1, timeout_s=60, read=start)  # now read everything: nothing was lost
    assert reply.complete and reply.body.count(b"x" * size) == chunks
    for _ in range(100):
        if env.backend.finished:
            break
        await asyncio.sleep(0.01)
    assert env.backend.finished == 1
    writer.close()
