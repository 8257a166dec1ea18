"""The recorded backend (``replay.backend=recorded``): a log's own service times, and a replay that reproduces the
decisions of the run that wrote the log."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from tokenpools.replay import logio, trace
from tokenpools.replay.backend.recorded import RecordedBackend, RecordedService, Recording
from tokenpools.replay.backend.records import Completed
from tokenpools.replay.experiments import _config, apply_replay_items, build
from tokenpools.replay.policy import TokenPoolsPolicy
from tokenpools.replay.replayer import replay
from tokenpools.replay.scenario import ReplayUsageError

SERVICES = {"a1": RecordedService(2.0, 0.1, 10, 20), "a2": RecordedService(4.0, 0.3, 10, 30),
            "b1": RecordedService(1.0, 0.2, 5, 5)}
OWNERS = {"a1": "a", "a2": "a", "b1": "b"}


def _backend(ticks: tuple[tuple[float, int, int], ...] = ()) -> RecordedBackend:
    return RecordedBackend(Recording(SERVICES, OWNERS, ticks), replicas=2, slots_per_replica=4)


def test_a_recorded_request_completes_after_its_recorded_service_with_its_recorded_tokens() -> None:
    be = _backend()
    be.submit("a2", 10.0, 99, 99, "a")  # the recorded tokens win over what the replay asked for
    be.submit("a1", 10.5, 99, 99, "a")
    assert be.next_event_s() == 12.5
    assert be.advance(12.4) == []
    assert be.advance(14.0) == [Completed("a1", 12.5, 10, 20, 0.1, 2.0, 0.0, "a"),
                                Completed("a2", 14.0, 10, 30, 0.3, 4.0, 0.0, "a")]
    assert be.next_event_s() is None


def test_an_unrecorded_request_takes_its_entitlements_median_service_and_its_own_lengths() -> None:
    be = _backend()
    be.submit("new-a", 0.0, 7, 11, "a")  # median of a: e2e 3.0, ttft 0.2
    be.submit("new-z", 0.0, 7, 11, "z")  # no recorded request of z: median of all, e2e 2.0, ttft 0.2
    assert be.advance(10.0) == [Completed("new-z", 2.0, 7, 11, 0.2, 2.0, 0.0, "z"),
                                Completed("new-a", 3.0, 7, 11, 0.2, 3.0, 0.0, "a")]


def test_an_aborted_request_never_completes() -> None:
    be = _backend()
    be.submit("a1", 0.0, 1, 1, "a")
    be.submit("b1", 0.0, 1, 1, "b")
    assert be.abort("b1", 0.5) and not be.abort("b1", 0.6) and not be.abort("unknown", 0.6)
    assert be.next_event_s() == 2.0  # b1's completion at 1.0 is gone
    assert [e.request_id for e in be.advance(5.0)] == ["a1"]


def test_the_snapshot_reports_the_queue_and_replicas_the_agents_saw_at_the_latest_recorded_tick() -> None:
    be = _backend(ticks=((5.0, 3, 8), (10.0, 0, 4)))
    be.submit("a1", 0.0, 1, 1, "a")
    before, during, after = be.snapshot(1.0), be.snapshot(7.0), be.snapshot(10.0)
    assert (before.waiting, before.ready_replicas, before.total_slots) == (0, 2, 8)  # no tick yet: as configured
    assert (during.waiting, during.ready_replicas, during.running) == (3, 2, 1)
    assert (after.waiting, after.ready_replicas, after.total_slots) == (0, 1, 4)  # half the pool down
    assert dict(during.running_by_tag) == {"a": 1}


def test_a_recording_needs_completions_and_time_ordered_ticks() -> None:
    with pytest.raises(ValueError, match="no request_completed rows"):
        Recording({}, {})
    with pytest.raises(ValueError, match="time order"):
        Recording(SERVICES, OWNERS, ((5.0, 0, 8), (1.0, 0, 8)))


def test_a_generated_scenario_has_no_recording_to_replay() -> None:
    scenario = build("exp1", ["load.compress=0.2"])
    with pytest.raises(ReplayUsageError, match="needs recorded service times"):
        replay(scenario.with_params(apply_replay_items(scenario.params, ["replay.backend=recorded"])))


def test_with_its_own_service_times_a_logs_replay_reproduces_every_decision_of_a_different_backend(
        tmp_path: Path) -> None:
    # the "live" run: a backend 40 % slower per decode step than the simulator's default calibration; the backend
    # queue is off in both runs (a replay's own log carries no limit updates to read it from), and so is the proxy's
    # admission queue (the decision record cannot say yet how long a request waited before its decision)
    scenario = build("exp1", ["load.compress=0.5", "replay.backend_waiting=off", "policy.queue_slo_fraction=0"])
    model = scenario.replica_model
    original = replay(replace(scenario, replica_model=replace(model, decode_step_per_seq_s=model.decode_step_per_seq_s * 1.4)))
    logio.write_log(original, tmp_path / "log")
    pool, ents, _ = _config(None, "exp1.yaml")
    rates = {}
    for backend in ("recorded", "sim"):
        params = apply_replay_items(scenario.params, [f"replay.backend={backend}"])
        again, recorded = logio.scenario_from_log(tmp_path / "log", pool, ents, params)
        assert again.recording is not None and len(again.recording.services) == len(original.completions.t_s)
        rates[backend], compared = logio.match_rate(replay(again), recorded)
        assert compared == len(original.decisions.t_s)
    assert rates["recorded"] == 1.0
    assert rates["sim"] < 0.98  # the default calibration is not that backend: concurrency decisions drift
    # the recorded service of a request is its completion minus its admission, in the log's milliseconds
    completed = trace.read_table(tmp_path / "log", trace.COMPLETIONS)
    rid, t_ms, admitted_ms = completed.select("request_id", "t_ms", "admitted_t_ms").row(0)
    assert again.recording.services[rid].e2e_s == pytest.approx((t_ms - admitted_ms) / 1000)


def test_spec_rows_make_an_entitlement_a_member_from_its_first_bound_row_to_the_next_unbound_one(
        tmp_path: Path) -> None:
    scenario = build("exp1", ["load.compress=0.2"])
    logio.write_log(replay(scenario), tmp_path / "log")
    origin = int(trace.read_table(tmp_path / "log", trace.REQUESTS)["t_ms"].min())
    rows = [("guaranteed-c", None, False, origin + 3_000), ("guaranteed-c", "Pending", False, origin + 9_000),
            ("spot-b", "Degraded", False, origin), ("guaranteed-a", "Bound", False, origin - 60_000),
            ("guaranteed-a", "Bound", True, origin + 5_000)]
    frame = trace.frame("spec", [
        {"schema_version": 1, "kind": "TokenEntitlement", "name": n, "pool": "qwen3-8b", "generation": 1,
         "spec": "{}", "state": s, "reason": "", "deleted": d, "t_ms": t, "kafka_partition": 0, "kafka_offset": i}
        for i, (n, s, d, t) in enumerate(rows)])
    for path in trace.table_files(tmp_path / "log", "spec"):
        path.unlink()
    trace.write_partitioned(tmp_path / "log", "spec", frame, 0, 0)
    pool, ents, _ = _config(None, "exp1.yaml")
    again, _ = logio.scenario_from_log(tmp_path / "log", pool, ents, scenario.params)
    window_s = (origin - again.origin_ms) / 1000  # (the scenario starts at the window of the first decision)
    c, a = again.member("guaranteed-c"), again.member("guaranteed-a")
    assert (c.join_s, c.leave_s) == pytest.approx((window_s + 3.0, window_s + 9.0))
    assert (a.join_s, a.leave_s) == pytest.approx((0.0, window_s + 5.0))  # Bound before the log began
    spot = next(e for e in again.entitlements if e.name == "spot-b")
    assert spot.state.value == "Pending" and "spot-b" not in again.membership  # never Bound: refused as not Bound
    decided = replay(replace(again, membership=again.membership))
    outcomes = pl.DataFrame({"e": decided.decisions.entitlement, "o": decided.decisions.outcome})
    assert set(outcomes.filter(pl.col("e") == "spot-b")["o"]) == {"not_bound"}


def test_an_update_is_in_force_from_the_first_decision_under_it_or_a_later_one() -> None:
    # versions 1000 and 3000 (ms from the origin) held from 1.1 s and 3.2 s; the proxy never applied 2000
    recording = Recording(SERVICES, OWNERS, held_ms=((1000, 1100), (3000, 3200)))
    assert recording.in_force_s(1.0) == 1.1
    assert recording.in_force_s(0.5) == 1.1  # a version it never showed: held once a later one was
    assert recording.in_force_s(2.0) == 3.2
    assert recording.in_force_s(3.0) == 3.2
    assert recording.in_force_s(3.5) is None  # no decision under it: the replay puts it in force at its tick
    # a proxy (of several) that held a later version first: from then on
    assert Recording(SERVICES, OWNERS, held_ms=((1000, 1500), (2000, 1200))).in_force_s(1.0) == 1.2
    assert Recording(SERVICES, OWNERS).in_force_s(1.0) is None  # a log without versions
    with pytest.raises(ValueError, match="ascending"):
        Recording(SERVICES, OWNERS, held_ms=((2000, 2100), (1000, 1100)))


def test_the_versions_a_log_holds_are_each_first_decision_under_it_waits_included() -> None:
    decided = pl.DataFrame({"t_ms": [5, 7, 3, 9, 4], "limits_version": [20, 10, None, 20, 10],
                            "waits": [False, False, False, False, True]})
    assert logio.held_versions(decided) == ((10, 4), (20, 5))
    assert logio.held_versions(decided.drop("limits_version")) == ()  # a log written before the field


def _versioned(log: Path, origin_ms: int, tick_ms: int, late_ms: int) -> None:
    """Give a replay's log the limits_version each decision was made under, for limits that reached the proxy
    ``late_ms`` after their window's end (the replay that wrote it ran with that grace)."""
    decided = trace.read_table(log, trace.REQUESTS)
    for path in trace.table_files(log, trace.REQUESTS):
        path.unlink()
    version = ((pl.col("t_ms") - origin_ms - late_ms) // tick_ms * tick_ms + origin_ms)
    decided = decided.with_columns(pl.when(pl.col("t_ms") >= origin_ms + late_ms).then(version).otherwise(None)
                                   .alias("limits_version"))
    trace.write_partitioned(log, trace.REQUESTS, decided, -1, 0)


@pytest.mark.parametrize("late_ms", [0, 100, 300])
def test_a_log_that_says_when_its_proxy_held_each_update_is_replayed_to_every_decision(
        tmp_path: Path, late_ms: int) -> None:
    # the "live" run: its proxy gets each window's limits late_ms after the window's end (the replay's grace); no
    # backend queue in the log and no admission queue (as the first recorded-backend test)
    items = ["load.compress=0.5", "replay.backend_waiting=off", "policy.queue_slo_fraction=0"]
    scenario = build("exp1", items)
    live = replay(scenario.with_params(apply_replay_items(scenario.params, [f"replay.grace_s={late_ms / 1000}"])))
    logio.write_log(live, tmp_path / "log")
    pool, ents, _ = _config(None, "exp1.yaml")
    params = apply_replay_items(scenario.params, ["replay.backend=recorded"])  # grace 0: the tick at the window's end

    def replayed() -> tuple[float | None, list[str]]:
        again, recorded = logio.scenario_from_log(tmp_path / "log", pool, ents, params)
        result = replay(again)
        return logio.match_rate(result, recorded)[0], result.decisions.outcome

    before, outcomes_before = replayed()
    _versioned(tmp_path / "log", scenario.origin_ms, round(scenario.params.tick_s * 1000), late_ms)
    after, outcomes_after = replayed()
    assert after == 1.0, (before, after)
    if late_ms:  # without the versions, the limits were in force late_ms earlier than live: decisions differ
        assert before is not None and before < 1.0
    else:  # held at their ticks: the versions change nothing
        assert outcomes_after == outcomes_before


def test_a_held_tick_changes_no_limit_until_put_in_force_oldest_first_and_skips_who_left() -> None:
    scenario = build("exp1", ["load.compress=0.2"])
    policy = TokenPoolsPolicy(scenario.pool, scenario.params, scenario.origin_ms)
    for spec in scenario.entitlements:
        policy.join(spec, 0.0)
    names = [e.name for e in scenario.entitlements]
    static = {n: policy.admission.limits_of(n) for n in names}
    for i in range(40):  # one entitlement busy: its limits move away from the static ones at the ticks
        policy.admit(names[0], f"r{i}", 200, 200, 1.0 + i / 100)
    tick_s = scenario.params.tick_s
    policy.tick(tick_s, 0, scenario.pool.replicas, hold=True)
    policy.tick(2 * tick_s, 0, scenario.pool.replicas, hold=True)
    assert {n: policy.admission.limits_of(n) for n in names} == static  # held: the proxy has not got them yet
    first, second = policy.held
    policy.leave(names[-1], 2 * tick_s)
    policy.put_in_force(2 * tick_s + 0.1)
    assert {n: policy.admission.limits_of(n) for n in names[:-1]} == \
        {n: lim for n, lim in first.limits if n != names[-1]}  # the older tick first
    assert dict(first.limits) != static and list(policy.held) == [second]  # (the tick moved them)
    policy.put_in_force(2 * tick_s + 0.2)
    assert {n: policy.admission.limits_of(n) for n in names[:-1]} == \
        {n: lim for n, lim in second.limits if n != names[-1]}  # (the one that left is skipped, not re-added)
    assert names[-1] not in policy.specs and not policy.held
    policy.put_in_force(3 * tick_s)  # nothing held: nothing changes
