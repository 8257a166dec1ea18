"""The backend simulator's API call by call: validation with clear errors, then what each call does."""

from __future__ import annotations

import pytest

from tokenpools.replay.backend.model import ReplicaModel, decode_step_s
from tokenpools.replay.backend.records import (
    Completed,
    FirstToken,
    Preempted,
    PreemptionCause,
    ReplicaReady,
    ReplicaRetired,
    ReplicaState,
)
from tokenpools.replay.backend.simulator import BackendSim
from backend_sim_support import completed, drain, first_tokens


# ---------------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_num_seqs": 0}, "`max_num_seqs` must be positive, got 0"),
        ({"max_num_seqs": 2.5}, "`max_num_seqs` must be an int, got 2.5"),
        ({"kv_capacity_tokens": -1}, "`kv_capacity_tokens` must be positive, got -1"),
        ({"prefill_s_per_token": -0.1}, "`prefill_s_per_token` must be non-negative, got -0.1"),
        ({"decode_step_base_s": float("nan")}, "`decode_step_base_s` must be a finite number of seconds"),
        ({"decode_step_base_s": 0.0, "decode_step_per_seq_s": 0.0}, "must be at least 1 ns"),
        ({"startup_delay_s": -1}, "`startup_delay_s` must be non-negative, got -1"),
        ({"preempt_on_kv_exhaustion": 1}, "`preempt_on_kv_exhaustion` must be a bool, got 1"),
    ],
)
def test_replica_model_rejects_bad_settings_with_clear_messages(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ReplicaModel(**kwargs)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("a", 1.0, -1, 5), "`prompt_tokens` must be non-negative, got -1"),
        (("a", 1.0, 5, 0), "`output_tokens` must be positive, got 0"),
        (("a", 1.0, True, 5), "`prompt_tokens` must be an int, got True"),
        (("a", 1.0, 5, 2.0), "`output_tokens` must be an int, got 2.0"),
        ((7, 1.0, 5, 5), "`request_id` must be a str, got 7"),
        (("dup", 1.0, 5, 5), "`request_id` 'dup' is already in the pool"),
        (("a", 0.5, 5, 5), "`now_s` must not go back in time: got 0.5"),
        (("a", float("inf"), 5, 5), "`now_s` must be a finite number of seconds"),
        (("a", 1.0, 60, 50), r"must fit one replica's KV cache \(100 tokens\), got 110"),
    ],
)
def test_submit_rejects_bad_requests_with_clear_messages(args: tuple, message: str) -> None:
    sim = BackendSim(ReplicaModel(kv_capacity_tokens=100), replicas=1)
    sim.submit("dup", 1.0, 5, 5)
    with pytest.raises(ValueError, match=message):
        sim.submit(*args)


def test_other_calls_validate_their_arguments() -> None:
    sim = BackendSim()
    sim.advance(5.0)
    with pytest.raises(ValueError, match="`now_s` must not go back in time"):
        sim.advance(4.0)
    with pytest.raises(ValueError, match="`max_num_seqs_per_replica` must be positive, got 0"):
        sim.set_capacity(0, 5.0)
    with pytest.raises(ValueError, match="`n` must be non-negative, got -1"):
        sim.set_replicas(-1, 5.0)
    with pytest.raises(ValueError, match="`replicas` must be non-negative, got -2"):
        BackendSim(replicas=-2)
    with pytest.raises(ValueError, match="`first_token_events` must be a bool, got 0"):
        BackendSim(first_token_events=0)  # type: ignore[arg-type]


def test_without_first_token_events_the_ttft_is_still_reported() -> None:
    sim = BackendSim(ReplicaModel(), first_token_events=False)
    sim.submit("a", 0.0, 64, 4)
    events = drain(sim)
    assert [type(e) for e in events] == [Completed]
    assert events[0].ttft_s == pytest.approx(64 * 0.000125 + decode_step_s(ReplicaModel(), 1))


def test_times_may_be_ints_and_kv_usage_is_a_fraction() -> None:
    sim = BackendSim(ReplicaModel(kv_capacity_tokens=1000), replicas=2)
    sim.submit("a", 1, 99, 10)
    snap = sim.snapshot(1)
    assert (snap.kv_used_tokens, snap.kv_capacity_tokens, snap.kv_usage_fraction) == (100, 2000, 0.05)
    assert snap.t_s == 1.0


