"""Mechanics of the backend simulator: event loop, continuous batching, bulk stepping, dispatch, replicas.

``backend_sim.BackendSim`` wraps this with the validated public API and documents the model; the records and
their invariants are in ``backend_sim_state``. Everything here is written for speed (the replayer pushes 360k
requests per simulated hour through it): integer-ns time, ``__slots__`` records, per-replica runs of
identical steps jumped over in one go, and heaps of plain int keys rather than tuples. Superseded keys stay
in the heap and are recognised when popped.
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush, heapreplace

from tokenpools.replay.backend_model import ReplicaModel
from tokenpools.replay.backend_sim_state import (
    DONE,
    FIRST_TOKENS,
    LOW_BITS,
    MAX_REPLICAS,
    NS_PER_S,
    READY,
    RUNNING,
    STEP_END,
    WAITING,
    Replica,
    Request,
)
from tokenpools.replay.backend_sim_types import (
    Completed,
    FirstToken,
    Preempted,
    PreemptionCause,
    ReplicaReady,
    ReplicaRetired,
    ReplicaState,
    SimEvent,
)

_new = tuple.__new__  # builds the NamedTuple events without their Python-level __new__

_STARTING = ReplicaState.STARTING
_READY_STATE = ReplicaState.READY
_DRAINING = ReplicaState.DRAINING
_RETIRED = ReplicaState.RETIRED
_KV_EXHAUSTED = PreemptionCause.KV_EXHAUSTED


class Engine:
    """The pool's state and mechanics; no validation (the public wrapper validates every input)."""

    def __init__(self, model: ReplicaModel, replicas: int) -> None:
        self.model = model
        self._slots = model.max_num_seqs
        self._kv_cap = model.kv_capacity_tokens
        self._preempt = model.preempt_on_kv_exhaustion
        self._per_seq_ns = round(model.decode_step_per_seq_s * NS_PER_S)
        self._base_ns = max(round(model.decode_step_base_s * NS_PER_S), 1 - self._per_seq_ns)  # a step takes >= 1 ns
        self._prefill_ns = round(model.prefill_s_per_token * NS_PER_S)
        self._startup_ns = round(model.startup_delay_s * NS_PER_S)
        self._now_ns = 0
        self._heap: list[int] = []
        self._out: list[SimEvent] = []
        self._replicas = [Replica(i, _READY_STATE) for i in range(replicas)]
        self._load_heap = list(range(replicas))  # lazy keys (running + waiting) << 32 | index
        self._unassigned: deque[Request] = deque()
        self._requests: dict[str, Request | None] = {}  # every id ever submitted; None once finished
        self._n_submitted = 0
        self._tag_counts: dict[str, list[int]] = {}  # tag -> [running, waiting]

    # ------------------------------------------------------------------ event loop

    def _run(self, t: int) -> None:
        """Process every internal event at or before ``t``, in time order."""
        heap, reps = self._heap, self._replicas
        step_end = self._step_end
        limit = (t << 32) | LOW_BITS
        while heap and heap[0] <= limit:
            key = heappop(heap)
            tn = key >> 32
            low = key & LOW_BITS
            r = reps[low >> 2]
            kind = low & 3
            if kind == STEP_END:
                if r.busy and r.end_ns == tn:
                    step_end(r, tn)
            elif kind == FIRST_TOKENS:
                fl = r.flushes
                if fl and fl[0][0] == tn:
                    batch = fl.pop(0)[2]
                    out = self._out
                    ts = tn / NS_PER_S
                    for req in batch:
                        if req.flush is batch:
                            req.flush = None
                            out.append(_new(FirstToken, (req.rid, ts)))
            elif r.state is _STARTING and r.ready_ns == tn:
                self._replica_ready(r, tn)

    def _step_end(self, r: Replica, t: int) -> None:
        """A run of steps ended at ``t``: retire finished sequences, preempt if KV is short, form the next batch."""
        done = r.steps_done + r.macro_steps
        r.steps_done = done
        r.busy = False  # between runs until _form_batch starts the next one
        heap = r.finish_heap
        if heap and heap[0][0] <= done:
            running, requests, out = r.running, self._requests, self._out
            ts = t / NS_PER_S
            while heap and heap[0][0] <= done:
                entry = heappop(heap)
                req = entry[2]
                if req.entry is not entry:
                    continue  # left the batch earlier (aborted or preempted)
                rid = req.rid
                del running[rid]
                requests[rid] = None
                req.entry = None
                req.state = DONE
                prompt, output, tag, sub = req.prompt, req.output, req.tag, req.submit_ns
                r.sum_pb -= prompt - req.base
                r.reserved -= prompt + output
                req.counts[0] -= 1
                out.append(_new(Completed, (
                    rid, ts, prompt, output, (req.first_ns - sub) / NS_PER_S, (t - sub) / NS_PER_S,
                    (req.admit_ns - sub) / NS_PER_S, tag,
                )))
            if r.state is _READY_STATE:
                lh = self._load_heap
                heappush(lh, (len(running) + len(r.waiting)) << 32 | r.index)
                if len(lh) > 2 * len(self._replicas) + 16:
                    self._rebuild_load_heap()
        r.batch_new = []
        if self._preempt and r.running and r.sum_pb + len(r.running) * (done + 1) > self._kv_cap:
            self._preempt_for_kv(r, t)
        self._form_batch(r, t)

    def _preempt_for_kv(self, r: Replica, t: int) -> None:
        running = r.running
        while r.sum_pb + len(running) * (r.steps_done + 1) > self._kv_cap:
            self._preempt_last(r, t, _KV_EXHAUSTED)

    def _preempt_last(self, r: Replica, t: int, cause: PreemptionCause) -> None:
        """Send the most recently admitted running request back to the head of the waiting queue."""
        victim = r.running[next(reversed(r.running))]
        self._leave_batch(r, victim, t)
        victim.state = WAITING
        r.waiting.appendleft(victim)
        counts = victim.counts
        counts[0] -= 1
        counts[1] += 1
        self._out.append(_new(Preempted, (victim.rid, t / NS_PER_S, cause)))

    def _form_batch(self, r: Replica, t: int) -> None:
        """At a step boundary ``t``: admit waiting requests, then schedule the run of steps that follows.

        Admission is FIFO into free slots while the KV fits (a head that does not fit blocks the queue). The
        requests admitted at ``t`` are collected in ``r.batch_new``; they are prefilled in the first step.
        """
        running, waiting = r.running, r.waiting
        b = len(running)
        steps = r.steps_done
        new = r.batch_new
        if waiting and b < self._slots:
            slots, cap, preempt = self._slots, self._kv_cap, self._preempt
            need = r.sum_pb + b * (steps + 1)  # KV the next step allocates
            while waiting and b < slots:
                req = waiting[0]
                g, prompt, output = req.generated, req.prompt, req.output
                if preempt:
                    need += prompt + g + 1
                    if need > cap:
                        break
                elif r.reserved + prompt + output > cap:
                    break
                waiting.popleft()
                r.reserved += prompt + output
                base = steps - g
                req.base = base
                r.sum_pb += prompt - base
                entry = (base + output, req.order, req)
                req.entry = entry
                heappush(r.finish_heap, entry)
                running[req.rid] = req
                req.state = RUNNING
                if req.admit_ns < 0:
                    req.admit_ns = t
                new.append(req)
                b += 1
                counts = req.counts
                counts[0] += 1
                counts[1] -= 1
        fl = r.flushes
        if fl and fl[-1][1] == t:  # re-forming the run that starts at t: its first tokens move
            fl.pop()
        if not b:
            r.busy = False
            fl.clear()  # every request of a pending first-token batch has left
            if r.state is _DRAINING:
                self._retire(r, t)
            return
        step = self._base_ns + self._per_seq_ns * b
        first = step
        any_fresh = False
        if new:
            prefill_tokens = 0
            for req in new:
                g = req.generated
                prefill_tokens += req.prompt + g
                if not g:
                    req.flush = new  # its first token comes at the end of the first step
                    any_fresh = True
            first += self._prefill_ns * prefill_tokens
        heap = r.finish_heap
        top = heap[0]
        while top[2].entry is not top:
            heappop(heap)
            top = heap[0]
        k = top[0] - steps  # steps until the earliest completion
        if self._preempt:
            k_kv = (self._kv_cap - r.sum_pb - b * (steps + 1)) // b + 1  # steps until KV runs out
            if k_kv < k:
                k = k_kv
        r.busy = True
        r.macro_start_ns = t
        r.first_step_ns = first
        r.step_ns = step
        r.macro_steps = k
        end = t + first + (k - 1) * step
        r.end_ns = end
        if any_fresh:
            tf = t + first
            for req in new:
                if req.flush is new:
                    req.first_ns = tf
            fl.append((tf, t, new))
            heappush(self._heap, (tf << 32) | r.key)
        heappush(self._heap, (end << 32) | r.key | STEP_END)

    def _kick(self, r: Replica, t: int) -> None:
        """``r`` changed at ``t``: re-form the batch of its next step boundary (booking it ahead of time)."""
        if not r.busy:
            if r.waiting:
                r.batch_new = []
                self._form_batch(r, t)
            elif r.state is _DRAINING:
                self._retire(r, t)
            return
        if not r.running and not r.waiting:  # every sequence left: the step in progress is abandoned
            r.busy = False
            r.flushes.clear()  # (their requests are gone)
            if r.state is _DRAINING:
                self._retire(r, t)
            return
        start = r.macro_start_ns
        if t <= start:  # the boundary that starts the current run is now or ahead: still open
            r.batch_new = r.batch_new.copy()  # the pending first-token entry keeps the old list
            self._form_batch(r, start)
            return
        e1 = start + r.first_step_ns
        if t < e1:
            boundary, steps = e1, 1
        else:
            q, rem = divmod(t - e1, r.step_ns)
            if rem:
                boundary, steps = e1 + (q + 1) * r.step_ns, q + 2
            else:
                boundary, steps = t, q + 1
        if steps < r.macro_steps:  # (else the boundary ends the run and its step end will form the batch)
            r.steps_done += steps
            r.batch_new = []
            self._form_batch(r, boundary)

    def _steps_completed_at(self, r: Replica, t: int) -> int:
        """Steps ``r`` has completed by ``t`` (``t`` is before the end of its current run)."""
        if not r.busy:
            return r.steps_done
        start = r.macro_start_ns
        if t < start:  # booked ahead: the last step of the previous run is in progress
            return r.steps_done - 1
        e1 = start + r.first_step_ns
        if t < e1:
            return r.steps_done
        return r.steps_done + 1 + (t - e1) // r.step_ns

    def _booked(self, r: Replica, t: int) -> list[Request]:
        """Requests admitted to a batch that starts after ``t``: still waiting, as far as ``t`` is concerned."""
        return r.batch_new if r.busy and t < r.macro_start_ns else []

    def _unbook(self, r: Replica, t: int) -> None:
        """Return the requests admitted to a batch that starts at or after ``t`` to the head of the waiting queue.

        They have not run yet (the boundary is still open at ``t``), so this is silent: no ``Preempted``.
        """
        booked = r.batch_new.copy() if r.busy and t <= r.macro_start_ns else []
        for req in reversed(booked):
            self._leave_batch(r, req, t)
            if req.admit_ns == r.macro_start_ns:
                req.admit_ns = -1  # it was not admitted after all
            req.state = WAITING
            r.waiting.appendleft(req)
            req.counts[0] -= 1
            req.counts[1] += 1

    def _leave_batch(self, r: Replica, req: Request, t: int) -> None:
        """Take a running request out of the batch at ``t`` (abort or preemption), freeing slot and KV."""
        if req not in self._booked(r, t):
            req.generated = self._steps_completed_at(r, t) - req.base
        del r.running[req.rid]
        r.sum_pb -= req.prompt - req.base
        r.reserved -= req.prompt + req.output
        req.entry = None
        if req.flush is not None:  # its first token was not out yet
            req.flush = None
            req.first_ns = -1
        if req in r.batch_new:
            r.batch_new.remove(req)

    # ------------------------------------------------------------------ replicas and dispatch

    def _dispatch(self, req: Request, t: int) -> None:
        """Queue ``req`` on the READY replica with the fewest running + waiting (ties: lowest index)."""
        heap, reps = self._load_heap, self._replicas
        while heap:
            key = heap[0]
            r = reps[key & LOW_BITS]
            if r.state is _READY_STATE and len(r.running) + len(r.waiting) == key >> 32:
                break
            heappop(heap)
        else:
            self._unassigned.append(req)
            return
        req.replica = r
        req.state = WAITING
        waiting = r.waiting
        waiting.append(req)
        heapreplace(heap, key + (1 << 32))
        if not r.busy:
            r.batch_new = []
            self._form_batch(r, t)
        elif len(waiting) == 1 and len(r.running) < self._slots:
            # Book it into the batch of the next step boundary (``_kick``, inlined: this is the hot path).
            start = r.macro_start_ns
            if t <= start:
                r.batch_new = r.batch_new.copy()
                self._form_batch(r, start)
                return
            e1 = start + r.first_step_ns
            if t < e1:
                boundary, steps = e1, 1
            else:
                q, rem = divmod(t - e1, r.step_ns)
                if rem:
                    boundary, steps = e1 + (q + 1) * r.step_ns, q + 2
                else:
                    boundary, steps = t, q + 1
            if steps < r.macro_steps:
                r.steps_done += steps
                r.batch_new = []
                self._form_batch(r, boundary)

    def _push_load(self, r: Replica) -> None:
        if r.state is not _READY_STATE:
            return
        heap = self._load_heap
        heappush(heap, (len(r.running) + len(r.waiting)) << 32 | r.index)
        if len(heap) > 2 * len(self._replicas) + 16:
            self._rebuild_load_heap()

    def _rebuild_load_heap(self) -> None:
        """Drop the stale keys (a replica's load changed since they were pushed) now and then."""
        heap = self._load_heap
        heap[:] = [(len(x.running) + len(x.waiting)) << 32 | x.index for x in self._replicas if x.state is _READY_STATE]
        heapify(heap)

    def _add_starting_replica(self, t: int) -> None:
        if len(self._replicas) >= MAX_REPLICAS:
            raise ValueError(f"a pool holds at most {MAX_REPLICAS} replicas over its lifetime")
        r = Replica(len(self._replicas), _STARTING)
        self._replicas.append(r)
        r.ready_ns = t + self._startup_ns
        heappush(self._heap, (r.ready_ns << 32) | r.key | READY)

    def _replica_ready(self, r: Replica, t: int) -> None:
        r.state = _READY_STATE
        self._out.append(_new(ReplicaReady, (r.index, t / NS_PER_S)))
        self._push_load(r)
        pending, self._unassigned = self._unassigned, deque()
        for req in pending:  # dispatch in FIFO order; simultaneous arrivals share the step formed at t
            self._dispatch(req, t)

    def _retire(self, r: Replica, t: int) -> None:
        r.state = _RETIRED
        self._out.append(_new(ReplicaRetired, (r.index, t / NS_PER_S)))

    def _next_internal_ns(self) -> int | None:
        """Time of the next live internal event, dropping superseded heap keys on the way."""
        heap, reps = self._heap, self._replicas
        while heap:
            key = heap[0]
            t = key >> 32
            r = reps[(key & LOW_BITS) >> 2]
            kind = key & 3
            if kind == STEP_END:
                live = r.busy and r.end_ns == t
            elif kind == FIRST_TOKENS:
                fl = r.flushes
                live = bool(fl) and fl[0][0] == t
                if live and not any(req.flush is fl[0][2] for req in fl[0][2]):
                    fl.pop(0)  # every request of this batch left before its first token
                    live = False
            else:
                live = r.state is _STARTING and r.ready_ns == t
            if live:
                return t
            heappop(heap)
        return None
