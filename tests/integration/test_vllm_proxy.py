"""The proxy in front of real vLLM (the CPU build serving a tiny random Llama, docs/vllm.md), driven by the official
``openai`` client: what llm-d-inference-sim can only imitate, checked against the real thing.

Kafka is off (the events spool) and the limits are the file's (static): this is about the request path. Between
the proxy and vLLM sits a counting relay (``tokenpools_dev.proxy.relay``), so "at most 2 at vLLM" is counted at
every instant, not sampled. The session shares one vLLM (``vllm_server``, conftest.py): a start costs a minute.

"Settled exactly" means three witnesses agree: vLLM's usage (or, where the client was sent none, vLLM's own token
counters), the proxy's completion record (what the agents charge) and its token metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI, BadRequestError, NotFoundError
from vllm_fixtures import (CONTINUOUS_USAGE, IGNORE_EOS, Stack, entitlement_doc, pool_doc, proxied, settled_metrics,
                           vllm_metrics, vllm_tokens)

from tokenpools.topics.records import CompletionStatus
from tokenpools_dev.devstack.vllm import VLLMServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POOL = "vllm-pool"
RENAMED = "renamed-pool"  # a pool whose model vLLM does not serve (a rename half rolled out): vLLM's own 404
KEYS = {"wide": "sk-vllm-wide", "pair": "sk-vllm-pair", "renamed": "sk-vllm-renamed"}


def config(model: str) -> str:
    return "---".join([
        pool_doc(POOL, model),
        entitlement_doc("wide", POOL, KEYS["wide"], kv_gib=0.5, concurrency=6),
        entitlement_doc("pair", POOL, KEYS["pair"], slo_ms=60_000, queue_timeout_ms=60_000),
        pool_doc(RENAMED, model + "-renamed"),
        entitlement_doc("renamed", RENAMED, KEYS["renamed"]),
    ])


@pytest.fixture
async def stack(vllm_server: VLLMServer, tmp_path: Path) -> AsyncIterator[Stack]:
    async with proxied(vllm_server, tmp_path, config(vllm_server.model_name), KEYS) as s:
        yield s


async def assert_settled(stack: Stack, request_id: str, tokens: tuple[float, float], pool: str = POOL,
                         entitlement: str = "wide") -> None:
    """The request's completion record and the proxy's token metrics (of a stack that served this request only)
    both say ``tokens`` (prompt, completion)."""
    record = await stack.completion(request_id)
    assert (record.prompt_tokens, record.completion_tokens) == tokens, record
    assert stack.settled(pool, entitlement) == tokens


async def test_chat_reports_usage_and_rate_limit_headers(stack: Stack) -> None:
    async with stack.client("wide") as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=stack.vllm.model_name, messages=[{"role": "user", "content": "Hello, real vLLM"}], max_tokens=12,
            temperature=0, extra_body=IGNORE_EOS)
    chat = raw.parse()
    assert chat.model == stack.vllm.model_name and chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.completion_tokens == 12 and chat.usage.prompt_tokens > 5
    assert raw.headers["x-ratelimit-limit-requests"] == "6"
    assert raw.headers["x-ratelimit-remaining-requests"] == "5"  # after this decision: this request in flight
    assert int(raw.headers["x-ratelimit-limit-tokens"]) == 20_000  # 2000 tokens/s × the 10 s window
    assert 0 < int(raw.headers["x-ratelimit-remaining-tokens"]) < 20_000
    assert stack.relay.paths == ["/v1/chat/completions"]
    await assert_settled(stack, raw.headers["x-request-id"], (chat.usage.prompt_tokens, 12))  # what vLLM counted


STREAM_OPTIONS: dict[str, dict[str, bool] | None] = {
    "none": None,  # the proxy asks vLLM for usage and removes it: the client sees none
    "include_usage": {"include_usage": True},  # one usage, on the last chunk
    "continuous": CONTINUOUS_USAGE["stream_options"],  # a running total on every chunk
    "continuous_alone": {"continuous_usage_stats": True},  # no include_usage: vLLM alone would send none either
}


@pytest.mark.parametrize("options", STREAM_OPTIONS)
async def test_a_chat_stream_settles_vllms_last_usage_whatever_its_stream_options(stack: Stack, options: str) -> None:
    """vLLM's final usage is settled, never an earlier running total (``continuous_usage_stats``: its first chunk says
    0 completion tokens), and the client sees usage exactly when it asked for it."""
    before = await settled_metrics(stack.vllm)
    extra: dict[str, Any] = dict(IGNORE_EOS)
    if STREAM_OPTIONS[options] is not None:
        extra["stream_options"] = STREAM_OPTIONS[options]
    async with stack.client("wide") as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=stack.vllm.model_name, messages=[{"role": "user", "content": "Stream, please"}], max_tokens=20,
            temperature=0, stream=True, extra_body=extra)
        chunks = [chunk async for chunk in raw.parse()]
    prompt, generated = vllm_tokens(before, await settled_metrics(stack.vllm))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and generated == 20
    usages = [(c.usage.prompt_tokens, c.usage.completion_tokens) if c.usage else None for c in chunks]
    if options == "include_usage":
        assert usages[:-1] == [None] * (len(chunks) - 1) and not chunks[-1].choices
    if options == "continuous":
        assert None not in usages and usages[0] == (prompt, 0)  # the first total: the role chunk, nothing made yet
        assert [u[1] for u in usages if u] == sorted(u[1] for u in usages if u)  # running totals
    if options in ("none", "continuous_alone"):
        assert usages == [None] * len(chunks)
    else:
        assert usages[-1] == (prompt, 20)
    await assert_settled(stack, raw.headers["x-request-id"], (prompt, 20))  # vLLM's count, its last usage


async def test_completions_plain_and_streamed(stack: Stack) -> None:
    async with stack.client("wide") as client:
        plain = await client.completions.create(model=stack.vllm.model_name, prompt="Token pools are", max_tokens=8,
                                                temperature=0, extra_body=IGNORE_EOS)
        assert plain.usage is not None and plain.usage.completion_tokens == 8 and plain.choices[0].text
        stream = await client.completions.create(model=stack.vllm.model_name, prompt="Token pools are",
                                                 max_tokens=8, temperature=0, stream=True,
                                                 extra_body={**IGNORE_EOS, **CONTINUOUS_USAGE})
        chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text  # greedy: the same
    totals = [c.usage.completion_tokens for c in chunks if c.usage]  # every chunk's running total, then the usage
    assert len(totals) == len(chunks) and totals == sorted(totals) and totals[-2:] == [8, 8]  # (a slow reader gets
    # several tokens in one chunk: vLLM merges the steps it has not sent yet)
    assert stack.settled(POOL, "wide") == (2 * plain.usage.prompt_tokens, 16)


async def test_responses_plain_and_streamed_settle_vllms_usage(stack: Stack) -> None:
    """``/v1/responses``: vLLM's ``usage`` (input/output tokens), in the answer or in the stream's final
    ``response.completed``, is what the proxy settles."""
    async with stack.client("wide") as client:
        raw = await client.responses.with_raw_response.create(
            model=stack.vllm.model_name, input="Respond, real vLLM", max_output_tokens=10, temperature=0,
            extra_body=IGNORE_EOS)
        plain = raw.parse()
        assert plain.usage is not None and plain.usage.output_tokens == 10 and plain.output_text
        await assert_settled(stack, raw.headers["x-request-id"], (plain.usage.input_tokens, 10))
        streamed = await client.responses.with_raw_response.create(
            model=stack.vllm.model_name, input="Respond, real vLLM", max_output_tokens=6, temperature=0,
            stream=True, extra_body=IGNORE_EOS)
        events = [event async for event in streamed.parse()]
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")  # vLLM: incomplete, at max_output_tokens
    usage = final.response.usage
    assert usage is not None and (usage.input_tokens, usage.output_tokens) == (plain.usage.input_tokens, 6)
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta")
    record = await stack.completion(streamed.headers["x-request-id"])
    assert (record.prompt_tokens, record.completion_tokens) == (usage.input_tokens, 6)
    assert stack.settled(POOL, "wide") == (2 * usage.input_tokens, 16)


async def test_models_are_the_pools_and_vllm_serves_the_same_name(stack: Stack) -> None:
    async with stack.client("wide") as client:
        listed = await client.models.list()
    assert [m.id for m in listed.data] == [stack.vllm.model_name]
    async with AsyncOpenAI(base_url=stack.vllm.base_url + "/v1", api_key="unused", max_retries=0) as direct:
        assert [m.id for m in (await direct.models.list()).data] == [stack.vllm.model_name]


async def test_vllms_400_for_too_many_tokens_reaches_the_client_and_costs_nothing(stack: Stack) -> None:
    async with stack.client("wide") as client:
        with pytest.raises(BadRequestError) as refused:
            await client.chat.completions.create(model=stack.vllm.model_name,
                                                 messages=[{"role": "user", "content": "Too long"}],
                                                 max_tokens=stack.vllm.max_model_len + 100)
        assert refused.value.status_code == 400
        assert stack.relay.total == 1  # vLLM said it, not the proxy
        assert str(stack.vllm.max_model_len) in str(refused.value.message)
        await assert_backend_error_settled(stack, client, refused.value.response.headers["x-request-id"], 400)


async def test_vllms_404s_reach_the_client_and_cost_nothing(stack: Stack) -> None:
    """Two 404s vLLM writes itself: a model it does not serve (the pool names another: a rename half rolled out) and
    an endpoint its model has not (``/v1/embeddings`` of a generative model: the route is not there)."""
    async with stack.client("renamed") as client:
        with pytest.raises(NotFoundError) as unknown_model:
            await client.chat.completions.create(model=stack.vllm.model_name + "-renamed",
                                                 messages=[{"role": "user", "content": "Who?"}], max_tokens=4)
        body = unknown_model.value.body
        assert isinstance(body, dict) and body["type"] == "NotFoundError" and body["param"] == "model"  # vLLM's
        await assert_backend_error_settled(stack, client, unknown_model.value.response.headers["x-request-id"], 404,
                                           RENAMED, "renamed")
    async with stack.client("wide") as client:
        with pytest.raises(NotFoundError) as no_route:
            await client.embeddings.create(model=stack.vllm.model_name, input="embed me")
        assert no_route.value.body == {"detail": "Not Found"}  # the HTTP server's, for a route it does not have
        await assert_backend_error_settled(stack, client, no_route.value.response.headers["x-request-id"], 404)
    assert stack.relay.paths == ["/v1/chat/completions", "/v1/chat/completions", "/v1/embeddings",
                                 "/v1/chat/completions"]  # every error came from vLLM, every check after it too


async def assert_backend_error_settled(stack: Stack, client: AsyncOpenAI, request_id: str, status: int,
                                       pool: str = POOL, entitlement: str = "wide") -> None:
    """vLLM's ``status`` for ``request_id`` is settled as a backend error that used nothing (no usage: vLLM did no
    work), and the slot is free again: the next request's ``x-ratelimit-remaining-requests`` is the limit less one."""
    record = await stack.completion(request_id)
    assert (record.status, record.http_status, record.prompt_tokens, record.completion_tokens) == (
        CompletionStatus.BACKEND_ERROR, status, 0, 0)
    assert stack.proxy.metrics.completions[(pool, entitlement, "backend_error")] >= 1
    assert stack.proxy.pools[pool].controller.in_flight_of(entitlement) == 0
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=stack.proxy.pools[pool].pool.model, messages=[{"role": "user", "content": "Next"}], max_tokens=1)
        headers = raw.headers
    except NotFoundError as again:  # the renamed pool's model: vLLM's 404 again, after the same admission
        headers = again.response.headers
    assert int(headers["x-ratelimit-remaining-requests"]) == int(headers["x-ratelimit-limit-requests"]) - 1


