"""Deterministic discrete-event model of a pool of vLLM replicas (continuous batching, slots, KV, queue).

Used by the offline replayer and the paper's experiments to answer "what would the backend
have done": TTFT, end-to-end latency, queueing, running/waiting counts. Pure: no I/O, no clock (every call
takes the event time ``now_s``), no randomness. The calibration lives in ``model.ReplicaModel``.

Modelling choices (the paper does not describe its backend beyond "16 slots, ~240 tokens/s"):

* **Time** is kept in integer nanoseconds. Inputs are rounded to the nearest ns, model durations are
  quantised to whole ns once, and event times are ``ns / 1e9`` (an event time passed back as ``now_s``
  maps to the same ns for runs up to ~46 days). Integer time makes bulk stepping exact, so the results
  cannot depend on how a caller slices ``advance()``.
* **Simultaneity.** Internal events at time t (step ends, first tokens, replicas becoming ready) happen
  before a call made at t, but a step boundary at t stays open to what happens at t: requests arriving at t
  join the batch formed at t (16 requests submitted at the same instant to an idle replica share one prefill
  step), an abort or capacity change at t re-forms it. Hence calling ``advance(t)`` before a call at t, or
  not, gives identical results, and so does slicing ``advance`` finer or coarser.
* **Dispatch**: a new request goes to the READY replica with the fewest running + waiting requests, ties to
  the lowest index. With no READY replica it waits in a pool-level FIFO until one becomes ready.
* **Continuous batching**, per replica, at every step boundary: (1) sequences that produced their last token
  leave and free their slot and KV; (2) KV preemption, if needed (below); (3) waiting requests are admitted in
  FIFO order while a slot is free and their KV fits; a head that does not fit blocks the queue (vLLM does not
  skip it); (4) the step runs for ``base + per_seq * B`` seconds plus, with no chunked prefill,
  ``prefill_s_per_token`` times the prompt tokens of every sequence scheduled in this step: the whole batch
  waits for the new prefills. Every sequence in the batch emits one token at the end of each step, so a new
  request's first token (TTFT) is at the end of the step that prefilled it.
* **KV** is counted in tokens: a sequence with g generated tokens holds ``prompt + g + 1`` during a step
  (its context plus the token being written). With ``preempt_on_kv_exhaustion`` (vLLM recompute preemption),
  when the next step would exceed capacity the most recently admitted running sequence goes back to the head
  of the waiting queue, repeatedly until the batch fits; it frees all its KV, keeps the tokens it already
  streamed, and on readmission re-prefills ``prompt + g`` tokens before generating again. Without it,
  admission reserves ``prompt + output`` tokens, so the cache can never run out. Either way a request whose
  ``prompt + output`` exceeds a replica's capacity is refused at ``submit``. ``kv_used_tokens`` reports what
  is allocated (``prompt + g + 1`` per running sequence), the quantity behind vLLM's KV usage gauge.
* **Bulk stepping.** While a batch is unchanged its step time is constant, so the simulator jumps straight to
  the next change: the earliest completion, or the step at which KV would run out. A request that arrives
  mid-step on a replica with a free slot is booked at once into the batch of the next boundary (the run is
  cut there); until that boundary it is reported as waiting and holds no KV. Work is O(batch changes), not
  O(tokens).
* **abort** frees the slot and KV at once; the step in progress keeps its duration (a GPU step is not
  cancelled) and the batch is re-formed at its end. If nothing is left on the replica, running or waiting,
  the step is abandoned and the replica is idle at once. Returns False for unknown or finished requests.
* **set_capacity** (the Exp-2 outage: 16 -> 8 slots) applies to every replica at once, and to replicas
  started later. The compute goes with the slots: a replica left with n of its ``max_num_seqs`` slots keeps
  n / ``max_num_seqs`` of it (a GPU node of the replica failed), so each sequence decodes at the pace it had with
  the whole replica full and tokens/s scale with the slots, as the control plane's Λ_p does
  (``Batching.resize``; the live stack's outage stops half its simulators). It is not vLLM restarted with fewer
  slots on the same GPU, where a smaller batch steps faster (Exp 2: 8 sequences would move ~322 tokens/s, not
  240; a ``ReplicaModel`` with fewer ``max_num_seqs`` models that). The KV stays whole (``Batching.resize``
  says why). vLLM never runs more sequences than its slots, so running sequences above the new limit are
  preempted immediately, most recently admitted first, exactly like KV preemption
  (``Preempted(cause=CAPACITY_REDUCED)``); requests booked into a step that has not started yet just go back
  to the head of the queue, without an event. Raising the limit admits waiting requests at the next boundary.
* **set_replicas**: replicas are never renumbered. Scale-up adds STARTING replicas that become READY after
  ``startup_delay_s`` (``ReplicaReady``); the initial replicas are READY at t = 0 without an event.
  Scale-down first cancels STARTING replicas (newest first), then drains READY ones from the highest index: a
  draining replica takes no new requests, finishes everything already dispatched to it (running and
  waiting), and is then RETIRED (``ReplicaRetired``).
* **Limits**: ``output_tokens`` must be >= 1 (an OpenAI request produces at least one token); a request
  completes after exactly ``output_tokens`` tokens (the caller passes the realised length, <= max_tokens).
  A request id must not be that of a request still in the pool (one that finished or was aborted is forgotten:
  a pool that remembered every id it ever served spent a twentieth of a long replay looking them up).
* **Observation**: ``snapshot`` reports what vLLM's ``/metrics`` would (num_requests_running/waiting, KV usage),
  per replica and summed, plus per-tag running/waiting counts (a tag is the caller's label, e.g. the
  entitlement). ``next_event_s`` tells a driver when to call ``advance`` next, so it can interleave its own
  arrivals with the simulator's steps exactly. Events are ordered by time, then replica index, then first
  tokens before completions; completions at one boundary in submission order. ``first_token_events=False``
  leaves ``FirstToken`` out (every other event, ``Completed.ttft_s`` included, is the same): a driver that
  only needs completions, like the replayer, saves an internal event per batch that prefills a new request.
* **Types at the boundary.** The public methods validate their arguments themselves, so the parameters they
  check are annotated ``object``: compiled by mypyc (``scripts/build-accel.sh``), a ``float`` or ``int``
  annotation would make the compiled entry point convert an int or a bool silently, or raise ``TypeError``
  before the clear ``ValueError``, and pure and compiled builds must behave alike.
* **Determinism**: same calls, same events. The model draws no random numbers; ``seed`` seeds a
  ``random.Random`` owned by the simulator so the constructor stays stable if stochastic step times are added.

The code is written for speed (the replayer pushes 360k requests per simulated hour through it): integer-ns time,
``__slots__`` records (``state``, with the invariants the code relies on), runs of identical steps jumped over in
one go, and heaps of plain int keys rather than tuples (superseded keys stay in a heap and are recognised when
popped). ``BackendSim`` is the pool; each replica's continuous batching is the ``batching.Batching`` it owns.
"""

