"""metrics loop against the real things: llm-d-inference-sim scraped by a real Prometheus (Debian 2.42), samples
published to the real Kafka broker and read back from the topic.

The controller runs as ``tokenpools controller --no-kubernetes`` would (``build_controller`` with the config file as
the source: the pool named like the Prometheus job). Pinned:
- under load, every sample's gauges (running, waiting, KV usage) equal what Prometheus last scraped from the sim
  before the sample's time (its raw samples: a short dip between two of the test's own /metrics polls is still
  seen by a scrape, so comparing with the test's polling was flaky); token rates agree with the sim's own counters over the rate window;
  TTFT / inter-token / e2e quantiles fall in the histogram buckets the sim's latencies land in;
- a stopped sim turns the next samples stale: every field None and listed in ``stale``, ``replicas_ready`` too
  (no proxy is scraped here, so nothing tells a stopped backend from one too busy to answer its scrape: the
  count is unknown, not 0; the proxies' word that the pool is idle is what makes it 0, a unit test's case).
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from backend_fixtures import MetricsRecorder, inference_sim_binary, prometheus_binary  # noqa: F401
from controllers_fixtures import SMALL_PARTITIONS, create_topics, read_to_end
from openai import AsyncOpenAI

from tokenpools.config import load_settings
from tokenpools.controllers.app import ControllerOptions, build_controller
from tokenpools.controllers.promql import SAMPLE_FIELDS
from tokenpools.controllers.supervisor import run_loops
from tokenpools.runtime.backoff import Backoff
from tokenpools.topics.declarations import topics_for
from tokenpools_dev.devstack.inference_sim import InferenceSim
from tokenpools_dev.devstack.prometheus import PrometheusServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

MODEL = "fake-model"
POOL = "sim-pool"
INTERVAL = 1.0  # Prometheus scrape interval, s
WINDOW = 6.0  # rate window, s
TTFT, ITL, TOKENS = 0.3, 0.05, 30

CONFIG = f"""
apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {{name: {POOL}}}
spec:
  model: {MODEL}
  backendRef: {{name: sim}}
  perReplica: {{tokensPerSecond: 480, kvCacheGiB: 8, concurrency: 4}}
  kvBytesPerToken: 147456
"""


# function-scoped: the test stops its simulator, so a rerun (make test reruns a failure) needs a fresh one
@pytest.fixture
def sim(inference_sim_binary: Path) -> Iterator[InferenceSim]:  # noqa: F811
    with InferenceSim(model=MODEL, max_num_seqs=4, time_to_first_token=TTFT, inter_token_latency=ITL,
                      enable_kvcache=True, extra_args=["--kv-cache-size=256", "--block-size=8"],
                      binary=inference_sim_binary) as s:
        yield s


@pytest.fixture
def prom(sim: InferenceSim, prometheus_binary: Path) -> Iterator[PrometheusServer]:  # noqa: F811
    with PrometheusServer({POOL: [sim.host_port]}, scrape_interval=INTERVAL, binary=prometheus_binary) as p:
        p.wait_for_targets(health="up", timeout=20)
        yield p


async def read_all(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    out = [orjson.loads(m.value) for m in await read_to_end(bootstrap, topic) if m.value is not None]
    return sorted(out, key=lambda r: r["t_ms"])


GAUGES = (("running", "vllm:num_requests_running"), ("waiting", "vllm:num_requests_waiting"),
          ("kv_cache_usage", "vllm:kv_cache_usage_perc"))


def scrapes(prom_url: str, selector: str, at_s: float, span_s: int = 120) -> list[tuple[float, float]]:
    """Every raw (timestamp, value) Prometheus stored for a one-series selector in the ``span_s`` before ``at_s``."""
    query = urllib.parse.urlencode({"query": f"{selector}[{span_s}s]", "time": f"{at_s:.3f}"})
    with urllib.request.urlopen(f"{prom_url}/api/v1/query?{query}", timeout=10) as response:
        result = orjson.loads(response.read())["data"]["result"]
    assert len(result) == 1, (selector, result)
    return [(float(ts), float(v)) for ts, v in result[0]["values"]]


def at_or_before(history: list[tuple[float, dict[str, float]]], key: str, t: float) -> float:
    """The sim's counter at ``t`` (a labelled Go counter is not exposed before its first increment: 0)."""
    assert history and history[0][0] <= t, (key, t)
    values = [s.get(key, 0.0) for ts, s in history if ts <= t]
    return values[-1]


