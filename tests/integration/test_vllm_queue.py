"""The proxy in front of a vLLM of its own that runs one sequence at a time (``--max-num-seqs 1``) and holds at most
``MAX_QUEUED`` requests (``--max-num-queued-reqs``): vLLM's queue, where the engine priority the proxy writes
(``enginePriority: true``) must really reorder work, where a full queue is vLLM's own 503, and where a dead engine
is vLLM's own 500.

One sequence at a time makes the order of completions the order vLLM served requests in. This module starts its own
vLLM (a minute) rather than sharing the session's: the other tests need several sequences running at once. The last
test kills its engine; a test that finds it dead starts it again (a rerun).

On 2 busy cores vLLM's API server may take a request, notice a disconnect or send an answer only seconds late while
its engine generates (docs/vllm.md). So the requests of a test are queued while vLLM's scheduler is paused (its
``/pause?mode=keep``, a development endpoint: ``VLLM_SERVER_DEV_MODE=1``), until vLLM's ``/load`` (its API
server's requests in progress: ``--enable-server-load-tracking``) counts them all; then ``/resume`` lets it
schedule them. The tests compare the order in which non-streamed answers came back, never when a stream's first
chunk did.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from openai import APIError, AsyncOpenAI, InternalServerError
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from vllm_fixtures import (CONTINUOUS_USAGE, ENGINE_NICE, IGNORE_EOS, Stack, entitlement_doc, installed, pool_doc,
                           proxied, started)

from tokenpools.topics.records import CompletionStatus
from tokenpools_dev.devstack.vllm import VLLMServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POOL = "queue-pool"
KEYS = {"low": "sk-queue-low", "gold": "sk-queue-gold"}
MAX_QUEUED = 4  # running and waiting, at vLLM


def config(model: str) -> str:
    return "---".join([
        pool_doc(POOL, model, engine_priority=True),
        entitlement_doc("low", POOL, KEYS["low"], service_class="elastic", slo_ms=60_000, concurrency=MAX_QUEUED + 1),
        entitlement_doc("gold", POOL, KEYS["gold"]),
    ])


@pytest.fixture(scope="module")
def one_seq_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    server = VLLMServer(installed(), workdir=tmp_path_factory.mktemp("vllm-one-seq"), max_num_seqs=1,
                        engine_nice=ENGINE_NICE, env={"VLLM_SERVER_DEV_MODE": "1"},
                        extra_args=["--max-num-queued-reqs", str(MAX_QUEUED), "--enable-server-load-tracking"])
    with started(server):
        yield server


@pytest.fixture
async def stack(one_seq_vllm: VLLMServer, tmp_path: Path) -> AsyncIterator[Stack]:
    if not one_seq_vllm.running:  # its engine was killed (the last test, run again)
        one_seq_vllm.stop()
        await asyncio.to_thread(one_seq_vllm.start)
    async with proxied(one_seq_vllm, tmp_path, config(one_seq_vllm.model_name), KEYS) as s:
        yield s


def _call(vllm: VLLMServer, method: str, path: str) -> dict[str, object]:
    request = urllib.request.Request(vllm.base_url + path, method=method)
    with urllib.request.urlopen(request, timeout=30) as r:
        answer: dict[str, object] = json.load(r)
    return answer


async def paused(vllm: VLLMServer) -> int:
    """Pause vLLM's scheduler, keeping what it holds (``/pause?mode=keep``); its ``/load`` now."""
    await asyncio.to_thread(_call, vllm, "POST", "/pause?mode=keep")
    return await load(vllm)


async def resume(vllm: VLLMServer) -> None:
    await asyncio.to_thread(_call, vllm, "POST", "/resume")


async def load(vllm: VLLMServer) -> int:
    """vLLM's ``/load``: the requests its API server is handling (taken, not yet answered)."""
    answer = await asyncio.to_thread(_call, vllm, "GET", "/load")
    value = answer["server_load"]
    assert isinstance(value, int)
    return value


async def until_load(vllm: VLLMServer, count: int, timeout_s: float = 30.0) -> None:
    """Until vLLM's ``/load`` is ``count``."""
    deadline = time.monotonic() + timeout_s
    while (now := await load(vllm)) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"vLLM's /load is {now}, not {count}, after {timeout_s} s")
        await asyncio.sleep(0.05)


async def chat(client: AsyncOpenAI, vllm: VLLMServer, name: str, tokens: int) -> ChatCompletion:
    return await client.chat.completions.create(model=vllm.model_name, messages=[{"role": "user", "content": name}],
                                                max_tokens=tokens, extra_body=IGNORE_EOS)


async def test_a_guaranteed_request_overtakes_the_elastic_ones_queued_before_it(stack: Stack) -> None:
    """Three elastic requests are queued at vLLM; a guaranteed one comes after them. With the proxy's engine
    priority (guaranteed 100–199, elastic 200–299) vLLM serves it first; first come, first served would serve it
    last (the same test with ``enginePriority: false`` fails so)."""
    finished: list[str] = []

    async def one(client: AsyncOpenAI, name: str, tokens: int) -> None:
        await chat(client, stack.vllm, name, tokens)
        finished.append(name)

    async with stack.client("low") as low, stack.client("gold") as gold:
        base = await paused(stack.vllm)
        try:
            lows = [asyncio.create_task(one(low, f"low-{i}", 300)) for i in range(3)]
            await until_load(stack.vllm, base + 3)  # vLLM holds the three
            guaranteed = asyncio.create_task(one(gold, "gold", 300))
            await until_load(stack.vllm, base + 4)
        finally:
            await resume(stack.vllm)
        await asyncio.gather(guaranteed, *lows)
    print(f"finished in order {finished}")
    assert finished[0] == "gold", finished
    assert stack.relay.peak == 4 and stack.proxy.metrics.completions[(POOL, "gold", "ok")] == 1


