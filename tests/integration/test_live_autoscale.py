"""What the paper never ran, live: a preemptible tenant evicted for a guaranteed one, and a pool that scales out.

The stack runs with the local kube-apiserver: the scaler patches the pool's Deployment ``/scale``, the stack starts
one more llm-d-inference-sim per added replica (joining the pool's Service and the Prometheus targets), the
controller reports the replicas that are up, the agents' capacity and limits grow, and admission follows.

The simulators get 2 spare sequences (``StackOptions.sim_spare_seqs``): llm-d-inference-sim 0.10.2 keeps generating
an evicted stream until its end (vLLM aborts it when the connection closes), so without them the request admitted
in its place would queue in the simulator behind the zombie.

Pool: up to 3 replicas of 4 slots, compressed 4×. Timeline (experiment s; the first guaranteed request is sent at
14 s or later, once the proxy reports all 4 slots held: the preemptible load refills a freed slot only after a
Poisson gap, so at a fixed instant the pool was full in only about 9 runs of 10, and the eviction never happened):
- 0–2: guaranteed-prod and elastic-team (1-slot baselines) send two short requests each, then go idle: their
  baselines are measured idle and lent (``policy.lend_idle_protected: true``; off by default);
- 2–40: preemptible-eval wants ≈ 17 slots and is lent all 4; guaranteed-prod arrives at 14 s into the full pool and
  is admitted at once by evicting a preemptible request in flight; its baseline is then reserved again, so its
  later requests (22, 30, 38 s) find their slot free;
- 40–100: elastic-team asks for ≈ 10 slots (burst ceiling 12): the scaler goes 1 → 3 replicas.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

import pytest

from tokenpools.config import hash_api_key
from tokenpools.replay.load import Arrival, Lengths, LoadSpec, RetryPolicy, poisson_arrivals
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.records import LimitUpdate, RequestCompleted, RequestDecided, ScaleCommand
from tokenpools_dev.devstack import kube_objects as ko
from tokenpools_dev.devstack.stack.config import StackOptions
from tokenpools_dev.devstack.stack.lifecycle import Stack
from tokenpools_dev.live.observe import TopicRecorder, query_range
from tokenpools_dev.live.report import proxy_concurrency
from tokenpools_dev.live.runner import PassRecord
from tokenpools_dev.loadgen.client import LoadGenerator, LoadOptions

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TIME_SCALE = 0.25
PROD_AT = (14.0, 22.0, 30.0, 38.0)  # guaranteed-prod arrives into a pool full of preemptible requests
DURATION_S = 100.0
KEYS = {"guaranteed-prod": "sk-it-auto-prod", "elastic-team": "sk-it-auto-team", "preemptible-eval": "sk-it-auto-eval"}
CONFIG = """
apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {{name: auto, namespace: tokenpools}}
spec:
  model: fake-model
  backendRef: {{apiVersion: apps/v1, kind: Deployment, name: auto-vllm, namespace: tokenpools}}
  scaling: {{minReplicas: 1, maxReplicas: 3, replicas: 1}}
  perReplica: {{tokensPerSecond: 240, kvCacheGiB: 32, concurrency: 4}}
  kvGeometry: {{layers: 36, kvHeads: 8, headDim: 128, bytesPerElement: 2}}
  defaults: {{maxTokens: 64}}
  tokenBucketWindowSeconds: 10
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: guaranteed-prod, namespace: tokenpools}}
spec:
  tenantId: prod
  poolRef: {{name: auto}}
  qos: {{serviceClass: guaranteed, sloTargetMs: 1000}}
  resources: {{tokensPerSecond: 30, kvCacheGiB: 1, concurrency: 1}}
  apiKeys: [{{sha256: {guaranteed_prod}}}]
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: elastic-team, namespace: tokenpools}}
spec:
  tenantId: team
  poolRef: {{name: auto}}
  qos: {{serviceClass: elastic, sloTargetMs: 5000}}
  resources: {{tokensPerSecond: 30, kvCacheGiB: 1, concurrency: 1}}
  burstCeiling: {{tokensPerSecond: 360, kvCacheGiB: 24, concurrency: 12}}
  apiKeys: [{{sha256: {elastic_team}}}]
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: preemptible-eval, namespace: tokenpools}}
spec:
  tenantId: eval
  poolRef: {{name: auto}}
  qos: {{serviceClass: preemptible, sloTargetMs: 60000}}
  apiKeys: [{{sha256: {preemptible_eval}}}]
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenPoolsSettings
spec:
  policy: {{lend_idle_protected: true}}   # guaranteed-prod's idle slot is lent, and taken back by eviction
  scaling: {{target_utilization: 0.8, cooldown_s: 5, scale_down_stabilization_s: 300, include_spot: false}}
