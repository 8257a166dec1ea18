"""The backend simulator's internal state: one in-flight request, one replica, the dispatch index, the key layout.

Mutable ``__slots__`` classes, private to ``simulator`` and ``batching`` (the public records are in
``records``). Times are integer nanoseconds.

An internal event is the int key ``t_ns << TIME_SHIFT | replica_index << 2 | kind``, so ties go to the lower
replica, then to first tokens before step ends before replicas becoming ready. ``TIME_SHIFT`` is 18 bits (at most
``MAX_REPLICAS`` = 65,536 replicas over a pool's life): a key stays below 2^62, a compiled build's native int, for
the first 2^44 ns (4.9 h) of a run, and is exact, only slower, after that. Invariants the simulator relies on:

* while a replica is busy, its current run started at ``macro_start_ns``; its first step lasts
  ``first_step_ns`` (prefills included) and each further step ``step_ns``; the run ends after ``macro_steps``
  steps, at ``end_ns`` (a step-end key is live iff the replica is busy and its time equals ``end_ns``);
* ``flushes`` holds the replica's pending first-token batches ``(t_ns, run_start_ns, requests)`` in time
  order (at most two: the previous run's and the current run's); a request is in one iff its ``flush`` is
  that list. Without first-token events both stay empty; either way a request's first token is out at ``t``
  iff ``0 <= first_ns <= t``;
* a running request has produced ``replica.steps_done - request.base`` tokens at the start of the run, and its
  live completion-heap entry is the one whose steps count is ``request.finish`` (-1 while it has none; stale
  entries are skipped lazily). An entry is recognised by value, not identity, so the compiled build (mypyc keeps
  fixed-shape tuples unboxed) behaves like the pure one; a stale entry that equals the live one is the same
  completion at the same step, so whichever of the two is popped first is the one counted;
* ``sum_pb = sum(prompt - base)`` over running requests, so the KV the next step allocates is
  ``sum_pb + B * (steps_done + 1)`` = sum(prompt + generated + 1).
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush, heapreplace
from typing import Final

from tokenpools.replay.backend.records import ReplicaState

NS_PER_S: Final = 1_000_000_000

# Internal event kinds, the low two bits of a heap key.
FIRST_TOKENS: Final = 0
STEP_END: Final = 1
READY: Final = 2
TIME_SHIFT: Final = 18  # the key bits below the time
LOW_BITS: Final = (1 << TIME_SHIFT) - 1
MAX_REPLICAS: Final = 1 << (TIME_SHIFT - 2)

_READY_STATE: Final = ReplicaState.READY

# Request states.
UNASSIGNED: Final = 0
WAITING: Final = 1
RUNNING: Final = 2
DONE: Final = 3


class Request:
    """One submitted request, from its submission until it completes or is aborted."""

    __slots__ = (
        "rid", "order", "prompt", "output", "tag", "submit_ns", "admit_ns", "first_ns",
        "generated", "base", "state", "replica", "finish", "flush", "counts",
    )

    def __init__(
        self, rid: str, order: int, prompt: int, output: int, tag: str, submit_ns: int, counts: list[int]
    ) -> None:
        self.rid = rid
        self.order = order
        self.prompt = prompt
        self.output = output
        self.tag = tag
        self.submit_ns = submit_ns
        self.admit_ns = -1  # first time it was scheduled into a batch
        self.first_ns = -1  # time of its first output token, once the step producing it is under way
        self.generated = 0  # tokens produced when it last left a batch (preempted)
        self.base = 0  # while running: generated = replica.steps_done - base
        self.state = UNASSIGNED
        self.replica: Replica | None = None
        self.finish = -1  # steps_done at which its live completion-heap entry fires (-1: none)
        self.flush: list | None = None  # the pending first-token batch it belongs to
        self.counts = counts  # its tag's [running, waiting] counters, shared by the tag's requests


class Replica:
    """One replica: its running batch and waiting queue, and the run of identical steps it is in."""

    __slots__ = (
        "index", "state", "running", "waiting", "steps_done", "sum_pb", "reserved", "finish_heap",
        "busy", "macro_start_ns", "first_step_ns", "step_ns", "macro_steps", "end_ns", "batch_new", "flushes",
        "ready_ns", "key",
    )

    def __init__(self, index: int, state: ReplicaState) -> None:
        self.index = index
        self.state = state
        self.running: dict[str, Request] = {}  # insertion order = admission order
        self.waiting: deque[Request] = deque()
        self.steps_done = 0  # steps completed before the current run
        self.sum_pb = 0
        self.reserved = 0  # sum(prompt + output) over running (reservation mode)
        self.finish_heap: list[tuple[int, int, Request]] = []  # (steps_done at completion, order, request)
        self.busy = False
        self.macro_start_ns = 0
        self.first_step_ns = 0
        self.step_ns = 0
        self.macro_steps = 0
        self.end_ns = 0
        self.batch_new: list[Request] = []  # admitted at macro_start_ns, prefilled in its first step
        self.flushes: list[tuple[int, int, list[Request]]] = []
        self.ready_ns = 0
        self.key = index << 2  # low bits of its heap keys

    def steps_completed_at(self, t: int) -> int:
        """Steps completed by ``t`` (``t`` is before the end of the current run)."""
        if not self.busy:
            return self.steps_done
        start = self.macro_start_ns
        if t < start:  # booked ahead: the last step of the previous run is in progress
            return self.steps_done - 1
        e1 = start + self.first_step_ns
        if t < e1:
            return self.steps_done
        return self.steps_done + 1 + (t - e1) // self.step_ns

    def booked(self, t: int) -> list[Request]:
        """Requests admitted to a batch that starts after ``t``: still waiting, as far as ``t`` is concerned."""
        return self.batch_new if self.busy and t < self.macro_start_ns else []


class LoadIndex:
    """The READY replicas by load (running + waiting), for dispatch: a heap of int keys ``load << 32 | index``.

    A replica whose load changed is pushed again; a key whose load is no longer its replica's (or whose replica is
    no longer READY) is stale: dropped when it reaches the top, and all of them once they outnumber the replicas.
    """

    __slots__ = ("_heap", "_replicas")

    def __init__(self, replicas: list[Replica]) -> None:
        self._replicas = replicas  # the pool's replicas by index (the list grows, it is never reordered)
        self._heap = [r.index for r in replicas]  # every replica at load 0 (a sorted list is a heap)

    def least_loaded(self) -> Replica | None:
        """The READY replica with the fewest running + waiting requests (ties: lowest index); None if none is."""
        heap, reps = self._heap, self._replicas
        while heap:
            key = heap[0]
            r = reps[key & LOW_BITS]
            if r.state is _READY_STATE and len(r.running) + len(r.waiting) == key >> 32:
                return r
            heappop(heap)
        return None

    def took_one(self) -> None:
        """The replica ``least_loaded`` returned was given one request: its key (still on top) counts one more."""
        heap = self._heap
        heapreplace(heap, heap[0] + (1 << 32))

    def push(self, r: Replica) -> None:
        """``r``'s load changed (or it became READY): key it by its load now."""
        if r.state is not _READY_STATE:
            return
        heap = self._heap
        heappush(heap, (len(r.running) + len(r.waiting)) << 32 | r.index)
        if len(heap) > 2 * len(self._replicas) + 16:
            ready = [x for x in self._replicas if x.state is _READY_STATE]
            heap[:] = [(len(x.running) + len(x.waiting)) << 32 | x.index for x in ready]
            heapify(heap)
