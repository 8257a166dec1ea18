"""The recorded backend: a log's own service times stand in for the simulator (``replay.backend=recorded``).

Replaying a log recorded from a live run with the simulator asks "what would this traffic have done on the model
backend?"; the simulator's latencies are not the live backend's, so the in-flight counts drift and with them every
concurrency decision. With the recorded backend, a request the replay admits completes exactly as long after its
admission as it did live (prompt and completion tokens, TTFT and end-to-end latency from its ``request_completed``
row), so the admission state at every instant is the live proxy's, and the replay reproduces the live decisions:
this is how a replayed log is checked against the proxy that made it (``match_rate``), and how admission-side
parameters (bucket window, Retry-After, default ``max_tokens``) are tuned without the simulator's model error.

Choices, where the log cannot say:

- a request the live proxy refused but the replay admits has no service time of its own: it takes the median
  end-to-end latency and TTFT of its entitlement's recorded completions (of all of them, if it has none) and its
  requested output length;
- the backend's waiting queue and its ready replicas at a tick are what the live agents saw: ``backend_waiting`` and
  ``capacity_concurrency`` ÷ slots per replica of the latest recorded limit update at or before the tick (so an
  outage the agents measured live is in the replay too); with no limit updates in the log, no queue, and the
  replicas the replay asked for;
- a limit update is put in force when the live proxy held it (``Recording.in_force_s``): at the first recorded
  decision that carries its version, or a later one, in ``limits_version`` (docs/tuning.md#limit-updates), not at
  its window's end; a log whose decisions carry no version puts each in force at its tick, as before the field;
- capacity changes and scaling change the slots this backend reports, never the service times (those are recorded);
- ``abort`` (a preemptible request evicted by the replay) ends the request at once; its recorded completion is
  dropped.

Same interface as ``simulator.BackendSim`` where the replayer uses it; pure (time is always an argument).
"""

from __future__ import annotations

import statistics
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush
from types import MappingProxyType
from typing import NamedTuple

from tokenpools.replay.backend.records import Completed, PoolSnapshot, SimEvent


class RecordedService(NamedTuple):
    """How the live backend served one request: latencies measured from its admission at the proxy."""

    e2e_s: float
    ttft_s: float
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class Recording:
    """What a log knows of its backend: each admitted request's service, and the waiting queue over time."""

    services: Mapping[str, RecordedService]  # by request id, as the proxy decided it
    entitlement_of: Mapping[str, str]  # request id -> entitlement, for the per-entitlement fallback
    ticks: tuple[tuple[float, int, int], ...] = ()  # (t_s, backend waiting, pool slots) the agents saw, ascending
    # (a limit update's version: its window's end, the first decision the proxy made under it), ms from the
    # scenario's origin, ascending by version; empty: the log's decisions carry no limits_version
    held_ms: tuple[tuple[int, int], ...] = ()
    _fallback: dict[str, RecordedService] = field(init=False, repr=False, compare=False)
    _held_from_ms: tuple[int, ...] = field(init=False, repr=False, compare=False)  # held_ms's suffix minima

    def __post_init__(self) -> None:
        if not self.services:
            raise ValueError("a recorded backend needs the log's completions: it has no request_completed rows")
        if any(b[0] < a[0] for a, b in zip(self.ticks, self.ticks[1:])):
            raise ValueError("recorded ticks must be in time order")
        by_entitlement: dict[str, list[RecordedService]] = {}
        for rid, service in self.services.items():
            by_entitlement.setdefault(self.entitlement_of.get(rid, ""), []).append(service)
        fallback = {name: _median(rows) for name, rows in by_entitlement.items()}
        fallback[""] = _median(list(self.services.values()))
        object.__setattr__(self, "_fallback", fallback)
        if any(b[0] <= a[0] for a, b in zip(self.held_ms, self.held_ms[1:])):
            raise ValueError("recorded limit versions must be ascending and distinct")
        earliest: list[int] = []
        for _, first_ms in reversed(self.held_ms):  # the first decision under this version or any later one
            earliest.append(first_ms if not earliest else min(first_ms, earliest[-1]))
        object.__setattr__(self, "_held_from_ms", tuple(reversed(earliest)))

    def service(self, request_id: str, entitlement: str, output_tokens: int, prompt_tokens: int) -> RecordedService:
        """The recorded service of ``request_id``, or its entitlement's median one (see the module's choices)."""
        found = self.services.get(request_id)
        if found is not None:
            return found
        typical = self._fallback.get(entitlement, self._fallback[""])
        return RecordedService(typical.e2e_s, typical.ttft_s, prompt_tokens, output_tokens)

    def in_force_s(self, window_end_s: float) -> float | None:
        """When the live proxy held the limit update of the window ending at ``window_end_s``: the first recorded
        decision carrying its version or a later one (a proxy that never applied it, its update skipped or lost,
        held it from when it held a newer one). None: no recorded decision carries it or a later one (a log without
        versions, or its end), and the update is put in force at its tick."""
        end_ms = round(window_end_s * 1000)
        i = bisect_left(self.held_ms, (end_ms,))
        return self._held_from_ms[i] / 1000 if i < len(self._held_from_ms) else None

    def tick_at(self, t_s: float) -> tuple[float, int, int] | None:
        """The latest recorded tick at or before ``t_s``."""
        i = bisect_right(self.ticks, (t_s, float("inf")))
        return self.ticks[i - 1] if i else None


