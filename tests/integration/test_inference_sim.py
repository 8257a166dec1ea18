"""The vLLM stand-in (llm-d-inference-sim v0.10.2) behaves like vLLM where the control plane cares.

Pinned here, against the real binary and the official ``openai`` client: response and stream chunk
shapes, where usage is reported, how ``max_tokens`` is honoured, what happens above max-num-seqs
(queue, then 429 when the waiting queue is full), the context-length check, the ``vllm:*`` metrics
and their relation to usage, and kill/restart on the same port. Each test gets its own sim (start-up
is ~0.1 s) so counters start from zero.
"""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from backend_fixtures import inference_sim_binary, metric, scrape  # noqa: F401  (fixture import)
from openai import AsyncOpenAI

from tokenpools_dev.devstack.inference_sim import InferenceSim

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

SimFactory = Callable[..., InferenceSim]
Connect = Callable[[InferenceSim], AsyncOpenAI]

MODEL = "fake-model"
MESSAGES = [{"role": "user", "content": "Hello there, how are you today?"}]

# Families present on /metrics right after start (gauges/info) ...
GAUGES = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
    "vllm:lora_requests_info",
}
# ... and those with a model_name-labelled sample only after the first finished request
# (vllm:request_queue_time_seconds only after the first request that actually waited in the queue).
AFTER_FIRST_REQUEST = {
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds",
    "vllm:time_per_output_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:max_num_generation_tokens",
    "vllm:request_params_max_tokens",
}


@pytest.fixture
def start_sim(inference_sim_binary: Path) -> Iterator[SimFactory]:  # noqa: F811
    """Factory: ``start_sim(**InferenceSim kwargs)``; every sim is stopped at teardown."""
    sims: list[InferenceSim] = []

    def start(**kwargs: Any) -> InferenceSim:
        s = InferenceSim(binary=inference_sim_binary, **kwargs)
        sims.append(s)
        return s.start()

    yield start
    for s in sims:
        s.close()


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """Factory for OpenAI clients on a sim, all closed at teardown (unclosed ones leak sockets).

    max_retries=0: the client would otherwise silently retry the 429s we want to observe.
    """
    clients: list[AsyncOpenAI] = []

    def make(sim: InferenceSim) -> AsyncOpenAI:
        c = AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="unused", max_retries=0, timeout=30)
        clients.append(c)
        return c

    yield make
    for c in clients:
        await c.close()


@pytest.fixture
def sim(start_sim: SimFactory) -> InferenceSim:
    return start_sim(model=MODEL, max_num_seqs=4, time_to_first_token=0.02, inter_token_latency=0.002, seed=42)


@pytest.fixture
def oai(sim: InferenceSim, connect: Connect) -> AsyncOpenAI:
    return connect(sim)


def families(base_url: str) -> set[str]:
    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as r:
        return {ln.split()[2] for ln in r.read().decode().splitlines() if ln.startswith("# TYPE ")}


async def test_models_endpoint_reports_model_and_context_length(sim: InferenceSim, oai: AsyncOpenAI) -> None:
    models = (await oai.models.list()).data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_dump()["max_model_len"] == sim.max_model_len  # vLLM extension field
    assert models[0].owned_by == "vllm"


async def test_chat_completion_shape_and_usage(sim: InferenceSim, oai: AsyncOpenAI) -> None:
    resp = await oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16)
    print("non-stream:", resp.model_dump_json())
    assert resp.object == "chat.completion"
    assert resp.id.startswith("chatcmpl-")
    assert resp.model == MODEL
    assert len(resp.choices) == 1
    choice = resp.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in {"stop", "length"}
    usage = resp.usage
    assert usage is not None
    assert usage.prompt_tokens > 0
    assert 1 <= usage.completion_tokens <= 16
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens == 0
    assert usage.completion_tokens_details is None


async def test_max_tokens_is_an_upper_bound_in_random_mode(sim: InferenceSim, oai: AsyncOpenAI) -> None:
    """Random mode draws a length <= max_tokens; hitting the cap reports finish_reason=length."""
    c = oai
    seen: list[tuple[int, str | None]] = []
    for i in range(12):
        r = await c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"q{i}"}], max_tokens=4
        )
        assert r.usage is not None
        n, reason = r.usage.completion_tokens, r.choices[0].finish_reason
        seen.append((n, reason))
        assert 1 <= n <= 4
        assert reason == ("length" if n == 4 else "stop")
    print("max_tokens=4 ->", seen)
    # max_tokens=1 always hits the cap
    r = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=1)
    assert r.usage is not None and r.usage.completion_tokens == 1 and r.choices[0].finish_reason == "length"


