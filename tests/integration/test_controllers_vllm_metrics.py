"""The controller on real metrics: Prometheus scrapes real vLLM (its CPU build, docs/vllm.md) and the proxy in front of
it, the controller reads both and writes the TokenPool's status on the session's kube-apiserver.

Pinned (issue #29):
- under load through the proxy, the controller's reading comes from vLLM's own series: fresh, source vllm, and
  vLLM's ``num_requests_running`` above 0 in its samples;
- then vLLM's ``/metrics`` stops answering (a hop between Prometheus and vLLM holds every scrape, as a starved API
  server does): the scrape times out, ``up`` is 0 and every ``vllm:*`` series is gone from Prometheus (checked
  there: a reader of vLLM's series alone now sees no load and no ready replica). The controller reads the
  proxies' view instead: stale, source proxies, running their in flight (> 0 but in the instants between a
  response and the next request), ready replicas unknown (not 0, even when the starved vLLM finished nothing over
  the rate window: its requests are in flight), the tokens the proxy settled over the rate window (a request's
  count when it ends: > 0 in some sample whose window holds an end, not in every one); its metrics and the
  TokenPool's ``BackendMetricsFresh`` condition (False, ScrapeFailed) say so. A reading of that phase whose
  proxies' series were missing too (on a starved machine the proxy's own scrape can fail: it shares this test's
  event loop) is source none with the load unknown, never 0; at least half are the proxies';
- answering again, the reading is vLLM's again (the condition True, SeriesCurrent).

vLLM's scrape job has ``vllm_job`` (5 s interval and timeout); the proxy's 2 s. The controller runs
its entitlements and metrics loops only (no Kafka: its records go to a MemoryPublisher; no scaler).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml
from aiohttp import web
from backend_fixtures import prometheus_binary  # noqa: F401
from controllers_fixtures import NS, conditions, create, eventually, get
from kubernetes_asyncio.client.api_client import ApiClient
from openai import AsyncOpenAI

from tokenpools.config import apply_overrides, hash_api_key, load_config_text, load_settings
from tokenpools.controllers.app import ControllerOptions, build_controller
from tokenpools.controllers.kube import KubeMode
from tokenpools.controllers.metrics import ControllerMetrics
from tokenpools.controllers.metrics_loop import MetricsLoop
from tokenpools.controllers.publisher import MemoryPublisher
from tokenpools.controllers.supervisor import LoopStatus, run_loops
from tokenpools.proxy.app import build_app, listening
from tokenpools.proxy.main import proxy_config
from tokenpools.proxy.options import ProxyOptions
from tokenpools.runtime.backoff import Backoff
from tokenpools.topics.records import BackendMetricsSample, MetricsSource, MetricsState
from tokenpools_dev.devstack.prometheus import VLLM_SCRAPE_S, PrometheusServer, ScrapeJob, vllm_job
from tokenpools_dev.devstack.vllm import VLLMServer

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.slow]

POOL = "vllm-metrics"
KEY = "sk-vllm-metrics"
WORKERS, MAX_TOKENS = 6, 1200  # 6 requests in flight all the time, a batch ~4-7 s on this CPU
FRESH_S, STALE_S = 20.0, 20.0  # seconds of load with vLLM's /metrics answering, then not
MIN_STALE_SAMPLES = 5  # the hold lasts until the controller has published this many in its checked window
STALE_AFTER_S = 3 * VLLM_SCRAPE_S
RATE_WINDOW_S = 4 * VLLM_SCRAPE_S
PROXY_JOB = "tokenpools-proxy"
PROXY_SCRAPE_S = 2.0  # the proxy shares this test's event loop with the load and the controller

SPEC = {"model": "tiny-llama", "backendRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm"},
        "scaling": {"minReplicas": 1, "maxReplicas": 1},
        "perReplica": {"tokensPerSecond": 5000, "kvCacheGiB": 1, "concurrency": 8},
        "kvGeometry": {"layers": 2, "kvHeads": 2, "headDim": 32, "bytesPerElement": 2}}


def proxy_file(endpoint: str) -> str:
    """The proxy's file: the pool as the controller sees it in Kubernetes, and one entitlement for the load."""
    pool = {"spec": {**SPEC, "defaults": {"maxTokens": MAX_TOKENS}, "tokenBucketWindowSeconds": 10,
                     "endpoints": [endpoint]}, "kind": "TokenPool", "metadata": {"name": POOL}}
    tenant = {"kind": "TokenEntitlement", "metadata": {"name": "tenant"},
              "spec": {"tenantId": "tenant", "poolRef": {"name": POOL},
                       "qos": {"serviceClass": "guaranteed", "sloTargetMs": 60000},
                       "resources": {"tokensPerSecond": 5000, "kvCacheGiB": 0.5, "concurrency": WORKERS},
                       "apiKeys": [{"sha256": hash_api_key(KEY)}]}}
    return yaml.safe_dump_all([{"apiVersion": "tokenpools.io/v1alpha1", **doc} for doc in (pool, tenant)])


