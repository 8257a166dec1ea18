"""Unit tests of the backend simulator (pure, virtual time, no services).

Three layers: calibration against the paper's testbed (16 slots, ~240 tokens/s), behaviour of each API call,
and property tests on named invariants. The strongest property compares the bulk-stepping simulator with a
naive step-by-step reference written here from the documented rules: same calls, same events, exactly.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.replay.backend_model import ReplicaModel, decode_step_s, full_load_tokens_per_s
from tokenpools.replay.backend_sim import (
    BackendSim,
    Completed,
    FirstToken,
    Preempted,
    PreemptionCause,
    ReplicaReady,
    ReplicaRetired,
    ReplicaState,
)

PAPER_TOKENS_PER_S = 240.0
NS = 1_000_000_000
_SETTINGS = {"deadline": None, "database": None}  # pure and fast; no example database written to the repo


def completed(events: list) -> list[Completed]:
    return [e for e in events if type(e) is Completed]


def first_tokens(events: list) -> dict[str, float]:
    return {e.request_id: e.t_s for e in events if type(e) is FirstToken}


def drain(sim: BackendSim) -> list:
    """Advance event by event until nothing is left (exercises next_event_s)."""
    out: list = []
    while (t := sim.next_event_s()) is not None:
        out += sim.advance(t)
    return out


# ---------------------------------------------------------------------------------------------- calibration


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
        (("dup", 1.0, 5, 5), "`request_id` 'dup' was already submitted"),
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


# ---------------------------------------------------------------------------------------------- reference


@dataclass(eq=False)
class _Req:
    rid: str
    order: int
    prompt: int
    output: int
    submit: int
    g: int = 0
    admit: int | None = None
    first: int | None = None


@dataclass(eq=False)
class _Rep:
    running: list[_Req] = field(default_factory=list)
    waiting: deque[_Req] = field(default_factory=deque)
    step_end: int | None = None
    step_batch: list[_Req] = field(default_factory=list)
    step_new: list[_Req] = field(default_factory=list)
    form_pending: bool = False


def reference(model: ReplicaModel, n_replicas: int, ops: list[tuple]) -> tuple[list, list[bool]]:
    """Naive step-by-step simulation of the documented rules; times in integer ns. Returns (events, aborts)."""
    base, per, pre = (round(x * NS) for x in (model.decode_step_base_s, model.decode_step_per_seq_s,
                                              model.prefill_s_per_token))
    cap, preempt = model.kv_capacity_tokens, model.preempt_on_kv_exhaustion
    slots = model.max_num_seqs
    reps = [_Rep() for _ in range(n_replicas)]
    live: dict[str, tuple[_Req, _Rep]] = {}
    events: list = []
    aborts: list[bool] = []
    order = itertools.count(1)

    def kv(rep: _Rep) -> int:
        return sum(x.prompt + x.g + 1 for x in rep.running)

    def end_step(rep: _Rep, t: int) -> None:
        for x in rep.step_batch:
            if x in rep.running:
                x.g += 1
        for x in rep.step_new:
            if x in rep.running and x.first is None:
                x.first = t
                events.append(FirstToken(x.rid, t / NS))
        for x in sorted((x for x in rep.running if x.g == x.output), key=lambda x: x.order):
            rep.running.remove(x)
            del live[x.rid]
            events.append(Completed(x.rid, t / NS, x.prompt, x.output, (x.first - x.submit) / NS,
                                    (t - x.submit) / NS, (x.admit - x.submit) / NS, ""))
        while preempt and rep.running and kv(rep) > cap:
            victim = rep.running.pop()
            rep.waiting.appendleft(victim)
            events.append(Preempted(victim.rid, t / NS, PreemptionCause.KV_EXHAUSTED))
        rep.step_end = None
        rep.form_pending = True

    def form(rep: _Rep, t: int) -> None:
        rep.form_pending = False
        new = []
        while rep.waiting and len(rep.running) < slots:
            x = rep.waiting[0]
            if preempt and kv(rep) + x.prompt + x.g + 1 > cap:
                break
            if not preempt and sum(y.prompt + y.output for y in rep.running) + x.prompt + x.output > cap:
                break
            rep.waiting.popleft()
            rep.running.append(x)
            new.append(x)
            if x.admit is None:
                x.admit = t
        if not rep.running:
            return
        rep.step_batch, rep.step_new = list(rep.running), new
        rep.step_end = t + base + per * len(rep.running) + pre * sum(x.prompt + x.g for x in new)

    def apply(op: tuple, t: int) -> None:
        nonlocal slots
        if op[0] == "submit":
            _, rid, prompt, output = op
            rep = min(reps, key=lambda r: (len(r.running) + len(r.waiting), reps.index(r)))
            x = _Req(rid, next(order), prompt, output, t)
            live[rid] = (x, rep)
            rep.waiting.append(x)
            if rep.step_end is None:
                rep.form_pending = True
        elif op[0] == "abort":
            entry = live.pop(op[1], None)
            aborts.append(entry is not None)
            if entry is not None:
                x, rep = entry
                if x in rep.waiting:
                    rep.waiting.remove(x)
                else:
                    rep.running.remove(x)
                    if not rep.running and not rep.waiting and rep.step_end is not None:
                        rep.step_end = None  # the step in progress is abandoned
        else:
            slots = op[1]
            for rep in reps:
                while len(rep.running) > slots:
                    victim = rep.running.pop()
                    rep.waiting.appendleft(victim)
                    events.append(Preempted(victim.rid, t / NS, PreemptionCause.CAPACITY_REDUCED))

    i = 0
    while True:
        internal = [r.step_end for r in reps if r.step_end is not None]
        t_int = min(internal) if internal else None
        t_op = ops[i][0] if i < len(ops) else None
        if t_int is None and t_op is None:
            break
        t = t_int if t_op is None or (t_int is not None and t_int <= t_op) else t_op
        for rep in reps:
            if rep.step_end == t:
                end_step(rep, t)
        while i < len(ops) and ops[i][0] == t:
            apply(ops[i][1:], t)
            i += 1
        for rep in reps:
            if rep.form_pending:
                form(rep, t)
    return events, aborts


def run_sim(model: ReplicaModel, n_replicas: int, ops: list[tuple], advance_step_ns: int | None) -> tuple[list, list]:
    """Drive the simulator through ``ops``. With ``advance_step_ns`` it is advanced on that grid between calls
    and drained event by event; without, it is never advanced until one final call far in the future."""
    sim = BackendSim(model, replicas=n_replicas)
    events: list = []
    aborts: list[bool] = []
    clock_ns = 0
    for t, kind, *args in ops:
        while advance_step_ns and clock_ns + advance_step_ns <= t:
            clock_ns += advance_step_ns
            events += sim.advance(clock_ns / NS)
        if kind == "submit":
            sim.submit(args[0], t / NS, args[1], args[2])
        elif kind == "abort":
            aborts.append(sim.abort(args[0], t / NS))
        elif kind == "capacity":
            sim.set_capacity(args[0], t / NS)
        else:
            sim.set_replicas(args[0], t / NS)
    events += drain(sim) if advance_step_ns else sim.advance(1e4)
    return events, aborts


_MS = 1_000_000


@st.composite
def workloads(draw: st.DrawFn) -> tuple[ReplicaModel, int, list[tuple]]:
    """Small pools and op sequences on a 1-ms grid, with step times in whole ms so boundaries and calls collide."""
    model = ReplicaModel(
        max_num_seqs=draw(st.integers(1, 4)),
        kv_capacity_tokens=draw(st.sampled_from([40, 80, 10_000])),
        prefill_s_per_token=draw(st.sampled_from([0.0, 0.001])),
        decode_step_base_s=draw(st.sampled_from([0.002, 0.005])),
        decode_step_per_seq_s=draw(st.sampled_from([0.0, 0.001])),
        preempt_on_kv_exhaustion=draw(st.booleans()),
    )
    n_replicas = draw(st.integers(1, 3))
    ops: list[tuple] = []
    t = 0
    ids: list[str] = []
    for _ in range(draw(st.integers(1, 25))):
        t += draw(st.integers(0, 12)) * _MS
        kind = draw(st.sampled_from(["submit"] * 6 + ["abort", "capacity"]))
        if kind == "submit" or not ids:
            rid = f"r{len(ids)}"
            ids.append(rid)
            prompt = draw(st.integers(0, 20))
            ops.append((t, "submit", rid, prompt, draw(st.integers(1, min(15, 40 - prompt)))))
        elif kind == "abort":
            ops.append((t, "abort", draw(st.sampled_from(ids))))
        else:
            ops.append((t, "capacity", draw(st.integers(1, 4))))
    return model, n_replicas, ops


@settings(max_examples=200, **_SETTINGS)
@given(workloads())
def test_bulk_stepping_matches_a_step_by_step_reference(workload: tuple) -> None:
    model, n_replicas, ops = workload
    expected_events, expected_aborts = reference(model, n_replicas, ops)
    events, aborts = run_sim(model, n_replicas, ops, advance_step_ns=None)
    assert aborts == expected_aborts
    assert [_round(e) for e in events] == [_round(e) for e in expected_events]


def _round(event: object) -> object:
    """Compare times to the ns (the reference converts once, the simulator subtracts then converts)."""
    if type(event) is Completed:
        return event._replace(ttft_s=round(event.ttft_s, 9), e2e_s=round(event.e2e_s, 9),
                              queue_s=round(event.queue_s, 9), tag="")
    return event


# ---------------------------------------------------------------------------------------------- invariants


@settings(max_examples=100, **_SETTINGS)
@given(st.one_of(workloads(), st.deferred(lambda: pool_workloads())), st.sampled_from([1 * _MS, 3 * _MS, 7 * _MS]))
def test_one_advance_or_many_gives_the_same_events(workload: tuple, step_ns: int) -> None:
    model, n_replicas, ops = workload
    assert run_sim(model, n_replicas, ops, advance_step_ns=step_ns) == run_sim(
        model, n_replicas, ops, advance_step_ns=None
    )


@settings(max_examples=30, **_SETTINGS)
@given(workloads())
def test_same_calls_give_identical_events(workload: tuple) -> None:
    model, n_replicas, ops = workload
    assert run_sim(model, n_replicas, ops, None) == run_sim(model, n_replicas, ops, None)


@st.composite
def pool_workloads(draw: st.DrawFn) -> tuple[ReplicaModel, int, list[tuple]]:
    """``workloads`` plus scaling: replicas start after 0-10 ms, and the pool may be scaled to zero."""
    model, n_replicas, ops = draw(workloads())
    model = ReplicaModel(**{**_fields(model), "startup_delay_s": draw(st.sampled_from([0.0, 0.004, 0.01]))})
    n_scale = draw(st.integers(0, 4))
    for _ in range(n_scale):
        t = draw(st.sampled_from([op[0] for op in ops]))
        ops.append((t, "replicas", draw(st.integers(0, 3))))
    ops.sort(key=lambda op: op[0])  # stable: scaling calls go after the other calls at the same time
    ops.append((ops[-1][0], "replicas", 2))  # so that everything can finish
    return model, n_replicas, ops


def _fields(model: ReplicaModel) -> dict:
    return {name: getattr(model, name) for name in ReplicaModel.__dataclass_fields__}


def _drive_checking(model: ReplicaModel, n_replicas: int, ops: list[tuple]) -> tuple[list, set[str], set[str]]:
    """Run ``ops``, checking the snapshot invariants at every call and on a 1-ms grid between calls."""
    sim = BackendSim(model, replicas=n_replicas)
    events: list = []
    submitted: set[str] = set()
    aborted: set[str] = set()
    clock_ns = 0

    def check(t_ns: int) -> None:
        nonlocal events
        events += sim.advance(t_ns / NS)
        snap = sim.snapshot(t_ns / NS)
        for rep in snap.replicas:
            assert rep.running <= rep.max_num_seqs  # running never exceeds slots
            assert rep.kv_used_tokens <= model.kv_capacity_tokens  # KV used never exceeds capacity
            assert rep.running or rep.kv_used_tokens == 0
        assert snap.running <= snap.total_slots
        assert snap.kv_used_tokens <= snap.kv_capacity_tokens
        assert sum(snap.running_by_tag.values()) == snap.running
        assert sum(snap.waiting_by_tag.values()) == snap.waiting
        assert snap.running + snap.waiting == len(submitted) - len(aborted) - len(completed(events))

    for t, kind, *args in ops:
        while clock_ns + _MS <= t:
            clock_ns += _MS
            check(clock_ns)
        if kind == "submit":
            sim.submit(args[0], t / NS, args[1], args[2], tag=f"tag{len(submitted) % 2}")
            submitted.add(args[0])
        elif kind == "abort":
            if sim.abort(args[0], t / NS):
                assert args[0] not in aborted
                aborted.add(args[0])
        elif kind == "capacity":
            sim.set_capacity(args[0], t / NS)
        else:
            sim.set_replicas(args[0], t / NS)
        check(t)
    while (t_next := sim.next_event_s()) is not None:
        check(round(t_next * NS))
    return events, submitted, aborted


@settings(max_examples=100, **_SETTINGS)
@given(pool_workloads())
def test_running_stays_within_slots_and_kv_within_capacity_at_every_snapshot(workload: tuple) -> None:
    _drive_checking(*workload)


@settings(max_examples=100, **_SETTINGS)
@given(pool_workloads())
def test_every_request_is_completed_or_aborted_exactly_once(workload: tuple) -> None:
    events, submitted, aborted = _drive_checking(*workload)
    done = [e.request_id for e in completed(events)]
    assert len(done) == len(set(done))
    assert set(done) | aborted == submitted
    assert not set(done) & aborted
    firsts = [e.request_id for e in events if type(e) is FirstToken]
    assert len(firsts) == len(set(firsts))
    assert set(done) <= set(firsts)
    seen_first: set[str] = set()
    for e in events:  # a request's first token precedes its completion
        if type(e) is FirstToken:
            seen_first.add(e.request_id)
        elif type(e) is Completed:
            assert e.request_id in seen_first
    times = [e.t_s for e in events]
    assert times == sorted(times)


@settings(max_examples=100, **_SETTINGS)
@given(workloads())
def test_fifo_one_replica_without_preemption_starts_requests_in_submit_order(workload: tuple) -> None:
    model, _, ops = workload
    model = ReplicaModel(**{**_fields(model), "kv_capacity_tokens": 10_000})
    submits = [op for op in ops if op[1] == "submit"]
    events, _ = run_sim(model, 1, submits, None)
    order = {op[2]: i for i, op in enumerate(submits)}
    done = sorted(completed(events), key=lambda e: order[e.request_id])
    started = [round((e.t_s - e.e2e_s + e.queue_s) * NS) for e in done]
    assert started == sorted(started)
    assert [e.request_id for e in events if type(e) is FirstToken] == [op[2] for op in submits]


@settings(max_examples=100, **_SETTINGS)
@given(workloads())
def test_ttft_covers_the_prefill_and_one_decode_step(workload: tuple) -> None:
    model, n_replicas, ops = workload
    events, _ = run_sim(model, n_replicas, ops, None)
    for e in completed(events):
        prefill_s = e.prompt_tokens * model.prefill_s_per_token
        assert e.ttft_s >= prefill_s + decode_step_s(model, 1) - 1e-9
        assert e.e2e_s >= e.ttft_s + (e.completion_tokens - 1) * decode_step_s(model, 1) - 1e-9
        assert 0 <= e.queue_s <= e.ttft_s
