"""The load generator: requests sent with the official ``openai`` client, open or closed loop, Retry-After honoured.

Open loop: each first attempt is sent at ``origin + time_scale × t_s`` whatever happened before. Closed loop
(docs/load.md#open-and-closed-loop): each client of a ``ClosedLoad`` is a task that sends its next request
(``closed_requests``) ``think_s`` after its previous one ended — served, evicted, failed or given up — until the
load's ``end_s``; a client never has two requests at once. Both send a request the same way (``_request``): a
refused attempt (429) is tried again after the wait its headers give plus ``time_scale × U[0, jitter)``, at most
``max_retries`` times, then given up (counted in ``abandoned``) — the same client model the replay uses. The wait is
``retry-after-ms`` when present (as the openai client honours it): the proxy's own estimate, in the stack's (wall)
milliseconds, so it is waited as is. Else ``Retry-After``, read in experiment seconds: its unit cannot go below one
second, so a compressed run waits the compressed time. Each attempt records the header and the wait used. Each
attempt says which it is as the openai client's own retries do, ``x-stainless-retry-count: n`` (0 on the first;
the client's ``max_retries`` is 0 here, so it would say 0 every time), and names its request in an
``Idempotency-Key``, so the proxy's decided records link the retries to their first attempt exactly (docs/tuning.md#how-the-proxy-links-attempts).

Measured on the client: TTFT (send of the admitted attempt → first text chunk) and end-to-end latency (→ end of the
stream), both streamed (``stream_options.include_usage`` returns the token counts); a request's first attempt is
when it was sent (the client TTFT counts from there). Attempts go round robin over the
targets (several proxy replicas behind a client-side balancer), or where ``route`` says: a fleet run sends each
request to the proxy a seeded random balancer picked for it, as a Kubernetes Service spreads connections. Nothing
else runs in this loop, so its event-loop lag stays small; under CPU contention it shows up as latency, which is why
the numbers are reported per phase.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import random
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any
from dataclasses import dataclass

import aiohttp
import openai
import orjson
from openai import AsyncOpenAI

try:  # openai ≥ 3 is built on httpx2, earlier releases on httpx
    import httpx2 as httpx
except ImportError:  # pragma: no cover - depends on the installed openai
    import httpx  # type: ignore[no-redef]

from tokenpools.proxy.admission.retries import IDEMPOTENCY_KEY, SDK_RETRY_COUNT
from tokenpools.replay.load import Arrival, ClosedLoad, RetryPolicy, closed_requests
from tokenpools_dev.loadgen.plan import (
    ADMITTED,
    Attempt,
    Completion,
    LoadResult,
    RequestEnd,
    outcome_of,
    prompt_text,
)

log = logging.getLogger("tokenpools_dev.loadgen")


@dataclass(frozen=True, slots=True)
class LoadOptions:
    model: str
    keys: Mapping[str, str]  # entitlement → API key
    time_scale: float = 1.0
    retry: RetryPolicy = RetryPolicy()
    duration_s: float = float("inf")  # experiment time after which no retry (and no closed-loop request) is sent
    seed: int = 0
    api: str = "completions"  # or "chat"
    drain_timeout_s: float = 120.0  # wall seconds to wait for what is in flight when the schedule ends
    request_timeout_s: float = 300.0


Route = Callable[[Arrival, int], int]
"""(arrival, attempt number) → index of the target that attempt goes to."""


class LoadGenerator:
    def __init__(self, targets: Sequence[str], options: LoadOptions, route: Route | None = None) -> None:
        if not targets:
            raise ValueError("no target to send load to")
        self.options = options
        self.targets = [t.rstrip("/") for t in targets]
        self._turn = itertools.cycle(range(len(self.targets)))
        self._route = route
        self._jitter = random.Random(f"{options.seed}:live-retries")
        self._http = http_client(4096, options.request_timeout_s)
        self._clients = {(t, name): AsyncOpenAI(base_url=t + "/v1", api_key=key, max_retries=0, http_client=self._http)
                         for t in self.targets for name, key in options.keys.items()}
        self.result = LoadResult(time_scale=options.time_scale)
        self.failures = 0  # requests that raised (a bug here, not an outcome): logged, and checked by the tests
        self.loop_lags_s: list[float] = []  # how late a 10-ms timer fired, every 10 ms (event-loop health)
        self.cpu_s = 0.0  # CPU time of this process during run()
        self.send_lags_s: list[float] = []  # experiment s each request went out after it was due (open or closed)
        self._origin_mono = 0.0

    async def close(self) -> None:
        await self._http.aclose()

    def now_s(self) -> float:
        """Experiment time since the origin."""
        return (time.monotonic() - self._origin_mono) / self.options.time_scale

    async def run(self, arrivals: Iterable[Arrival] = (), origin_s: float | None = None,
                   clients: Sequence[ClosedLoad] = ()) -> LoadResult:
        """Send every arrival on schedule (open loop) and run every client of ``clients`` (closed loop), until
        ``duration_s``; then wait (at most ``drain_timeout_s``) for what is still in flight."""
        k = self.options.time_scale
        unbounded = [c.entitlement for c in clients if min(c.end_s, self.options.duration_s) == float("inf")]
        if unbounded:
            raise ValueError(f"closed-loop clients of {', '.join(unbounded)} would never stop: give an end_s or a "
                             "duration_s")
        origin_s = time.time() + 0.5 if origin_s is None else origin_s
        self._origin_mono = time.monotonic() + (origin_s - time.time())
        self.result.origin_s = origin_s
        tasks: set[asyncio.Task[Any]] = set()
        gc.collect()
        gc.freeze()  # what exists now (openai, pydantic, the schedule) is never scanned again: short GC pauses
        monitor = asyncio.create_task(self._monitor_lag())
        cpu0 = time.process_time()
        for load in clients:
            for client in range(load.clients):
                self._spawn(tasks, self._client(load, client))
        for arrival in sorted(arrivals, key=lambda a: (a.t_s, a.request_id)):
            await self._until(arrival.t_s)
            self._spawn(tasks, self._request(arrival))
        end = self._origin_mono + self.options.duration_s * k if self.options.duration_s != float("inf") else None
        if end is not None and end > time.monotonic():
            await asyncio.sleep(end - time.monotonic())
        if tasks:
            await asyncio.wait(set(tasks), timeout=self.options.drain_timeout_s)
        for task in tasks:
            task.cancel()
        monitor.cancel()
        self.cpu_s = time.process_time() - cpu0
        self.result.end_s = max([self.now_s(), *(c.t_s for c in self.result.completions)])
        return self.result

    async def send(self, arrival: Arrival) -> RequestEnd:
        """Send one arrival now, outside the schedule (its ``t_s`` is ignored), and record it with the rest; for a
        caller that must send when the system is in a given state rather than at a given time. Call it while
        ``run`` is running."""
        return await self._request(arrival, scheduled=False)

    async def _until(self, t_s: float) -> None:
        delay = self._origin_mono + t_s * self.options.time_scale - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def _spawn(self, tasks: set[asyncio.Task[Any]], work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(work)
        tasks.add(task)
        task.add_done_callback(self._done(tasks))

    async def _client(self, load: ClosedLoad, client: int) -> None:
        """One closed-loop client: its requests one after the other, each sent ``think_s`` after the previous one
        ended, while that time is before the load's end (and the run's). A request whose retry falls after the run's
        end (pending) keeps its client waiting: it sends nothing more."""
        end_s = min(load.end_s, self.options.duration_s)
        due_s = load.client_start_s(client)
        for request_id, prompt_tokens, output_tokens in closed_requests(load, self.options.seed, client):
            if due_s >= end_s:
                return
            await self._until(due_s)
            arrival = Arrival(due_s, load.entitlement, request_id, prompt_tokens, load.max_tokens, output_tokens)
            if await self._request(arrival) is RequestEnd.PENDING:
                return
            due_s = self.now_s() + load.think_s

    async def _monitor_lag(self, period_s: float = 0.01) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(period_s)
            self.loop_lags_s.append(time.monotonic() - before - period_s)

    def _done(self, tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
        def done(task: asyncio.Task[Any]) -> None:
            tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                self.failures += 1
                log.error("load request failed: %r", task.exception(), exc_info=task.exception())
        return done

    async def _request(self, arrival: Arrival, scheduled: bool = True) -> RequestEnd:
        """One request through its retries, as both loops send it (a scheduled one records how late it went out)."""
        o, k = self.options, self.options.time_scale
        first_s = self.now_s()
        if scheduled:
            self.send_lags_s.append(first_s - arrival.t_s)
        max_tokens = arrival.max_tokens or arrival.output_tokens
        attempt = 0
        while True:
            answer = await self._attempt(arrival, attempt, first_s, max_tokens)
            if isinstance(answer, RequestEnd):
                return answer
            if answer <= 0:
                self.result.abandoned[arrival.entitlement] = self.result.abandoned.get(arrival.entitlement, 0) + 1
                return RequestEnd.GIVEN_UP
            if self.now_s() + answer > o.duration_s:
                self.result.pending[arrival.entitlement] = self.result.pending.get(arrival.entitlement, 0) + 1
                return RequestEnd.PENDING
            await asyncio.sleep(answer * k)
            attempt += 1

    async def _attempt(self, arrival: Arrival, attempt: int, first_s: float, max_tokens: int) -> RequestEnd | float:
        """One call. How the request ended when it was admitted or got no answer, else (refused) the wait before its
        retry in experiment seconds, jitter included (0: not retried: not a 429, no retry header, or out of
        retries)."""
        target = self.targets[self._route(arrival, attempt) if self._route is not None else next(self._turn)]
        client = self._clients[(target, arrival.entitlement)]
        k = self.options.time_scale
        sent, sent_s = time.monotonic(), self.now_s()

        def record(outcome: str, status: int, reason: str = "", retry_after: int = 0, rid: str = "",
                   retry_after_ms: int = 0, wait_s: float = 0.0) -> None:
            self.result.attempts.append(Attempt(sent_s, arrival.entitlement, arrival.request_id, attempt, outcome,
                                                reason, retry_after, status, arrival.prompt_tokens, max_tokens,
                                                target, rid, retry_after_ms, wait_s, self.now_s()))

        ttft: float | None = None
        completion_tokens, prompt_tokens, status, rid = 0, arrival.prompt_tokens, "ok", ""
        try:
            async with self._create(client, arrival, max_tokens, attempt) as response:
                rid = response.headers.get("x-request-id", "")
                record(ADMITTED, response.status_code, rid=rid)
                async for line in response.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = orjson.loads(line[6:])
                    if "error" in chunk:
                        status = "evicted" if (chunk["error"] or {}).get("code") == "evicted" else "error"
                        break
                    if ttft is None and _text(chunk):
                        ttft = (time.monotonic() - sent) / k
                    if chunk.get("usage"):
                        completion_tokens = chunk["usage"].get("completion_tokens", 0)
                        prompt_tokens = chunk["usage"].get("prompt_tokens", prompt_tokens)
        except openai.APIStatusError as exc:
            headers = exc.response.headers
            retry_after, retry_after_ms = _int(headers.get("retry-after")), _int(headers.get("retry-after-ms"))
            wait_s = 0.0
            if exc.status_code == 429 and attempt < self.options.retry.max_retries:
                wait_s = retry_after_wait_s(retry_after_ms, retry_after, k)
                jitter_s = self.options.retry.jitter_s
                if wait_s > 0 and jitter_s:
                    wait_s += self._jitter.random() * jitter_s
            record(outcome_of(exc.status_code, exc.code), exc.status_code, str(exc.message)[:200], retry_after,
                   headers.get("x-request-id", ""), retry_after_ms, wait_s)
            return wait_s
        except (openai.APIConnectionError, openai.APITimeoutError) as exc:
            if not rid:  # no answer at all
                record("error", 0, type(exc).__name__)
                return RequestEnd.ERROR
            status = "error"
        except (httpx.HTTPError, aiohttp.ClientError, ValueError):
            if not rid:
                record("error", 0, "transport")
                return RequestEnd.ERROR
            status = "error"
        end_s = self.now_s()
        self.result.completions.append(Completion(
            arrival.request_id, arrival.entitlement, attempt, first_s, sent_s, end_s, prompt_tokens,
            completion_tokens, ttft, (time.monotonic() - sent) / k, status, rid))
        return {"ok": RequestEnd.SERVED, "evicted": RequestEnd.EVICTED}.get(status, RequestEnd.ERROR)

    def _create(self, client: AsyncOpenAI, arrival: Arrival, max_tokens: int, attempt: int) -> Any:
        """The streaming call as an async context manager. The raw SSE lines are read here: the openai client
        builds, sends and checks the request, but turning each of thousands of chunks per second into a pydantic
        object would cost the load generator 3–4× its CPU (measured: 21 vs 5 ms per 64-token request)."""
        common = {"model": self.options.model, "max_tokens": max_tokens, "stream": True,
                  "stream_options": {"include_usage": True}, "extra_body": {"ignore_eos": True},
                  "extra_headers": retry_headers(arrival.request_id, attempt)}
        if self.options.api == "chat":
            return client.chat.completions.with_streaming_response.create(
                messages=[{"role": "user", "content": prompt_text(arrival.prompt_tokens)}], **common)
        return client.completions.with_streaming_response.create(prompt=prompt_text(arrival.prompt_tokens), **common)


def retry_headers(request_id: str, attempt: int) -> dict[str, str]:
    """What a careful client sends on its ``attempt``-th try (0: the first): the openai client's retry count, and an
    ``Idempotency-Key`` naming the request, which the proxy links by first. The key is needed here: the generator's
    requests of one shape have identical bodies, so the retry count alone (linked to a first attempt by the body's
    digest) would often name another request's first attempt."""
    return {SDK_RETRY_COUNT: str(attempt), IDEMPOTENCY_KEY: request_id}


def _text(chunk: Mapping[str, Any]) -> str:
    choices = chunk.get("choices") or ()
    if not choices:
        return ""
    choice = choices[0]
    delta = choice.get("delta")
    return ((delta or {}).get("content") if delta is not None else choice.get("text")) or ""


def http_client(max_connections: int, timeout_s: float) -> Any:
    """openai's aiohttp transport when available (cheaper per chunk than httpx), else its httpx client."""
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=min(512, max_connections))
    timeout = httpx.Timeout(timeout_s, connect=10.0)
    factory = getattr(openai, "DefaultAioHttpClient", None) or openai.DefaultAsyncHttpxClient
    return factory(limits=limits, timeout=timeout)


def retry_after_wait_s(retry_after_ms: int, retry_after_s: int, time_scale: float) -> float:
    """The wait a refusal asks for, in experiment seconds (module doc): ``retry-after-ms`` (wall ms) when the proxy
    sent it, else ``Retry-After`` (experiment seconds); 0 when it sent neither (do not retry)."""
    if retry_after_ms > 0:
        return retry_after_ms / 1000 / time_scale
    return float(retry_after_s)


def _int(value: str | None) -> int:
    try:
        return max(0, int(float(value))) if value else 0
    except ValueError:
        return 0
