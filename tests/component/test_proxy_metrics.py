"""/metrics: every family the issue names, label values from closed sets only, values that match what happened.
(The queue's families with requests that wait: test_proxy_queue.py.)"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.waiting import WaitOutcome
from tokenpools.proxy.app import build_app
from tokenpools.topics.records import CompletionStatus
from tokenpools_dev.proxy.doubles import FakeBackend, ProducerHub, offline_options, proxy_config, running

pytestmark = pytest.mark.component

POOL = PoolSpec("pool-a", "fake-model", Capacity(1000, 1e10, 4))
ENTS = [EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(300, 3e9, 2)),
        EntitlementSpec("spot", "pool-a", ServiceClass.SPOT, 30000, queue_timeout_ms=0)]  # refused at once, no wait


async def test_metrics_cover_decisions_tokens_latency_events_and_limits(tmp_path: Path) -> None:
    backend = FakeBackend()
    async with running(backend.app()) as backend_url:
        config = proxy_config({"pool-a": (backend_url,)}, [POOL], ENTS, {"gold": "sk-gold", "spot": "sk-spot"})
        app = build_app(config, offline_options(tmp_path),
                        producer_factory=ProducerHub().factory)
        async with running(app) as url, aiohttp.ClientSession() as s:
            body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
            for key in ("sk-gold", "sk-gold", "sk-unknown-1", "sk-unknown-2"):
                async with s.post(url + "/v1/chat/completions", json={**body, "stream": True},
                                  headers={"Authorization": f"Bearer {key}"}) as r:
                    await r.read()
            async with s.post(url + "/v1/chat/completions", json={**body, "max_tokens": 10**6},
                              headers={"Authorization": "Bearer sk-spot"}) as r:
                assert r.status == 429
            async with s.get(url + "/metrics") as r:
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
                text = await r.text()
    samples = {}
    labels: dict[str, set[str]] = {}
    outcomes: dict[str, set[str]] = {}  # family → its outcome label's values
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
            for k, v in sample.labels.items():
                labels.setdefault(k, set()).add(v)
            if "outcome" in sample.labels:
                outcomes.setdefault(family.name, set()).add(sample.labels["outcome"])
    names = {name for name, _ in samples}
    for expected in ("tokenpools_proxy_decisions_total", "tokenpools_proxy_completions_total",
                     "tokenpools_proxy_tokens_total", "tokenpools_proxy_in_flight", "tokenpools_proxy_ttft_seconds_bucket",
                     "tokenpools_proxy_request_duration_seconds_count", "tokenpools_proxy_decision_seconds_count",
                     "tokenpools_proxy_event_queue_depth", "tokenpools_proxy_event_spool_depth",
                     "tokenpools_proxy_events_total", "tokenpools_proxy_limit", "tokenpools_proxy_limits_age_seconds",
                     "tokenpools_proxy_limits_version", "tokenpools_proxy_limits_static", "tokenpools_proxy_bucket_tokens",
                     "tokenpools_proxy_waiters", "tokenpools_proxy_queue_outcomes_total"):
        assert expected in names, expected
    decided = {dict(k)["entitlement"] + ":" + dict(k)["outcome"]: v for (n, k), v in samples.items()
               if n == "tokenpools_proxy_decisions_total"}
    assert decided == {"gold:admitted": 2, ":unknown_key": 2, "spot:token_budget": 1}
    assert samples[("tokenpools_proxy_tokens_total", (("entitlement", "gold"), ("kind", "completion"),
                                                      ("pool", "pool-a")))] == 8
    # label values only from the config and the closed enums: no keys, ids or free text
    assert labels["entitlement"] <= {"", "gold", "spot"} and labels["pool"] <= {"", "pool-a"}
    assert outcomes.pop("tokenpools_proxy_decisions") <= {o.value for o in AdmissionOutcome}
    assert outcomes.pop("tokenpools_proxy_queue_outcomes") == {o.value for o in WaitOutcome}
    assert not outcomes, outcomes  # (no other family has an outcome yet: nothing waited)
    assert labels.get("status", set()) <= {s.value for s in CompletionStatus}
    assert not any("sk-" in v for values in labels.values() for v in values)
