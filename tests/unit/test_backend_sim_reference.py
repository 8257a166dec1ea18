"""The bulk-stepping simulator against a naive step-by-step reference written here from the documented rules:
same calls, same events, exactly.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from hypothesis import given, settings

from tokenpools.replay.backend.model import ReplicaModel
from tokenpools.replay.backend.records import Completed, FirstToken, Preempted, PreemptionCause
from backend_sim_support import NS, SETTINGS, run_sim, workloads


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
    base = round(model.decode_step_base_s * NS)

    def per_and_pre() -> tuple[int, int]:  # a replica with fewer slots than the model's has that share of its compute
        inverse_share = max(1.0, model.max_num_seqs / slots)
        return (round(model.decode_step_per_seq_s * inverse_share * NS),
                round(model.prefill_s_per_token * inverse_share * NS))

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
        per, pre = per_and_pre()
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


@settings(max_examples=200, **SETTINGS)
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
