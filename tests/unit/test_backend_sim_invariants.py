"""Property tests of the backend simulator on named invariants: slicing, determinism, limits, conservation, FIFO."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.replay.backend.model import ReplicaModel, decode_step_s
from tokenpools.replay.backend.records import Completed, FirstToken
from tokenpools.replay.backend.simulator import BackendSim
from backend_sim_support import MS, NS, SETTINGS, completed, model_fields, pool_workloads, run_sim, workloads


@settings(max_examples=100, **SETTINGS)
@given(st.one_of(workloads(), st.deferred(lambda: pool_workloads())), st.sampled_from([1 * MS, 3 * MS, 7 * MS]))
def test_one_advance_or_many_gives_the_same_events(workload: tuple, step_ns: int) -> None:
    model, n_replicas, ops = workload
    assert run_sim(model, n_replicas, ops, advance_step_ns=step_ns) == run_sim(
        model, n_replicas, ops, advance_step_ns=None
    )


@settings(max_examples=30, **SETTINGS)
@given(workloads())
def test_same_calls_give_identical_events(workload: tuple) -> None:
    model, n_replicas, ops = workload
    assert run_sim(model, n_replicas, ops, None) == run_sim(model, n_replicas, ops, None)


@settings(max_examples=100, **SETTINGS)
@given(st.one_of(workloads(), pool_workloads()), st.sampled_from([None, 1 * MS, 3 * MS]))
def test_without_first_token_events_every_other_event_is_the_same(workload: tuple, step_ns: int | None) -> None:
    """``first_token_events=False`` (the replayer's setting) drops the FirstToken records and nothing else: the
    same completions (TTFT included), preemptions and replica events in the same order, the same abort results."""
    model, n_replicas, ops = workload
    events, aborts = run_sim(model, n_replicas, ops, step_ns)
    quiet_events, quiet_aborts = run_sim(model, n_replicas, ops, step_ns, first_token_events=False)
    assert quiet_aborts == aborts
    assert quiet_events == [e for e in events if type(e) is not FirstToken]


def _drive_checking(model: ReplicaModel, n_replicas: int, ops: list[tuple]) -> tuple[list, set[str], set[str]]:
    """Run ``ops``, checking the snapshot invariants at every call and on a 1-ms grid between calls (and that
    ``counts`` reads the same numbers as the snapshot)."""
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
        running, waiting, slots, running_by_tag, waiting_by_tag = sim.counts(t_ns / NS)  # the sample's cheap read
        assert (running, waiting, slots) == (snap.running, snap.waiting, snap.total_slots)
        assert {k: v for k, v in running_by_tag.items() if v} == snap.running_by_tag
        assert {k: v for k, v in waiting_by_tag.items() if v} == snap.waiting_by_tag

    for t, kind, *args in ops:
        while clock_ns + MS <= t:
            clock_ns += MS
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


@settings(max_examples=100, **SETTINGS)
@given(pool_workloads())
def test_running_stays_within_slots_and_kv_within_capacity_at_every_snapshot(workload: tuple) -> None:
    _drive_checking(*workload)


@settings(max_examples=100, **SETTINGS)
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


@settings(max_examples=100, **SETTINGS)
@given(workloads())
def test_fifo_one_replica_without_preemption_starts_requests_in_submit_order(workload: tuple) -> None:
    model, _, ops = workload
    model = ReplicaModel(**{**model_fields(model), "kv_capacity_tokens": 10_000})
    submits = [op for op in ops if op[1] == "submit"]
    events, _ = run_sim(model, 1, submits, None)
    order = {op[2]: i for i, op in enumerate(submits)}
    done = sorted(completed(events), key=lambda e: order[e.request_id])
    started = [round((e.t_s - e.e2e_s + e.queue_s) * NS) for e in done]
    assert started == sorted(started)
    assert [e.request_id for e in events if type(e) is FirstToken] == [op[2] for op in submits]


@settings(max_examples=100, **SETTINGS)
@given(workloads())
def test_ttft_covers_the_prefill_and_one_decode_step(workload: tuple) -> None:
    model, n_replicas, ops = workload
    events, _ = run_sim(model, n_replicas, ops, None)
    for e in completed(events):
        prefill_s = e.prompt_tokens * model.prefill_s_per_token
        assert e.ttft_s >= prefill_s + decode_step_s(model, 1) - 1e-9
        assert e.e2e_s >= e.ttft_s + (e.completion_tokens - 1) * decode_step_s(model, 1) - 1e-9
        assert 0 <= e.queue_s <= e.ttft_s
