"""The proxy against the real stack: Apache Kafka and llm-d-inference-sim, driven by the official openai client.

Limits arrive the production way, as LimitUpdate records on the limits topic; every test has its own topics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
from backend_fixtures import inference_sim_binary, metric, scrape  # noqa: F401  (fixture import)
from openai import AsyncOpenAI
from proxy_fixtures import KEYS, KV_PER_TOKEN, RunningProxy, produce, read_topic, start_proxy, start_sim, topics  # noqa: F401

# these scenarios count refusals as they happen: a refused request must not wait for its check instead
# (docs/queueing.md; the queue is tested through the real proxy in tests/component/test_proxy_queue.py)
NO_WAITING = ("policy.queue_slo_fraction=0",)

from tokenpools.topics.declarations import Topics
from tokenpools_dev.devstack.inference_sim import InferenceSim
from tokenpools_dev.proxy.doubles import limit_update

pytestmark = pytest.mark.integration

POOL = "sim-pool"
# (concurrency, tokens/s, KV bytes, priority); this proxy's share of the pool: 3 slots
LIMITS = {"gold": (2, 500.0, 1e9, 900.0), "kvtight": (2, 5000.0, 200 * KV_PER_TOKEN, 800.0),
          "spot": (3, 5000.0, 1e10, 1.0), "pre": (3, 5000.0, 1e10, 0.1)}
MESSAGES = [{"role": "user", "content": "Hello there, how are you today?"}]


def client(proxy: RunningProxy, name: str, key: str | None = None) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=proxy.base_url, api_key=key or KEYS[name], max_retries=0)


async def apply(proxy: RunningProxy, bootstrap: str, topics: Topics, version: int,
                limits: dict[str, tuple[int, float, float, float]] = LIMITS, pool_concurrency: int = 3) -> None:
    await produce(bootstrap, topics.limits.name, POOL, limit_update(POOL, version, int(time.time() * 1000), limits,
                                                                  pool_concurrency))
    await proxy.wait_version(POOL, version)


async def test_admitted_requests_return_what_the_backend_returned(
        start_sim: Callable[..., InferenceSim], kafka_bootstrap: str, topics: Topics, tmp_path: Path) -> None:
    sim = start_sim()
    async with start_proxy([sim.base_url], kafka_bootstrap, topics, tmp_path) as proxy:
        async with client(proxy, "gold") as oai, AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="x") as direct:
            raw = await oai.chat.completions.with_raw_response.create(model="fake-model", messages=MESSAGES, max_tokens=8)
            r = raw.parse()
            assert raw.headers["X-Request-Id"].startswith("it-proxy-")
            d = await direct.chat.completions.create(model="fake-model", messages=MESSAGES, max_tokens=8)
            assert r.object == d.object == "chat.completion" and r.model == d.model
            assert r.choices[0].message.content and r.usage is not None
            assert r.usage.prompt_tokens == d.usage.prompt_tokens  # type: ignore[union-attr]  # same prompt, same count
            assert r.usage.completion_tokens <= 8
            chunks = [c async for c in await oai.chat.completions.create(model="fake-model", messages=MESSAGES,
                                                                          max_tokens=8, stream=True)]
            assert chunks and all(c.usage is None for c in chunks)  # usage was requested by the proxy, then hidden
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            with_usage = [c async for c in await oai.chat.completions.create(
                model="fake-model", messages=MESSAGES, max_tokens=8, stream=True,
                stream_options={"include_usage": True})]
            assert with_usage[-1].usage is not None and with_usage[-1].choices == []
            text = await oai.completions.create(model="fake-model", prompt="Say something", max_tokens=5)
            assert text.choices[0].text and text.usage is not None
            assert [m.id for m in (await oai.models.list()).data] == ["fake-model"]


async def test_each_refusal_reason_has_a_scenario_that_deserves_it(
        start_sim: Callable[..., InferenceSim], kafka_bootstrap: str, topics: Topics, tmp_path: Path) -> None:
    sim = start_sim(max_num_seqs=8, time_to_first_token=0.6)
    async with start_proxy([sim.base_url], kafka_bootstrap, topics, tmp_path, NO_WAITING) as proxy:
        await apply(proxy, kafka_bootstrap, topics, 1)

        async def call(name: str, key: str | None = None, **kw: object) -> str:
            async with client(proxy, name, key) as oai:
                try:
                    await oai.chat.completions.create(model="fake-model", messages=MESSAGES, **kw)  # type: ignore[call-overload]
                    return "ok"
                except openai.APIStatusError as e:
                    assert isinstance(e.body, dict)
                    if e.status_code == 429:
                        assert int(e.response.headers["Retry-After"]) >= 1
                        wait_ms = int(e.response.headers["retry-after-ms"])  # the estimate behind it, in ms
                        assert int(e.response.headers["Retry-After"]) == max(1, -(-wait_ms // 1000)) and wait_ms > 0
                    return f"{e.status_code} {e.body['code']}"

        assert await call("gold", key="sk-wrong") == "401 unknown_key"
        assert await call("big") == "403 not_bound"  # its baseline does not fit the pool: Degraded
        # concurrency: gold holds 2 slots, a third concurrent request is refused
        assert sorted(await asyncio.gather(*(call("gold") for _ in range(3)))) == ["429 concurrency", "ok", "ok"]
        # token budget: 500 tokens/s × 10 s = a 5000-token bucket, the request asks for more
        assert await call("gold", max_tokens=6000) == "429 token_budget"
        # KV: kvtight may hold 200 tokens of KV; this request reserves n_in + 300
        assert await call("kvtight", max_tokens=300) == "429 kv_cache"
        assert await call("kvtight", max_tokens=100) == "ok"
        # low priority: gold and kvtight fill the pool's 3 slots; spot's priority 1 is not above 800
        held = [asyncio.create_task(call("gold")), asyncio.create_task(call("gold")), asyncio.create_task(call("kvtight"))]
        await asyncio.sleep(0.3)
        assert await call("spot") == "429 low_priority"
        assert await asyncio.gather(*held) == ["ok"] * 3
        assert await call("spot") == "ok"  # not contended any more


async def test_usage_settles_the_bucket_with_the_backends_counts(
        start_sim: Callable[..., InferenceSim], kafka_bootstrap: str, topics: Topics, tmp_path: Path) -> None:
    sim = start_sim()
    async with start_proxy([sim.base_url], kafka_bootstrap, topics, tmp_path) as proxy:
        await apply(proxy, kafka_bootstrap, topics, 1, {**LIMITS, "gold": (2, 10.0, 1e9, 900.0)})  # depth 100
        controller = proxy.proxy.pools[POOL].controller
        now = proxy.proxy.clock.now_s
        async with client(proxy, "gold") as oai:
            before = controller.bucket_tokens_of("gold", now())
            t0 = now()
            r = await oai.chat.completions.create(model="fake-model", messages=MESSAGES, max_tokens=50)
            t1 = now()
            after = controller.bucket_tokens_of("gold", t1)
        assert r.usage is not None
        used = r.usage.prompt_tokens + r.usage.completion_tokens
        refill = 10.0 * (t1 - t0)
        # reserved n_in estimate + 50, refunded down to what the backend reported
        assert after == pytest.approx(before - used + refill, abs=1.5)
        assert controller.in_flight_of("gold") == 0 and controller.kv_reserved_of("gold") == 0


async def test_events_land_on_the_topics_with_correct_fields(
        start_sim: Callable[..., InferenceSim], kafka_bootstrap: str, topics: Topics, tmp_path: Path) -> None:
    sim = start_sim(time_to_first_token=0.05)
    async with start_proxy([sim.base_url], kafka_bootstrap, topics, tmp_path, heartbeat_interval_s=0.5) as proxy:
        await apply(proxy, kafka_bootstrap, topics, 1)
        async with client(proxy, "gold") as oai:
            plain = await oai.chat.completions.with_raw_response.create(model="fake-model", messages=MESSAGES,
                                                                         max_tokens=6)
            streamed = await oai.chat.completions.with_raw_response.create(
                model="fake-model", messages=MESSAGES, max_tokens=6, stream=True, stream_options={"include_usage": True})
            chunks = [c async for c in streamed.parse()]
            with pytest.raises(openai.RateLimitError):
                await oai.chat.completions.create(model="fake-model", messages=MESSAGES, max_tokens=9000)
        await proxy.drained()
    ids = [plain.headers["X-Request-Id"], streamed.headers["X-Request-Id"]]
    decided = await read_topic(kafka_bootstrap, topics.requests.name, expect=3)
    completed = await read_topic(kafka_bootstrap, topics.completions.name, expect=2)
    assert [d["outcome"] for d in decided] == ["admitted", "admitted", "token_budget"]
    assert [d["request_id"] for d in decided[:2]] == ids
    for d in decided:
        assert (d["pool"], d["entitlement"], d["proxy_id"]) == (POOL, "gold", "it-proxy")
        assert d["priority"] == 900.0 and d["cost_tokens"] == d["prompt_tokens_est"] + d["max_tokens"]
    assert [d["stream"] for d in decided] == [False, True, False]
    assert decided[0]["kv_bytes"] == decided[0]["cost_tokens"] * KV_PER_TOKEN and decided[2]["kv_bytes"] == 0
    assert [c["request_id"] for c in completed] == ids
    usage = [plain.parse().usage, chunks[-1].usage]
    for c, u in zip(completed, usage, strict=True):
        assert u is not None and (c["prompt_tokens"], c["completion_tokens"]) == (u.prompt_tokens, u.completion_tokens)
        assert c["status"] == "ok" and c["http_status"] == 200 and c["backend"] == sim.base_url
        assert c["reserved_tokens"] == decided[completed.index(c)]["cost_tokens"]
        assert c["admitted_t_ms"] <= c["t_ms"] and c["e2e_s"] > 0
    assert completed[0]["ttft_s"] is None and 0.04 < completed[1]["ttft_s"] <= completed[1]["e2e_s"]
    beats = await read_topic(kafka_bootstrap, topics.heartbeats.name)
    assert beats and all(b["proxy_id"] == "it-proxy" and b["pools"] == [POOL] for b in beats)


async def test_limit_updates_raise_or_lower_admission_stale_ones_are_ignored_and_ttl_falls_back(
        start_sim: Callable[..., InferenceSim], kafka_bootstrap: str, topics: Topics, tmp_path: Path) -> None:
    sim = start_sim(max_num_seqs=16, time_to_first_token=0.5)
    async with start_proxy([sim.base_url], kafka_bootstrap, topics, tmp_path, NO_WAITING, limits_ttl_s=3.0,
                           watchdog_interval_s=0.2) as proxy:
        rt = proxy.proxy.pools[POOL]
        static_spot = rt.controller.limits_of("spot").concurrency

        async def admitted(n: int) -> int:
            async with client(proxy, "spot") as oai:
                async def one() -> bool:
                    try:
                        await oai.chat.completions.create(model="fake-model", messages=MESSAGES, max_tokens=2)
                        return True
                    except openai.RateLimitError:
                        return False
                return sum(await asyncio.gather(*(one() for _ in range(n))))

        await apply(proxy, kafka_bootstrap, topics, 5, {**LIMITS, "spot": (1, 5000.0, 1e10, 1.0)}, 8)
        assert await admitted(4) == 1  # lowered
        await apply(proxy, kafka_bootstrap, topics, 6, {**LIMITS, "spot": (4, 5000.0, 1e10, 1.0)}, 8)
        assert await admitted(4) == 4  # raised
        # a stale (older) version is ignored: the next newer one proves the consumer read past it
        await produce(kafka_bootstrap, topics.limits.name, POOL,
                      limit_update(POOL, 4, int(time.time() * 1000), {**LIMITS, "spot": (0, 1.0, 1.0, 1.0)}, 8))
        for _ in range(100):
            if proxy.proxy.metrics.limit_updates[(POOL, "stale")]:
                break
            await asyncio.sleep(0.05)
        assert proxy.proxy.metrics.limit_updates[(POOL, "stale")] == 1
        assert rt.in_force.version == 6 and rt.controller.limits_of("spot").concurrency == 4
        # no update for longer than the TTL: static limits, never unlimited
        await asyncio.sleep(3.5)
        assert rt.in_force.source.value == "static" and proxy.proxy.metrics.limit_fallbacks[POOL] == 1
        assert rt.controller.limits_of("spot").concurrency == static_spot < 10**6
        assert await admitted(static_spot + 2) == static_spot


async def test_backend_refusals_pass_through_labelled_as_the_backends(
        start_sim: Callable[..., InferenceSim], kafka_bootstrap: str, topics: Topics, tmp_path: Path) -> None:
    sim = start_sim(max_num_seqs=1, time_to_first_token=0.5, extra_args=["--max-waiting-queue-length=1"])
    async with start_proxy([sim.base_url], kafka_bootstrap, topics, tmp_path) as proxy:
        await apply(proxy, kafka_bootstrap, topics, 1, {**LIMITS, "spot": (5, 5000.0, 1e10, 1.0)}, 8)
        async with client(proxy, "spot") as oai:
            async def one() -> str:
                try:
                    await oai.chat.completions.create(model="fake-model", messages=MESSAGES, max_tokens=2)
                    return "ok"
                except openai.APIStatusError as e:
                    return f"{e.status_code} {e.response.headers.get('X-TokenPools-Refused-By')}"
            results = sorted(await asyncio.gather(*(one() for _ in range(4))))
        assert results == ["429 backend", "429 backend", "ok", "ok"]  # one runs, one waits, the sim refuses two
        m = proxy.proxy.metrics
        assert m.backend_refusals[(POOL, "429")] == 2
        assert m.decisions[(POOL, "spot", "admitted")] == 4 and not any(k[2] != "admitted" for k in m.decisions)
        assert m.completions[(POOL, "spot", "backend_refused")] == 2


async def test_eviction_aborts_the_backend_request_and_frees_its_slot(
        start_sim: Callable[..., InferenceSim], kafka_bootstrap: str, topics: Topics, tmp_path: Path) -> None:
    sim = start_sim(max_num_seqs=8, time_to_first_token=0.05, inter_token_latency=0.05)
    async with start_proxy([sim.base_url], kafka_bootstrap, topics, tmp_path) as proxy:
        await apply(proxy, kafka_bootstrap, topics, 1)
        async with client(proxy, "pre") as pre, client(proxy, "gold") as gold:
            streams = [await pre.chat.completions.create(model="fake-model", messages=MESSAGES, max_tokens=400,
                                                         stream=True, extra_body={"ignore_eos": True})
                       for _ in range(3)]
            readers = [asyncio.create_task(_drain(s)) for s in streams]
            await asyncio.sleep(0.5)
            assert metric(scrape(sim.base_url), "vllm:num_requests_running", "fake-model") == 3
            r = await gold.chat.completions.create(model="fake-model", messages=MESSAGES, max_tokens=4)
            assert r.choices[0].message.content
            outcomes = await asyncio.gather(*readers)
        assert sorted(outcomes) == ["evicted", "finished", "finished"]
        await asyncio.sleep(0.3)
        assert metric(scrape(sim.base_url), "vllm:num_requests_running", "fake-model") < 3
        assert proxy.proxy.metrics.evictions[(POOL, "pre")] == 1
        await proxy.drained()
    completed = await read_topic(kafka_bootstrap, topics.completions.name, expect=4)
    assert sorted(c["status"] for c in completed) == ["evicted", "ok", "ok", "ok"]


async def _drain(stream: object) -> str:
    try:
        async for _ in stream:  # type: ignore[attr-defined]
            pass
    except openai.APIError as e:
        return "evicted" if "evicted" in str(e) else f"error {e}"
    return "finished"
