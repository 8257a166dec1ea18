"""``/v1/embeddings`` and ``/v1/responses`` through the proxy to llm-d-inference-sim (v0.10.2 serves both, the
Responses API streamed as typed events), driven by the official ``openai`` client: the answers are the sim's, and
what the proxy settled is exactly the usage the sim reported. A pool with ``enginePriority`` on sends ``priority``,
which the sim accepts (it ignores it: the body the engine gets is checked in the component tier). Kafka is off
(the events spool): this is about the request path."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from backend_fixtures import inference_sim_binary  # noqa: F401  (fixture import)
from openai import AsyncOpenAI
from proxy_fixtures import KEYS, config_text, start_sim  # noqa: F401

from tokenpools.config import apply_overrides, load_config_text, load_settings
from tokenpools.proxy.app import Proxy, build_app, listening
from tokenpools.proxy.main import proxy_config
from tokenpools.proxy.options import ProxyOptions
from tokenpools_dev.devstack.inference_sim import InferenceSim

pytestmark = [pytest.mark.integration]

POOL = "sim-pool"


@contextlib.asynccontextmanager
async def proxied(sim: InferenceSim, spool_dir: Path, *, engine_priority: bool = False
                  ) -> AsyncIterator[tuple[AsyncOpenAI, Proxy]]:
    """The proxy of the integration config before ``sim``, Kafka off; the client holds gold's key."""
    text = config_text([sim.base_url])
    if engine_priority:
        text = text.replace("  tokenBucketWindowSeconds: 10\n", "  tokenBucketWindowSeconds: 10\n  enginePriority: true\n")
    loaded = load_config_text(text, "integration.yaml")
    assert loaded.pools[POOL].engine_priority is engine_priority
    settings = apply_overrides(load_settings(loaded.settings_values), ["kafka.bootstrap_servers=127.0.0.1:9"])
    options = ProxyOptions.from_settings(settings, "it-proxy", spool_dir=spool_dir, kafka_enabled=False)
    app = build_app(proxy_config(loaded, settings, time.time()), options)
    async with listening(app, "127.0.0.1", 0) as url:
        async with AsyncOpenAI(base_url=url + "/v1", api_key=KEYS["gold"], max_retries=0, timeout=20) as client:
            yield client, app.proxy


def settled(proxy: Proxy) -> tuple[int, int]:
    """The prompt and completion tokens the proxy released gold's reservations with, so far."""
    tokens = proxy.metrics.tokens
    return tokens[(POOL, "gold", "prompt")], tokens[(POOL, "gold", "completion")]


def completions(proxy: Proxy) -> int:
    return proxy.metrics.completions[(POOL, "gold", "ok")]


async def test_embeddings_pass_through_and_settle_on_the_sims_prompt_tokens(
        start_sim: Callable[..., InferenceSim], tmp_path: Path) -> None:
    sim = start_sim()
    async with proxied(sim, tmp_path) as (client, proxy):
        raw = await client.embeddings.with_raw_response.create(model="fake-model", input=["Hello there", "again"])
        assert "x-ratelimit-remaining-tokens" in raw.headers
        result = raw.parse()  # base64 by default, decoded by the client
        assert len(result.data) == 2 and len(result.data[0].embedding) == 384  # the sim's default dimensions
        floats = await client.embeddings.create(model="fake-model", input=[1, 2, 3], encoding_format="float",
                                                dimensions=8)
        assert len(floats.data[0].embedding) == 8 and floats.usage.prompt_tokens == 3
        assert completions(proxy) == 2
        assert settled(proxy) == (result.usage.prompt_tokens + 3, 0)


async def test_responses_pass_through_and_settle_on_the_sims_input_and_output_tokens(
        start_sim: Callable[..., InferenceSim], tmp_path: Path) -> None:
    sim = start_sim()
    async with proxied(sim, tmp_path) as (client, proxy):
        raw = await client.responses.with_raw_response.create(
            model="fake-model", instructions="Answer briefly.", max_output_tokens=6,
            input=[{"role": "user", "content": [{"type": "input_text", "text": "Hello over the Responses API"}]}])
        assert "x-ratelimit-remaining-tokens" in raw.headers
        result = raw.parse()
        assert result.output_text and result.usage is not None and 1 <= result.usage.output_tokens <= 6
        assert completions(proxy) == 1
        assert settled(proxy) == (result.usage.input_tokens, result.usage.output_tokens)


async def test_a_streamed_response_passes_its_events_and_settles_on_response_completed(
        start_sim: Callable[..., InferenceSim], tmp_path: Path) -> None:
    sim = start_sim(time_to_first_token=0.05, inter_token_latency=0.01)
    async with proxied(sim, tmp_path) as (client, proxy):
        stream = await client.responses.create(model="fake-model", input="Tell me about the weather",
                                               max_output_tokens=8, stream=True)
        deltas, usage = [], None
        async for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
            elif event.type == "response.completed":
                usage = event.response.usage
        assert deltas and usage is not None and usage.output_tokens == len(deltas) <= 8
        assert completions(proxy) == 1
        assert settled(proxy) == (usage.input_tokens, usage.output_tokens)
        assert sum(proxy.metrics.ttft[(POOL, "gold")].counts) == 1  # content started: the first non-empty delta


async def test_a_pool_with_engine_priority_on_serves_every_endpoint(
        start_sim: Callable[..., InferenceSim], tmp_path: Path) -> None:
    sim = start_sim()
    async with proxied(sim, tmp_path, engine_priority=True) as (client, proxy):
        chat = await client.chat.completions.create(model="fake-model", max_tokens=4,
                                                    messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].message.content
        assert (await client.embeddings.create(model="fake-model", input="hi")).data
        assert (await client.responses.create(model="fake-model", input="hi", max_output_tokens=4)).output_text
        assert completions(proxy) == 3