"""


def schedule() -> list[Arrival]:
    # guaranteed-prod and elastic-team send a little at first, so their idle baselines are measured and lent
    arrivals = [Arrival(t, n, f"{n}-warm-{i}", 64, None, 16) for i, t in enumerate((0.5, 1.5))
                for n in ("guaranteed-prod", "elastic-team")]
    # preemptible-eval wants ≈ 17 slots of 64/128-token requests: it holds every slot it is lent
    eval_load = LoadSpec("preemptible-eval", 2.0, Lengths(64, 64), Lengths(128, 128), start_s=2.0, end_s=40.0)
    arrivals += [Arrival(t, "guaranteed-prod", f"prod-{i}", 64, None, 64) for i, t in enumerate(PROD_AT) if i]
    team = LoadSpec("elastic-team", 10 / 4.3, Lengths(64, 64), Lengths(64, 64), start_s=40.0, end_s=DURATION_S)
    return sorted(arrivals + poisson_arrivals([eval_load, team], DURATION_S, seed=7), key=lambda a: a.t_s)


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("autoscale") / "auto.yaml"
    path.write_text(CONFIG.format(**{n.replace("-", "_"): hash_api_key(k) for n, k in KEYS.items()}))
    return path


def test_preemptible_evicted_for_guaranteed_and_pool_scales_out(config_file: Path, tmp_path: Path) -> None:
    options = StackOptions(config=config_file, run_dir=tmp_path / "stack", kubernetes=True, time_scale=TIME_SCALE,
                           background_nice=5, sim_spare_seqs=2)
    with Stack(options) as stack:
        assert len(stack.pool("auto").replicas) == 1
        records, load, generator = asyncio.run(_run(stack))
        api = stack.kube_api
        assert api is not None
        desired = ko.desired_replicas(api, "tokenpools", "auto-vllm")
        sims = len(stack.pool("auto").replicas)
        members = stack.pool("auto").members()
        now = time.time()
        up = query_range(stack.prometheus_url, 'sum(up{job="auto"})', now - 5, now, 1.0)
    assert generator.failures == 0

    # preemption: every guaranteed request got in at once; one that found the pool full evicted a preemptible one
    prod = [c for c in load.completions if c.request_id.startswith("prod-")]
    refused = [a for a in load.attempts if a.request_id.startswith("prod-") and a.outcome != "admitted"]
    assert len(prod) == len(PROD_AT) and all(c.status == "ok" for c in prod) and not refused
    assert max(c.ttft_s or 99 for c in prod) < 2.0
    evicted = [c for c in load.completions if c.entitlement == "preemptible-eval" and c.status == "evicted"]
    proxy_evicted = [c for c in records["completions"] if c.entitlement == "preemptible-eval" and c.status == "evicted"]
    assert evicted and len(proxy_evicted) == len(evicted)
    # each eviction is the moment a guaranteed request was admitted into the full pool
    assert all(min(abs(e.t_s - c.admitted_s) for c in prod) < 0.5 for e in evicted), (evicted, prod)

    # scale-out: the scaler asked for 3, the Deployment says 3, three simulators serve behind the Service
    assert max(c.desired_replicas for c in records["scale"]) == 3
    assert desired == 3 and sims == 3 and len(members) == 3
    assert up and up[-1][1] == 3
    # capacity grew in the agents' view, and admission followed: more in flight than one replica could hold
    capacity = [u.capacity_concurrency for u in records["limits"]]
    assert capacity[0] == 4 and max(capacity) == 12, capacity
    fleet = proxy_concurrency(PassRecord("token-pools", load, [], {
        "requests": records["requests"], "completions": records["completions"], "limits": records["limits"]}))
    assert fleet["elastic-team"]["max_admitted_in_flight"] > 4, fleet
    assert fleet["elastic-team"]["limit"] >= 8, fleet


async def _run(stack: Stack) -> tuple[dict[str, list], object, LoadGenerator]:
    topics = topics_for("tokenpools.")
    recorder = TopicRecorder(stack.kafka_bootstrap, [(topics.limits, LimitUpdate), (topics.scale, ScaleCommand),
                                                     (topics.requests, RequestDecided),
                                                     (topics.completions, RequestCompleted)])
    await recorder.start()
    generator = LoadGenerator(stack.proxy_urls, LoadOptions(model="fake-model", keys=KEYS, time_scale=TIME_SCALE,
                                                            retry=RetryPolicy(5, 0.1), duration_s=DURATION_S, seed=7))
    try:
        first_prod = asyncio.create_task(_prod_into_a_full_pool(stack.proxy_urls[0], generator))
        load = await generator.run(schedule())
        await first_prod
    finally:
        await generator.close()
    await recorder.stop(settle_s=1.0)
    return {k.removeprefix("tokenpools."): v for k, v in recorder.records.items()}, load, generator


async def _prod_into_a_full_pool(proxy_url: str, generator: LoadGenerator, pool_slots: int = 4) -> None:
    """prod-0 at PROD_AT[0] or later, at the first moment the proxy reports every slot of the pool held."""
    await asyncio.sleep(max(0.0, (PROD_AT[0] - generator.now_s()) * TIME_SCALE))
    deadline_s = PROD_AT[0] + 8.0
    while _held(await asyncio.to_thread(_metrics, proxy_url)) < pool_slots:
        assert generator.now_s() < deadline_s, "the preemptible load never filled the pool: the test's premise"
        await asyncio.sleep(0.005)
    await generator.send(Arrival(generator.now_s(), "guaranteed-prod", "prod-0", 64, None, 64))


def _metrics(proxy_url: str) -> str:
    with urllib.request.urlopen(proxy_url.rstrip("/") + "/metrics", timeout=2.0) as response:
        return response.read().decode()


def _held(text: str) -> int:
    """Requests in flight in pool "auto" at the proxy, from its ``tokenpools_proxy_in_flight`` gauge."""
    return sum(round(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("tokenpools_proxy_in_flight{") and 'pool="auto"' in line)