async def test_concurrency_two_means_two_at_vllm_from_six_streams(stack: Stack) -> None:
    before = vllm_metrics(stack.vllm)
    seen_running: list[float] = []

    async def one(i: int) -> int:
        stream = await client.completions.create(model=stack.vllm.model_name, prompt=f"Stream {i}", max_tokens=150,
                                                 temperature=0, stream=True, stream_options={"include_usage": True},
                                                 extra_body=IGNORE_EOS)
        usage = [chunk.usage async for chunk in stream][-1]
        assert usage is not None
        return usage.completion_tokens

    async def watch() -> None:
        while True:
            seen_running.append((await asyncio.to_thread(vllm_metrics, stack.vllm))["vllm:num_requests_running"])
            await asyncio.sleep(0.05)

    async with stack.client("pair") as client:
        watcher = asyncio.create_task(watch())
        try:
            done = await asyncio.gather(*(one(i) for i in range(6)))
        finally:
            watcher.cancel()
    assert done == [150] * 6  # all six served: the four over the limit waited at the proxy
    assert stack.relay.peak == 2 and stack.relay.total == 6
    after = vllm_metrics(stack.vllm)
    print(f"vllm:num_requests_running seen: {sorted(set(seen_running))}")
    assert max(seen_running) <= 2  # vLLM's own gauge agrees (docs/vllm.md: its metrics are correct here)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 6 * 150
    assert after["vllm:request_success_total:length"] - before["vllm:request_success_total:length"] == 6