def test_events_are_closed_records_that_only_equal_their_own_type() -> None:
    assert FirstToken("a", 1.0) == FirstToken("a", 1.0)
    assert FirstToken("a", 1.0) != ReplicaReady("a", 1.0)  # type: ignore[arg-type]
    assert FirstToken("a", 1.0) != ("a", 1.0)
    assert len({FirstToken("a", 1.0), FirstToken("a", 1.0)}) == 1


# ---------------------------------------------------------------------------------------------- behaviour


def test_ttft_is_prefill_plus_one_step_and_completion_adds_the_remaining_steps() -> None:
    model = ReplicaModel()
    sim = BackendSim(model, replicas=1)
    sim.submit("a", 2.0, prompt_tokens=100, output_tokens=10)
    (done,) = completed(drain(sim))
    step_s = decode_step_s(model, 1)
    assert done.ttft_s == pytest.approx(100 * model.prefill_s_per_token + step_s)
    assert done.e2e_s == pytest.approx(done.ttft_s + 9 * step_s)
    assert done.t_s == pytest.approx(2.0 + done.e2e_s)
    assert (done.prompt_tokens, done.completion_tokens, done.queue_s) == (100, 10, 0.0)


def test_a_request_arriving_mid_step_joins_at_the_next_boundary_and_counts_as_waiting_until_then() -> None:
    model = ReplicaModel(prefill_s_per_token=0.0, decode_step_base_s=0.1, decode_step_per_seq_s=0.0)
    sim = BackendSim(model, replicas=1)
    sim.submit("a", 0.0, 10, 100)
    sim.submit("b", 0.25, 10, 100)  # steps end at 0.1, 0.2, 0.3, ...
    snap = sim.snapshot(0.25)
    assert (snap.running, snap.waiting, snap.kv_used_tokens) == (1, 1, 10 + 2 + 1)
    snap = sim.snapshot(0.3)
    assert (snap.running, snap.waiting, snap.kv_used_tokens) == (2, 0, (10 + 3 + 1) + (10 + 1))
    ft = first_tokens(sim.advance(0.5))
    assert ft == {"a": 0.1, "b": pytest.approx(0.4)}


def test_a_request_arriving_exactly_at_a_boundary_joins_that_boundary() -> None:
    model = ReplicaModel(prefill_s_per_token=0.0, decode_step_base_s=0.1, decode_step_per_seq_s=0.0)
    for advance_first in (False, True):
        sim = BackendSim(model, replicas=1)
        sim.submit("a", 0.0, 10, 100)
        if advance_first:
            sim.advance(0.3)
        sim.submit("b", 0.3, 10, 5)
        (done,) = completed(sim.advance(1.0))
        assert (done.request_id, done.queue_s, done.t_s) == ("b", 0.0, pytest.approx(0.8))


def test_dispatch_goes_to_the_least_loaded_replica_lowest_index_first() -> None:
    sim = BackendSim(ReplicaModel(max_num_seqs=2), replicas=3)
    for i in range(7):
        sim.submit(f"r{i}", 0.0, 10, 10)
    loads = [(x.running, x.waiting) for x in sim.snapshot(0.0).replicas]
    assert loads == [(2, 1), (2, 0), (2, 0)]


def test_abort_frees_the_slot_at_once_and_reports_whether_the_request_was_live() -> None:
    sim = BackendSim(ReplicaModel(max_num_seqs=1), replicas=1)
    sim.submit("a", 0.0, 10, 100)
    sim.submit("b", 0.0, 10, 100)
    sim.submit("c", 0.0, 10, 100)
    assert sim.abort("c", 0.01) is True  # waiting
    assert sim.abort("a", 0.5) is True  # running
    snap = sim.snapshot(0.5)
    assert (snap.running, snap.waiting, snap.kv_used_tokens) == (0, 1, 0)  # b is booked for the next step
    assert sim.abort("a", 0.5) is False
    assert sim.abort("nobody", 0.5) is False
    assert sim.abort(7, 0.5) is False  # an id of another type is unknown too
    events = drain(sim)
    assert [e.request_id for e in completed(events)] == ["b"]
    assert sim.abort("b", sim.snapshot(60.0).t_s) is False


def test_abort_before_the_first_token_cancels_it() -> None:
    sim = BackendSim(ReplicaModel(), replicas=1)
    sim.submit("a", 0.0, 1000, 10)  # 0.125 s of prefill
    assert sim.abort("a", 0.05) is True
    assert drain(sim) == []
    assert sim.snapshot(1.0).running == 0


