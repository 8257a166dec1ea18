"""Mechanics of the backend simulator, pool level: the event loop, dispatch and the replicas' life cycle.

``simulator.BackendSim`` wraps this with the validated public API and documents the model; the per-replica
continuous batching is ``batching.Batching``; the records and their invariants are in
``state``. Everything here is written for speed (the replayer pushes 360k requests per simulated
hour through it): integer-ns time, ``__slots__`` records, per-replica runs of identical steps jumped over in
one go, and heaps of plain int keys rather than tuples. Superseded keys stay in the heap and are recognised
when popped.
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush, heapreplace
from typing import Final

from tokenpools.replay.backend.model import ReplicaModel
from tokenpools.replay.backend.batching import Batching
from tokenpools.replay.backend.state import (
    FIRST_TOKENS,
    LOW_BITS,
    MAX_REPLICAS,
    NS_PER_S,
    READY,
    STEP_END,
    WAITING,
    Replica,
    Request,
)
from tokenpools.replay.backend.records import FirstToken, ReplicaReady, ReplicaRetired, ReplicaState, SimEvent

_new: Final = tuple.__new__  # builds the NamedTuple events without their Python-level __new__

_STARTING: Final = ReplicaState.STARTING
_READY_STATE: Final = ReplicaState.READY
_RETIRED: Final = ReplicaState.RETIRED


class Engine(Batching):
    """The pool's state and mechanics; no validation (the public wrapper validates every input)."""

    def __init__(self, model: ReplicaModel, replicas: int, first_token_events: bool = True) -> None:
        self.model = model
        self._first_token_events = first_token_events
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
            self._rebook(r, t)  # book it into the batch of the next step boundary

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
