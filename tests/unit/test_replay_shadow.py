"""Shadow mode in replay (docs/shadow.md): the replayer runs the core's shadow decision, its rows carry
``would_refuse``, the results and the report have a shadow section, and ``replay.shadow`` turns it on for a run."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.enforcement import Enforcement
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.errors import ConfigError
from tokenpools.replay import metrics
from tokenpools.replay.backend.model import ReplicaModel
from tokenpools.replay.experiments import with_shadow
from tokenpools.replay.load import Arrival, RetryPolicy
from tokenpools.replay.replayer import replay
from tokenpools.replay.report import shadow_table
from tokenpools.replay.results import MODE_KEYS
from tokenpools.replay.scenario import EPOCH_MS, ReplayParams, Scenario

POOL = PoolSpec("p", "m", Capacity(240.0, 1e12, 8.0), kv_bytes_per_token=1, default_max_tokens=32,
                token_bucket_window_s=2.0)
A = EntitlementSpec("a", "p", ServiceClass.GUARANTEED, 1000.0, Capacity(120.0, 1e11, 2.0), queue_timeout_ms=0)
B = EntitlementSpec("b", "p", ServiceClass.SPOT, 30000.0)
# a's limit is 2 slots: r0, r1 take them; r2 and r3 arrive while both run (a concurrency refusal under enforce)
ARRIVALS = (Arrival(0.0, "a", "r0", 16, 32, 32), Arrival(0.0, "a", "r1", 16, 32, 32),
            Arrival(0.1, "a", "r2", 16, 32, 16), Arrival(0.2, "a", "r3", 16, 32, 16), Arrival(0.3, "b", "s0", 16, 32, 8))


def _scenario() -> Scenario:
    return Scenario("shadow", POOL, (A, B), ARRIVALS, 10.0, replica_model=ReplicaModel(max_num_seqs=8),
                    retry=RetryPolicy(max_retries=0), params=ReplayParams(tick_s=100.0), origin_ms=EPOCH_MS)


def _rows(result) -> dict[str, tuple[str, str]]:
    d = result.decisions
    return {rid: (o, w) for rid, o, w in zip(d.request_id, d.outcome, d.would_refuse)}


def test_enforce_refuses_what_shadow_serves_and_the_rows_say_so() -> None:
    enforced = replay(_scenario())
    assert _rows(enforced)["r2"] == ("concurrency", "") and _rows(enforced)["r3"] == ("concurrency", "")
    assert metrics.shadow_counts(enforced) == {}

    shadowed = replay(with_shadow(_scenario(), ["replay.shadow=a"]))
    rows = _rows(shadowed)
    assert rows["r0"] == rows["r1"] == ("admitted", "")
    assert rows["r2"] == rows["r3"] == ("admitted", "concurrency")  # served, and what enforce would have said
    assert rows["s0"] == ("admitted", "")
    assert sorted(shadowed.completions.request_id) == ["r0", "r1", "r2", "r3", "s0"]
    assert metrics.shadow_counts(shadowed) == {"a": {"served": 4, "concurrency": 2}}


def test_the_spec_field_and_the_pool_turn_it_on_as_replay_shadow_does() -> None:
    by_spec = replace(_scenario(), entitlements=(replace(A, enforcement=Enforcement.SHADOW), B))
    by_pool = with_shadow(_scenario(), ["replay.shadow=*"])
    assert by_pool.pool.enforcement is Enforcement.SHADOW
    expected = _rows(replay(with_shadow(_scenario(), ["replay.shadow=a"])))
    assert _rows(replay(by_spec)) == expected == _rows(replay(by_pool))
    assert set(metrics.shadow_counts(replay(by_pool))) == {"a", "b"}
    with pytest.raises(ConfigError, match="--set: replay.shadow: unknown entitlements"):
        with_shadow(_scenario(), ["replay.shadow=nobody"])


def test_the_report_has_a_shadow_section_only_when_an_entitlement_is_in_shadow() -> None:
    mode = MODE_KEYS["open"]
    results = {mode: {"exp1": {"token_pools": {"shadow": {"a": {"served": 4, "concurrency": 2}}}}}}
    table = shadow_table(results, "exp1", mode)
    assert table is not None and "| a | 4 | 2 | 0 | 0 | 0 | 2 |" in table
    assert shadow_table({mode: {"exp1": {"token_pools": {}}}}, "exp1", mode) is None