async def test_a_client_that_disconnects_mid_stream_gives_its_slot_back(stack: Stack) -> None:
    before = vllm_metrics(stack.vllm)
    async with stack.client("pair") as client:
        for _ in range(2):  # both of pair's slots, each given up after a few chunks
            stream = await client.chat.completions.create(
                model=stack.vllm.model_name, messages=[{"role": "user", "content": "Go on and on"}],
                max_tokens=1500, stream=True, extra_body=IGNORE_EOS)
            got = 0
            async for _chunk in stream:
                got += 1
                if got == 5:
                    break
            await stream.close()
        await stack.relay.wait_idle()  # the proxy closed its upstream requests too
        raw = await client.chat.completions.with_raw_response.create(
            model=stack.vllm.model_name, messages=[{"role": "user", "content": "Again"}], max_tokens=4)
    assert raw.headers["x-ratelimit-remaining-requests"] == "1"  # 2, less this one: both slots were given back
    after = await settled_metrics(stack.vllm)
    assert after["vllm:num_requests_running"] == 0
    # How much vLLM made depends on when its first chunk left: on 2 busy cores its API server may send a stream's
    # first chunk only once the engine has finished it (docs/vllm.md), and a stream already whole is not aborted.
    # A request its client dropped in time is in no finished_reason of request_success_total, "abort" included.
    made = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    finished = sum(after[k] - before[k] for k in after if k.startswith("vllm:request_success_total:"))
    print(f"vLLM made {made:.0f} tokens for two streams dropped after 5 chunks (max 1500 each) and one of 4; "
          f"{finished:.0f} of the 3 requests finished")
    assert made <= 2 * 1500 + 4 and 1 <= finished <= 3
