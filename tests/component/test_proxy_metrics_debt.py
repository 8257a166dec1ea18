"""tokenpools_proxy_entitlement_debt: the agents' debt of each entitlement in the limit update in force, which the
underserved-entitlement alert (deploy/prometheus/rules/proxy.yaml) reads; none before the first update and none
again once the TTL put static limits in force (the last update's debt is then no longer news)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.outbox.events import EventPipeline
from tokenpools.proxy.observability.metrics import ProxyMetrics
from tokenpools.proxy.views.gauges import register_gauges
from tokenpools.proxy.admission.pools import PoolRuntime, UpdateResult
from tokenpools.proxy.outbox.spool import Spool
from tokenpools.runtime.clock import FakeClock
from tokenpools_dev.proxy.doubles import limit_update

pytestmark = pytest.mark.component

POOL = PoolSpec("pool-a", "fake-model", Capacity(1000, 1e10, 8))
ENTS = [EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(300, 3e9, 3)),
        EntitlementSpec("spot", "pool-a", ServiceClass.SPOT, 30000)]
TTL_S = 30.0


def debts(metrics: ProxyMetrics) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == "tokenpools_proxy_entitlement_debt":
                out[(s.labels["pool"], s.labels["entitlement"])] = s.value
    return out


def test_debt_follows_the_update_in_force_and_goes_with_the_fallback(tmp_path: Path) -> None:
    clock = FakeClock()
    rt = PoolRuntime(POOL, ENTS, proxy_id="p1", ttl_s=TTL_S, retry_after_s=1, now_s=clock.now_s(),
                     wall_s=clock.wall_ms() / 1000)
    metrics = ProxyMetrics()
    register_gauges(metrics, {"pool-a": rt}, EventPipeline(None, Spool(tmp_path / "spool"), queue_size=10), clock)
    assert debts(metrics) == {}  # static limits at start: no update, no debt

    update = limit_update("pool-a", 1, clock.wall_ms(), {"gold": (3, 300.0, 3e9, 900.0), "spot": (5, 700.0, 7e9, 1.0)}, 8)
    update = update.model_copy(update={"entitlements": tuple(
        e.model_copy(update={"debt": {"gold": 0.62, "spot": -0.25}[e.name]}) for e in update.entitlements)})
    assert rt.apply_update(update, clock.now_s(), clock.wall_ms()) is UpdateResult.APPLIED
    assert debts(metrics) == {("pool-a", "gold"): pytest.approx(0.62), ("pool-a", "spot"): pytest.approx(-0.25)}

    clock.advance(TTL_S + 1)
    assert rt.check_ttl(clock.now_s())  # fell back to static limits
    assert debts(metrics) == {}
