"""The stream agents and the replayer run one pool tick, ``core.tick.pool_tick``, not two copies of its glue: a
setting tuned in a replay decides the same way live.

A spy stands in for ``pool_tick`` in both callers' modules and records every real call: one agents' tick and one
replay tick of the same pool must each call it once, at the same window end with the same entitlements, and apply
exactly what it returned (the members' whole slots; an entitlement it did not bind gets nothing from it).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tokenpools.core import tick as core_tick
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.replay import policy as replay_policy
from tokenpools.replay.scenario import ReplayParams
from tokenpools.streams.table import pool_state
from tokenpools.streams.table.params import StreamParams
from tokenpools_dev import builders
from tokenpools_dev.builders import entitlement_spec

BASE_MS = 1_700_000_000_000
POOL = PoolSpec("pool", "Qwen/Qwen3-8B", Capacity(240.0, 16e9, 16.0), min_replicas=1, max_replicas=1)


def elastic(name: str, slo_ms: float) -> EntitlementSpec:
    return entitlement_spec(name, ServiceClass.ELASTIC, 5.0, 75.0, 1e9, slo_ms=slo_ms)


# the fourth baseline does not fit the pool at max replicas (300 > 240 tokens/s): Degraded, on both sides
ENTITLEMENTS = (elastic("copilot", 500.0), elastic("synth", 30_000.0), elastic("reports", 5_000.0),
                elastic("late", 1_000.0))


@dataclass
class Call:
    caller: str
    entitlements: list[str]
    now_s: float
    result: core_tick.PoolTickResult


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """Every call of ``pool_tick`` from the agents' and the replayer's modules, to the real function."""
    real = core_tick.pool_tick
    assert pool_state.pool_tick is real and replay_policy.pool_tick is real  # both bind the core's function itself
    recorded: list[Call] = []

    def spy(caller: str):  # noqa: ANN202
        def pool_tick(pool, entitlements, now_s, *args, **kwargs):  # noqa: ANN001, ANN202
            result = real(pool, entitlements, now_s, *args, **kwargs)
            recorded.append(Call(caller, [e.name for e in entitlements], now_s, result))
            return result
        return pool_tick

    monkeypatch.setattr(pool_state, "pool_tick", spy("streams"))
    monkeypatch.setattr(replay_policy, "pool_tick", spy("replay"))
    return recorded


def streams_tick() -> pool_state.TickOutput:
    """The agents close window 0 of a pool that saw one admission of copilot."""
    params = StreamParams(width_ms=1000, grace_ms=300, mean_slo_frozen=True)
    record = builders.decided("r1", BASE_MS + 100, entitlement="copilot")
    state, _ = pool_state.apply_event(pool_state.new("pool", params.width_ms), record, params, pool_state.Position("requests/0", 0, BASE_MS + 100))
    return pool_state.tick(state, pool_state.PoolView(POOL, ENTITLEMENTS), BASE_MS + 1300, params)


def replay_tick() -> replay_policy.TokenPoolsPolicy:
    """The replayer closes the same window: every entitlement joined at 0, one admission of copilot, the tick at
    the window's end + grace."""
    policy = replay_policy.TokenPoolsPolicy(POOL, ReplayParams(tick_s=1.0, grace_s=0.3, mean_slo="frozen"), BASE_MS)
    for spec in ENTITLEMENTS:
        policy.join(spec, 0.0)
    policy.admit("copilot", "r1", 36, 64, 0.1)
    policy.tick(1.3, 0, POOL.replicas)
    return policy


def test_the_agents_and_the_replayer_run_the_same_pool_tick(calls: list[Call]) -> None:
    out = streams_tick()
    policy = replay_tick()
    assert [c.caller for c in calls] == ["streams", "replay"]
    live, replayed = calls
    # the same question: the pool's entitlements, oldest first, at the window's end
    assert live.entitlements == replayed.entitlements == [e.name for e in ENTITLEMENTS]
    assert live.now_s == replayed.now_s == (BASE_MS + 1000) / 1000
    # the same membership and ℓ̄*: the Degraded one takes no part on either side
    for call in calls:
        assert [e.name for e in call.result.members] == ["copilot", "synth", "reports"]
        assert call.result.mean_slo_ms == pytest.approx(35_500.0 / 3)
    # each side applies what the function returned: the agents publish its slots, the replay's proxy enforces them
    (update,) = out.updates
    assert {e.name: e.concurrency for e in update.entitlements} == live.result.concurrency
    assert {name: policy.admission.limits_of(name).concurrency for name in replayed.result.concurrency} == \
        replayed.result.concurrency
    assert {t.entitlement: t.limit_concurrency for t in policy.entitlement_ticks} == replayed.result.concurrency
    assert policy.mean_slo_ms == replayed.result.mean_slo_ms and out.state.mean_slo_ms == live.result.mean_slo_ms
