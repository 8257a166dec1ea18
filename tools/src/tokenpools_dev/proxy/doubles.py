"""Test and benchmark support: an in-process OpenAI-style backend, an in-memory producer, offline options.

Nothing happens at import time; tests build these explicitly. The fake backend speaks enough of vLLM's API for the
proxy's logic (chat and completion streams with ``include_usage``, usage in JSON responses, its own 429/503, and
embeddings and the Responses API in OpenAI's shapes) and records what it saw.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from tokenpools.config import KafkaSettings, PolicySettings, ProxySettings, Settings
from tokenpools.config.keys import hash_api_key
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.app import ProxyApp, listening
from tokenpools.proxy.options import ProxyConfig, ProxyOptions
from tokenpools.proxy.admission.pools import FleetOptions
from tokenpools.topics.records import EntitlementLimit, LimitUpdate, ProxyShare


@dataclass
class FakeBackend:
    """Attributes steer the next responses; ``bodies`` holds every request body received."""

    model: str = "fake-model"
    chunks: int = 4
    chunk_text: str = "tok "  # the content of each streamed chunk
    chunk_delay_s: float = 0.0
    delay_s: float = 0.0  # before a non-streaming answer or the first chunk
    prompt_tokens: int = 10
    cached_prompt_tokens: int = 0  # >0: chat/completions usage reports them (prompt_tokens_details.cached_tokens)
    status: int = 200  # anything else: an error of the backend's own
    usage_on_last_content_chunk: bool = False
    reject_priority: bool = False  # answer 400 to a body with `priority`, as vLLM does without priority scheduling
    fail_after: int | None = None  # a stream's error event after this many chunks (vLLM's, when its engine dies),
    # then [DONE] after ``chunk_delay_s``
    bodies: list[dict[str, Any]] = field(default_factory=list)
    authorizations: list[str | None] = field(default_factory=list)  # each completion request's Authorization header
    aborted: int = 0
    started: int = 0
    finished: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "x"}]})

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.bodies.append(body)
        self.authorizations.append(request.headers.get("Authorization"))
        self.started += 1
        chat = request.path.endswith("/chat/completions")
        refused = self._refused(body)
        if refused is not None:
            return refused
        n = min(self.chunks, int(body.get("max_tokens") or body.get("max_completion_tokens") or self.chunks))
        delay_s = self.delay_s
        usage: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": n,
                                 "total_tokens": self.prompt_tokens + n}
        if self.cached_prompt_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached_prompt_tokens}
        try:
            if delay_s:
                await asyncio.sleep(delay_s)
            if not body.get("stream"):
                choice = ({"index": 0, "message": {"role": "assistant", "content": "tok " * n},
                           "finish_reason": "length"} if chat else {"index": 0, "text": "tok " * n,
                                                                    "finish_reason": "length"})
                self.finished += 1
                return web.json_response({"id": "cmpl-1", "object": "chat.completion" if chat else "text_completion",
                                          "created": 1, "model": self.model, "choices": [choice], "usage": usage})
            return await self._stream(request, body, chat, n, usage, self.chunk_delay_s)
        except (asyncio.CancelledError, ConnectionResetError):
            self.aborted += 1
            raise

    def _refused(self, body: dict[str, Any]) -> web.Response | None:
        """The backend's own error (``status``), or vLLM's 400 for a ``priority`` it does not schedule by."""
        if self.status != 200:
            return web.json_response({"error": {"message": f"backend says {self.status}", "type": "overloaded",
                                                "code": self.status}}, status=self.status)
        if self.reject_priority and "priority" in body:
            return web.json_response({"error": {"message": f"Got priority {body['priority']} but Priority scheduling "
                                                "is not enabled.", "type": "BadRequestError", "code": 400}},
                                     status=400)
        return None

    async def _embeddings(self, request: web.Request) -> web.Response:
        """One 4-dimension vector per input (floats, or base64 float32 as the ``openai`` client asks by default);
        usage: ``prompt_tokens`` per input, no completion."""
        body = orjson.loads(await request.read())
        self.bodies.append(body)
        self.started += 1
        refused = self._refused(body)
        if refused is not None:
            return refused
        inputs = body["input"] if isinstance(body["input"], list) and not isinstance(body["input"][0], int) \
            else [body["input"]]
        vector = [0.5, -0.25, 0.125, 1.0]
        encoded: Any = (base64.b64encode(struct.pack("<4f", *vector)).decode()
                        if body.get("encoding_format") == "base64" else vector)
        prompt = self.prompt_tokens * len(inputs)
        self.finished += 1
        return web.json_response({"object": "list", "model": self.model, "data": [
            {"object": "embedding", "index": i, "embedding": encoded} for i in range(len(inputs))],
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt}})

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        """The Responses API: ``min(chunks, max_output_tokens)`` output tokens, as one message or as typed events
        (``response.created``, ``response.output_text.delta`` each, ``response.completed`` with the usage)."""
        body = orjson.loads(await request.read())
        self.bodies.append(body)
        self.started += 1
        refused = self._refused(body)
        if refused is not None:
            return refused
        n = min(self.chunks, int(body.get("max_output_tokens") or self.chunks))
        usage = {"input_tokens": self.prompt_tokens, "output_tokens": n, "total_tokens": self.prompt_tokens + n,
                 "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}
        message = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                   "content": [{"type": "output_text", "text": self.chunk_text * n, "annotations": []}]}
        response: dict[str, Any] = {"id": "resp_1", "object": "response", "created_at": 1, "model": self.model,
                                    "status": "completed", "output": [message], "usage": usage,
                                    "parallel_tool_calls": False, "tool_choice": "auto", "tools": []}
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if not body.get("stream"):
                self.finished += 1
                return web.json_response(response)
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            events: list[dict[str, Any]] = [{"type": "response.created", "response": {
                **response, "status": "in_progress", "output": [], "usage": None}}]
            events += [{"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
                        "content_index": 0, "delta": self.chunk_text} for _ in range(n)]
            events.append({"type": "response.completed", "response": response})
            for i, event in enumerate(events):
                if i > 1 and self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
                event["sequence_number"] = i
                await out.write(b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n")
            await out.write_eof()
            self.finished += 1
            return out
        except (asyncio.CancelledError, ConnectionResetError):
            self.aborted += 1
            raise

    async def _stream(self, request: web.Request, body: dict[str, Any], chat: bool, n: int,
                      usage: dict[str, int], chunk_delay_s: float) -> web.StreamResponse:
        """A request keeps the pacing it started with, whatever a test sets for the next ones."""
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"
        fail_after = self.fail_after
        for i in range(n):
            if i and chunk_delay_s:
                await asyncio.sleep(chunk_delay_s)
            if i == fail_after:
                error = {"message": "EngineCore encountered an issue.", "type": "InternalServerError", "code": 500}
                await out.write(b"data: " + orjson.dumps({"error": error}) + b"\n\n")
                await asyncio.sleep(chunk_delay_s)
                await out.write(b"data: [DONE]\n\n")
                await out.write_eof()
                return out
            text = self.chunk_text
            choice: dict[str, Any] = ({"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text})
            if i == n - 1:
                choice["finish_reason"] = "length"
            chunk: dict[str, Any] = {"id": "c1", "object": obj, "created": 1, "model": self.model, "choices": [choice]}
            if i == n - 1 and self.usage_on_last_content_chunk:
                chunk["usage"] = usage
            await out.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        options = body.get("stream_options") or {}
        if options.get("include_usage") and not self.usage_on_last_content_chunk:
            final = {"id": "c1", "object": obj, "created": 1, "model": self.model, "choices": [], "usage": usage}
            await out.write(b"data: " + orjson.dumps(final) + b"\n\n")
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        self.finished += 1
        return out


class FakeProducer:
    """In-memory stand-in for AIOKafkaProducer. ``down`` parks deliveries (like an idempotent producer retrying)
    until it is ``up`` again; ``fail_sends`` makes ``send`` raise as a full accumulator would."""

    def __init__(self, hub: ProducerHub) -> None:
        self.hub = hub

    async def start(self) -> None:
        if self.hub.refuse_start:
            raise ConnectionError("broker unreachable")

    async def stop(self) -> None:
        pass

    async def flush(self) -> None:
        while self.hub.parked and not self.hub.down:
            await asyncio.sleep(0.01)

    async def send(self, topic: str, value: bytes, key: bytes | None = None) -> asyncio.Future[Any]:
        return await self._submit(topic, [(key, value)])

    async def partitions_for(self, topic: str) -> set[int]:
        from aiokafka.errors import KafkaTimeoutError

        if self.hub.fail_sends:
            raise KafkaTimeoutError()
        return {0, 1, 2, 3}

    def create_batch(self) -> FakeBatch:
        return FakeBatch()

    async def send_batch(self, batch: FakeBatch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        return await self._submit(topic, batch.records)

    async def _submit(self, topic: str, records: list[tuple[bytes | None, bytes]]) -> asyncio.Future[Any]:
        from aiokafka.errors import KafkaTimeoutError

        if self.hub.fail_sends:
            await asyncio.sleep(0)
            raise KafkaTimeoutError()
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.hub.down:
            self.hub.parked.append((fut, topic, records))
        else:
            self.hub.deliver(fut, topic, records)
        return fut


class FakeBatch:
    """A producer batch: at most ``capacity`` records."""

    def __init__(self, capacity: int = 64) -> None:
        self.records: list[tuple[bytes | None, bytes]] = []
        self.capacity = capacity

    def append(self, *, timestamp: float | None, key: bytes | None, value: bytes) -> object | None:
        if len(self.records) >= self.capacity:
            return None
        self.records.append((key, value))
        return len(self.records)


@dataclass
class ProducerHub:
    """What every FakeProducer made by ``factory`` delivers to: ``records`` is the "topic"."""

    records: list[tuple[str, bytes | None, bytes]] = field(default_factory=list)
    parked: list[tuple[asyncio.Future[Any], str, list[tuple[bytes | None, bytes]]]] = field(default_factory=list)
    down: bool = False
    fail_sends: bool = False
    refuse_start: bool = False

    def factory(self) -> FakeProducer:
        return FakeProducer(self)

    def deliver(self, fut: asyncio.Future[Any], topic: str, records: list[tuple[bytes | None, bytes]]) -> None:
        if fut.done():  # failed meanwhile (a test's doing): the broker never got it
            return
        self.records.extend((topic, key, value) for key, value in records)
        fut.set_result(len(self.records))

    def set_up(self) -> None:
        self.down = self.fail_sends = self.refuse_start = False
        parked, self.parked = self.parked, []
        for fut, topic, records in parked:
            self.deliver(fut, topic, records)

    def of(self, topic_suffix: str) -> list[dict[str, Any]]:
        """The events produced to the topic, a packed record (``topics.batches``) giving each of its elements."""
        return unpack([orjson.loads(v) for t, _, v in self.records if t.endswith(topic_suffix)])


def unpack(values: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Record values as read from a topic → the events in them (an ``event_batch`` holds several, or none)."""
    return [e for v in values for e in (v.get("events", []) if v.get("record_type") == "event_batch" else [v])]


