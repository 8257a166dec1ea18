"""Helpers for the tests of the proxy in front of real vLLM (``test_vllm_*.py``, docs/vllm.md).

Import what you use into the test module (``from vllm_fixtures import ...``). ``proxied`` runs the proxy in-process
(static limits from a config text, Kafka off: every event is kept in its spool) in front of a vLLM through a
counting relay (``tokenpools_dev.proxy.relay``), so "how many at vLLM" is counted at every instant. ``started``
starts a ``VLLMServer`` the way the session fixture ``vllm_server`` (conftest.py) does, for a module's own vLLM.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from openai import AsyncOpenAI

from tokenpools.config import apply_overrides, hash_api_key, load_config_text, load_settings
from tokenpools.proxy.app import Proxy, build_app, listening
from tokenpools.proxy.main import proxy_config
from tokenpools.proxy.options import ProxyOptions
from tokenpools.topics.codec import decode
from tokenpools.topics.records import RequestCompleted
from tokenpools_dev.devstack.vllm import VLLMError, VLLMInstall, VLLMServer
from tokenpools_dev.proxy.relay import CountingRelay

IGNORE_EOS = {"ignore_eos": True}  # vLLM's sampling parameter: a random model may say <|eos|> at any token
CONTINUOUS_USAGE = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # vLLM's: a running
# total on every chunk (in extra_body: the openai client's type for stream_options has no such field)
ENGINE_NICE = 10
"""``VLLMServer(engine_nice=...)`` of every test vLLM: its API server must take requests, notice disconnects and
answer ``/metrics`` while its engine generates, which it barely does on 2 busy cores otherwise (docs/vllm.md)."""
_SAMPLE = re.compile(r'^(vllm:[a-z_]+)\{([^}]*)\}\s+(\S+)$', re.M)


def pool_doc(name: str, model: str, *, engine_priority: bool = False) -> str:
    """A ``TokenPool`` of one replica (the relay's URL is filled in by ``proxied``: ``{endpoint}``) for the tiny
    model's KV geometry; requests without ``max_tokens`` get 16."""
    return f"""
apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {{name: {name}}}
spec:
  model: {model}
  backendRef: {{apiVersion: apps/v1, kind: Deployment, name: {name}}}
  scaling: {{minReplicas: 1, maxReplicas: 1}}
  perReplica: {{tokensPerSecond: 5000, kvCacheGiB: 1, concurrency: 8}}
  kvGeometry: {{layers: 2, kvHeads: 2, headDim: 32, bytesPerElement: 2}}
  defaults: {{maxTokens: 16}}
  tokenBucketWindowSeconds: 10
  enginePriority: {str(engine_priority).lower()}
  endpoints: ["{{endpoint}}"]
"""


def entitlement_doc(name: str, pool: str, key: str, *, service_class: str = "guaranteed", slo_ms: int = 10_000,
                    kv_gib: float = 0.25, concurrency: int = 2, queue_timeout_ms: int | None = None) -> str:
    """A ``TokenEntitlement`` of 2000 tokens/s (x-ratelimit-limit-tokens 20 000) for the key ``key``."""
    queue = f", queueTimeoutMs: {queue_timeout_ms}" if queue_timeout_ms is not None else ""
    return f"""
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: {name}}}
spec:
  tenantId: tenant-{name}
  poolRef: {{name: {pool}}}
  qos: {{serviceClass: {service_class}, sloTargetMs: {slo_ms}{queue}}}
  resources: {{tokensPerSecond: 2000, kvCacheGiB: {kv_gib}, concurrency: {concurrency}}}
  apiKeys: [{{sha256: {hash_api_key(key)}}}]
"""


@dataclass
class Stack:
    vllm: VLLMServer
    relay: CountingRelay
    proxy: Proxy
    url: str
    keys: Mapping[str, str]  # entitlement → its API key

    def client(self, tenant: str) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=self.url + "/v1", api_key=self.keys[tenant], max_retries=0, timeout=120)

    async def completion(self, request_id: str, timeout_s: float = 5.0) -> RequestCompleted:
        """The proxy's completion record of ``request_id`` (its ``X-Request-Id``): what it settled, as the agents
        will charge it. Kafka is off, so every event goes to the spool (within 0.1 s)."""
        assert self.proxy.events is not None
        path = self.proxy.events.spool.path
        deadline = time.monotonic() + timeout_s
        while True:
            for line in path.read_bytes().splitlines():
                value = orjson.loads(line.split(b" ", 1)[1])["value"]
                if value.get("record_type") == "request_completed" and value.get("request_id") == request_id:
                    return decode(RequestCompleted, orjson.dumps(value))
            if time.monotonic() > deadline:
                raise AssertionError(f"no completion record for {request_id} in {path} after {timeout_s} s")
            await asyncio.sleep(0.05)

    def settled(self, pool: str, entitlement: str) -> tuple[float, float]:
        """The (prompt, completion) tokens the proxy settled for ``entitlement`` so far (its metrics)."""
        tokens = self.proxy.metrics.tokens
        return tokens[(pool, entitlement, "prompt")], tokens[(pool, entitlement, "completion")]


@contextlib.asynccontextmanager
async def proxied(vllm: VLLMServer, spool_dir: Path, config: str, keys: Mapping[str, str]) -> AsyncIterator[Stack]:
    """The proxy of ``config`` (``{endpoint}`` placeholders: the relay's URL) in front of ``vllm``, Kafka off."""
    relay = CountingRelay(vllm.base_url)
    async with relay.running() as relay_url:
        loaded = load_config_text(config.replace("{endpoint}", relay_url), "vllm.yaml")
        settings = apply_overrides(load_settings(loaded.settings_values), ["kafka.bootstrap_servers=127.0.0.1:9"])
        options = ProxyOptions.from_settings(settings, "it-vllm", spool_dir=spool_dir, kafka_enabled=False)
        app = build_app(proxy_config(loaded, settings, time.time()), options)
        async with listening(app, "127.0.0.1", 0) as url:
            yield Stack(vllm, relay, app.proxy, url, keys)
        await relay.wait_idle()


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


async def settled_metrics(vllm: VLLMServer, timeout_s: float = 10.0) -> dict[str, float]:
    """vLLM's metrics once it runs and queues nothing (an abort reaches its engine a step after the connection
    closes)."""
    deadline = time.monotonic() + timeout_s
    while ((now := await asyncio.to_thread(vllm_metrics, vllm))["vllm:num_requests_running"]
           or now["vllm:num_requests_waiting"]) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return now


def vllm_tokens(before: Mapping[str, float], after: Mapping[str, float]) -> tuple[float, float]:
    """The (prompt, generated) tokens vLLM counted between two ``vllm_metrics`` readings."""
    return (after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"],
            after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"])


def installed() -> VLLMInstall:
    """The vLLM install, or a skip saying how to make it (its tests are skipped, not failed: docs/vllm.md)."""
    try:
        return VLLMInstall.find()
    except VLLMError as e:
        missing = str(e)
    pytest.skip(missing)


@contextlib.contextmanager
def started(server: VLLMServer) -> Iterator[VLLMServer]:
    """``server`` started (a start that fails FAILS the test, with vLLM's log tail), closed at the end."""
    failure = ""
    try:
        server.start()
    except VLLMError as e:
        failure = str(e)
    if failure:  # outside `except`: the message alone, no chained traceback
        server.close()
        pytest.fail(failure, pytrace=False)
    print(f"vLLM ({server.model_name}) ready at {server.base_url} in {server.startup_seconds:.1f}s")
    try:
        yield server
    finally:
        server.close()
