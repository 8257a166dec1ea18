"""Internal records of the backend simulator: one in-flight request, one replica, and the heap-key layout.

Mutable ``__slots__`` classes, private to ``engine`` and ``batching`` (the public records are in
``records``). Times are integer nanoseconds.

An internal event is the int key ``t_ns << 32 | replica_index << 2 | kind``, so ties go to the lower replica,
then to first tokens before step ends before replicas becoming ready. Invariants the engine relies on:

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
from typing import Final

from tokenpools.replay.backend.records import ReplicaState

NS_PER_S: Final = 1_000_000_000

# Internal event kinds, the low two bits of a heap key.
FIRST_TOKENS: Final = 0
STEP_END: Final = 1
READY: Final = 2
LOW_BITS: Final = 0xFFFFFFFF  # the key bits below the time
MAX_REPLICAS: Final = 1 << 30

# Request states.
UNASSIGNED: Final = 0
WAITING: Final = 1
RUNNING: Final = 2
DONE: Final = 3


class Request:
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