async def test_ignore_eos_generates_exactly_max_tokens(sim: InferenceSim, oai: AsyncOpenAI) -> None:
    """vLLM's ``ignore_eos`` extension makes output length deterministic (useful for load tests)."""
    c = oai
    for n in (1, 7, 33):
        r = await c.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=n, extra_body={"ignore_eos": True}
        )
        assert r.usage is not None and r.usage.completion_tokens == n
        assert r.choices[0].finish_reason == "length"


async def test_echo_mode_returns_last_message_and_ignores_max_tokens(start_sim: SimFactory, connect: Connect) -> None:
    """Echo mode is NOT capped by max_tokens (it only flips finish_reason to "length")."""
    c = connect(start_sim(mode="echo"))
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one two three four five"}]
    r = await c.chat.completions.create(model=MODEL, messages=msgs)
    assert r.choices[0].message.content == "one two three four five"
    assert r.usage is not None and r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "stop"
    r = await c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=3)
    assert r.choices[0].message.content == "one two three four five"
    assert r.usage is not None and r.usage.completion_tokens == 5
    assert r.choices[0].finish_reason == "length"


async def test_streaming_chunks_and_usage_with_include_usage(sim: InferenceSim, oai: AsyncOpenAI) -> None:
    stream = await oai.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=24, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    for c in chunks:
        print("chunk:", c.model_dump_json(exclude_none=True))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert all(c.model == MODEL for c in chunks)

    *choice_chunks, usage_chunk = chunks
    # first chunk: role only, no content
    assert choice_chunks[0].choices[0].delta.role == "assistant"
    assert choice_chunks[0].choices[0].delta.content is None
    # middle chunks: one token of content each, no role
    content = choice_chunks[1:-1]
    assert content and all(c.choices[0].delta.content and c.choices[0].delta.role is None for c in content)
    # last choice chunk: empty delta + finish_reason
    last = choice_chunks[-1].choices[0]
    assert last.delta.content is None and last.finish_reason in {"stop", "length"}
    assert all(c.choices[0].finish_reason is None for c in choice_chunks[:-1])
    # usage only on the final chunk, whose choices list is empty (OpenAI include_usage contract)
    assert all(c.usage is None for c in choice_chunks)
    assert usage_chunk.choices == []
    u = usage_chunk.usage
    assert u is not None
    assert u.completion_tokens == len(content)  # one content chunk per generated token
    assert 1 <= u.completion_tokens <= 24
    assert u.prompt_tokens > 0 and u.total_tokens == u.prompt_tokens + u.completion_tokens


async def test_streaming_without_include_usage_has_no_usage_chunk(sim: InferenceSim, oai: AsyncOpenAI) -> None:
    stream = await oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, stream=True)
    chunks = [c async for c in stream]
    assert all(c.usage is None for c in chunks)
    assert all(len(c.choices) == 1 for c in chunks)
    assert chunks[-1].choices[0].finish_reason in {"stop", "length"}


async def test_same_prompt_counts_same_prompt_tokens_stream_and_non_stream(sim: InferenceSim, oai: AsyncOpenAI) -> None:
    c = oai
    r = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    stream = await c.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=2, stream=True, stream_options={"include_usage": True}
    )
    usage = [ch.usage async for ch in stream if ch.usage][0]
    assert r.usage is not None and usage.prompt_tokens == r.usage.prompt_tokens


async def test_above_max_num_seqs_requests_queue_then_429_when_queue_full(
    start_sim: SimFactory, connect: Connect
) -> None:
    """max_num_seqs=2, waiting queue of 2: 2 run, 2 wait (and finish one TTFT later), the rest get 429."""
    s = start_sim(max_num_seqs=2, time_to_first_token=0.4, extra_args=["--max-waiting-queue-length=2"])
    c = connect(s)

    async def one(i: int) -> tuple[str, float]:
        t0 = time.monotonic()
        try:
            await c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"r{i}"}], max_tokens=1
            )
            return "ok", time.monotonic() - t0
        except openai.RateLimitError as e:
            assert "waiting requests queue is full" in e.message
            return "429", time.monotonic() - t0

    tasks = []
    for i in range(6):  # ordered arrival: the sim's dispatcher is FIFO
        tasks.append(asyncio.create_task(one(i)))
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)
    live = await asyncio.to_thread(scrape, s.base_url)
    assert metric(live, "vllm:num_requests_running", MODEL) == 2
    assert metric(live, "vllm:num_requests_waiting", MODEL) == 2
    results = await asyncio.gather(*tasks)
    print("6 requests, 2 seqs, queue 2:", [(r, round(t, 2)) for r, t in results])
    assert [r for r, _ in results] == ["ok", "ok", "ok", "ok", "429", "429"]
    assert all(t < 0.3 for r, t in results if r == "429")  # rejected at once, not after a wait
    assert all(t < 0.75 for _, t in results[:2])
    assert all(t > 0.7 for _, t in results[2:4])  # queued behind a full TTFT
    after = await asyncio.to_thread(scrape, s.base_url)
    assert metric(after, "vllm:num_requests_running", MODEL) == 0
    assert metric(after, "vllm:num_requests_waiting", MODEL) == 0
    assert after['vllm:request_queue_time_seconds_count{model_name="fake-model"}'] == 2  # only the queued ones


