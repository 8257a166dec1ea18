"""tokenpools_controller_entitlement_state: after each evaluation the reconciler leaves every entitlement's state in
the controller's metrics, exported as 1 for the state in force and 0 for the others (what the
TokenPoolsEntitlementNotBound alert reads); cleared, nothing is exported (a standby leaves it to the leader)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tokenpools.controllers.entitlements_loop import FileSource, Reconciler
from tokenpools.controllers.inventory import Inventory
from tokenpools.controllers.metrics import ControllerMetrics
from tokenpools.controllers.publisher import MemoryPublisher
from tokenpools.controllers.specs import SpecPublisher
from tokenpools.core.classes import EntitlementState
from tokenpools.runtime.clock import FakeClock

ROOT = Path(__file__).resolve().parents[2]


def exported(metrics: ControllerMetrics) -> dict[tuple[str, str, str], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render()[0].decode()):
        for s in family.samples:
            if s.name == "tokenpools_controller_entitlement_state":
                out[(s.labels["pool"], s.labels["entitlement"], s.labels["state"])] = s.value
    return out


def in_force(metrics: ControllerMetrics) -> dict[str, str]:
    return {name: state for (_, name, state), v in exported(metrics).items() if v == 1}


async def test_the_states_of_the_last_evaluation_are_exported_one_hot(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    text = (ROOT / "examples/exp1.yaml").read_text()
    config.write_text(text)
    clock, metrics = FakeClock(wall_ms=1_800_000_000_000), ControllerMetrics()
    reconciler = Reconciler(Inventory(), SpecPublisher(MemoryPublisher(), "t.specs", clock), "default", clock=clock,
                            observed=metrics.set_entitlement_states)
    source = FileSource(config, reconciler)
    assert exported(metrics) == {}  # nothing evaluated yet

    assert source.load()
    reconciler.evaluate(source.objects)
    assert in_force(metrics) == {"guaranteed-a": "Bound", "spot-b": "Bound", "guaranteed-c": "Bound"}
    samples = exported(metrics)
    assert len(samples) == 3 * len(EntitlementState)  # every state of every entitlement, so != 1 reads as "not"
    assert {pool for pool, _, _ in samples} == {"qwen3-8b"}  # labelled with the entitlement's pool

    # 6 + 6 + 11 > 16 slots: the newest guaranteed baseline no longer fits
    c_key = "  apiKeys:\n    - sha256: f60c"
    config.write_text(text.replace("concurrency: 6}\n" + c_key, "concurrency: 11}\n" + c_key))
    assert source.load()
    reconciler.evaluate(source.objects)
    assert in_force(metrics)["guaranteed-c"] == EntitlementState.DEGRADED.value

    metrics.set_entitlement_states({})
    assert exported(metrics) == {}