async def test_vllms_503_for_a_full_queue_is_a_backend_refusal_that_costs_nothing(stack: Stack) -> None:
    """vLLM holds ``MAX_QUEUED`` requests; the next gets vLLM's own 503, passed through as the backend's refusal."""
    async with stack.client("low") as low:
        base = await paused(stack.vllm)
        try:
            fillers = [asyncio.create_task(chat(low, stack.vllm, f"filler-{i}", 20)) for i in range(MAX_QUEUED)]
            await until_load(stack.vllm, base + MAX_QUEUED)
            with pytest.raises(InternalServerError) as refused:
                await low.chat.completions.create(model=stack.vllm.model_name,
                                                  messages=[{"role": "user", "content": "one more"}], max_tokens=4)
        finally:
            await resume(stack.vllm)
        await asyncio.gather(*fillers)
    response = refused.value.response
    assert response.status_code == 503 and response.headers["x-tokenpools-refused-by"] == "backend"
    assert "busy" in str(refused.value.message)  # vLLM's QueueOverflowError
    record = await stack.completion(response.headers["x-request-id"])
    assert (record.status, record.http_status, record.prompt_tokens, record.completion_tokens) == (
        CompletionStatus.BACKEND_REFUSED, 503, 0, 0)
    assert stack.proxy.metrics.backend_refusals[(POOL, "503")] == 1
    assert stack.proxy.metrics.completions[(POOL, "low", "backend_refused")] == 1
    assert stack.proxy.metrics.completions[(POOL, "low", "ok")] == MAX_QUEUED  # the four, served after it
    assert stack.proxy.pools[POOL].controller.in_flight_of("low") == 0


async def test_when_vllms_engine_dies_its_500_and_its_stream_error_are_passed_and_settled(stack: Stack) -> None:
    """vLLM's engine core is killed while vLLM holds a stream (its answer begun) and a plain request: vLLM's API
    server answers the plain one 500 and ends the stream with an error event, then exits. Both are backend errors
    that used nothing (vLLM reported no usage: its engine had made nothing), and the next request, with no vLLM
    left, is the proxy's 502. Every slot comes back. (Besides its 503 for a full queue, a failing engine is the only
    5xx vLLM writes itself: docs/vllm.md.) The engine is paused when it dies: killed while it generates, what it
    made and had not sent yet is lost with it too (its error replaces the output a request has not taken)."""
    begun = asyncio.Event()

    async def stream(client: AsyncOpenAI) -> tuple[str, list[ChatCompletionChunk], APIError | None]:
        raw = await client.chat.completions.with_raw_response.create(
            model=stack.vllm.model_name, messages=[{"role": "user", "content": "until the end"}], max_tokens=1900,
            stream=True, extra_body={**IGNORE_EOS, **CONTINUOUS_USAGE})
        begun.set()
        chunks: list[ChatCompletionChunk] = []
        try:
            async for chunk in raw.parse():
                chunks.append(chunk)
        except APIError as error:  # the error event
            return raw.headers["x-request-id"], chunks, error
        return raw.headers["x-request-id"], chunks, None

    async with stack.client("low") as low:
        base = await paused(stack.vllm)
        streamed = asyncio.create_task(stream(low))
        plain = asyncio.create_task(chat(low, stack.vllm, "plain", 1900))
        await until_load(stack.vllm, base + 2)
        await asyncio.wait_for(begun.wait(), 30)  # the stream's 200 and headers have come
        stack.vllm.kill_engine()
        with pytest.raises(InternalServerError) as failed:
            await plain
        stream_id, chunks, stream_error = await streamed
        t0 = time.monotonic()
        while stack.vllm.running and time.monotonic() < t0 + 60:  # vLLM's API server exits after its engine
            await asyncio.sleep(0.1)
        assert not stack.vllm.running, "vLLM's API server did not exit after its engine died"
        print(f"vllm serve exited {time.monotonic() - t0:.1f} s after the answers")
        with pytest.raises(InternalServerError) as unavailable:
            await low.chat.completions.create(model=stack.vllm.model_name,
                                              messages=[{"role": "user", "content": "anyone?"}], max_tokens=4)

    assert failed.value.status_code == 500 and "EngineCore" in str(failed.value.message)  # vLLM's EngineDeadError
    plain_record = await stack.completion(failed.value.response.headers["x-request-id"])
    assert (plain_record.status, plain_record.http_status, plain_record.prompt_tokens,
            plain_record.completion_tokens) == (CompletionStatus.BACKEND_ERROR, 500, 0, 0)

    assert stream_error is not None and "EngineCore" in str(stream_error.message) and chunks == []
    stream_record = await stack.completion(stream_id)
    assert (stream_record.status, stream_record.http_status, stream_record.prompt_tokens,
            stream_record.completion_tokens) == (CompletionStatus.BACKEND_ERROR, 200, 0, 0)

    assert unavailable.value.status_code == 502 and unavailable.value.code == "backend_unavailable"
    gone = await stack.completion(unavailable.value.response.headers["x-request-id"])
    assert (gone.status, gone.prompt_tokens, gone.completion_tokens) == (CompletionStatus.BACKEND_ERROR, 0, 0)
    errors = stack.proxy.metrics.backend_errors
    assert (errors[(POOL, "http_5xx")], errors[(POOL, "stream")], errors[(POOL, "connect")]) == (1, 1, 1), errors
    assert stack.proxy.pools[POOL].controller.in_flight_of("low") == 0
