"""Scaler decisions (tokenpools.controllers.scaler_policy) and the Scaler shell with a fake scale client."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.controllers.inventory import Inventory, PoolEntry, ScaleTarget
from tokenpools.controllers.scaler_loop import Scaler, ScalerOptions, newest_per_pool
from tokenpools.controllers.scaler_policy import PoolScaleState, ScaleOutcome, decide
from tokenpools.core.capacity import Capacity
from tokenpools.core.scaling import ScalingConfig
from tokenpools.core.spec import PoolSpec
from tokenpools.errors import PermanentError
from tokenpools.runtime.clock import FakeClock
from tokenpools.topics.records import ScaleCommand

POOL = PoolSpec("p", "m", Capacity(480.0, 8 * 2**30, 16.0), min_replicas=1, max_replicas=5, replicas=1)
CONFIG = ScalingConfig(scale_down_stabilization_s=10.0, cooldown_s=3.0)
T0 = 1_800_000_000.0


def cmd(desired: int, t_s: float, floor: int = 0, version: int | None = None) -> ScaleCommand:
    return ScaleCommand(pool="p", version=int(t_s * 1000) if version is None else version, t_ms=int(t_s * 1000),
                        desired_replicas=desired, current_replicas=0, floor_replicas=floor, reason="demand")


class Sim:
    """Feeds commands through decide() and 'applies' each change, like the shell after a successful patch."""

    def __init__(self, replicas: int = 1, local_floor: int = 0) -> None:
        self.replicas, self.local_floor, self.state = replicas, local_floor, PoolScaleState()

    def step(self, desired: int, t_s: float, floor: int = 0) -> ScaleOutcome:
        self.state, decision = decide(self.state, cmd(desired, t_s, floor), POOL, self.replicas, self.local_floor,
                                      t_s, CONFIG, max_age_s=30.0)
        self.replicas = decision.replicas
        return decision.outcome


def test_scale_up_is_immediate_and_clamped_to_max() -> None:
    sim = Sim()
    assert sim.step(3, T0) is ScaleOutcome.SCALED_UP and sim.replicas == 3
    assert sim.step(9, T0 + 4) is ScaleOutcome.SCALED_UP and sim.replicas == 5  # maxReplicas


def test_scale_down_waits_for_the_stabilisation_window() -> None:
    sim = Sim(replicas=1)
    sim.step(4, T0)
    for dt in (4, 6, 8):  # within 10 s of the wish for 4: held
        assert sim.step(1, T0 + dt) is ScaleOutcome.HELD_STABILIZATION and sim.replicas == 4
    assert sim.step(1, T0 + 10.5) is ScaleOutcome.SCALED_DOWN and sim.replicas == 1


def test_cooldown_holds_any_change_right_after_one() -> None:
    sim = Sim()
    sim.step(2, T0)
    assert sim.step(4, T0 + 1) is ScaleOutcome.HELD_COOLDOWN and sim.replicas == 2
    assert sim.step(4, T0 + 3.1) is ScaleOutcome.SCALED_UP and sim.replicas == 4


def test_never_below_the_protected_floor_nor_min() -> None:
    sim = Sim(replicas=4)
    assert sim.step(0, T0, floor=3) is ScaleOutcome.HELD_STABILIZATION  # fresh stabiliser: window first
    assert sim.step(0, T0 + 11, floor=3) is ScaleOutcome.SCALED_DOWN and sim.replicas == 3
    assert sim.step(0, T0 + 30, floor=0) is ScaleOutcome.SCALED_DOWN and sim.replicas == 1  # minReplicas
    local = Sim(replicas=1, local_floor=2)  # the controller's own Bound baselines, even if the command says 0
    assert local.step(1, T0, floor=0) is ScaleOutcome.SCALED_UP and local.replicas == 2


def test_reaching_the_floor_ignores_cooldown() -> None:
    sim = Sim()
    sim.step(2, T0)
    assert sim.step(2, T0 + 1, floor=4) is ScaleOutcome.SCALED_UP and sim.replicas == 4


def test_a_workload_outside_the_bounds_is_brought_inside_at_once() -> None:
    sim = Sim(replicas=9)
    assert sim.step(2, T0) is ScaleOutcome.SCALED_DOWN and sim.replicas == 5


def test_replays_and_old_commands_are_ignored() -> None:
    state, first = decide(PoolScaleState(), cmd(3, T0), POOL, 1, 0, T0, CONFIG, 30.0)
    assert first.outcome is ScaleOutcome.SCALED_UP
    same, replay = decide(state, cmd(1, T0), POOL, 3, 0, T0 + 20, CONFIG, 30.0)
    assert replay.outcome is ScaleOutcome.IGNORED_REPLAY and same == state
    _, old = decide(state, cmd(5, T0 + 1), POOL, 3, 0, T0 + 40, CONFIG, 30.0)
    assert old.outcome is ScaleOutcome.IGNORED_TOO_OLD and old.replicas == 3


def test_a_hand_scaled_workload_is_taken_as_it_is_then_brought_back_like_an_hpa_would() -> None:
    state, _ = decide(PoolScaleState(), cmd(2, T0), POOL, 1, 0, T0, CONFIG, 30.0)
    _, held = decide(state, cmd(2, T0 + 1), POOL, 4, 0, T0 + 1, CONFIG, 30.0)  # someone made it 4 (in cooldown)
    assert (held.current, held.replicas, held.outcome) == (4, 4, ScaleOutcome.HELD_COOLDOWN)
    _, back = decide(state, cmd(2, T0 + 5), POOL, 4, 0, T0 + 5, CONFIG, 30.0)
    assert (back.current, back.replicas, back.outcome) == (4, 2, ScaleOutcome.SCALED_DOWN)  # the window's highest wish


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.integers(0, 7), st.floats(0.1, 20.0)), min_size=1, max_size=30),
       st.integers(0, 9), st.integers(0, 5))
def test_invariant_result_always_within_bounds_and_at_or_above_the_floor(
        steps: list[tuple[int, int, float]], start: int, local_floor: int) -> None:
    sim, t = Sim(replicas=start, local_floor=local_floor), T0
    for desired, floor, dt in steps:
        t += dt
        sim.step(desired, t, floor)
        assert POOL.min_replicas <= sim.replicas <= POOL.max_replicas
        assert sim.replicas >= min(POOL.max_replicas, max(floor, local_floor))


def test_newest_command_per_pool_wins_a_batch() -> None:
    a1, a2 = cmd(1, T0, version=1), cmd(2, T0, version=2)
    b = ScaleCommand(pool="q", version=1, t_ms=0, desired_replicas=1, current_replicas=1, floor_replicas=0)
    assert sorted(newest_per_pool([a2, b, a1]), key=lambda c: c.pool) == [a2, b]


# ---- the shell -------------------------------------------------------------------------------------------------

class FakeScale:
    def __init__(self, replicas: int = 1, fail: Exception | None = None) -> None:
        self.replicas, self.fail, self.patches = replicas, fail, []  # type: ignore[var-annotated]

    async def get_replicas(self, target: ScaleTarget) -> int:
        if self.fail:
            raise self.fail
        return self.replicas

    async def set_replicas(self, target: ScaleTarget, replicas: int) -> int:
        self.patches.append(replicas)
        self.replicas = replicas
        return replicas


class FakeEvents:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    async def record(self, involved: dict[str, str], reason: str, message: str, now: str, warning: bool = False) -> None:
        self.events.append((reason, message))


def scaler(scale: Any, dry_run: bool = False, events: FakeEvents | None = None, clock_s: float = T0) -> Scaler:
    inventory = Inventory()
    inventory.replace({"p": PoolEntry(POOL, "ns", ScaleTarget("apps/v1", "Deployment", "d", "ns"), floor_replicas=0)})
    return Scaler(inventory, scale, events, ScalerOptions(CONFIG, 30.0, dry_run),
                  clock=FakeClock(wall_ms=round(clock_s * 1000)))


async def test_every_change_is_patched_and_recorded_as_an_event() -> None:
    scale, events = FakeScale(), FakeEvents()
    s = scaler(scale, events=events)
    decision = await s.handle(cmd(3, T0))
    assert decision is not None and decision.outcome is ScaleOutcome.SCALED_UP
    assert scale.patches == [3] and events.events[0][0] == "ScaledUp" and "1 → 3 replicas" in events.events[0][1]
    assert (await s.handle(cmd(3, T0 + 0.001))).outcome is ScaleOutcome.UNCHANGED  # type: ignore[union-attr]
    assert scale.patches == [3] and len(events.events) == 1


async def test_dry_run_decides_but_never_patches() -> None:
    scale, events = FakeScale(), FakeEvents()
    s = scaler(scale, dry_run=True, events=events)
    assert (await s.handle(cmd(4, T0))).outcome is ScaleOutcome.SCALED_UP  # type: ignore[union-attr]
    assert scale.patches == [] and events.events == []


async def test_unknown_pool_and_permanent_errors_drop_the_command_only() -> None:
    s = scaler(FakeScale(fail=PermanentError("403 forbidden")))
    assert await s.handle(cmd(3, T0)) is None
    other = ScaleCommand(pool="nope", version=1, t_ms=0, desired_replicas=1, current_replicas=1, floor_replicas=0)
    assert await s.handle(other) is None
    assert s.states == {}


async def test_no_kubernetes_keeps_the_size_it_would_have_set() -> None:
    s = scaler(None)
    await s.handle(cmd(3, T0))
    assert s.replicas == {"p": 3}


@pytest.mark.parametrize("bad", [dict(scale_down_stabilization_s=-1), dict(target_utilization=0)])
def test_scaling_config_is_validated(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        ScalingConfig(**bad)  # type: ignore[arg-type]
