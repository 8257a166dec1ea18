"""The shell of ``tokenpools calibrate``: the backend's HTTP API (aiohttp) and the clock; every decision is pure.

In order: ``/v1/models`` (is this an OpenAI-compatible server, does it serve the model?), ``/metrics`` (vLLM's
``vllm:cache_config_info``, if there), two warm-up requests (does it accept ``ignore_eos``; how many words make the
asked prompt tokens; and vLLM's first requests pay for compilation), then the steps one after the other, each between
two reads of vLLM's queue-time counter (``/metrics`` while the backend is idle: a busy vLLM answers it late). A backend
that cannot be reached, or does not serve the model, is bad input: ``ConfigError``, one line, exit 2. A warm-up that
fails is a ``PermanentError`` (exit 1) with the backend's own message.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import orjson

from tokenpools.calibrate.exposition import counter_increase
from tokenpools.calibrate.kv import parse_cache_config
from tokenpools.calibrate.plan import SOURCE, CalibrationPlan, Step, steps
from tokenpools.calibrate.result import Calibration
from tokenpools.calibrate.stats import RequestOutcome, RequestResult, StepStats, summarize
from tokenpools.calibrate.workload import COMPLETIONS_PATH, body, prompt, words_for
from tokenpools.errors import ConfigError, ConfigProblem, PermanentError
from tokenpools.runtime.sse import SseScanner, usage_tokens
from tokenpools.runtime.clock import Clock

log = logging.getLogger(__name__)
PROBE_TIMEOUT_S = 10.0  # /v1/models and /metrics
QUEUE_TIME = "vllm:request_queue_time_seconds_sum"
RUNNING = "vllm:num_requests_running"  # always there where vLLM's metrics are: a missing QUEUE_TIME is then 0
REFUSED_FIELD_STATUSES = (400, 422)  # a server that validates its bodies refuses an unknown field with these


def _bad_input(message: str) -> ConfigError:
    return ConfigError([ConfigProblem(SOURCE, message)])


async def calibrate(plan: CalibrationPlan, clock: Clock) -> Calibration:
    """Measure every step of ``plan`` against its backend."""
    connector = aiohttp.TCPConnector(limit=plan.max_concurrency + 2)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        models = await served_models(session, plan.base_url)
        if plan.model not in models:
            raise _bad_input(f"{plan.base_url} does not serve the model {plan.model!r}; it serves: "
                             f"{', '.join(models) or 'no model'}")
        kv = parse_cache_config(await metrics_page(session, plan.base_url) or "")
        indexes = itertools.count()
        ignore_eos, words, warm_up_tokens = await warm_up(session, plan, clock, indexes)
        measured_at = datetime.fromtimestamp(clock.wall_ms() / 1000, UTC).isoformat(timespec="seconds")
        done: list[StepStats] = []
        for step in steps(plan):
            stats = await run_step(session, plan, step, words, ignore_eos, clock, indexes)
            log.info("concurrency %d: %d requests (%d failed) in %.1f s, %.0f tokens/s, P99 TTFT %s",
                     stats.concurrency, stats.requests, stats.failed, stats.elapsed_s, stats.total_tokens_per_s,
                     "-" if stats.ttft_p99_s is None else f"{stats.ttft_p99_s * 1000:.0f} ms")
            done.append(stats)
    return Calibration(plan, measured_at, ignore_eos, words, kv, tuple(done), warm_up_tokens)


async def served_models(session: aiohttp.ClientSession, base_url: str) -> list[str]:
    """The model ids ``/v1/models`` lists; ``ConfigError`` if the server cannot be reached or lists none."""
    url = base_url + "/v1/models"
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            async with session.get(url) as response:
                status, raw = response.status, await response.read()
    except TimeoutError:
        raise _bad_input(f"{url}: no answer within {PROBE_TIMEOUT_S:g} s") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise _bad_input(f"cannot reach {base_url}: {exc or type(exc).__name__}") from None
    try:
        data = orjson.loads(raw)["data"] if status == 200 else None
        models = [m["id"] for m in data] if isinstance(data, list) else None
    except (orjson.JSONDecodeError, KeyError, TypeError):
        models = None
    if models is None or not all(isinstance(m, str) for m in models):
        raise _bad_input(f"{url} answered HTTP {status} without a model list: is {base_url} an OpenAI-compatible "
                         "server?")
    return models


async def metrics_page(session: aiohttp.ClientSession, base_url: str) -> str | None:
    """The backend's ``/metrics`` (read between steps, when it is idle); None when it has none."""
    try:
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            async with session.get(base_url + "/metrics") as response:
                if response.status != 200:
                    return None
                return await response.text()
    except (TimeoutError, aiohttp.ClientError, OSError, UnicodeDecodeError) as exc:
        log.warning("%s/metrics: %s", base_url, exc or type(exc).__name__)
        return None


