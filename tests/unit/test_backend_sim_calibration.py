"""The backend simulator against the paper's testbed: 16 slots, ~240 tokens/s, and the Exp 1 / Exp 2 shapes."""

from __future__ import annotations

import pytest

from tokenpools.replay.backend.model import ReplicaModel, decode_step_s, full_load_tokens_per_s
from tokenpools.replay.backend.records import Preempted, PreemptionCause
from tokenpools.replay.backend.simulator import BackendSim
from backend_sim_support import PAPER_TOKENS_PER_S, completed, drain, first_tokens


def test_default_calibration_decodes_about_240_tokens_per_s_at_full_load() -> None:
    model = ReplicaModel()
    assert model.max_num_seqs == 16
    assert decode_step_s(model, 16) == pytest.approx(0.0668)
    assert full_load_tokens_per_s(model) == pytest.approx(PAPER_TOKENS_PER_S, rel=0.05)


def test_exp1_request_shape_keeps_about_240_tokens_per_s_including_prefill() -> None:
    assert full_load_tokens_per_s(ReplicaModel(), prompt_tokens=64, output_tokens=64) == pytest.approx(
        PAPER_TOKENS_PER_S, rel=0.05
    )


def test_16_concurrent_exp1_requests_give_240_tokens_per_s_and_sub_second_ttft() -> None:
    sim = BackendSim(ReplicaModel(), replicas=1)
    for i in range(16):
        sim.submit(f"r{i}", 0.0, prompt_tokens=64, output_tokens=64)
    events = drain(sim)
    done = completed(events)
    assert len(done) == 16
    makespan_s = max(e.t_s for e in done)
    assert 16 * 64 / makespan_s == pytest.approx(PAPER_TOKENS_PER_S, rel=0.05)
    assert all(e.ttft_s < 1.2 for e in done)  # the paper's protected-class bound, with room to spare
    assert len(set(first_tokens(events).values())) == 1  # simultaneous arrivals share one prefill step
    assert all(e.queue_s == 0.0 for e in done)


def test_22_concurrent_requests_leave_a_waiting_queue_of_6() -> None:
    sim = BackendSim(ReplicaModel(), replicas=1)
    for i in range(22):
        sim.submit(f"r{i}", 0.0, 64, 64, tag="spot" if i >= 6 else "guaranteed")
    snap = sim.snapshot(0.0)
    assert (snap.running, snap.waiting, snap.total_slots) == (16, 6, 16)
    assert dict(snap.running_by_tag) == {"guaranteed": 6, "spot": 10}
    assert dict(snap.waiting_by_tag) == {"spot": 6}
    assert snap.kv_used_tokens == 16 * (64 + 1)


def _queueing(slots: int, n: int) -> tuple[int, float]:
    sim = BackendSim(ReplicaModel(max_num_seqs=slots), replicas=1)
    for i in range(n):
        sim.submit(f"r{i}", 0.0, 64, 64)
    waiting = sim.snapshot(0.0).waiting
    done = completed(drain(sim))
    return waiting, sum(e.queue_s for e in done) / len(done)


def test_halving_slots_to_8_doubles_queueing() -> None:
    waiting_16, queue_16_s = _queueing(16, 24)
    waiting_8, queue_8_s = _queueing(8, 24)
    assert (waiting_16, waiting_8) == (8, 16)
    # Mean queueing time of 32 identical requests: 16 slots -> 1 wave waits; 8 slots -> 3 waves wait (each
    # wave is shorter, as a smaller batch steps faster), so the ratio is ~2.15.
    _, queue_16_s = _queueing(16, 32)
    _, queue_8_s = _queueing(8, 32)
    assert 1.8 < queue_8_s / queue_16_s < 2.5


def test_exp2_outage_preempts_down_to_8_slots_and_recovers() -> None:
    sim = BackendSim(ReplicaModel(), replicas=1)
    for i in range(16):
        sim.submit(f"r{i}", 29.0, 64, 176)
    events = sim.advance(30.0)
    sim.set_capacity(max_num_seqs_per_replica=8, now_s=30.0)
    outage = sim.advance(30.0)
    assert [e.request_id for e in outage] == [f"r{i}" for i in range(15, 7, -1)]  # newest first
    assert all(type(e) is Preempted and e.cause is PreemptionCause.CAPACITY_REDUCED for e in outage)
    assert all(e.t_s == 30.0 for e in outage)
    snap = sim.snapshot(31.0)
    assert (snap.running, snap.waiting, snap.total_slots) == (8, 8, 8)
    sim.set_capacity(16, 32.0)
    snap = sim.snapshot(32.1)
    assert (snap.running, snap.waiting, snap.total_slots) == (16, 0, 16)
    events += outage + drain(sim)
    assert sorted(e.request_id for e in completed(events)) == sorted(f"r{i}" for i in range(16))
    assert len(first_tokens(events)) == 16  # the preempted kept the first token they had streamed
