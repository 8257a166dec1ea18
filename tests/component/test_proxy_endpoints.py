"""``POST /v1/embeddings`` and ``POST /v1/responses`` through the proxy, driven by the official ``openai`` client
against the in-process backend speaking OpenAI's shapes: admission (embeddings cost their input only; responses
cost like chat), the backend's usage settling each (``prompt_tokens``/``total_tokens``; ``input_tokens``/
``output_tokens``, streamed in ``response.completed``), the rate-limit headers, and the bad bodies the proxy
answers itself. The same calls run against llm-d-inference-sim in tests/integration/test_proxy_endpoints_sim.py."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.reservation import ReservationConfig
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.app import Proxy, build_app
from tokenpools.runtime.clock import FakeClock
from tokenpools.topics.codec import encode
from tokenpools_dev.proxy.doubles import FakeBackend, ProducerHub, limit_update, offline_options, proxy_config, running

pytestmark = pytest.mark.component

POOL = PoolSpec("pool-a", "fake-model", Capacity(10_000, 1e9, 8), kv_bytes_per_token=1000, default_max_tokens=32)
ENTITLEMENTS = [EntitlementSpec("team", "pool-a", ServiceClass.ELASTIC, 5000, Capacity(1000, 2e8, 4))]
RATE = 100.0  # tokens/s: a 1000-token bucket (10-s window)
HEADERS = ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests",
           "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")


@dataclasses.dataclass
class Env:
    client: AsyncOpenAI
    backend: FakeBackend
    hub: ProducerHub
    proxy: Proxy

    async def records(self, topic: str) -> list[dict[str, Any]]:
        for _ in range(200):
            assert self.proxy.events is not None
            if not self.proxy.events.queue_depth and not self.proxy.events.in_flight:
                break
            await asyncio.sleep(0.01)
        return [r for r in self.hub.of(topic) if not r.get("waits")]

    def bucket(self) -> float:
        runtime = self.proxy.pools["pool-a"]
        return runtime.controller.bucket_tokens_of("team", self.proxy.clock.now_s())


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    backend, hub, clock = FakeBackend(), ProducerHub(), FakeClock()  # the clock stands still: no refill
    async with running(backend.app()) as backend_url:
        config = dataclasses.replace(  # the output estimate learns after two completions (the cap until then)
            proxy_config({"pool-a": (backend_url,)}, [POOL], ENTITLEMENTS, {"team": "sk-team"}),
            reservation=ReservationConfig(0.5, window_completions=4, min_completions=2))
        app = build_app(config, offline_options(tmp_path, policy={"queue_slo_fraction": 0}),
                        producer_factory=hub.factory, clock=clock)
        async with running(app) as url:
            assert app.proxy.limits is not None
            update = limit_update("pool-a", 1, app.proxy.clock.wall_ms(), {"team": (4, RATE, 2e8, 50.0)}, 8)
            assert app.proxy.limits.handle(encode(update)) == "applied"
            async with AsyncOpenAI(base_url=url + "/v1", api_key="sk-team", max_retries=0) as client:
                yield Env(client, backend, hub, app.proxy)


# ---- embeddings ---------------------------------------------------------------------------------------------------
async def test_an_embedding_costs_its_input_and_settles_on_the_backends_prompt_tokens(env: Env) -> None:
    env.backend.prompt_tokens = 7
    raw = await env.client.embeddings.with_raw_response.create(model="fake-model", input=["a" * 400, "b" * 40])
    result = raw.parse()
    assert [d.embedding for d in result.data] == [[0.5, -0.25, 0.125, 1.0]] * 2  # base64 decoded by the client
    assert result.usage.prompt_tokens == 14 and result.usage.total_tokens == 14
    assert all(name in raw.headers for name in HEADERS)
    sent = env.backend.bodies[-1]
    assert sent["input"] == ["a" * 400, "b" * 40] and not {"max_tokens", "stream_options", "priority"} & set(sent)
    (decided,) = await env.records("requests")
    assert (decided["prompt_tokens_est"], decided["max_tokens"], decided["cost_tokens"]) == (110, 0, 110)
    assert decided["stream"] is False
    (done,) = await env.records("completions")
    assert (done["status"], done["prompt_tokens"], done["completion_tokens"]) == ("ok", 14, 0)
    assert done["reserved_tokens"] == 110
    assert env.bucket() == 1000 - 14  # the estimate came back, the real use was charged


async def test_every_shape_of_embedding_input_is_admitted(env: Env) -> None:
    for value in ("one text", ["two", "texts"], [1, 2, 3, 4], [[1, 2], [3]]):
        result = await env.client.embeddings.create(model="fake-model", input=value, encoding_format="float")
        assert result.data[0].embedding == [0.5, -0.25, 0.125, 1.0]
    estimates = [r["prompt_tokens_est"] for r in await env.records("requests")]
    assert estimates == [2, 1 + 2, 4, 3]  # each text by its length (⌈chars / 4⌉), token ids by their count


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"model": "fake-model"}, "input", "missing_field"),
    ({"model": "fake-model", "input": {"text": "x"}}, "input", "invalid_type"),
    ({"model": "fake-model", "input": ["x", 1]}, "input", "invalid_type"),
    ({"model": "fake-model", "input": []}, "input", "invalid_type"),
    ({"model": "other-model", "input": "x"}, "model", "model_not_found"),
])
async def test_a_bad_embedding_body_is_answered_by_the_proxy(env: Env, body: dict[str, Any], param: str,
                                                           code: str) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        await env.client.post("/embeddings", cast_to=object, body=body)
    assert caught.value.body["code"] == code and caught.value.body["param"] == param  # type: ignore[index]
    assert env.backend.bodies == []


# ---- responses ----------------------------------------------------------------------------------------------------
async def test_a_response_costs_like_chat_and_settles_on_input_and_output_tokens(env: Env) -> None:
    env.backend.prompt_tokens, env.backend.chunks = 9, 3
    raw = await env.client.responses.with_raw_response.create(model="fake-model", input="hello there",
                                                              instructions="be brief", max_output_tokens=20)
    result = raw.parse()
    assert result.output_text == "tok tok tok "
    assert result.usage is not None and (result.usage.input_tokens, result.usage.output_tokens) == (9, 3)
    assert all(name in raw.headers for name in HEADERS)
    sent = env.backend.bodies[-1]
    assert sent["max_output_tokens"] == 20 and "stream_options" not in sent and "priority" not in sent
    (decided,) = await env.records("requests")
    assert decided["max_tokens"] == 20 and decided["cost_tokens"] == decided["prompt_tokens_est"] + 20
    (done,) = await env.records("completions")
    assert (done["prompt_tokens"], done["completion_tokens"]) == (9, 3)


async def test_a_response_without_a_cap_gets_the_pool_default(env: Env) -> None:
    await env.client.responses.create(model="fake-model", input=[
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}])
    assert env.backend.bodies[-1]["max_output_tokens"] == POOL.default_max_tokens


async def test_a_streamed_response_passes_its_events_and_settles_on_response_completed(env: Env) -> None:
    env.backend.prompt_tokens, env.backend.chunks = 5, 4
    raw = await env.client.responses.with_raw_response.create(model="fake-model", input="hi", stream=True,
                                                              max_output_tokens=16)
    assert all(name in raw.headers for name in HEADERS)
    stream = raw.parse()
    kinds, deltas, usage = [], [], None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type == "response.completed":
            usage = event.response.usage
    assert kinds == ["response.created"] + ["response.output_text.delta"] * 4 + ["response.completed"]
    assert "".join(deltas) == "tok " * 4
    assert usage is not None and (usage.input_tokens, usage.output_tokens) == (5, 4)  # the client keeps its usage
    assert env.backend.bodies[-1]["stream"] is True and "stream_options" not in env.backend.bodies[-1]
    (decided,) = await env.records("requests")
    assert decided["stream"] is True
    (done,) = await env.records("completions")
    assert (done["status"], done["prompt_tokens"], done["completion_tokens"]) == ("ok", 5, 4)
    assert done["ttft_s"] is not None


async def test_a_streamed_response_that_runs_past_its_reservation_is_charged_as_it_goes(env: Env) -> None:
    env.backend.prompt_tokens, env.backend.chunks = 5, 3
    for _ in range(2):  # two responses of 3 tokens: the output estimate under the default cap becomes 3
        await env.client.responses.create(model="fake-model", input="hi")
    level0 = env.bucket()
    env.backend.chunks, env.backend.chunk_delay_s = 20, 0.03
    stream = await env.client.responses.create(model="fake-model", input="hi", stream=True)
    seen = 0
    async for event in stream:
        if event.type == "response.output_text.delta":
            seen += 1
            if seen == 12:  # the proxy has read 12 deltas: all past the 3 reserved were charged already
                assert env.bucket() <= level0 - seen
    assert seen == 20
    decided = await env.records("requests")
    assert decided[-1]["cost_tokens"] == decided[-1]["prompt_tokens_est"] + 3
    done = await env.records("completions")
    assert (done[-1]["prompt_tokens"], done[-1]["completion_tokens"]) == (5, 20)
    assert env.bucket() == level0 - 25  # settled with the backend's usage, whatever was reserved and charged


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"model": "fake-model"}, "input", "missing_field"),
    ({"model": "fake-model", "input": 3}, "input", "invalid_type"),
    ({"model": "fake-model", "input": []}, "input", "invalid_value"),
    ({"model": "fake-model", "input": ["text"]}, "input[0]", "invalid_type"),
    ({"model": "fake-model", "input": [{"role": "user", "content": 5}]}, "input[0].content", "invalid_type"),
    ({"model": "fake-model", "input": "x", "instructions": ["a"]}, "instructions", "invalid_type"),
    ({"model": "fake-model", "input": "x", "max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
    ({"model": "fake-model", "input": "x", "stream": "yes"}, "stream", "invalid_type"),
])
async def test_a_bad_responses_body_is_answered_by_the_proxy(env: Env, body: dict[str, Any], param: str,
                                                           code: str) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        await env.client.post("/responses", cast_to=object, body=body)
    assert caught.value.status_code == 400
    assert caught.value.body["code"] == code and caught.value.body["param"] == param  # type: ignore[index]
    assert env.backend.bodies == []


async def test_a_refusal_on_either_endpoint_is_a_429_with_the_rate_limit_headers(env: Env) -> None:
    assert env.proxy.limits is not None
    update = limit_update("pool-a", 2, env.proxy.clock.wall_ms(), {"team": (4, 1.0, 2e8, 50.0)}, 8)  # a 10-token bucket
    assert env.proxy.limits.handle(encode(update)) == "applied"
    await asyncio.sleep(0)
    for call in (env.client.embeddings.create(model="fake-model", input="x" * 400),
                 env.client.responses.create(model="fake-model", input="hi", max_output_tokens=100)):
        with pytest.raises(openai.RateLimitError) as caught:
            await call
        headers = caught.value.response.headers
        assert headers["x-tokenpools-refused-by"] == "proxy" and all(name in headers for name in HEADERS)
    assert env.backend.bodies == []