async def serve(app: web.Application, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """Start an aiohttp ``app`` (the fake backend) on a free port; returns the runner and its base URL."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    address = runner.addresses[0]
    return runner, f"http://{address[0]}:{address[1]}"


@contextlib.asynccontextmanager
async def running(app: web.Application | ProxyApp) -> AsyncIterator[str]:
    """Serve ``app`` on a free port of 127.0.0.1 for the duration of the block; yields its base URL. A ``ProxyApp``
    runs on the proxy's own server (``app.listening``), exactly as ``tokenpools proxy`` serves it."""
    if isinstance(app, ProxyApp):
        async with listening(app, "127.0.0.1", 0) as url:
            yield url
        return
    runner, url = await serve(app)
    try:
        yield url
    finally:
        await runner.cleanup()


def offline_options(spool_dir: Path, proxy_id: str = "proxy-0", *, policy: dict[str, Any] | None = None,
                    **proxy: Any) -> ProxyOptions:
    """A proxy under test: the ``proxy`` settings' defaults with Kafka off, its spool under ``spool_dir``, and
    ``proxy`` (settings of that group) applied; ``policy``: settings of the ``policy`` group (e.g. the queue's)."""
    settings = ProxySettings(**{"spool_dir": spool_dir, "kafka_enabled": False, **proxy})
    project = Settings(policy=PolicySettings(**(policy or {})))
    return ProxyOptions(settings, proxy_id, KafkaSettings().topic_prefix,
                        FleetOptions.from_settings(project, settings), project.policy.to_queue_config(),
                        project.budgets)


def proxy_config(endpoints: dict[str, tuple[str, ...]], pools: list[PoolSpec], entitlements: list[EntitlementSpec],
                 keys: dict[str, str]) -> ProxyConfig:
    """A ProxyConfig from clear-text keys (entitlement → key); only their digests are kept."""
    return ProxyConfig(pools={p.name: p for p in pools}, endpoints=endpoints,
                       entitlements={e.name: e for e in entitlements},
                       key_digests={hash_api_key(key): name for name, key in keys.items()})


def limit_update(pool: str, version: int, t_ms: int, limits: dict[str, tuple[int, float, float, float]],
                 pool_concurrency: int, proxies: tuple[ProxyShare, ...] = (), backend_waiting: float = 0) -> LimitUpdate:
    """limits: entitlement → (concurrency, tokens_per_s, kv_bytes, priority)."""
    return LimitUpdate(
        pool=pool, version=version, t_ms=t_ms, contended=False, backend_waiting=backend_waiting, mean_slo_ms=1000.0,
        capacity_tokens_per_s=sum(v[1] for v in limits.values()), capacity_kv_bytes=sum(v[2] for v in limits.values()),
        capacity_concurrency=pool_concurrency,
        entitlements=tuple(EntitlementLimit(name=n, priority=v[3], debt=0.0, burst=0.0, tokens_per_s=v[1],
                                            kv_bytes=v[2], concurrency=v[0]) for n, v in sorted(limits.items())),
        proxies=proxies)