def test_kv_exhaustion_preempts_the_newest_sequence_which_later_resumes() -> None:
    model = ReplicaModel(kv_capacity_tokens=60, max_num_seqs=4)
    sim = BackendSim(model, replicas=1)
    for i in range(3):
        sim.submit(f"r{i}", 0.0, prompt_tokens=10, output_tokens=20)
    events = drain(sim)
    preempted = [e for e in events if type(e) is Preempted]
    assert preempted and preempted[0].request_id == "r2"
    assert {e.cause for e in preempted} == {PreemptionCause.KV_EXHAUSTED}
    assert sorted(e.request_id for e in completed(events)) == ["r0", "r1", "r2"]
    assert list(first_tokens(events)) == ["r0", "r1", "r2"]  # a resumed request keeps its first token


def test_without_preemption_admission_reserves_the_whole_sequence() -> None:
    model = ReplicaModel(kv_capacity_tokens=60, max_num_seqs=4, preempt_on_kv_exhaustion=False)
    sim = BackendSim(model, replicas=1)
    for i in range(3):
        sim.submit(f"r{i}", 0.0, prompt_tokens=10, output_tokens=20)
    assert sim.snapshot(0.0).running == 2  # 2 x 30 reserved of 60
    events = drain(sim)
    assert not [e for e in events if type(e) is Preempted]
    assert len(completed(events)) == 3


def test_scale_up_waits_for_startup_then_takes_new_work() -> None:
    sim = BackendSim(ReplicaModel(startup_delay_s=30.0), replicas=1)
    sim.set_replicas(2, 10.0)
    snap = sim.snapshot(10.0)
    assert (snap.ready_replicas, snap.starting_replicas, snap.total_slots) == (1, 1, 16)
    events = sim.advance(40.0)
    assert events == [ReplicaReady(1, 40.0)]
    sim.submit("a", 40.0, 10, 10)
    sim.submit("b", 40.0, 10, 10)
    assert [x.running for x in sim.snapshot(40.0).replicas] == [1, 1]


def test_scale_down_drains_in_flight_work_then_retires_the_replica() -> None:
    sim = BackendSim(ReplicaModel(max_num_seqs=1), replicas=2)
    for i in range(4):
        sim.submit(f"r{i}", 0.0, 10, 50)
    sim.set_replicas(1, 1.0)
    snap = sim.snapshot(1.0)
    assert [x.state for x in snap.replicas] == [ReplicaState.READY, ReplicaState.DRAINING]
    sim.submit("late", 1.0, 10, 50)
    assert [x.waiting for x in sim.snapshot(1.0).replicas] == [2, 1]  # nothing new for the draining one
    events = drain(sim)
    assert len(completed(events)) == 5
    retired = [e for e in events if type(e) is ReplicaRetired]
    assert [e.index for e in retired] == [1]
    assert retired[0].t_s == max(e.t_s for e in completed(events) if e.request_id in ("r1", "r3"))
    snap = sim.snapshot(1e3)
    assert (snap.ready_replicas, snap.draining_replicas, snap.total_slots) == (1, 0, 1)
    assert snap.replicas[1].state is ReplicaState.RETIRED


def test_scale_down_cancels_starting_replicas_first_and_scale_to_zero_holds_requests() -> None:
    sim = BackendSim(ReplicaModel(startup_delay_s=5.0), replicas=1)
    sim.set_replicas(3, 0.0)
    sim.set_replicas(1, 1.0)
    assert [e.index for e in sim.advance(1.0)] == [2, 1]
    sim.set_replicas(0, 2.0)
    assert sim.advance(2.0) == [ReplicaRetired(0, 2.0)]  # idle, so it retires at once
    sim.submit("a", 3.0, 10, 10)
    snap = sim.snapshot(3.0)
    assert (snap.waiting, snap.unassigned_waiting, snap.ready_replicas) == (1, 1, 0)
    sim.set_replicas(1, 4.0)
    events = drain(sim)
    assert events[0] == ReplicaReady(3, 9.0)
    assert completed(events)[0].queue_s == pytest.approx(6.0)


def test_next_event_s_is_none_when_idle_and_events_come_in_time_order() -> None:
    sim = BackendSim(ReplicaModel(), replicas=2)
    assert sim.next_event_s() is None
    for i in range(40):
        sim.submit(f"r{i}", i * 0.05, 10 + i, 5 + (i * 7) % 30)
    events = drain(sim)
    times = [e.t_s for e in events]
    assert times == sorted(times)
    assert sim.next_event_s() is None