from __future__ import annotations

import math
import random
from collections import deque
from heapq import heappop, heappush
from types import MappingProxyType
from typing import Final

from tokenpools.core.rounding import round_half_even
from tokenpools.replay.backend.batching import Batching
from tokenpools.replay.backend.model import ReplicaModel
from tokenpools.replay.backend.records import (
    FirstToken,
    PoolSnapshot,
    PreemptionCause,
    ReplicaReady,
    ReplicaSnapshot,
    ReplicaState,
    SimEvent,
)
from tokenpools.replay.backend.state import (
    DONE,
    FIRST_TOKENS,
    LOW_BITS,
    MAX_REPLICAS,
    NS_PER_S,
    READY,
    STEP_END,
    TIME_SHIFT,
    UNASSIGNED,
    WAITING,
    LoadIndex,
    Replica,
    Request,
)

__all__ = ["BackendSim"]

_new: Final = tuple.__new__  # builds the NamedTuple events without their Python-level __new__

_STARTING: Final = ReplicaState.STARTING
_READY_STATE: Final = ReplicaState.READY
_DRAINING: Final = ReplicaState.DRAINING
_RETIRED: Final = ReplicaState.RETIRED
_CAPACITY_REDUCED: Final = PreemptionCause.CAPACITY_REDUCED
_FAST_MAX_S: Final = 1e9  # plain non-negative float times below this (~31 years) skip the slow validation path


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"`{name}` must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"`{name}` must be {'positive' if minimum else 'non-negative'}, got {value}")
    return int(value)


