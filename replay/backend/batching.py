"""Continuous batching on the simulated replicas: step ends, batch forming, booking, preemption, leaving.

``Batching`` is the per-replica half of the simulator's mechanics, an object of its own that ``BackendSim`` owns:
it runs every replica's batches with the pool's step timing and slots, and writes what happens into the pool's
outputs it was handed (the internal-event heap, the events out, the finished requests, the dispatch index). The
pool half (the event loop, dispatch, the replicas' life cycle, the public API) is ``simulator.BackendSim``. Written
for speed like the rest of the simulator: integer-ns time, runs of identical steps jumped over in one go. The
records and their invariants are in ``state``.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Final

from tokenpools.replay.backend.model import ReplicaModel
from tokenpools.replay.backend.records import (
    Completed,
    Preempted,
    PreemptionCause,
    ReplicaRetired,
    ReplicaState,
    SimEvent,
)
from tokenpools.replay.backend.state import (
    DONE,
    NS_PER_S,
    RUNNING,
    STEP_END,
    TIME_SHIFT,
    WAITING,
    LoadIndex,
    Replica,
    Request,
)

_new: Final = tuple.__new__  # builds the NamedTuple events without their Python-level __new__

_DRAINING: Final = ReplicaState.DRAINING
_RETIRED: Final = ReplicaState.RETIRED
_KV_EXHAUSTED: Final = PreemptionCause.KV_EXHAUSTED


class Batching:
    """Each replica's continuous batching, with the pool's step timing and slots; no validation (the public
    ``BackendSim`` validates every input)."""

    def __init__(self, model: ReplicaModel, first_token_events: bool, internal: list[int], out: list[SimEvent],
                 requests: dict[str, Request], load: LoadIndex) -> None:
        self._model = model
        self._kv_cap = model.kv_capacity_tokens
        self._preempt = model.preempt_on_kv_exhaustion
        self.slots = 0  # every replica's, changed by ``set_capacity`` (with the step timing: ``resize``)
        self._per_seq_ns = self._base_ns = self._prefill_ns = 0
        self.resize(model.max_num_seqs)
        self._first_token_events = first_token_events
        # the pool's, shared: its heap of internal-event keys, its events for the next ``advance``, every request
        # id ever submitted (None once finished), and its READY replicas by load
        self._internal = internal
        self._out = out
        self._requests = requests
        self._load = load

    def resize(self, slots: int) -> None:
        """Every replica keeps ``slots`` of the model's ``max_num_seqs`` slots and the same share of its compute: a
        replica that lost half its GPUs has half its slots, and each of its sequences decodes at the pace it had
        with the whole replica full. So the per-sequence step cost and the prefill cost per token scale by
        ``max_num_seqs / slots``; the fixed step cost stays. Tokens/s then scale with the slots, as the control
        plane's Λ_p does (docs/paper.md#the-exp-2-outage). Slots above the model's run on the same hardware (the
        model's timing, a larger batch). The KV stays whole: a request admitted while it fitted must still fit
        (else it would wait forever if the capacity never came back), and no Exp 2 batch comes near it. Steps
        already under way keep their timing; the next boundary uses the new one.
        """
        model = self._model
        inverse_share = max(1.0, model.max_num_seqs / slots)  # more slots than the model's: the same hardware
        self.slots = slots
        self._per_seq_ns = round(model.decode_step_per_seq_s * inverse_share * NS_PER_S)
        self._base_ns = max(round(model.decode_step_base_s * NS_PER_S), 1 - self._per_seq_ns)  # a step takes >= 1 ns
        self._prefill_ns = round(model.prefill_s_per_token * inverse_share * NS_PER_S)

    def step_end(self, r: Replica, t: int) -> None:
        """A run of steps ended at ``t``: retire finished sequences, preempt if KV is short, form the next batch."""
        done = r.steps_done + r.macro_steps
        r.steps_done = done
        r.busy = False  # between runs until form_batch starts the next one
        heap = r.finish_heap
        if heap and heap[0][0] <= done:
            running, requests, out = r.running, self._requests, self._out
            ts = t / NS_PER_S
            while heap and heap[0][0] <= done:
                entry = heappop(heap)
                req = entry[2]
                if req.finish != entry[0]:
                    continue  # left the batch earlier (aborted or preempted)
                rid = req.rid
                del running[rid]
                del requests[rid]
                req.finish = -1
                req.state = DONE
                prompt, output, tag, sub = req.prompt, req.output, req.tag, req.submit_ns
                r.sum_pb -= prompt - req.base
                r.reserved -= prompt + output
                req.counts[0] -= 1
                out.append(_new(Completed, (
                    rid, ts, prompt, output, (req.first_ns - sub) / NS_PER_S, (t - sub) / NS_PER_S,
                    (req.admit_ns - sub) / NS_PER_S, tag,
                )))
            self._load.push(r)
        r.batch_new = []
        if self._preempt and r.running and r.sum_pb + len(r.running) * (done + 1) > self._kv_cap:
            self._preempt_for_kv(r, t)
        self.form_batch(r, t)

    def _preempt_for_kv(self, r: Replica, t: int) -> None:
        running = r.running
        while r.sum_pb + len(running) * (r.steps_done + 1) > self._kv_cap:
            self.preempt_last(r, t, _KV_EXHAUSTED)

    def preempt_last(self, r: Replica, t: int, cause: PreemptionCause) -> None:
        """Send the most recently admitted running request back to the head of the waiting queue."""
        victim = r.running[next(reversed(r.running))]
        self.leave_batch(r, victim, t)
        victim.state = WAITING
        r.waiting.appendleft(victim)
        counts = victim.counts
        counts[0] -= 1
        counts[1] += 1
        self._out.append(_new(Preempted, (victim.rid, t / NS_PER_S, cause)))

    def form_batch(self, r: Replica, t: int) -> None:
        """At a step boundary ``t``: admit waiting requests, then schedule the run of steps that follows.

        Admission is FIFO into free slots while the KV fits (a head that does not fit blocks the queue). The
        requests admitted at ``t`` are collected in ``r.batch_new``; they are prefilled in the first step.
        """
        running, waiting = r.running, r.waiting
        b = len(running)
        steps = r.steps_done
        new = r.batch_new
        if waiting and b < self.slots:
            slots, cap, preempt = self.slots, self._kv_cap, self._preempt
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
                finish = base + output
                req.finish = finish
                heappush(r.finish_heap, (finish, req.order, req))
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
                self.retire(r, t)
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
        while top[2].finish != top[0]:
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
            if self._first_token_events:
                for req in new:
                    if req.flush is new:
                        req.first_ns = tf
                fl.append((tf, t, new))
                heappush(self._internal, (tf << TIME_SHIFT) | r.key)
            else:  # the time is all a Completed needs: no first-token batch, no internal event
                for req in new:
                    if req.flush is new:
                        req.first_ns = tf
                        req.flush = None
        heappush(self._internal, (end << TIME_SHIFT) | r.key | STEP_END)

    def kick(self, r: Replica, t: int) -> None:
        """``r`` changed at ``t``: re-form the batch of its next step boundary (booking it ahead of time)."""
        if not r.busy:
            if r.waiting:
                r.batch_new = []
                self.form_batch(r, t)
            elif r.state is _DRAINING:
                self.retire(r, t)
            return
        if not r.running and not r.waiting:  # every sequence left: the step in progress is abandoned
            r.busy = False
            r.flushes.clear()  # (their requests are gone)
            if r.state is _DRAINING:
                self.retire(r, t)
            return
        self.rebook(r, t)

    def rebook(self, r: Replica, t: int) -> None:
        """Busy ``r`` changed at ``t``: re-form the batch at its next step boundary, the one that starts the
        current run if that is still open at ``t``."""
        start = r.macro_start_ns
        if t <= start:  # the boundary that starts the current run is now or ahead: still open
            r.batch_new = r.batch_new.copy()  # the pending first-token entry keeps the old list
            self.form_batch(r, start)
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
            self.form_batch(r, boundary)

    def unbook(self, r: Replica, t: int) -> None:
        """Return the requests admitted to a batch that starts at or after ``t`` to the head of the waiting queue.

        They have not run yet (the boundary is still open at ``t``), so this is silent: no ``Preempted``.
        """
        booked = r.batch_new.copy() if r.busy and t <= r.macro_start_ns else []
        for req in reversed(booked):
            self.leave_batch(r, req, t)
            if req.admit_ns == r.macro_start_ns:
                req.admit_ns = -1  # it was not admitted after all
            req.state = WAITING
            r.waiting.appendleft(req)
            req.counts[0] -= 1
            req.counts[1] += 1

    def leave_batch(self, r: Replica, req: Request, t: int) -> None:
        """Take a running request out of the batch at ``t`` (abort or preemption), freeing slot and KV."""
        if req not in r.booked(t):
            req.generated = r.steps_completed_at(t) - req.base
        del r.running[req.rid]
        r.sum_pb -= req.prompt - req.base
        r.reserved -= req.prompt + req.output
        req.finish = -1
        if req.first_ns > t:  # its first token is not out yet (internal events at t come before a call at t)
            req.flush = None
            req.first_ns = -1
        if req in r.batch_new:
            r.batch_new.remove(req)

    def retire(self, r: Replica, t: int) -> None:
        """``r`` leaves the pool at ``t`` (drained, or cancelled while starting)."""
        r.state = _RETIRED
        self._out.append(_new(ReplicaRetired, (r.index, t / NS_PER_S)))
