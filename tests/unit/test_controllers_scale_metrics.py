"""tokenpools_controller_scale_commands_total: the scaler counts every command it handles by pool and what became of
it (its decision's outcome, failed, unknown_pool), so a scaler that cannot patch a pool's workload is seen, not only
logged (the TokenPoolsScaleCommandsFailing alert reads it). A replica that stopped leading is no failure."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenpools.controllers.inventory import Inventory, PoolEntry, ScaleTarget
from tokenpools.controllers.leader import NotLeading
from tokenpools.controllers.metrics import ControllerMetrics
from tokenpools.controllers.scaler_loop import Scaler, ScalerOptions
from tokenpools.controllers.scaler_policy import CommandFailure, ScaleOutcome
from tokenpools.core.capacity import Capacity
from tokenpools.core.scaling import ScalingConfig
from tokenpools.core.spec import PoolSpec
from tokenpools.errors import PermanentError, RetryableError
from tokenpools.runtime.clock import FakeClock
from tokenpools.topics.records import ScaleCommand

POOL = PoolSpec("p", "m", Capacity(480.0, 8 * 2**30, 16.0), min_replicas=1, max_replicas=5, replicas=1)
T0_S = 1_800_000_000.0


class Workload:
    """A pool's workload behind the ``/scale`` subresource; ``fail`` is raised by every read."""

    def __init__(self) -> None:
        self.replicas = 1
        self.fail: Exception | None = None

    async def get_replicas(self, target: ScaleTarget) -> int:
        if self.fail is not None:
            raise self.fail
        return self.replicas

    async def set_replicas(self, target: ScaleTarget, replicas: int) -> int:
        self.replicas = replicas
        return replicas


def command(pool: str, desired: int, version: int) -> ScaleCommand:
    return ScaleCommand(pool=pool, version=version, t_ms=int(T0_S * 1000) + version, desired_replicas=desired,
                        current_replicas=1, floor_replicas=0, reason="demand")


def counts(metrics: ControllerMetrics) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render()[0].decode()):
        for s in family.samples:
            if s.name == "tokenpools_controller_scale_commands_total":
                out[(s.labels["pool"], s.labels["outcome"])] = s.value
    return out


async def test_every_command_is_counted_by_what_became_of_it() -> None:
    inventory = Inventory()
    inventory.replace({"p": PoolEntry(POOL, "ns", ScaleTarget("apps/v1", "Deployment", "d", "ns"), floor_replicas=0)})
    workload, metrics = Workload(), ControllerMetrics()
    scaler = Scaler(inventory, workload, None, ScalerOptions(ScalingConfig(), 30.0, dry_run=False),  # type: ignore[arg-type]
                    clock=FakeClock(wall_ms=round(T0_S * 1000)), counted=metrics.count_scale_command)

    assert (await scaler.handle(command("p", 3, 1))).outcome is ScaleOutcome.SCALED_UP  # type: ignore[union-attr]
    assert (await scaler.handle(command("p", 3, 2))).outcome is ScaleOutcome.UNCHANGED  # type: ignore[union-attr]
    assert await scaler.handle(command("nope", 2, 3)) is None
    workload.fail = PermanentError("403 forbidden")
    assert await scaler.handle(command("p", 4, 4)) is None  # dropped
    workload.fail = RetryableError("api server unavailable", 1.0)
    with pytest.raises(RetryableError):
        await scaler.handle(command("p", 4, 5))  # the loop restarts and the next command retries
    workload.fail = NotLeading("not the leader any more", 1.0)
    with pytest.raises(NotLeading):
        await scaler.handle(command("p", 4, 6))

    assert counts(metrics) == {("p", ScaleOutcome.SCALED_UP.value): 1, ("p", ScaleOutcome.UNCHANGED.value): 1,
                               ("nope", CommandFailure.UNKNOWN_POOL.value): 1, ("p", CommandFailure.FAILED.value): 2}