async def warm_up(session: aiohttp.ClientSession, plan: CalibrationPlan, clock: Clock,
                  indexes: Iterator[int]) -> tuple[bool, int, tuple[int, int]]:
    """(whether the backend accepts ``ignore_eos``, the words per prompt, the (prompt, completion) tokens the warm-up
    made), from two requests that do not count in any step."""
    words, ignore_eos = plan.prompt_tokens, True
    first = await send(session, plan, body(plan.model, prompt(next(indexes), words), plan.output_tokens, True),
                       clock)
    if first.outcome is RequestOutcome.HTTP_ERROR and first.status in REFUSED_FIELD_STATUSES:
        ignore_eos = False
        first = await send(session, plan, body(plan.model, prompt(next(indexes), words), plan.output_tokens, False),
                           clock)
    _warm(first)
    words = words_for(plan.prompt_tokens, words, first.prompt_tokens)
    second = await send(session, plan, body(plan.model, prompt(next(indexes), words), plan.output_tokens, ignore_eos),
                        clock)
    _warm(second)
    log.info("warmed up: ignore_eos %s, %d words make a prompt of ~%d tokens", "accepted" if ignore_eos else "refused",
             words, plan.prompt_tokens)
    return ignore_eos, words, (first.prompt_tokens + second.prompt_tokens,
                               first.completion_tokens + second.completion_tokens)


def _warm(result: RequestResult) -> None:
    if result.outcome is not RequestOutcome.OK:
        raise PermanentError(f"the warm-up request failed ({result.outcome}): {result.detail or 'no detail'}")


async def run_step(session: aiohttp.ClientSession, plan: CalibrationPlan, step: Step, words: int, ignore_eos: bool,
                   clock: Clock, indexes: Iterator[int]) -> StepStats:
    """``step.concurrency`` clients in a closed loop until the step's requests are sent or its time is up."""
    results: list[RequestResult] = []
    before = await metrics_page(session, plan.base_url)
    started_s, sent = clock.now_s(), 0

    async def client() -> None:
        nonlocal sent
        while step.sends_another(sent, clock.now_s() - started_s):
            sent += 1
            text = prompt(next(indexes), words)
            results.append(await send(session, plan, body(plan.model, text, plan.output_tokens, ignore_eos), clock))

    await asyncio.gather(*(client() for _ in range(step.concurrency)))
    after = await metrics_page(session, plan.base_url)
    queued_s = counter_increase(before, after, QUEUE_TIME, plan.model, witness=RUNNING)
    return summarize(step.concurrency, started_s, results, queued_s)


async def send(session: aiohttp.ClientSession, plan: CalibrationPlan, request: dict[str, Any],
               clock: Clock) -> RequestResult:
    """One streamed request: its TTFT from the first chunk of output, its tokens from the stream's usage."""
    scanner = SseScanner(strip_usage=False)
    start_s, ttft_s, status = clock.now_s(), None, None
    try:
        async with asyncio.timeout(plan.request_timeout_s):
            async with session.post(plan.base_url + COMPLETIONS_PATH, data=orjson.dumps(request),
                                    headers={"Content-Type": "application/json"}) as response:
                status = response.status
                if status != 200:
                    detail = _error_message(await response.read())
                    return RequestResult(RequestOutcome.HTTP_ERROR, start_s, clock.now_s(), status=status,
                                         detail=f"HTTP {status}: {detail}")
                async for data in response.content.iter_any():
                    scanner.feed(data)
                    if ttft_s is None and scanner.chunks:
                        ttft_s = clock.now_s() - start_s
                scanner.flush()
    except TimeoutError:
        return RequestResult(RequestOutcome.TIMED_OUT, start_s, clock.now_s(), status=status,
                             detail=f"no end within {plan.request_timeout_s:g} s")
    except (aiohttp.ClientError, OSError) as exc:
        return RequestResult(RequestOutcome.BROKEN, start_s, clock.now_s(), status=status,
                             detail=str(exc) or type(exc).__name__)
    end_s = clock.now_s()
    if scanner.error is not None:
        return RequestResult(RequestOutcome.STREAM_ERROR, start_s, end_s, status=status,
                             detail=str(scanner.error.get("message", scanner.error)))
    tokens = usage_tokens(scanner.usage)
    if tokens is None:
        return RequestResult(RequestOutcome.NO_USAGE, start_s, end_s, ttft_s, status=status,
                             detail="the stream carried no usage (stream_options.include_usage)")
    if ttft_s is None:
        return RequestResult(RequestOutcome.BROKEN, start_s, end_s, status=status, detail="no output was streamed")
    return RequestResult(RequestOutcome.OK, start_s, end_s, ttft_s, tokens[0], tokens[1], status=status)


def _error_message(raw: bytes) -> str:
    """The backend's ``error.message`` (OpenAI's shape), else the start of its body, on one line."""
    try:
        error = orjson.loads(raw).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (orjson.JSONDecodeError, AttributeError):
        message = None
    text = message if isinstance(message, str) else raw.decode("utf-8", "replace")
    return " ".join(text.split())[:300]
