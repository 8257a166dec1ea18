"""The deterministic event-time replayer: arrivals, clients, retries, ticks, the queue and backend events in one loop.

One idea: the replay's event loop; the order of simultaneous things below is the whole of its contract, so it is
one function in one module.

Order of simultaneous things (all at the same event time t): backend events up to and including t first (a slot
freed at t is free for a request at t, and the proxy's queue is drained on that release before anything else), then
membership and capacity changes, then the control tick (and a held tick's limits put in force, below), then the
queue's wake-ups, then the metrics sample, then attempts (retries and closed-loop clients' requests before open-loop
first attempts, each in the order they were scheduled). Nothing reads a clock and every random draw comes from a seeded generator, so the same scenario gives
the same result, decision for decision, on every run.

The admission queue (docs/queueing.md): a request the token-pools policy makes wait is held until ``drain`` resolves
it, which the loop calls when the live proxy does (``proxy/admission/waiting.py``): after every release (a completion or an
eviction; a preemption inside the backend frees nothing at the proxy), every limit change (a tick, a capacity
change, an entitlement joining or leaving: a spec change) and at the queue's next wake. Like the proxy's one timer
per pool, the loop keeps one pending wake, re-armed at ``next_wake_s`` after every drain and every request that
starts to wait; a wake the queue no longer names (its line was served or refreshed meanwhile) is dropped, not
drained. While anything waits, the loop steps the backend event by event, so a waiter is admitted at the completion
that frees its slot, not at the next arrival. A resolved waiter's final decision goes through the same code as an
arrival's; its row carries ``queued_s`` and its time is the final decision's.

Load: ``scenario.arrivals`` are open-loop first attempts; ``scenario.closed`` are closed-loop clients
(``load.ClosedLoad``): client i sends its first request at ``client_start_s(i)`` and its next one ``think_s``
(on the next whole ms, like retries) after the previous one ended — completed, evicted, or refused for good
(given up after its retries, or refused with no retry) — if that is before the load's ``end_s`` and the duration.
A client of an entitlement that is not Bound waits until it is (and then sends at the join); a retry of an
entitlement that is no longer Bound is not sent, which ends its request.

A recorded log (``replay.backend=recorded``) whose decisions carry ``limits_version`` says when the live proxy held
each limit update: the tick then computes at its window's end as always (the agents' part) and holds its limits
until the first recorded decision made under that update or a later one (``Recording.in_force_s``; never before an
earlier tick's), where they are put in force and the queue drained, as the proxy drains on a limit change. Without
versions, a tick's limits are in force at the tick.

The loop is plain Python on purpose (no per-event polars): it runs the core's admission and window functions
once per event and keeps the results in flat lists; ``ReplayResult.frames()`` turns them into tables at the end.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from heapq import heappop, heappush
from itertools import count
from typing import Final, Protocol

from tokenpools.core.admission import Decision
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.waiting import Waiter
from tokenpools.replay.backend.recorded import RecordedBackend
from tokenpools.replay.backend.records import Completed, PoolSnapshot, Preempted, SimEvent
from tokenpools.replay.backend.simulator import BackendSim
from tokenpools.replay.baseline import POLICIES
from tokenpools.replay.budgets import BudgetPeriod
from tokenpools.replay.load import ClosedLoad, closed_requests
from tokenpools.replay.policy import EntitlementTick, PoolTick
from tokenpools.replay.scenario import ReplayUsageError, Scenario

# the kinds of heap events, in the order of simultaneous ones (Final: compiled, constants, not dict lookups)
_CONTROL: Final = 0
_TICK: Final = 1
_WAKE: Final = 2
_SAMPLE: Final = 3
_ATTEMPT: Final = 4


class Backend(Protocol):
    """What the loop needs of a backend: ``BackendSim`` (``replay.backend=sim``) or ``RecordedBackend``."""

    def submit(self, request_id: str, now_s: float, prompt_tokens: int, output_tokens: int, tag: str) -> None: ...
    def advance(self, until_s: float) -> list[SimEvent]: ...
    def next_event_s(self) -> float | None: ...
    def abort(self, request_id: str, now_s: float) -> bool: ...
    def set_capacity(self, slots_per_replica: int, now_s: float) -> None: ...
    def set_replicas(self, n: int, now_s: float) -> None: ...
    def snapshot(self, now_s: float) -> PoolSnapshot: ...
    def counts(self, now_s: float) -> tuple[int, int, int, dict[str, int], dict[str, int]]: ...

_ADMITTED: Final = AdmissionOutcome.ADMITTED
_COMPLETED: Final = Completed  # (the classes as C statics when compiled, not looked up in the module's dict)
_PREEMPTED: Final = Preempted


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
    queued_s: list[float] = field(default_factory=list)  # how long it waited in the proxy's queue first; 0: not
    would_refuse: list[str] = field(default_factory=list)  # a shadow admission's refusal under enforce; "": none


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
    abandoned: dict[str, int]  # refused for good: gave up after its retries (or a fitted client gave up)
    pending: dict[str, int]  # a retry was still scheduled when the load stopped
    preempted: int  # backend preemptions (KV or capacity), requeued inside the backend
    evicted: int  # preemptible requests aborted by admission for a protected one
    end_s: float
    queue_outcomes: dict[str, dict[str, int]] = field(default_factory=dict)  # entitlement -> WaitOutcome -> count
    budgets: list[BudgetPeriod] = field(default_factory=list)  # every budget's periods (docs/budgets.md#replay)
    wait_starts: list[tuple[float, str, str]] = field(default_factory=list)  # (t_s, entitlement, refusal a wait began with)


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
    fitted, seed = scenario.retry.fitted, scenario.seed  # a log replay's client model (clients.py), else None
    duration = scenario.duration_s
    specs = {e.name: e for e in scenario.entitlements}
    default_max = scenario.pool.default_max_tokens
    waiting_signal = params.backend_waiting == "tick"
    # a recorded log whose decisions say which limit update the live proxy held: each tick's limits are put in force
    # when it held them (``Recording.in_force_s``), not at the tick; None: at the tick
    recording = scenario.recording if params.backend == "recorded" and scenario.recording is not None and \
        scenario.recording.held_ms else None
    in_force_s = 0.0  # when the last held tick's limits are put in force

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
    # closed-loop clients, numbered k over all loads: client k's load, its requests, which request is whose
    clients: list[ClosedLoad] = []
    streams: list[Iterator[tuple[str, int, int]]] = []
    for load in scenario.closed:
        for c in range(load.clients):
            if load.client_start_s(c) < min(load.end_s, duration):
                heappush(heap, (load.client_start_s(c), _ATTEMPT, next(seq), "closed", len(clients)))
            clients.append(load)
            streams.append(closed_requests(load, scenario.seed, c))
    closed_loop = bool(clients)
    client_of: dict[str, int] = {}  # request id -> its client, while the request lasts
    parked: dict[str, list[int]] = {}  # entitlement -> its clients waiting for it to be Bound

    dec, comp, samples = Decisions(), Completions(), Samples()
    inf = float("inf")
    d_t, d_ent, d_rid, d_att, d_out, d_reason = dec.t_s, dec.entitlement, dec.request_id, dec.attempt, dec.outcome, dec.reason
    d_ra, d_prompt, d_max, d_prio = dec.retry_after_s, dec.prompt_tokens, dec.max_tokens, dec.priority
    d_ra_ms, d_wait, d_queued = dec.retry_after_ms, dec.retry_wait_s, dec.queued_s
    d_cost = dec.cost_tokens
    in_flight: dict[str, tuple] = {}
    held: dict[str, tuple] = {}  # attempt id -> (its Waiter, ent, rid, prompt, max_tokens, output, attempt, first_s)
    # the one pending wake (the proxy's timer): its time, or inf; and its number, which a wake event in the heap must
    # carry to be drained (a re-armed timer leaves its earlier event in the heap, dropped when it comes up)
    armed_s, armed = inf, 0
    active: set[str] = set()
    abandoned = {e.name: 0 for e in scenario.entitlements}
    pending: dict[str, int] = {}
    preempted = evicted = 0
    # (policy and sim are called as policy.x(...), not through bound methods taken once: compiled, a call on a
    # TokenPoolsPolicy or a BackendSim is native, a bound method's goes through the interpreter's calling convention)
    outcome_value = {o: o.value for o in AdmissionOutcome}  # (``.value`` is a Python-level property)

    c_append = (comp.request_id.append, comp.entitlement.append, comp.attempt.append, comp.first_attempt_s.append,
                comp.admitted_s.append, comp.t_s.append, comp.prompt_tokens.append, comp.completion_tokens.append,
                comp.ttft_s.append, comp.e2e_s.append, comp.queue_s.append)

    def ended(rid: str, t: float) -> None:
        """A request is over: its closed-loop client (if it has one) sends its next one after its think time."""
        k = client_of.pop(rid, -1)
        if k < 0:
            return
        load = clients[k]
        due = t + load.think_s
        t_next = round(due, 3)
        if t_next < due:
            t_next = round(t_next + 0.001, 3)
        if t_next < load.end_s and t_next < duration:
            heappush(heap, (t_next, _ATTEMPT, next(seq), "closed", k))

    def handle(events: list) -> bool:
        """Record the backend's events; True when one released a slot at the proxy (a completion)."""
        nonlocal preempted
        a_rid, a_ent, a_att, a_first, a_adm, a_t, a_prompt, a_out, a_ttft, a_e2e, a_queue = c_append
        released = False
        for ev in events:
            cls = type(ev)
            if cls is _COMPLETED:
                done: Completed = ev  # (unpacked as a tuple: compiled, each field by name is an attribute lookup)
                attempt_id, t_s, prompt_tokens, completion_tokens, ttft_s, e2e_s, queue_s, _ = done
                ticket, ent, rid, attempt, admitted_s, first_s, _ = in_flight.pop(attempt_id)
                policy.completed(ticket, prompt_tokens + completion_tokens, t_s, completion_tokens)
                a_rid(rid)
                a_ent(ent)
                a_att(attempt)
                a_first(first_s)
                a_adm(admitted_s)
                a_t(t_s)
                a_prompt(prompt_tokens)
                a_out(completion_tokens)
                a_ttft(ttft_s)
                a_e2e(e2e_s)
                a_queue(queue_s)
                released = True
                if closed_loop:
                    ended(rid, t_s)
            elif cls is _PREEMPTED:
                preempted += 1
        return released

    def decide(t: float, d: Decision, attempt_id: str, ent: str, rid: str, prompt: int, max_tokens: int | None,
               output: int, attempt: int, first_s: float, queued_s: float) -> None:
        """Record an attempt's final decision and act on it: submit an admitted one (and evict for it), schedule a
        refused one's retry or give it up."""
        nonlocal evicted
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
        d_queued.append(queued_s)
        dec.would_refuse.append("" if d.would_refuse is None else outcome_value[d.would_refuse])  # docs/shadow.md
        cap = default_max if max_tokens is None else max_tokens
        d_max.append(cap)
        if outcome is _ADMITTED:
            ticket = d.ticket
            assert ticket is not None  # (an admitted decision carries its ticket)
            d_cost.append(ticket.reserved_tokens)
            d_prio.append(ticket.priority)
            d_wait.append(0.0)
            in_flight[attempt_id] = (ticket, ent, rid, attempt, t, first_s, prompt)
            sim.submit(attempt_id, t, prompt, output, ent)
            for victim in d.evict:  # a preemptible request makes room for a protected one
                if sim.abort(victim.request_id, t):
                    entry = in_flight.pop(victim.request_id)
                    policy.completed(entry[0], entry[6], t)  # charged its prompt; the streamed part is not known
                    evicted += 1
                    if closed_loop:
                        ended(entry[2], t)
        else:
            d_cost.append(prompt + policy.output_reservation(ent, cap))  # what it would have reserved
            d_prio.append(0.0)
            delay_ms = -1  # a fitted client's wait (ms), -1: it gives up; else the policy's rule below
            if fitted is not None:
                wait_ms = fitted.retry_delay_ms(ent, rid, attempt, d.retry_after_ms, seed)
                delay_ms = -1 if wait_ms is None else wait_ms
            if fitted is not None and delay_ms >= 0:
                # the fitted client's wait, on the nearest whole ms, never before the refusal
                t_retry = round(t + delay_ms / 1000, 3)
                if t_retry < t:
                    t_retry = round(t_retry + 0.001, 3)
                d_wait.append(t_retry - t)
                heappush(heap, (t_retry, _ATTEMPT, next(seq), "retry",
                                (ent, rid, prompt, max_tokens, output, attempt + 1, first_s)))
            elif fitted is None and d.retry_after_ms > 0 and attempt < max_retries:
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
                if closed_loop:
                    ended(rid, t)

    def resolve(waiters: list[Waiter], t: float) -> None:
        for w in waiters:
            _, ent, rid, prompt, max_tokens, output, attempt, first_s = held.pop(w.request_id)
            decide(t, w.decision, w.request_id, ent, rid, prompt, max_tokens, output, attempt, first_s, w.waited_s)

    def arm(t: float) -> None:
        """Re-arm the one pending wake at the queue's next wake, as the proxy re-arms its pool's timer (a wake
        already due fires at once, at ``t``)."""
        nonlocal armed_s, armed
        due = policy.next_wake_s() if held else None
        if due is None:
            due = inf
        elif due < t:
            due = t
        if due != armed_s:  # cancel the pending one (its event is dropped when it comes up), arm at due
            armed_s = due
            armed += 1
            if due < inf:
                heappush(heap, (due, _WAKE, next(seq), "wake", armed))

    def drain(t: float) -> None:
        """The proxy's drain after a release or a limit change, until no eviction frees anything more."""
        while True:
            before = evicted
            resolve(policy.drain(t), t)
            if evicted == before or not held:
                break
        arm(t)

    arrivals = scenario.arrivals
    n_arrivals = len(arrivals)
    i = 0
    t = 0.0
    while True:
        ta = arrivals[i][0] if i < n_arrivals else inf
        if held or closed_loop:  # step the backend event by event: releases drain the queue, end clients' requests
            tb = sim.next_event_s()
            if tb is not None and tb <= duration and tb < ta and (not heap or tb < heap[0][0]):
                t = tb
                events = sim.advance(t)
                if events and handle(events) and held:
                    drain(t)
                continue
        if heap and (heap[0][0] < ta or (heap[0][0] == ta and heap[0][1] <= _ATTEMPT)):
            t, kind, _, what, payload = heappop(heap)
            if kind == _WAKE and payload != armed:  # a timer re-armed since: the proxy cancelled it
                continue
        elif i < n_arrivals:
            t, kind = ta, _ATTEMPT
            what = None
            payload = arrivals[i]
            i += 1
        else:
            break
        if t > duration:
            if what == "retry":
                pending[payload[0]] = pending.get(payload[0], 0) + 1
            break
        events = sim.advance(t)
        if events and handle(events) and held:
            drain(t)
        if kind == _ATTEMPT:
            if what is None:  # a first attempt: (t, entitlement, request_id, prompt, max_tokens, output, attempt)
                _, ent, rid, prompt, max_tokens, output, attempt = payload
                first_s = t
            elif what == "retry":
                ent, rid, prompt, max_tokens, output, attempt, first_s = payload
                if ent not in active:  # its entitlement is no longer Bound: the client does not retry
                    if closed_loop:
                        ended(rid, t)
                    continue
            else:  # a closed-loop client's next request
                load = clients[payload]
                ent = load.entitlement
                if ent not in active:  # it waits for its entitlement to be Bound
                    parked.setdefault(ent, []).append(payload)
                    continue
                rid, prompt, output = next(streams[payload])
                client_of[rid] = payload
                max_tokens, attempt, first_s = load.max_tokens, 0, t
            if ent not in active:
                continue  # the entitlement is not (or no longer) Bound: its client sends nothing
            attempt_id = rid if attempt == 0 else f"{rid}/{attempt}"
            d = policy.admit(ent, attempt_id, prompt, max_tokens, t)
            if isinstance(d, Waiter):  # the proxy holds it: its decision comes from a drain
                held[attempt_id] = (d, ent, rid, prompt, max_tokens, output, attempt, first_s)
                arm(t)  # its deadline (or its line's refill) may come before the pending wake
                continue
            before = evicted
            decide(t, d, attempt_id, ent, rid, prompt, max_tokens, output, attempt, first_s, 0.0)
            if held and evicted != before:
                drain(t)
        elif kind == _WAKE:
            armed_s = inf
            drain(t)
        elif kind == _TICK and what == "in force":  # a held tick's limits reach the proxy
            policy.put_in_force(t)
            if held:
                drain(t)
        elif kind == _TICK:
            snap = sim.snapshot(t)
            if recording is None:
                target = policy.tick(t, snap.waiting if waiting_signal else 0, snap.ready_replicas)
            else:  # held until the recorded decisions say the live proxy had them (never before an earlier tick's)
                target = policy.tick(t, snap.waiting if waiting_signal else 0, snap.ready_replicas, True)
                due = recording.in_force_s(t - params.grace_s)
                in_force_s = max(t, in_force_s) if due is None else max(t, due, in_force_s)
                heappush(heap, (in_force_s, _TICK, next(seq), "in force", 0))
            if target is not None and target != snap.ready_replicas + snap.starting_replicas:
                sim.set_replicas(target, t)
            heappush(heap, (round(t + params.tick_s, 9), _TICK, next(seq), "tick", 0))
            if held and recording is None:
                drain(t)
        elif kind == _SAMPLE:
            n_running, n_waiting, slots, running, waiting = sim.counts(t)
            samples.pool.append((t, n_running, n_waiting, slots))
            flight = policy.in_flight()
            for name in specs:
                samples.by_entitlement.append((t, name, running.get(name, 0), waiting.get(name, 0), flight.get(name, 0)))
            heappush(heap, (round(t + params.sample_s, 9), _SAMPLE, next(seq), "sample", 0))
        elif what == "join":
            active.add(payload)
            policy.join(specs[payload], t)
            for k in parked.pop(payload, ()):  # its clients that were waiting for it send now
                if t < clients[k].end_s:
                    heappush(heap, (t, _ATTEMPT, next(seq), "closed", k))
            if held:  # the proxy drains after every spec change it puts in force
                drain(t)
        elif what == "leave":
            active.discard(payload)
            resolve(policy.leave(payload, t), t)  # its waiters are refused as not Bound
            if held:
                drain(t)
            else:
                arm(t)
        elif what == "capacity":
            sim.set_capacity(payload, t)
            policy.set_capacity(payload, model.max_num_seqs, sim.snapshot(t).waiting)
            if held:
                drain(t)
    # the load has stopped: the backend finishes what it holds (latencies of late requests count too) and the
    # queue resolves its waiters, at a release or at a wake (a retry they are refused into comes too late: pending)
    end_s = duration
    while True:
        tb = sim.next_event_s()
        tw = armed_s if held else inf
        if tb is None and tw == inf:
            break
        t = tw if tb is None or tw <= tb else tb
        woken = t == tw
        if woken:
            armed_s = inf
        events = sim.advance(t)
        released = bool(events) and handle(events)
        if held and (released or woken):
            drain(t)
        end_s = max(end_s, t)
    for entry in heap:
        if entry[1] == _ATTEMPT and entry[3] == "retry":
            ent = entry[4][0]
            pending[ent] = pending.get(ent, 0) + 1
    return ReplayResult(scenario, policy_name, dec, comp, samples, policy.entitlement_ticks, policy.pool_ticks,
                        abandoned, pending, preempted, evicted, end_s, policy.queue_outcomes, policy.budget_periods(),
                        policy.wait_starts)


def _backend(scenario: Scenario) -> BackendSim | RecordedBackend:
    """The scenario's backend. Each is a ``Backend``; the union is the return type so that, compiled, the loop's calls
    on a ``BackendSim`` are native."""
    if scenario.params.backend == "recorded":
        if scenario.recording is None:
            raise ReplayUsageError(f"scenario {scenario.name}: replay.backend=recorded needs recorded service times: "
                                   "a log with request_completed rows of admitted requests (`tokenpools record` "
                                   "the completions topic); a generated scenario or a log without them has none")
        return RecordedBackend(scenario.recording, scenario.pool.replicas, scenario.replica_model.max_num_seqs)
    # (the loop uses completions and preemptions only; Completed carries the TTFT)
    return BackendSim(scenario.replica_model, replicas=scenario.pool.replicas, seed=scenario.seed,
                      first_token_events=False)