def _median(rows: Sequence[RecordedService]) -> RecordedService:
    return RecordedService(statistics.median(r.e2e_s for r in rows), statistics.median(r.ttft_s for r in rows), 0, 0)


class RecordedBackend:
    """Completes each submitted request after its recorded service time. ``BackendSim``'s interface, for the
    replayer."""

    def __init__(self, recording: Recording, replicas: int, slots_per_replica: int) -> None:
        self._recording = recording
        self._replicas = replicas
        self._slots = slots_per_replica
        self._heap: list[tuple[float, int, str]] = []  # (completion time, submission order, request id)
        self._running: dict[str, tuple[Completed, str]] = {}  # request id -> (its completion, tag)
        self._seq = 0

    def submit(self, request_id: str, now_s: float, prompt_tokens: int, output_tokens: int, tag: str = "") -> None:
        if request_id in self._running:
            raise ValueError(f"request {request_id!r} is already running")
        s = self._recording.service(request_id, tag, output_tokens, prompt_tokens)
        end_s = now_s + s.e2e_s
        done = Completed(request_id, end_s, s.prompt_tokens, s.completion_tokens, s.ttft_s, s.e2e_s, 0.0, tag)
        self._running[request_id] = (done, tag)
        heappush(self._heap, (end_s, self._seq, request_id))
        self._seq += 1

    def advance(self, until_s: float) -> list[SimEvent]:
        """Every completion at or before ``until_s``, in time order (submission order at equal times)."""
        out: list[SimEvent] = []
        heap, running = self._heap, self._running
        while heap and heap[0][0] <= until_s:
            _, _, rid = heappop(heap)
            entry = running.pop(rid, None)
            if entry is not None:  # (an aborted request's entry is gone: its completion is dropped)
                out.append(entry[0])
        return out

    def next_event_s(self) -> float | None:
        heap, running = self._heap, self._running
        while heap and heap[0][2] not in running:
            heappop(heap)
        return heap[0][0] if heap else None

    def abort(self, request_id: str, now_s: float) -> bool:
        return self._running.pop(request_id, None) is not None

    def set_capacity(self, slots_per_replica: int, now_s: float) -> None:
        self._slots = slots_per_replica

    def set_replicas(self, n: int, now_s: float) -> None:
        self._replicas = n

    def counts(self, now_s: float) -> tuple[int, int, int, dict[str, int], dict[str, int]]:
        """``BackendSim.counts``: what a metrics sample reads of the snapshot."""
        snap = self.snapshot(now_s)
        return (snap.running, snap.waiting, snap.total_slots, dict(snap.running_by_tag), dict(snap.waiting_by_tag))

    def snapshot(self, now_s: float) -> PoolSnapshot:
        running_by_tag: dict[str, int] = {}
        for _, tag in self._running.values():
            running_by_tag[tag] = running_by_tag.get(tag, 0) + 1
        tick = self._recording.tick_at(now_s)
        waiting, replicas = (0, self._replicas) if tick is None else (tick[1], tick[2] // self._slots)
        return PoolSnapshot(
            t_s=now_s, running=len(self._running), waiting=waiting, unassigned_waiting=0,
            running_by_tag=MappingProxyType(running_by_tag), waiting_by_tag=MappingProxyType({}),
            kv_used_tokens=0, kv_capacity_tokens=0, ready_replicas=replicas, starting_replicas=0,
            draining_replicas=0, max_num_seqs_per_replica=self._slots, total_slots=replicas * self._slots,
            replicas=(),
        )