class MetricsGate:
    """vLLM's ``/metrics`` through a hop that can stop answering: while ``holding``, a scrape is accepted and never
    answered, so Prometheus times it out as it does a starved vLLM API server's."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.holding, self.url = upstream, False, ""
        self._session: aiohttp.ClientSession | None = None

    async def _metrics(self, _: web.Request) -> web.Response:
        while self.holding:
            await asyncio.sleep(0.1)  # Prometheus gives up at its timeout and closes: this handler is cancelled
        assert self._session is not None
        async with self._session.get(self.upstream + "/metrics") as r:
            return web.Response(body=await r.read(), headers={"Content-Type": r.headers["Content-Type"]})

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        try:
            yield f"127.0.0.1:{runner.addresses[0][1]}"
        finally:
            await self._session.close()
            await runner.cleanup()


def instant(prom_url: str, promql: str) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(f"{prom_url}/api/v1/query?{query}", timeout=10) as response:
        return list(orjson.loads(response.read())["data"]["result"])


def samples_of(publisher: MemoryPublisher) -> list[BackendMetricsSample]:
    return [r for _, _, r in publisher.records if isinstance(r, BackendMetricsSample)]


def between(samples: list[BackendMetricsSample], start_s: float, end_s: float) -> list[BackendMetricsSample]:
    return [s for s in samples if start_s <= s.t_ms / 1000 <= end_s]


async def test_the_controller_reads_vllms_series_and_the_proxies_view_when_they_go_stale(
        vllm_server: VLLMServer, kube_admin: ApiClient, controllers_cluster: Path,
        prometheus_binary: Path, tmp_path: Path) -> None:  # noqa: F811
    t0 = time.monotonic()
    loaded = load_config_text(proxy_file(vllm_server.base_url), "vllm-metrics.yaml")
    proxy_settings = apply_overrides(load_settings(loaded.settings_values), ["kafka.bootstrap_servers=127.0.0.1:9"])
    proxy_app = build_app(proxy_config(loaded, proxy_settings, time.time()),
                          ProxyOptions.from_settings(proxy_settings, "it-vllm-metrics", spool_dir=tmp_path / "spool",
                                                     kafka_enabled=False))
    gate = MetricsGate(vllm_server.base_url)
    async with gate.running() as gate_address, listening(proxy_app, "127.0.0.1", 0) as proxy_url:
        targets = {POOL: vllm_job([gate_address]),
                   PROXY_JOB: ScrapeJob((proxy_url.removeprefix("http://"),), interval_s=PROXY_SCRAPE_S,
                                        timeout_s=PROXY_SCRAPE_S)}
        with PrometheusServer(targets, scrape_interval=1.0, binary=prometheus_binary) as prom:
            await asyncio.to_thread(prom.wait_for_targets, health="up", timeout=30)
            await create(kube_admin, {"apiVersion": "tokenpools.io/v1alpha1", "kind": "TokenPool",
                                      "metadata": {"name": POOL}, "spec": SPEC})
            settings = load_settings({}, ["kafka.bootstrap_servers=127.0.0.1:9", f"prometheus.url={prom.url}"])
            options = ControllerOptions.from_settings(
                settings, Path("unused.yaml"), KubeMode.KUBECONFIG, kubeconfig=controllers_cluster, namespace=NS,
                resync_s=5.0, metrics_interval_s=1.0, rate_window_s=RATE_WINDOW_S,
                metrics_stale_after_s=STALE_AFTER_S, leader_election=False)
            publisher, metrics = MemoryPublisher(), ControllerMetrics()
            async with build_controller(options, settings, publisher=publisher, controller_metrics=metrics) as ctl:
                statuses: dict[str, LoopStatus] = {}
                loops = {name: ctl.loops[name] for name in ("entitlements", "metrics")}
                runner = asyncio.create_task(run_loops(loops, Backoff(0.2, 2.0), statuses=statuses))
                try:
                    timeline = await _load_then_hold(gate, prom, proxy_url, kube_admin, metrics, ctl.metrics,
                                                      publisher)
                finally:
                    runner.cancel()
                    await asyncio.gather(runner, return_exceptions=True)
    samples = samples_of(publisher)
    t_load, t_hold, t_stop, seen = timeline["load"], timeline["hold"], timeline["stop"], timeline["seen"]
    ends_s: list[float] = timeline["ends_s"]

    fresh = between(samples, t_load + VLLM_SCRAPE_S, t_hold)
    from_vllm = [s for s in fresh if s.source is MetricsSource.VLLM]
    busy = [s for s in from_vllm if s.running is not None and s.running > 0]
    assert busy, [(s.metrics_state.value, s.running) for s in fresh]  # vLLM's own gauge saw the load
    assert all(s.metrics_state is MetricsState.FRESH and s.replicas_ready == 1 for s in from_vllm)
    assert max(s.running or 0 for s in busy) <= WORKERS  # vLLM's own gauge: at most what the proxy let through
    timed_out = [s for s in fresh if s.source is not MetricsSource.VLLM]  # a real scrape that took > 5 s

    # one scrape interval until the first held scrape, its timeout, 2 s of margin
    stale = between(samples, t_hold + VLLM_SCRAPE_S + VLLM_SCRAPE_S + 2, t_stop)
    assert len(stale) >= MIN_STALE_SAMPLES, len(stale)
    for s in stale:
        assert s.metrics_state is MetricsState.STALE and s.replicas_ready != 0, s  # the pool answers: never 0
        if s.source is MetricsSource.PROXIES:
            assert s.running is not None and s.replicas_ready is None and "replicas_ready" in s.stale, s
        else:  # the proxy's own scrape failed too (the test process is starved as well): unknown, still not 0
            assert s.source is MetricsSource.NONE and s.running is None, s
    from_proxies = [s for s in stale if s.source is MetricsSource.PROXIES]
    loaded = [s for s in from_proxies if s.running]
    # the proxy counts a request's tokens when it ends, and a starved vLLM may end none for a whole rate window
    # (nor its series have two scrapes in it: then unknown): a sample whose window holds an end, one proxy scrape
    # from either edge, reads the proxy's tokens in some sample, not necessarily in each
    settled = [s for s in from_proxies if any(s.t_ms / 1000 - RATE_WINDOW_S + PROXY_SCRAPE_S < t
                                              < s.t_ms / 1000 - PROXY_SCRAPE_S for t in ends_s)]
    assert not settled or any((s.generation_tokens_per_s or 0) > 0 for s in settled), [
        (s.t_ms, s.generation_tokens_per_s) for s in from_proxies]
    # the proxies' in flight is a gauge too: a scrape in the instant between a response and the next request
    # (vLLM's starved API server sends the answers together) reads 0, which is the truth at that instant
    assert len(from_proxies) >= len(stale) / 2 and len(loaded) >= 0.75 * len(from_proxies), [
        (s.source.value, s.running) for s in stale]
    assert seen["prometheus_up"] == 0.0 and seen["prometheus_running"] == []  # vLLM's series alone: no load
    print(f"{len(samples)} samples; load {FRESH_S:.0f} s through vLLM's series: {len(from_vllm)} from vLLM "
          f"({len(busy)} with running > 0, max {max(s.running or 0 for s in busy):.0f}), {len(timed_out)} not "
          f"(a real scrape timed out); held {STALE_S:.0f} s: {len(from_proxies)} of {len(stale)} from the proxies, "
          f"{len(loaded)} with running > 0 (max {max(s.running or 0 for s in from_proxies):.0f}), "
          f"{sum((s.generation_tokens_per_s or 0) > 0 for s in settled)} of {len(settled)} whose window held an end "
          f"with the proxy's tokens > 0; fresh again "
          f"{seen['back_s']:.1f} s after the hold ended; {time.monotonic() - t0:.0f} s in all")


async def _load_then_hold(gate: MetricsGate, prom: PrometheusServer, proxy_url: str, kube: ApiClient,
                          metrics: ControllerMetrics, loop: MetricsLoop, publisher: MemoryPublisher) -> dict[str, Any]:
    """Load through the proxy: ``FRESH_S`` with vLLM's /metrics answering, ``STALE_S`` held (longer if the
    controller, starved on a busy machine, has not yet published ``MIN_STALE_SAMPLES`` samples of the hold's
    checked window); then unheld, idle. Checks the status and the controller's metrics on the way; returns when each phase started and what Prometheus
    said during the hold."""
    oai = AsyncOpenAI(base_url=proxy_url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    stop = asyncio.Event()
    seen: dict[str, Any] = {}
    ends_s: list[float] = []  # when each request of the load ended, wall seconds

    async def worker(i: int) -> None:
        # long requests of lengths of their own: vLLM answers /metrics 1.4-2.4 s late while it generates and at
        # once when idle, so short requests that end together are mostly scraped at idle (running 0)
        tokens = MAX_TOKENS - 100 * i
        while not stop.is_set():
            await oai.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": f"w{i} go"}],
                                              max_tokens=tokens, extra_body={"ignore_eos": True})
            ends_s.append(time.time())

    async def condition() -> tuple[str, str, str]:
        c = conditions(await get(kube, "TokenPool", POOL)).get("BackendMetricsFresh", {})
        return c.get("status", ""), c.get("reason", ""), c.get("message", "")

    async def reading_is(source: MetricsSource) -> bool:
        reading = loop.readings.get(POOL)
        return reading is not None and reading.source is source

    async def condition_is(status: str, reason: str, says: str) -> bool:
        got = await condition()
        return got[:2] == (status, reason) and says in got[2]

    async def exported_is(state: MetricsState, source: MetricsSource) -> bool:
        return metrics.readings.get(POOL) == (state, source)

    async def held_enough() -> bool:  # the window the test checks: past the first held scrape's timeout
        start = t_hold + VLLM_SCRAPE_S + VLLM_SCRAPE_S + 2
        return len(between(samples_of(publisher), start, time.time())) >= MIN_STALE_SAMPLES

    fresh = ("True", "SeriesCurrent", "load read from them")
    await eventually(lambda: reading_is(MetricsSource.VLLM), 30, "a first reading from vLLM's series")
    t_load = time.time()
    workers = [asyncio.create_task(worker(i)) for i in range(WORKERS)]
    try:
        await asyncio.sleep(FRESH_S)
        await eventually(lambda: condition_is(*fresh), 10, "BackendMetricsFresh True")
        t_hold = time.time()
        gate.holding = True
        await eventually(lambda: reading_is(MetricsSource.PROXIES), 3 * VLLM_SCRAPE_S, "the proxies' view")
        await eventually(lambda: condition_is("False", "ScrapeFailed", "proxies' view"), 10,
                         "BackendMetricsFresh False, ScrapeFailed, the proxies' view")
        await eventually(lambda: exported_is(MetricsState.STALE, MetricsSource.PROXIES), 10,
                         "tokenpools_controller_metrics_source{source=\"proxies\"} 1")
        await asyncio.sleep(max(0.0, t_hold + STALE_S - time.time()))
        await eventually(held_enough, 90, f"{MIN_STALE_SAMPLES} samples in the hold's checked window")
        up = await asyncio.to_thread(instant, prom.url, f'sum(up{{job="{POOL}"}})')
        seen["prometheus_up"] = float(up[0]["value"][1]) if up else None
        seen["prometheus_running"] = await asyncio.to_thread(
            instant, prom.url, f'vllm:num_requests_running{{job="{POOL}"}}')
        t_stop = time.time()
    finally:
        stop.set()
        ended = await asyncio.gather(*workers, return_exceptions=True)
        await oai.close()
    assert not [e for e in ended if e is not None], ended  # every request of the load was served
    gate.holding = False
    seen["back_s"] = await eventually(lambda: reading_is(MetricsSource.VLLM), 3 * VLLM_SCRAPE_S,
                                      "vLLM's series again")
    await eventually(lambda: condition_is(*fresh), 10, "BackendMetricsFresh True again")
    return {"load": t_load, "hold": t_hold, "stop": t_stop, "seen": seen, "ends_s": ends_s}