class BackendSim:
    """A pool of simulated vLLM replicas driven in event time. See the module docstring for the model.

    Every method that takes ``now_s``/``until_s`` first runs the pool up to that time; times must never go
    back. Events produced along the way are buffered and returned, in time order, by ``advance``. The pool's
    own mechanics (the event loop, dispatch, the replicas' life cycle) are here; each replica's continuous
    batching is its ``Batching``.
    """

    def __init__(self, model: object = None, replicas: object = 1, seed: int | float | str | bytes | None = 0,
                 first_token_events: object = True) -> None:
        model = model if model is not None else ReplicaModel()
        if not isinstance(model, ReplicaModel):
            raise ValueError(f"`model` must be a ReplicaModel, got {model!r}")
        if not isinstance(first_token_events, bool):
            raise ValueError(f"`first_token_events` must be a bool, got {first_token_events!r}")
        n = _check_count("replicas", replicas, 0)
        self.model = model
        self._kv_cap = model.kv_capacity_tokens
        self._startup_ns = round(model.startup_delay_s * NS_PER_S)
        self._now_ns = 0
        self._internal: list[int] = []  # internal-event keys (``state``), superseded ones dropped when met
        self._out: list[SimEvent] = []  # the events the next ``advance`` returns
        self._replicas = [Replica(i, _READY_STATE) for i in range(n)]
        self._load = LoadIndex(self._replicas)
        self._unassigned: deque[Request] = deque()  # waiting while no replica is READY
        self._requests: dict[str, Request] = {}  # the requests in the pool (running or waiting) by id
        self._n_submitted = 0
        self._tag_counts: dict[str, list[int]] = {}  # tag -> [running, waiting]
        self._batching = Batching(model, first_token_events, self._internal, self._out, self._requests, self._load)
        self._rng = random.Random(seed)

    # ------------------------------------------------------------------ requests

    def submit(
        self, request_id: object, now_s: object, prompt_tokens: object, output_tokens: object, tag: object = ""
    ) -> None:
        """Hand a request to the pool at ``now_s``; it is dispatched at once to the least-loaded READY replica.

        ``request_id`` and ``tag`` are str, the token counts int (``prompt_tokens >= 0``, ``output_tokens >= 1``,
        their sum within one replica's KV cache) and ``now_s`` a float or int; anything else is a ValueError.
        """
        if (
            type(request_id) is str
            and type(tag) is str
            and type(prompt_tokens) is int
            and type(output_tokens) is int
            and prompt_tokens >= 0
            and output_tokens >= 1
            and prompt_tokens + output_tokens <= self._kv_cap
            and request_id not in self._requests
        ):
            rid, label, prompt, output = request_id, tag, prompt_tokens, output_tokens
        else:
            rid, label, prompt, output = self._check_request(request_id, prompt_tokens, output_tokens, tag)
        t = self._enter(now_s)
        self._n_submitted += 1
        counts = self._tag_counts.get(label)
        if counts is None:
            counts = self._tag_counts[label] = [0, 0]
        counts[1] += 1
        req = self._requests[rid] = Request(rid, self._n_submitted, prompt, output, label, t, counts)
        self._dispatch(req, t)

    def abort(self, request_id: object, now_s: object) -> bool:
        """Drop a request at ``now_s``, freeing its slot and KV at once. True if it was running or waiting
        (False for an unknown or finished id, whatever its type)."""
        t = self._enter(now_s)
        req = self._requests.get(request_id) if isinstance(request_id, str) else None
        if req is None:
            return False
        del self._requests[req.rid]
        r = req.replica
        if req.state == UNASSIGNED:
            self._unassigned.remove(req)
            req.counts[1] -= 1
        elif req.state == WAITING:
            assert r is not None
            was_head = r.waiting[0] is req
            r.waiting.remove(req)
            req.counts[1] -= 1
            self._load.push(r)
            if was_head and r.waiting and len(r.running) < self._batching.slots:
                self._batching.kick(r, t)
        else:
            assert r is not None
            self._batching.leave_batch(r, req, t)
            req.counts[0] -= 1
            self._load.push(r)
            self._batching.kick(r, t)
        req.state = DONE
        return True

    # ------------------------------------------------------------------ capacity

    def set_capacity(self, max_num_seqs_per_replica: object, now_s: object) -> None:
        """Set every replica's slots at ``now_s``, and its compute with them: a replica with n of its model's
        ``max_num_seqs`` slots keeps n / ``max_num_seqs`` of its compute (``Batching.resize``: the Exp-2 outage is
        half the hardware failing, as in the live stack, not vLLM restarted with fewer slots on the same GPU).
        Running sequences above the limit are preempted at once."""
        new = _check_count("max_num_seqs_per_replica", max_num_seqs_per_replica, 1)
        t = self._enter(now_s)
        batching = self._batching
        batching.resize(new)
        for r in self._replicas:
            if r.state is _STARTING or r.state is _RETIRED:
                continue
            batching.unbook(r, t)  # requests booked for the next step have not run yet: they just wait again
            excess = len(r.running) - new
            for _ in range(excess):
                batching.preempt_last(r, t, _CAPACITY_REDUCED)
            if r.busy or r.waiting:
                batching.kick(r, t)

    def set_replicas(self, n: object, now_s: object) -> None:
        """Scale to ``n`` STARTING + READY replicas at ``now_s`` (start up new ones, or cancel/drain)."""
        target = _check_count("n", n, 0)
        t = self._enter(now_s)
        active = [r for r in self._replicas if r.state is _STARTING or r.state is _READY_STATE]
        for _ in range(target - len(active)):
            self._add_starting_replica(t)
        surplus = len(active) - target
        if surplus <= 0:
            return
        newest_first = sorted(active, key=lambda r: (r.state is _READY_STATE, -r.index))  # STARTING ones first
        for r in newest_first[:surplus]:
            if r.state is _STARTING or (not r.busy and not r.waiting):
                self._batching.retire(r, t)
            else:
                r.state = _DRAINING

    # ------------------------------------------------------------------ time and observation

    def advance(self, until_s: object) -> list[SimEvent]:
        """Run the pool up to and including ``until_s``; return the events since the last call, in time order."""
        self._enter(until_s)
        out = self._out.copy()
        self._out.clear()  # (the list is shared with the batching: emptied, not replaced)
        return out

    def next_event_s(self) -> float | None:
        """When ``advance`` next has something to do: the time of the next internal event (a step end, a first
        token, a replica becoming ready), or the current time if events produced by earlier calls are still
        undelivered. None when the pool is idle."""
        if self._out:
            return self._now_ns / NS_PER_S
        t = self._next_internal_ns()
        return None if t is None else t / NS_PER_S

    def snapshot(self, now_s: object) -> PoolSnapshot:
        """The pool at ``now_s``: running/waiting counts, per-tag running, KV use, replicas and slots."""
        t = self._enter(now_s)
        slots, cap = self._batching.slots, self._kv_cap
        running_by_tag = {tag: c[0] for tag, c in self._tag_counts.items()}
        waiting_by_tag = {tag: c[1] for tag, c in self._tag_counts.items()}
        reps = []
        for r in self._replicas:
            b = len(r.running)
            kv = r.sum_pb + b * (r.steps_completed_at(t) + 1) if b else 0
            booked = r.booked(t)  # admitted to a step that starts after t: report them as waiting
            for req in booked:
                kv -= req.prompt - req.base + r.steps_done
                running_by_tag[req.tag] -= 1
                waiting_by_tag[req.tag] += 1
            serving = r.state is _READY_STATE or r.state is _DRAINING
            reps.append(
                ReplicaSnapshot(
                    r.index, r.state, b - len(booked), len(r.waiting) + len(booked), slots, kv, cap if serving else 0
                )
            )
        n_serving = sum(1 for x in reps if x.kv_capacity_tokens)
        return PoolSnapshot(
            t_s=t / NS_PER_S,
            running=sum(x.running for x in reps),
            waiting=sum(x.waiting for x in reps) + len(self._unassigned),
            unassigned_waiting=len(self._unassigned),
            running_by_tag=MappingProxyType({k: v for k, v in sorted(running_by_tag.items()) if v}),
            waiting_by_tag=MappingProxyType({k: v for k, v in sorted(waiting_by_tag.items()) if v}),
            kv_used_tokens=sum(x.kv_used_tokens for x in reps),
            kv_capacity_tokens=cap * n_serving,
            ready_replicas=sum(1 for x in reps if x.state is _READY_STATE),
            starting_replicas=sum(1 for x in reps if x.state is _STARTING),
            draining_replicas=sum(1 for x in reps if x.state is _DRAINING),
            max_num_seqs_per_replica=slots,
            total_slots=slots * n_serving,
            replicas=tuple(reps),
        )

    def counts(self, now_s: object) -> tuple[int, int, int, dict[str, int], dict[str, int]]:
        """What a metrics sample reads of ``snapshot(now_s)``, without the per-replica snapshots: (running,
        waiting, total slots, running by tag, waiting by tag; a tag's zero counts included). Same numbers,
        a fraction of the cost: the replay samples every ``sample_s`` (0.5 s by default)."""
        t = self._enter(now_s)
        running_by_tag = {tag: c[0] for tag, c in self._tag_counts.items()}
        waiting_by_tag = {tag: c[1] for tag, c in self._tag_counts.items()}
        running = waiting = serving = 0
        for r in self._replicas:
            booked = r.booked(t)
            for req in booked:
                running_by_tag[req.tag] -= 1
                waiting_by_tag[req.tag] += 1
            running += len(r.running) - len(booked)
            waiting += len(r.waiting) + len(booked)
            if r.state is _READY_STATE or r.state is _DRAINING:
                serving += 1
        return (running, waiting + len(self._unassigned), self._batching.slots * serving, running_by_tag,
                waiting_by_tag)

    # ------------------------------------------------------------------ the pool's mechanics

    def _run(self, t: int) -> None:
        """Process every internal event at or before ``t``, in time order."""
        heap, reps, batching = self._internal, self._replicas, self._batching
        limit = (t << TIME_SHIFT) | LOW_BITS
        while heap and heap[0] <= limit:
            key = heappop(heap)
            tn = key >> TIME_SHIFT
            low = key & LOW_BITS
            r = reps[low >> 2]
            kind = low & 3
            if kind == STEP_END:
                if r.busy and r.end_ns == tn:
                    batching.step_end(r, tn)
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

    def _dispatch(self, req: Request, t: int) -> None:
        """Queue ``req`` on the READY replica with the fewest running + waiting (ties: lowest index)."""
        r = self._load.least_loaded()
        if r is None:
            self._unassigned.append(req)
            return
        req.replica = r
        req.state = WAITING
        waiting = r.waiting
        waiting.append(req)
        self._load.took_one()
        if not r.busy:
            r.batch_new = []
            self._batching.form_batch(r, t)
        elif len(waiting) == 1 and len(r.running) < self._batching.slots:
            self._batching.rebook(r, t)  # book it into the batch of the next step boundary

    def _add_starting_replica(self, t: int) -> None:
        if len(self._replicas) >= MAX_REPLICAS:
            raise ValueError(f"a pool holds at most {MAX_REPLICAS} replicas over its lifetime")
        r = Replica(len(self._replicas), _STARTING)
        self._replicas.append(r)
        r.ready_ns = t + self._startup_ns
        heappush(self._internal, (r.ready_ns << TIME_SHIFT) | r.key | READY)

    def _replica_ready(self, r: Replica, t: int) -> None:
        r.state = _READY_STATE
        self._out.append(_new(ReplicaReady, (r.index, t / NS_PER_S)))
        self._load.push(r)
        pending, self._unassigned = self._unassigned, deque()
        for req in pending:  # dispatch in FIFO order; simultaneous arrivals share the step formed at t
            self._dispatch(req, t)

    def _next_internal_ns(self) -> int | None:
        """Time of the next live internal event, dropping superseded heap keys on the way."""
        heap, reps = self._internal, self._replicas
        while heap:
            key = heap[0]
            t = key >> TIME_SHIFT
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

    # ------------------------------------------------------------------ validation

    def _enter(self, now_s: object) -> int:
        """Validate a call's time, run the pool up to and including it, and return it in ns."""
        if type(now_s) is float and 0.0 <= now_s < _FAST_MAX_S:
            t = round_half_even(now_s * NS_PER_S)  # (``round``, in native arithmetic when compiled)
        elif isinstance(now_s, bool) or not isinstance(now_s, (int, float)) or not math.isfinite(now_s):
            raise ValueError(f"`now_s` must be a finite number of seconds, got {now_s!r}")
        else:
            t = round(now_s * NS_PER_S)
        if t < self._now_ns:
            raise ValueError(
                f"`now_s` must not go back in time: got {now_s}, the simulator is at {self._now_ns / NS_PER_S}"
            )
        heap = self._internal
        if heap and heap[0] >> TIME_SHIFT <= t:
            self._run(t)
        self._now_ns = t
        return t

    def _check_request(
        self, request_id: object, prompt_tokens: object, output_tokens: object, tag: object
    ) -> tuple[str, str, int, int]:
        """The slow path of ``submit``'s validation: raise with a clear message, or return the checked values."""
        if not isinstance(request_id, str):
            raise ValueError(f"`request_id` must be a str, got {request_id!r}")
        if not isinstance(tag, str):
            raise ValueError(f"`tag` must be a str, got {tag!r}")
        prompt = _check_count("prompt_tokens", prompt_tokens, 0)
        output = _check_count("output_tokens", output_tokens, 1)
        if request_id in self._requests:
            raise ValueError(f"`request_id` {request_id!r} is already in the pool")
        if prompt + output > self._kv_cap:
            raise ValueError(
                f"`prompt_tokens + output_tokens` must fit one replica's KV cache ({self._kv_cap} tokens), "
                f"got {prompt + output}"
            )
        return request_id, tag, prompt, output