async def test_samples_match_the_backend_and_a_stopped_backend_turns_stale(
        sim: InferenceSim, prom: PrometheusServer, kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = topics_for(f"it-ctl-{uuid.uuid4().hex[:8]}.", partitions=SMALL_PARTITIONS)
    await create_topics(kafka_bootstrap, topics)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    settings = load_settings({}, [f"kafka.bootstrap_servers={kafka_bootstrap}", f"kafka.topic_prefix={topics.specs.name[:-5]}",
                                  f"prometheus.url={prom.url}", "streams.metrics_staleness_s=10"])
    options = ControllerOptions.from_settings(settings, config, None, metrics_interval_s=0.5,
                                              metrics_selector='job="{pool}"', rate_window_s=WINDOW)
    oai = AsyncOpenAI(base_url=sim.base_url + "/v1", api_key="unused", max_retries=0)
    stop = asyncio.Event()

    async def worker(i: int) -> None:  # 6 workers on 4 slots: ~4 running, ~2 waiting, all the time
        while not stop.is_set():
            await oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"w{i} " * 20}],
                                              max_tokens=TOKENS, extra_body={"ignore_eos": True})

    async with build_controller(options, settings) as controller:
        statuses: dict[str, Any] = {}
        runner = asyncio.create_task(run_loops(controller.loops, Backoff(0.1, 1.0), statuses=statuses))
        try:
            with MetricsRecorder(sim.base_url, period=0.05) as rec:
                workers = [asyncio.create_task(worker(i)) for i in range(6)]
                await asyncio.sleep(WINDOW + 6 * INTERVAL)  # a full rate window of steady load, then samples
                loaded_until = time.time()
                stop.set()
                await asyncio.gather(*workers)
            t_stop = time.time()
            await asyncio.to_thread(sim.stop)
            await asyncio.sleep(2.5 * INTERVAL + 1.0)  # a failed scrape, then a sample
        finally:
            runner.cancel()
            await asyncio.gather(runner, return_exceptions=True)
            await oai.close()
    assert controller.metrics.published > 10, statuses

    samples = await read_all(kafka_bootstrap, topics.backend_metrics.name)
    raw = {name: scrapes(prom.url, f'{name}{{job="{POOL}"}}', loaded_until) for _, name in GAUGES}
    for name, series in raw.items():  # every scrape is a value the sim can report (4 slots, 6 clients)
        assert series and all(0 <= v <= (1 if "perc" in name else 6) for _, v in series), (name, series[-5:])
    assert samples and all(s["pool"] == POOL and s["record_type"] == "backend_metrics" for s in samples)
    key = f'{{model_name="{MODEL}"}}'
    steady = [s for s in samples if rec.history[0][0] + WINDOW + 1.5 * INTERVAL <= s["t_ms"] / 1000 <= loaded_until - 0.5]
    assert len(steady) >= 5, f"{len(steady)} samples under steady load"
    seen_waiting = False
    for s in steady:
        t = s["t_ms"] / 1000
        assert s["stale"] == [] and s["replicas_ready"] == 1
        for field, name in GAUGES:
            # what Prometheus scraped from the sim last before the sample's time (the query's evaluation time)
            scraped = [v for ts, v in raw[name] if ts <= t]
            assert scraped and s[field] == scraped[-1], (field, t, s[field], scraped[-3:])
        seen_waiting |= s["waiting"] > 0
        for field, counter in (("generation_tokens_per_s", "vllm:generation_tokens_total"),
                               ("prompt_tokens_per_s", "vllm:prompt_tokens_total")):
            low = (at_or_before(rec.history, counter + key, t - 1.2 * INTERVAL)
                   - at_or_before(rec.history, counter + key, t - WINDOW + 1.2 * INTERVAL)) / WINDOW
            high = (at_or_before(rec.history, counter + key, t)
                    - at_or_before(rec.history, counter + key, t - WINDOW - INTERVAL)) / (WINDOW - 2 * INTERVAL)
            assert 0 < low <= s[field] <= high, (field, t, low, s[field], high)
        assert 0.25 < s["ttft_p99_s"] <= 5.0  # TTFT 0.3 s (+ queueing): its buckets lie above 0.25 s
        assert 0.025 < s["inter_token_latency_p50_s"] <= 0.075  # ITL 0.05 s: bucket (0.025, 0.05] or (0.05, 0.075]
        assert TTFT + TOKENS * ITL * 0.8 < s["e2e_p99_s"] <= 10.0
    assert seen_waiting, "6 workers on 4 slots never showed a waiting queue"

    after = [s for s in samples if s["t_ms"] / 1000 > t_stop + INTERVAL + 0.5]
    assert after, "no sample after the backend stopped"
    for s in after:
        assert (s["metrics_state"], s["source"]) == ("stale", "none"), s
        assert set(s["stale"]) == set(SAMPLE_FIELDS) and all(s[f] is None for f in SAMPLE_FIELDS), s
    print(f"{len(samples)} samples, {len(steady)} under steady load, {len(after)} after the stop (all stale)")
