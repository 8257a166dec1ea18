"""The replayer: the core's decisions on a hand-made trace, determinism, and a replayed log matching itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenpools.core.admission import AdmissionController, EntitlementLimits
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.tick import control_tick
from tokenpools.core.waiting import QueueConfig
from tokenpools.replay import logio, report, results, trace
from tokenpools.replay.backend.model import ReplicaModel
from tokenpools.replay.backend.records import Completed
from tokenpools.replay.backend.simulator import BackendSim
from tokenpools.replay.experiments import _config, build
from tokenpools.replay.load import Arrival, RetryPolicy
from tokenpools.replay.replayer import replay
from tokenpools.replay.scenario import EPOCH_MS, ReplayParams, Scenario

POOL = PoolSpec("p", "m", Capacity(240.0, 1e12, 4.0), kv_bytes_per_token=1, default_max_tokens=32,
                token_bucket_window_s=2.0)
A = EntitlementSpec("a", "p", ServiceClass.GUARANTEED, 1000.0, Capacity(120.0, 1e11, 2.0))
B = EntitlementSpec("b", "p", ServiceClass.SPOT, 30000.0)
# (t_s, entitlement, prompt, max_tokens, output): bursts that hit the concurrency limit and the token bucket
TRACE = [(0.0, "a", 16, 32, 32), (0.0, "a", 16, 32, 32), (0.001, "a", 16, 32, 8), (0.002, "b", 16, None, 24),
         (0.003, "b", 16, 32, 32), (0.004, "b", 16, 32, 20), (0.5, "a", 16, 32, 32), (1.0, "b", 100, 200, 200),
         (1.1, "b", 60, 128, 100), (1.25, "a", 16, 32, 32), (1.3, "a", 16, 32, 32), (1.31, "a", 16, 32, 32),
         (1.5, "b", 16, 32, 32), (2.5, "a", 16, 32, 16), (2.6, "b", 16, 32, 16)]


NO_QUEUE = QueueConfig(slo_fraction=0.0)  # every refusal answered at once (the oracle has no queue)


def _scenario(queue: QueueConfig = NO_QUEUE) -> Scenario:
    arrivals = tuple(Arrival(t, e, f"r{i}", p, m, o) for i, (t, e, p, m, o) in enumerate(TRACE))
    params = ReplayParams(tick_s=100.0, grace_s=0.0, queue=queue)  # one tick, at t = 0: the limits stay what it set
    return Scenario("hand", POOL, (A, B), arrivals, 10.0, replica_model=ReplicaModel(max_num_seqs=4),
                    retry=RetryPolicy(max_retries=0), params=params, origin_ms=EPOCH_MS)


def _oracle() -> list[str]:
    """The same attempts straight through AdmissionController + BackendSim, limits from one control_tick."""
    params = ReplayParams(tick_s=100.0, grace_s=0.0)
    ctl = AdmissionController(4, 1, 32, 2.0, retry_after_s=1)
    tick = control_tick(POOL, [A, B], {}, {"a": None, "b": None}, POOL.capacity(), 15500.0, 0,
                        params.constants, params.limit_config, params.scaling)
    for spec in (A, B):
        lim = tick.limits[spec.name]
        ctl.upsert_entitlement(spec, EntitlementLimits(int(lim.concurrency), lim.tokens_per_s, lim.kv_bytes,
                                                       tick.priorities[spec.name]), 0.0)
    sim = BackendSim(ReplicaModel(max_num_seqs=4))
    tickets, outcomes = {}, []
    for i, (t, ent, prompt, max_tokens, output) in enumerate(TRACE):
        for ev in sim.advance(t):
            if isinstance(ev, Completed):
                ctl.release(tickets.pop(ev.request_id), ev.prompt_tokens + ev.completion_tokens, ev.t_s)
        d = ctl.admit(ent, f"r{i}", prompt, max_tokens, t)
        outcomes.append(d.outcome.value)
        if d.admitted:
            tickets[f"r{i}"] = d.ticket
            sim.submit(f"r{i}", t, prompt, output, ent)
    return outcomes


def test_a_hand_made_trace_gets_the_decisions_the_core_predicts() -> None:
    result = replay(_scenario())
    assert result.decisions.outcome == _oracle()
    assert set(result.decisions.outcome) >= {"admitted", "concurrency", "token_budget"}
    assert len(result.completions.t_s) == result.decisions.outcome.count("admitted")


def test_replaying_twice_gives_identical_decisions_and_results_bytes(tmp_path: Path) -> None:
    scenario = build("exp2", ["load.compress=0.3"])
    first, second = replay(scenario), replay(scenario)
    assert first.decisions == second.decisions and first.completions == second.completions
    assert first.entitlement_ticks == second.entitlement_ticks
    for run, folder in ((first, "a"), (second, "b")):
        (tmp_path / folder).mkdir()
        report.write_json(tmp_path / folder / "results.json", results.summarize("exp2", {"token-pools": run}))
        logio.write_log(run, tmp_path / folder / "log")
    assert (tmp_path / "a/results.json").read_bytes() == (tmp_path / "b/results.json").read_bytes()
    for path in sorted((tmp_path / "a/log").rglob("*.parquet")):
        assert path.read_bytes() == (tmp_path / "b/log" / path.relative_to(tmp_path / "a/log")).read_bytes()


@pytest.mark.parametrize("queue", [
    "policy.queue_slo_fraction=0",  # a proxy that refuses at once: every attempt is replayed at its decision's time
    pytest.param("policy.queue_slo_fraction=0.5", marks=pytest.mark.skipif(
        "queued_ms" not in trace.SCHEMAS[trace.REQUESTS],
        reason="the decision record does not carry queued_ms yet, so a log cannot say when a waiter arrived")),
])
def test_a_replay_of_an_experiments_own_log_makes_every_decision_the_same_way(tmp_path: Path, queue: str) -> None:
    scenario = build("exp2", ["load.compress=0.3", queue])
    original = replay(scenario)
    logio.write_log(original, tmp_path / "log")
    pool, ents, _ = _config(None, "exp2.yaml")
    changes = [(c.t_s, c.slots_per_replica) for c in scenario.capacity_changes]
    again, recorded = logio.scenario_from_log(tmp_path / "log", pool, ents, scenario.params, changes)
    assert again.member("elastic-reports").join_s == scenario.member("elastic-reports").join_s
    assert logio.match_rate(replay(again), recorded) == (1.0, len(original.decisions.t_s))


def test_a_refused_attempt_retries_after_its_decisions_milliseconds_and_records_the_wait() -> None:
    """The client model honours retry-after-ms, as the load generator does: the retry is sent at t + ms (+ jitter),
    on a whole millisecond not before it, and the decision row keeps the wait used. (A row's time is its final
    decision, so a retry that waited in the proxy's queue was sent ``queued_s`` before its row's time.)"""
    scenario = build("exp2", ["load.compress=0.3"])
    result = replay(scenario)
    d = result.decisions
    jitter_s = scenario.retry.jitter_s
    assert any(q > 0 for q, a in zip(d.queued_s, d.attempt) if a > 0)  # (retries that waited are checked too)
    at = {(rid, a): t - q for rid, a, t, q in zip(d.request_id, d.attempt, d.t_s, d.queued_s)}
    retried = 0
    for rid, a, t, outcome, ms, wait in zip(d.request_id, d.attempt, d.t_s, d.outcome, d.retry_after_ms,
                                            d.retry_wait_s):
        if outcome == "admitted":
            assert ms == 0 and wait == 0
            continue
        assert ms > 0
        nxt = at.get((rid, a + 1))
        if nxt is None:
            continue
        retried += 1
        assert abs(nxt - t - wait) < 1e-9
        assert ms / 1000 - 1e-9 <= wait < ms / 1000 + jitter_s + 0.001
    assert retried > 0
    assert any(ms < 1000 for ms, o in zip(d.retry_after_ms, d.outcome) if o != "admitted")  # sub-second waits
