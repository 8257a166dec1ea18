"""A real Prometheus scrapes real inference sims; prometheus-api-client reads what the autoscaler reads.

Pinned: the gauges Prometheus stores equal the sim's own ``/metrics`` at scrape time,
``rate(vllm:generation_tokens_total[5s])`` agrees with the sim's token throughput, a stopped sim
turns ``up`` to 0 and its series go stale at once (an instant query returns nothing, not the last
value), a restarted sim shows up as a counter reset, and hot-reloaded targets add and drop pools.

One Prometheus and one sim per pool (= scrape job) for the whole module: Prometheus 2.42 applies
new targets only on its 5 s discovery/scrape-manager ticks, so every start or reload costs ~3-6 s.
Each test owns its pool, so tests stay independent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import requests
from backend_fixtures import (  # noqa: F401  (fixture imports)
    MetricsRecorder,
    inference_sim_binary,
    metric,
    prometheus_binary,
    scrape,
)
from openai import AsyncOpenAI
from prometheus_api_client import PrometheusConnect

from tokenpools_dev.devstack.inference_sim import InferenceSim
from tokenpools_dev.devstack.prometheus import PrometheusServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

MODEL = "fake-model"
INTERVAL = 1.0  # scrape interval (s)
POOLS = ("pool-gauges", "pool-rate", "pool-stale")
Connect = Callable[[InferenceSim], AsyncOpenAI]


def sel(job: str) -> str:
    return f'{{job="{job}",model_name="{MODEL}"}}'


def new_sim(binary: Path) -> InferenceSim:
    return InferenceSim(
        model=MODEL,
        max_num_seqs=8,
        time_to_first_token=0.05,
        inter_token_latency=0.02,
        enable_kvcache=True,  # else kv_cache_usage_perc is constant 0
        extra_args=["--kv-cache-size=64", "--block-size=8"],
        binary=binary,
    )


@pytest.fixture(scope="module")
def sims(inference_sim_binary: Path) -> Iterator[dict[str, InferenceSim]]:  # noqa: F811
    with ExitStack() as stack:
        yield {pool: stack.enter_context(new_sim(inference_sim_binary)) for pool in POOLS}


@pytest.fixture(scope="module")
def prom(sims: dict[str, InferenceSim], prometheus_binary: Path) -> Iterator[PrometheusServer]:  # noqa: F811
    targets = {pool: [s.host_port] for pool, s in sims.items()}
    with PrometheusServer(targets, scrape_interval=INTERVAL, binary=prometheus_binary) as p:
        t0 = time.monotonic()
        p.wait_for_targets(health="up", timeout=15)
        print(f"prometheus ready in {p.startup_seconds:.2f}s, targets up {time.monotonic() - t0:.2f}s later")
        yield p


@pytest.fixture
def pc(prom: PrometheusServer) -> Iterator[PrometheusConnect]:
    with requests.Session() as session:
        yield PrometheusConnect(url=prom.url, disable_ssl=True, session=session)


@pytest.fixture
async def connect() -> AsyncIterator[Connect]:
    """OpenAI client factory; all closed at teardown (unclosed clients leak sockets)."""
    clients: list[AsyncOpenAI] = []

    def make(sim: InferenceSim) -> AsyncOpenAI:
        clients.append(AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="unused", max_retries=0))
        return clients[-1]

    yield make
    for c in clients:
        await c.close()


async def query(pc: PrometheusConnect, promql: str, at: float | None = None) -> list[dict[str, Any]]:
    """Instant query off the event loop (the client is sync ``requests``)."""
    params = {"time": f"{at:.3f}"} if at is not None else None
    return list(await asyncio.to_thread(pc.custom_query, promql, params))


async def value(pc: PrometheusConnect, promql: str, at: float | None = None) -> float | None:
    """The single series' value, or None when the instant vector is empty."""
    res = await query(pc, promql, at)
    assert len(res) <= 1, res
    return float(res[0]["value"][1]) if res else None


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> float:
    """Poll ``check`` every 100 ms; return the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if await check():
            return time.monotonic() - t0
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {timeout}s: {what}")


async def generate(oai: AsyncOpenAI, prompt: str, tokens: int) -> int:
    r = await oai.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=tokens,
        extra_body={"ignore_eos": True},  # exactly `tokens` tokens: deterministic duration and counts
    )
    assert r.usage is not None
    return r.usage.completion_tokens


async def test_gauges_in_prometheus_match_the_sim(
    sims: dict[str, InferenceSim], pc: PrometheusConnect, connect: Connect
) -> None:
    sim, oai, s = sims["pool-gauges"], connect(sims["pool-gauges"]), sel("pool-gauges")
    assert pc.check_prometheus_connection()
    # 3 requests of 150 tokens at 20 ms/token: ~3 s of steady state (3 running, their KV blocks held)
    load = [
        asyncio.create_task(generate(oai, f"request {i}: " + "lorem ipsum dolor sit amet " * 6, 150))
        for i in range(3)
    ]

    async def sim_running() -> bool:
        return metric(await asyncio.to_thread(scrape, sim.base_url), "vllm:num_requests_running", MODEL) == 3

    await eventually(sim_running, 5, "sim reports 3 running")
    await asyncio.sleep(1.5 * INTERVAL)  # at least one scrape inside the steady state

    own = await asyncio.to_thread(scrape, sim.base_url)
    running = await value(pc, f"vllm:num_requests_running{s}")
    kv = await value(pc, f"vllm:kv_cache_usage_perc{s}")
    waiting = await value(pc, f"vllm:num_requests_waiting{s}")
    age = await value(pc, f"time() - timestamp(vllm:num_requests_running{s})")
    print(f"prometheus: running={running} kv={kv} waiting={waiting} sample age={age}s")
    assert running == metric(own, "vllm:num_requests_running", MODEL) == 3
    assert kv == metric(own, "vllm:kv_cache_usage_perc", MODEL)
    assert kv is not None and 0 < kv < 1
    assert waiting == 0
    assert age is not None and age < INTERVAL + 0.5  # fresh: from the last scrape
    assert sum(await asyncio.gather(*load)) == 450

    async def prom_idle() -> bool:
        return await value(pc, f"vllm:num_requests_running{s}") == 0

    took = await eventually(prom_idle, 3 * INTERVAL, "running back to 0 in Prometheus")
    assert await value(pc, f"vllm:kv_cache_usage_perc{s}") == 0
    print(f"running==0 visible in Prometheus {took:.2f}s after the load finished")


async def test_generation_token_rate_matches_the_sim(
    sims: dict[str, InferenceSim], pc: PrometheusConnect, connect: Connect
) -> None:
    """Steady load: 3 workers, 10-token requests (~0.25 s each) -> roughly 100 tokens/s."""
    sim, oai, s = sims["pool-rate"], connect(sims["pool-rate"]), sel("pool-rate")
    stop = asyncio.Event()
    produced = 0

    async def worker(i: int) -> None:
        nonlocal produced
        while not stop.is_set():
            n = await generate(oai, f"worker {i}", 10)
            produced += n  # not `produced += await ...`: that reads `produced` before the await

    with MetricsRecorder(sim.base_url) as rec:
        workers = [asyncio.create_task(worker(i)) for i in range(3)]
        await asyncio.sleep(7.5)  # > rate window + 2 scrapes
        at = time.time()
        prom_rate = await value(pc, f"rate(vllm:generation_tokens_total{s}[5s])", at)
        raw = await query(pc, f"vllm:generation_tokens_total{s}[5s]", at)  # the stored samples
        stop.set()
        await asyncio.gather(*workers)

    key = f'vllm:generation_tokens_total{{model_name="{MODEL}"}}'
    # 1. every sample Prometheus stored equals what the sim itself reported at that scrape time
    samples = [(float(ts), float(v)) for ts, v in raw[0]["values"]]
    assert len(samples) >= 4, samples
    for ts, v in samples:
        around = rec.values_between(key, ts - 0.25, ts + 0.25)
        assert around and min(around) <= v <= max(around), (ts, v, around)
    # 2. the PromQL rate agrees with the sim's own counter slope over the same 5 s
    before, after = rec.values_between(key, at - 5.1, at - 4.9), rec.values_between(key, at - 0.1, at + 0.1)
    assert before and after
    sim_rate = (after[-1] - before[0]) / 5.0
    print(f"rate: prometheus={prom_rate}/s sim={sim_rate:.1f}/s; produced {produced} tokens; samples={samples}")
    assert prom_rate is not None and sim_rate > 20
    assert prom_rate == pytest.approx(sim_rate, rel=0.25)


async def test_stopped_sim_goes_down_and_its_series_go_stale(
    sims: dict[str, InferenceSim], prom: PrometheusServer, pc: PrometheusConnect, connect: Connect
) -> None:
    sim, s, up = sims["pool-stale"], sel("pool-stale"), 'up{job="pool-stale"}'
    await generate(connect(sim), "hello", 20)

    async def counter_seen() -> bool:
        return await value(pc, f"vllm:generation_tokens_total{s}") == 20

    await eventually(counter_seen, 3 * INTERVAL, "counter scraped")
    assert await value(pc, up) == 1

    sim.stop()
    t0 = time.monotonic()

    async def down() -> bool:
        return await value(pc, up) == 0

    async def stale() -> bool:
        return (
            await value(pc, f"vllm:num_requests_running{s}") is None
            and await value(pc, f"vllm:generation_tokens_total{s}") is None
        )

    t_down = await eventually(down, 3 * INTERVAL, "up == 0")
    # stale markers from the failed scrape, not the 5 min lookback
    await eventually(stale, 3 * INTERVAL, "series stale")
    print(f"after stop: up==0 in {t_down:.2f}s, series gone in {time.monotonic() - t0:.2f}s")
    assert [t["health"] for t in prom.active_targets() if t["labels"]["job"] == "pool-stale"] == ["down"]
    # the last value is still in the TSDB, just not "current"
    assert await value(pc, f"last_over_time(vllm:generation_tokens_total{s}[1m])") == 20

    # back on the same port: up again; the smaller counter after the restart counts as a reset
    sim.restart()
    await generate(connect(sim), "hello again", 5)  # new client: the old one's connections are dead

    async def back() -> bool:
        return await value(pc, f"vllm:generation_tokens_total{s}") == 5

    await eventually(back, 4 * INTERVAL, "series back after restart")
    assert await value(pc, up) == 1
    assert await value(pc, f"resets(vllm:generation_tokens_total{s}[1m])") == 1


async def test_set_targets_hot_reloads_pools(
    inference_sim_binary: Path,  # noqa: F811
    prom: PrometheusServer,
    pc: PrometheusConnect,
) -> None:
    """Adding a pool is a reload; dropping one target of a job marks its series stale within ~2
    intervals; dropping a whole job does NOT (2.42 cancels the job's scrape pool before its
    end-of-run staleness), so its last samples stay visible to instant queries for the 5 min
    lookback. Pool deletion must be handled from the config side, not inferred from vanished series.
    """
    base = prom.targets
    with new_sim(inference_sim_binary) as b1, new_sim(inference_sim_binary) as b2:
        t0 = time.monotonic()
        prom.set_targets({**base, "pool-new": [b1.host_port, b2.host_port]})
        prom.wait_for_targets(health="up", timeout=15)
        print(f"pool-new scraped {time.monotonic() - t0:.2f}s after reload")

        async def new_up() -> bool:
            return await value(pc, 'sum(up{job="pool-new"})') == 2

        await eventually(new_up, 3 * INTERVAL, "both pool-new targets up")
        assert len(await query(pc, f"vllm:num_requests_running{sel('pool-new')}")) == 2
        assert await value(pc, f"vllm:num_requests_running{sel('pool-gauges')}") == 0  # others still scraped

        # drop one target, keep the job: its series get stale markers
        prom.set_targets({**base, "pool-new": [b2.host_port]})
        gone = f'up{{job="pool-new",instance="{b1.host_port}"}}'

        async def b1_stale() -> bool:
            return await value(pc, gone) is None

        took = await eventually(b1_stale, 4 * INTERVAL, "dropped target's series stale")
        print(f"dropped target stale after {took:.2f}s")

        # drop the whole job: no stale markers, the last sample lingers (lookback 5m)
        prom.set_targets(base)
        assert {t["labels"]["job"] for t in prom.active_targets()} == set(base)
        await asyncio.sleep(3 * INTERVAL)
        assert await value(pc, f'up{{job="pool-new",instance="{b2.host_port}"}}') == 1
        assert prom.config_path.read_text().count("job_name") == len(base)
