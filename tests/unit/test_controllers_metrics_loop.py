"""The metrics loop around ``reading.read_pool`` (no services): what it publishes, and how it says where a pool's load
came from — one log line per change, ``tokenpools_controller_metrics_state`` / ``_source``, a poke for the status,
and the TokenPool's ``BackendMetricsFresh`` condition."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenpools.controllers.inventory import Inventory, PoolEntry, ScaleTarget
from tokenpools.controllers.metrics import ControllerMetrics
from tokenpools.controllers.metrics_loop import MetricsLoop, MetricsOptions
from tokenpools.controllers.promql import PROXY_IN_FLIGHT, PROXY_SERVED, SCRAPE_AGE, QueryConfig
from tokenpools.controllers.publisher import MemoryPublisher
from tokenpools.controllers.reconcile import POOL, Reason, Verdict
from tokenpools.controllers.status import pool_status
from tokenpools.core.capacity import Capacity
from tokenpools.core.spec import PoolSpec
from tokenpools.runtime.clock import FakeClock
from tokenpools.topics.records import BackendMetricsSample, MetricsSource

SPEC = PoolSpec(name="p", model="m", per_replica=Capacity(480, 8 * 2**30, 8))
FRESH = {"replicas_ready": 1, "targets": 1, SCRAPE_AGE: 1.0, "running": 3, "waiting": 0, "vllm_finished": 9}
FAILED = {"replicas_ready": 0, "targets": 1, SCRAPE_AGE: 1.0, PROXY_IN_FLIGHT: 4, PROXY_SERVED: 6}


class Scripted:
    """A querier answering each query with the next of its answers (the last one again when they run out)."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        self.answers, self.asked = list(answers), 0

    async def query(self, promql: str, at_s: float) -> Sequence[Mapping[str, Any]]:
        values = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        return [{"metric": {"tp_field": k}, "value": [at_s, str(v)]} for k, v in values.items()]


def loop_of(querier: Scripted, metrics: ControllerMetrics, pokes: list[int]) -> tuple[MetricsLoop, MemoryPublisher]:
    inventory = Inventory()
    inventory.replace({"p": PoolEntry(SPEC, "ns", ScaleTarget("apps/v1", "Deployment", "d", "ns"), 1)})
    publisher = MemoryPublisher()
    loop = MetricsLoop(inventory, querier, publisher, "t.backend-metrics",
                       MetricsOptions(1.0, QueryConfig(stale_after_s=15)), FakeClock(),
                       observed=metrics.set_readings, changed=lambda: pokes.append(1))
    return loop, publisher


def exported(metrics: ControllerMetrics) -> dict[str, str]:
    """name → the label value in force (1) for pool p."""
    out = {}
    for family in text_string_to_metric_families(metrics.render()[0].decode()):
        for s in family.samples:
            if s.name in ("tokenpools_controller_metrics_state", "tokenpools_controller_metrics_source") and s.value:
                out[s.name.rsplit("_", 1)[1]] = s.labels.get("state") or s.labels["source"]
    return out


async def test_the_loop_publishes_the_reading_and_says_once_where_the_load_came_from(
        caplog: pytest.LogCaptureFixture) -> None:
    metrics, pokes = ControllerMetrics(), []
    loop, publisher = loop_of(Scripted(FRESH, FRESH, FAILED, FAILED, FRESH), metrics, pokes)
    caplog.set_level(logging.INFO, "tokenpools.controllers.metrics")
    for _ in range(5):
        await loop.run_once()
    samples = [r for _, _, r in publisher.records]
    assert all(isinstance(s, BackendMetricsSample) for s in samples)
    assert [s.source for s in samples] == [MetricsSource.VLLM] * 2 + [MetricsSource.PROXIES] * 2 + [MetricsSource.VLLM]
    assert [s.running for s in samples] == [3.0, 3.0, 4.0, 4.0, 3.0]  # the proxies' 4 in flight, not vLLM's nothing
    assert len(pokes) == 3  # the first reading, the fall-back, the way back: not every round

    changes = [r.getMessage() for r in caplog.records if "source" in r.getMessage()]
    assert len(changes) == 3, changes  # one line per change (the second stale round is throttled)
    assert "proxies' view" in changes[1] and "stale, source proxies; running 4.0" in changes[1]
    assert caplog.records[1].levelno == logging.WARNING and caplog.records[-1].levelno == logging.INFO
    assert exported(metrics) == {"state": "fresh", "source": "vllm"}

    metrics.set_readings({})  # a standby exports none
    assert exported(metrics) == {}


async def test_the_exported_gauges_are_one_hot_per_pool() -> None:
    metrics, pokes = ControllerMetrics(), []
    loop, _ = loop_of(Scripted(FAILED), metrics, pokes)
    await loop.run_once()
    assert exported(metrics) == {"state": "stale", "source": "proxies"}
    families = {f.name: f for f in text_string_to_metric_families(metrics.render()[0].decode())}
    assert len(families["tokenpools_controller_metrics_state"].samples) == 3  # fresh, stale, frozen
    assert len(families["tokenpools_controller_metrics_source"].samples) == 3  # vllm, proxies, none


async def test_a_pools_status_says_where_its_load_is_read_from() -> None:
    metrics, pokes = ControllerMetrics(), []
    loop, _ = loop_of(Scripted(FAILED, FRESH), metrics, pokes)
    verdict = Verdict(POOL, "p", "p", 3, Reason.VALID, "valid")
    assert [c["type"] for c in pool_status(verdict, None, None, 1e9)["conditions"]] == ["Ready", "CapacityAvailable"]

    stale = (await loop.run_once())[0]
    status = pool_status(verdict, None, None, 1e9, stale)
    condition = status["conditions"][-1]
    assert (condition["type"], condition["status"], condition["reason"]) == ("BackendMetricsFresh", "False",
                                                                              "ScrapeFailed")
    assert "proxies' view" in condition["message"]
    assert pool_status(verdict, None, status, 2e9, stale) == status  # the same reading rewrites nothing

    fresh = (await loop.run_once())[0]
    back = pool_status(verdict, None, status, 2e9, fresh)["conditions"][-1]
    assert (back["status"], back["reason"]) == ("True", "SeriesCurrent") and back["lastTransitionTime"] != condition[
        "lastTransitionTime"]