async def test_context_length_and_unknown_model_errors(start_sim: SimFactory, connect: Connect) -> None:
    c = connect(start_sim(max_model_len=32))
    with pytest.raises(openai.BadRequestError, match="maximum context length is 32 tokens"):
        await c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "w " * 40}])
    # prompt + max_tokens is checked up front, like vLLM
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=100)
    with pytest.raises(openai.NotFoundError):
        await c.chat.completions.create(model="no-such-model", messages=MESSAGES)


async def test_x_return_error_header_injects_429(sim: InferenceSim, oai: AsyncOpenAI) -> None:
    with pytest.raises(openai.RateLimitError):
        await oai.chat.completions.create(
            model=MODEL, messages=MESSAGES, extra_headers={"X-Return-Error": "429"}
        )


async def test_metrics_exposed_and_consistent_with_usage(sim: InferenceSim, oai: AsyncOpenAI) -> None:
    before = families(sim.base_url)
    assert GAUGES <= before
    start = scrape(sim.base_url)
    assert metric(start, "vllm:num_requests_running", MODEL) == 0
    assert 'vllm:generation_tokens_total{model_name="fake-model"}' not in start  # absent, not 0

    c = oai
    r1 = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8)
    stream = await c.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, stream=True, stream_options={"include_usage": True}
    )
    u2 = [ch.usage async for ch in stream if ch.usage][0]
    assert r1.usage is not None

    after = families(sim.base_url)
    print("metric families:", sorted(after))
    assert GAUGES | AFTER_FIRST_REQUEST <= after
    m = scrape(sim.base_url)
    assert metric(m, "vllm:generation_tokens_total", MODEL) == r1.usage.completion_tokens + u2.completion_tokens
    assert metric(m, "vllm:prompt_tokens_total", MODEL) == r1.usage.prompt_tokens + u2.prompt_tokens
    successes = {k: v for k, v in m.items() if k.startswith("vllm:request_success_total{")}
    assert sum(successes.values()) == 2 and all('finish_reason="' in k for k in successes)
    assert m['vllm:e2e_request_latency_seconds_count{model_name="fake-model"}'] == 2
    assert m['vllm:time_to_first_token_seconds_count{model_name="fake-model"}'] == 2


async def test_kvcache_usage_moves_with_running_requests(start_sim: SimFactory, connect: Connect) -> None:
    """kv_cache_usage_perc stays 0 unless --enable-kvcache; then it is prompt blocks in use / kv-cache-size."""
    s = start_sim(enable_kvcache=True, time_to_first_token=0.5, extra_args=["--kv-cache-size=64", "--block-size=8"])
    task = asyncio.create_task(
        connect(s).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "alpha beta gamma delta " * 8}], max_tokens=1
        )
    )
    await asyncio.sleep(0.25)
    during = await asyncio.to_thread(scrape, s.base_url)
    await task
    done = await asyncio.to_thread(scrape, s.base_url)
    assert metric(during, "vllm:num_requests_running", MODEL) == 1
    usage = metric(during, "vllm:kv_cache_usage_perc", MODEL)
    assert 0 < usage < 1 and (usage * 64) == int(usage * 64)  # whole blocks out of 64
    assert metric(done, "vllm:kv_cache_usage_perc", MODEL) == 0
    assert 'vllm:prefix_cache_queries{model_name="fake-model"}' in done


async def test_kill_and_restart_on_same_port(sim: InferenceSim, connect: Connect) -> None:
    port = sim.port
    await connect(sim).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    sim.kill()
    assert not sim.running
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(sim.base_url + "/health", timeout=1)
    sim.restart()
    assert sim.running and sim.port == port
    # fresh client: the old pool's keep-alive connections died with the process
    r = await connect(sim).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2)
    assert r.usage is not None
    # a restarted sim is a fresh process: counters restart from this one request (Prometheus sees a reset)
    assert metric(scrape(sim.base_url), "vllm:generation_tokens_total", MODEL) == r.usage.completion_tokens
    sim.stop()
    assert not sim.running
