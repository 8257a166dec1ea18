"""The deterministic event-time replayer: arrivals, retries, ticks and backend events in one ordered loop.

Order of simultaneous things (all at the same event time t): backend events up to and including t first (a slot
freed at t is free for a request at t), then membership and capacity changes, then the control tick, then the
metrics sample, then attempts (retries before first attempts, each in the order they were scheduled). Nothing
reads a clock and every random draw comes from a seeded generator, so the same scenario gives the same result,
decision for decision, on every run.

The loop is plain Python on purpose (no per-event polars): it runs the core's admission and window functions
once per event and keeps the results in flat lists; ``ReplayResult.frames()`` turns them into tables at the end.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from heapq import heappop, heappush
from itertools import count
from typing import Protocol

from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.replay.backend.recorded import RecordedBackend
from tokenpools.replay.backend.records import Completed, PoolSnapshot, Preempted, SimEvent
from tokenpools.replay.backend.simulator import BackendSim
from tokenpools.replay.baseline import POLICIES
from tokenpools.replay.policy import EntitlementTick, PoolTick
from tokenpools.replay.scenario import ReplayUsageError, Scenario

_CONTROL, _TICK, _SAMPLE, _ATTEMPT = 0, 1, 2, 3


class Backend(Protocol):
    """What the loop needs of a backend: ``BackendSim`` (``replay.backend=sim``) or ``RecordedBackend``."""

    def submit(self, request_id: str, now_s: float, prompt_tokens: int, output_tokens: int, tag: str) -> None: ...
    def advance(self, until_s: float) -> list[SimEvent]: ...
    def next_event_s(self) -> float | None: ...
    def abort(self, request_id: str, now_s: float) -> bool: ...
    def set_capacity(self, slots_per_replica: int, now_s: float) -> None: ...
    def set_replicas(self, n: int, now_s: float) -> None: ...
    def snapshot(self, now_s: float) -> PoolSnapshot: ...

_ADMITTED = AdmissionOutcome.ADMITTED


@dataclass(slots=True)
class Decisions:
    """One row per attempt, as columns."""

    t_s: list[float] = field(default_factory=list)
    entitlement: list[str] = field(default_factory=list)
    request_id: list[str] = field(default_factory=list)
    attempt: list[int] = field(default_factory=list)
    outcome: list[str] = field(default_factory=list)
    reason: list[str] = field(default_factory=list)
    retry_after_s: list[int] = field(default_factory=list)
    retry_after_ms: list[int] = field(default_factory=list)  # the decision's estimate (0: admitted or not retryable)
    retry_wait_s: list[float] = field(default_factory=list)  # the wait the client used before its retry; 0: none
    prompt_tokens: list[int] = field(default_factory=list)
    max_tokens: list[int] = field(default_factory=list)
    cost_tokens: list[int] = field(default_factory=list)  # n_in + the output estimate: reserved if admitted
    priority: list[float] = field(default_factory=list)


@dataclass(slots=True)
class Completions:
    """One row per admitted attempt that finished (latencies measured from its admission)."""

    request_id: list[str] = field(default_factory=list)
    entitlement: list[str] = field(default_factory=list)
    attempt: list[int] = field(default_factory=list)
    first_attempt_s: list[float] = field(default_factory=list)
    admitted_s: list[float] = field(default_factory=list)
    t_s: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    completion_tokens: list[int] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    queue_s: list[float] = field(default_factory=list)


@dataclass(slots=True)
class Samples:
    """The backend and the admission state every ``sample_s``: (t, entitlement, running, waiting, in_flight)."""

    pool: list[tuple[float, int, int, int]] = field(default_factory=list)  # t, running, waiting, total slots
    by_entitlement: list[tuple[float, str, int, int, int]] = field(default_factory=list)


@dataclass(slots=True)
class ReplayResult:
    scenario: Scenario
    policy: str
    decisions: Decisions
    completions: Completions
    samples: Samples
    entitlement_ticks: list[EntitlementTick]
    pool_ticks: list[PoolTick]
    abandoned: dict[str, int]  # gave up after max_retries refusals
    pending: dict[str, int]  # a retry was still scheduled when the load stopped
    preempted: int  # backend preemptions (KV or capacity), requeued inside the backend
    evicted: int  # preemptible requests aborted by admission for a protected one
    end_s: float


def replay(scenario: Scenario, policy_name: str = "token-pools") -> ReplayResult:
    """Run one scenario under one registered policy. Pure: the same arguments give the same result."""
    try:
        factory = POLICIES[policy_name]
    except KeyError:
        raise ReplayUsageError(f"unknown policy {policy_name!r}; registered: {sorted(POLICIES)}") from None
    params = scenario.params
    policy = factory(scenario.pool, params, scenario.origin_ms)
    model = scenario.replica_model
    sim = _backend(scenario)
    jitter = random.Random(f"{scenario.seed}:retries")
    max_retries, jitter_s = scenario.retry.max_retries, scenario.retry.jitter_s
    duration = scenario.duration_s
    specs = {e.name: e for e in scenario.entitlements}
    default_max = scenario.pool.default_max_tokens
    waiting_signal = params.backend_waiting == "tick"

    seq = count()
    heap: list[tuple] = []
    for e in scenario.entitlements:
        m = scenario.member(e.name)
        heappush(heap, (m.join_s, _CONTROL, next(seq), "join", e.name))
        if m.leave_s is not None:
            heappush(heap, (m.leave_s, _CONTROL, next(seq), "leave", e.name))
    for change in scenario.capacity_changes:
        heappush(heap, (change.t_s, _CONTROL, next(seq), "capacity", change.slots_per_replica))
    if policy.controlled:
        heappush(heap, (params.grace_s, _TICK, next(seq), "tick", 0))  # a window's tick: its end + grace
    heappush(heap, (0.0, _SAMPLE, next(seq), "sample", 0))

    dec, comp, samples = Decisions(), Completions(), Samples()
    d_t, d_ent, d_rid, d_att, d_out, d_reason = dec.t_s, dec.entitlement, dec.request_id, dec.attempt, dec.outcome, dec.reason
    d_ra, d_prompt, d_max, d_prio = dec.retry_after_s, dec.prompt_tokens, dec.max_tokens, dec.priority
    d_ra_ms, d_wait = dec.retry_after_ms, dec.retry_wait_s
    d_cost, output_reservation = dec.cost_tokens, policy.output_reservation
    in_flight: dict[str, tuple] = {}
    active: set[str] = set()
    abandoned = {e.name: 0 for e in scenario.entitlements}
    pending: dict[str, int] = {}
    preempted = evicted = 0
    admit, completed, submit, advance = policy.admit, policy.completed, sim.submit, sim.advance
    outcome_value = {o: o.value for o in AdmissionOutcome}  # (``.value`` is a Python-level property)

    c_append = (comp.request_id.append, comp.entitlement.append, comp.attempt.append, comp.first_attempt_s.append,
                comp.admitted_s.append, comp.t_s.append, comp.prompt_tokens.append, comp.completion_tokens.append,
                comp.ttft_s.append, comp.e2e_s.append, comp.queue_s.append)

    def handle(events: list) -> None:
        nonlocal preempted
        a_rid, a_ent, a_att, a_first, a_adm, a_t, a_prompt, a_out, a_ttft, a_e2e, a_queue = c_append
        for ev in events:
            cls = type(ev)
            if cls is Completed:
                ticket, ent, rid, attempt, admitted_s, first_s, _ = in_flight.pop(ev.request_id)
                completed(ticket, ev.prompt_tokens + ev.completion_tokens, ev.t_s, ev.completion_tokens)
                a_rid(rid)
                a_ent(ent)
                a_att(attempt)
                a_first(first_s)
                a_adm(admitted_s)
                a_t(ev.t_s)
                a_prompt(ev.prompt_tokens)
                a_out(ev.completion_tokens)
                a_ttft(ev.ttft_s)
                a_e2e(ev.e2e_s)
                a_queue(ev.queue_s)
            elif cls is Preempted:
                preempted += 1

    arrivals = scenario.arrivals
    n_arrivals = len(arrivals)
    i = 0
    inf = float("inf")
    while True:
        ta = arrivals[i][0] if i < n_arrivals else inf
        if heap and (heap[0][0] < ta or (heap[0][0] == ta and heap[0][1] <= _ATTEMPT)):
            t, kind, _, what, payload = heappop(heap)
        elif i < n_arrivals:
            t, kind = ta, _ATTEMPT
            what = None
            payload = arrivals[i]
            i += 1
        else:
            break
        if t > duration:
            if kind == _ATTEMPT and what is not None:
                pending[payload[0]] = pending.get(payload[0], 0) + 1
            break
        events = advance(t)
        if events:
            handle(events)
        if kind == _ATTEMPT:
            if what is None:  # a first attempt: (t, entitlement, request_id, prompt, max_tokens, output, attempt)
                _, ent, rid, prompt, max_tokens, output, attempt = payload
                first_s = t
            else:
                ent, rid, prompt, max_tokens, output, attempt, first_s = payload
            if ent not in active:
                continue  # the entitlement is not (or no longer) Bound: its client sends nothing
            attempt_id = rid if attempt == 0 else f"{rid}/{attempt}"
            d = admit(ent, attempt_id, prompt, max_tokens, t)
            outcome = d.outcome
            d_t.append(t)
            d_ent.append(ent)
            d_rid.append(rid)
            d_att.append(attempt)
            d_out.append(outcome_value[outcome])
            d_reason.append(d.reason)
            d_ra.append(d.retry_after_s)
            d_ra_ms.append(d.retry_after_ms)
            d_prompt.append(prompt)
            cap = default_max if max_tokens is None else max_tokens
            d_max.append(cap)
            if outcome is _ADMITTED:
                ticket = d.ticket
                assert ticket is not None  # (an admitted decision carries its ticket)
                d_cost.append(ticket.reserved_tokens)
                d_prio.append(ticket.priority)
                d_wait.append(0.0)
                in_flight[attempt_id] = (ticket, ent, rid, attempt, t, first_s, prompt)
                submit(attempt_id, t, prompt, output, ent)
                for victim in d.evict:  # a preemptible request makes room for a protected one
                    if sim.abort(victim.request_id, t):
                        entry = in_flight.pop(victim.request_id)
                        completed(entry[0], entry[6], t)  # charged its prompt; the streamed part is not known
                        evicted += 1
            else:
                d_cost.append(prompt + output_reservation(ent, cap))  # what it would have reserved
                d_prio.append(0.0)
                if d.retry_after_ms > 0 and attempt < max_retries:
                    # the decision's ms, as a client honouring retry-after-ms waits (the proxy sends it), plus jitter;
                    # event times are whole ms, rounded up so a retry never lands before the estimate
                    due = t + d.retry_after_ms / 1000 + (jitter.random() * jitter_s if jitter_s else 0.0)
                    t_retry = round(due, 3)
                    if t_retry < due:
                        t_retry = round(t_retry + 0.001, 3)
                    d_wait.append(t_retry - t)
                    heappush(heap, (t_retry, _ATTEMPT, next(seq), "retry",
                                    (ent, rid, prompt, max_tokens, output, attempt + 1, first_s)))
                else:
                    d_wait.append(0.0)
                    abandoned[ent] = abandoned.get(ent, 0) + 1
        elif kind == _TICK:
            snap = sim.snapshot(t)
            target = policy.tick(t, snap.waiting if waiting_signal else 0, snap.ready_replicas)
            if target is not None and target != snap.ready_replicas + snap.starting_replicas:
                sim.set_replicas(target, t)
            heappush(heap, (round(t + params.tick_s, 9), _TICK, next(seq), "tick", 0))
        elif kind == _SAMPLE:
            snap = sim.snapshot(t)
            samples.pool.append((t, snap.running, snap.waiting, snap.total_slots))
            running, waiting = snap.running_by_tag, snap.waiting_by_tag
            flight = policy.in_flight()
            for name in specs:
                samples.by_entitlement.append((t, name, running.get(name, 0), waiting.get(name, 0), flight.get(name, 0)))
            heappush(heap, (round(t + params.sample_s, 9), _SAMPLE, next(seq), "sample", 0))
        elif what == "join":
            active.add(payload)
            policy.join(specs[payload], t)
        elif what == "leave":
            active.discard(payload)
            policy.leave(payload, t)
        elif what == "capacity":
            sim.set_capacity(payload, t)
            policy.set_capacity(payload, model.max_num_seqs, sim.snapshot(t).waiting)
    # the load has stopped: let the backend finish what it holds (latencies of late requests count too)
    end_s = duration
    while (nxt := sim.next_event_s()) is not None:
        handle(advance(nxt))
        end_s = max(end_s, nxt)
    for entry in heap:
        if entry[1] == _ATTEMPT:
            ent = entry[4][0]
            pending[ent] = pending.get(ent, 0) + 1
    return ReplayResult(scenario, policy_name, dec, comp, samples, policy.entitlement_ticks, policy.pool_ticks,
                        abandoned, pending, preempted, evicted, end_s)


def _backend(scenario: Scenario) -> Backend:
    if scenario.params.backend == "recorded":
        if scenario.recording is None:
            raise ReplayUsageError(f"scenario {scenario.name}: replay.backend=recorded needs recorded service times: "
                                   "a log with request_completed rows of admitted requests (`tokenpools record` "
                                   "the completions topic); a generated scenario or a log without them has none")
        return RecordedBackend(scenario.recording, scenario.pool.replicas, scenario.replica_model.max_num_seqs)
    # (the loop uses completions and preemptions only; Completed carries the TTFT)
    return BackendSim(scenario.replica_model, replicas=scenario.pool.replicas, seed=scenario.seed,
                      first_token_events=False)
