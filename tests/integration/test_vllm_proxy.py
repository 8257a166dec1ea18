"""The proxy in front of real vLLM (the CPU build serving a tiny random Llama, docs/vllm.md), driven by the official
``openai`` client: what llm-d-inference-sim can only imitate, checked against the real thing.

Kafka is off (the events spool) and the limits are the file's (static): this is about the request path. Between
the proxy and vLLM sits a counting relay (``tokenpools_dev.proxy.relay``), so "at most 2 at vLLM" is counted at
every instant, not sampled. The session shares one vLLM (``vllm_server``, conftest.py): a start costs a minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import AsyncOpenAI, BadRequestError

from tokenpools.config import apply_overrides, hash_api_key, load_config_text, load_settings
from tokenpools.proxy.app import Proxy, build_app, listening
from tokenpools.proxy.main import proxy_config
from tokenpools.proxy.options import ProxyOptions
from tokenpools_dev.devstack.vllm import VLLMServer
from tokenpools_dev.proxy.relay import CountingRelay

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POOL = "vllm-pool"
KEYS = {"wide": "sk-vllm-wide", "pair": "sk-vllm-pair"}
CONFIG = """
apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {{name: {pool}}}
spec:
  model: {model}
  backendRef: {{apiVersion: apps/v1, kind: Deployment, name: vllm}}
  scaling: {{minReplicas: 1, maxReplicas: 1}}
  perReplica: {{tokensPerSecond: 5000, kvCacheGiB: 1, concurrency: 8}}
  kvGeometry: {{layers: 2, kvHeads: 2, headDim: 32, bytesPerElement: 2}}
  defaults: {{maxTokens: 16}}
  tokenBucketWindowSeconds: 10
  endpoints: ["{endpoint}"]
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: wide}}
spec:
  tenantId: tenant-wide
  poolRef: {{name: {pool}}}
  qos: {{serviceClass: guaranteed, sloTargetMs: 10000}}
  resources: {{tokensPerSecond: 2000, kvCacheGiB: 0.5, concurrency: 6}}
  apiKeys: [{{sha256: {wide}}}]
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: pair}}
spec:
  tenantId: tenant-pair
  poolRef: {{name: {pool}}}
  qos: {{serviceClass: guaranteed, sloTargetMs: 60000, queueTimeoutMs: 60000}}
  resources: {{tokensPerSecond: 2000, kvCacheGiB: 0.25, concurrency: 2}}
  apiKeys: [{{sha256: {pair}}}]
"""
IGNORE_EOS = {"ignore_eos": True}  # vLLM's sampling parameter: a random model may say <|eos|> at any token
_SAMPLE = re.compile(r'^(vllm:[a-z_]+)\{([^}]*)\}\s+(\S+)$', re.M)


@dataclass
class Stack:
    vllm: VLLMServer
    relay: CountingRelay
    proxy: Proxy
    url: str

    def client(self, tenant: str) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=self.url + "/v1", api_key=KEYS[tenant], max_retries=0, timeout=120)


@contextlib.asynccontextmanager
async def proxied(vllm: VLLMServer, spool_dir: Path) -> AsyncIterator[Stack]:
    relay = CountingRelay(vllm.base_url)
    async with relay.running() as relay_url:
        text = CONFIG.format(pool=POOL, model=vllm.model_name, endpoint=relay_url,
                             **{tenant: hash_api_key(key) for tenant, key in KEYS.items()})
        loaded = load_config_text(text, "vllm.yaml")
        settings = apply_overrides(load_settings(loaded.settings_values), ["kafka.bootstrap_servers=127.0.0.1:9"])
        options = ProxyOptions.from_settings(settings, "it-vllm", spool_dir=spool_dir, kafka_enabled=False)
        app = build_app(proxy_config(loaded, settings, time.time()), options)
        async with listening(app, "127.0.0.1", 0) as url:
            yield Stack(vllm, relay, app.proxy, url)
        await relay.wait_idle()


@pytest.fixture
async def stack(vllm_server: VLLMServer, tmp_path: Path) -> AsyncIterator[Stack]:
    async with proxied(vllm_server, tmp_path) as s:
        yield s


def vllm_metrics(vllm: VLLMServer) -> dict[str, float]:
    """vLLM's own ``/metrics``, ``vllm:*`` samples summed over their labels (one engine, one model)."""
    with urllib.request.urlopen(vllm.base_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for name, labels, value in _SAMPLE.findall(text):
        if name == "vllm:request_success_total":
            reason = re.search(r'finished_reason="([a-z]+)"', labels)
            name = f"{name}:{reason[1] if reason else ''}"
        out[name] = out.get(name, 0.0) + float(value)
    return out


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
    tokens = stack.proxy.metrics.tokens
    assert (tokens[(POOL, "wide", "prompt")], tokens[(POOL, "wide", "completion")]) == (
        chat.usage.prompt_tokens, chat.usage.completion_tokens)  # settled on what vLLM counted


async def test_a_chat_stream_ends_with_vllms_usage(stack: Stack) -> None:
    async with stack.client("wide") as client:
        stream = await client.chat.completions.create(
            model=stack.vllm.model_name, messages=[{"role": "user", "content": "Stream, please"}], max_tokens=20,
            temperature=0, stream=True, stream_options={"include_usage": True}, extra_body=IGNORE_EOS)
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert text and usage is not None and usage.completion_tokens == 20
    assert stack.proxy.metrics.tokens[(POOL, "wide", "completion")] == 20


async def test_completions_plain_and_streamed(stack: Stack) -> None:
    async with stack.client("wide") as client:
        plain = await client.completions.create(model=stack.vllm.model_name, prompt="Token pools are", max_tokens=8,
                                                temperature=0, extra_body=IGNORE_EOS)
        assert plain.usage is not None and plain.usage.completion_tokens == 8 and plain.choices[0].text
        stream = await client.completions.create(model=stack.vllm.model_name, prompt="Token pools are",
                                                 max_tokens=8, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}, extra_body=IGNORE_EOS)
        chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text  # greedy: the same
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


async def test_models_are_the_pools_and_vllm_serves_the_same_name(stack: Stack) -> None:
    async with stack.client("wide") as client:
        listed = await client.models.list()
    assert [m.id for m in listed.data] == [stack.vllm.model_name]
    async with AsyncOpenAI(base_url=stack.vllm.base_url + "/v1", api_key="unused", max_retries=0) as direct:
        assert [m.id for m in (await direct.models.list()).data] == [stack.vllm.model_name]


async def test_vllms_400_for_too_many_tokens_reaches_the_client(stack: Stack) -> None:
    async with stack.client("wide") as client:
        with pytest.raises(BadRequestError) as refused:
            await client.chat.completions.create(model=stack.vllm.model_name,
                                                 messages=[{"role": "user", "content": "Too long"}],
                                                 max_tokens=stack.vllm.max_model_len + 100)
    assert refused.value.status_code == 400
    assert stack.relay.total == 1  # vLLM said it, not the proxy
    assert str(stack.vllm.max_model_len) in str(refused.value.message)
    assert stack.proxy.metrics.completions[(POOL, "wide", "ok")] == 0


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


async def settled_metrics(vllm: VLLMServer, timeout_s: float = 10.0) -> dict[str, float]:
    """vLLM's metrics once it runs nothing (an abort reaches its engine a step after the connection closes)."""
    deadline = time.monotonic() + timeout_s
    while (now := await asyncio.to_thread(vllm_metrics, vllm))["vllm:num_requests_running"] and (
            time.monotonic() < deadline):
        await asyncio.sleep(0.05)
    return now
