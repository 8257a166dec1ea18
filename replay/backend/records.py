"""Records the backend simulator returns: its closed set of events and its metrics snapshot.

Events are immutable ``NamedTuple`` records rather than frozen dataclasses for one measured reason: the
replayer creates two per request (360k requests per simulated hour), and a frozen dataclass costs ~3 µs to
build on the reference machine against ~0.2 µs for a tuple. Equality is made type-strict, so a
``FirstToken`` never equals a ``Preempted`` (or a plain tuple) that happens to hold the same values.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

__all__ = [
    "Completed",
    "FirstToken",
    "PoolSnapshot",
    "Preempted",
    "PreemptionCause",
    "ReplicaReady",
    "ReplicaRetired",
    "ReplicaSnapshot",
    "ReplicaState",
    "SimEvent",
]


class PreemptionCause(enum.Enum):
    """Why a running sequence went back to the head of its replica's waiting queue."""

    KV_EXHAUSTED = "kv_exhausted"
    """The next decode step would not fit in the KV cache (vLLM recompute preemption)."""
    CAPACITY_REDUCED = "capacity_reduced"
    """``set_capacity`` lowered the slots below the replica's running count."""


class ReplicaState(enum.Enum):
    """Life cycle of a simulated replica: STARTING -> READY -> DRAINING -> RETIRED."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    RETIRED = "retired"


def _strict_record(cls: type) -> type:
    """Make a NamedTuple compare equal only to records of its own type."""

    def __eq__(self: tuple, other: object) -> bool:  # noqa: N807 - installed as a dunder
        return type(other) is type(self) and tuple.__eq__(self, other)

    def __ne__(self: tuple, other: object) -> bool:  # noqa: N807
        return not __eq__(self, other)

    cls.__eq__ = __eq__  # type: ignore[method-assign,assignment]
    cls.__ne__ = __ne__  # type: ignore[method-assign,assignment]
    cls.__hash__ = tuple.__hash__  # type: ignore[method-assign,assignment]
    return cls


@_strict_record
class FirstToken(NamedTuple):
    """A request produced its first output token at ``t_s`` (end of the step that prefilled it)."""

    request_id: str
    t_s: float


@_strict_record
class Completed(NamedTuple):
    """A request produced its last output token at ``t_s``; latencies are measured from its submission."""

    request_id: str
    t_s: float
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    e2e_s: float
    queue_s: float
    """Submission until it was first scheduled into a batch (vLLM's queue time)."""
    tag: str


@_strict_record
class Preempted(NamedTuple):
    """A running request went back to the head of its replica's waiting queue at ``t_s``."""

    request_id: str
    t_s: float
    cause: PreemptionCause


@_strict_record
class ReplicaReady(NamedTuple):
    """Replica ``index`` finished starting up and accepts work from ``t_s`` on."""

    index: int  # type: ignore[assignment]  # (shadows ``tuple.index``: the field is the replica's number)
    t_s: float


@_strict_record
class ReplicaRetired(NamedTuple):
    """Replica ``index`` left the pool at ``t_s`` (drained, or cancelled while still starting)."""

    index: int  # type: ignore[assignment]  # (shadows ``tuple.index``: the field is the replica's number)
    t_s: float


SimEvent: TypeAlias = FirstToken | Completed | Preempted | ReplicaReady | ReplicaRetired


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    """One replica as its ``/metrics`` endpoint would report it."""

    index: int
    state: ReplicaState
    running: int
    waiting: int
    max_num_seqs: int
    kv_used_tokens: int
    kv_capacity_tokens: int


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """The pool at ``t_s``: what a fake vLLM ``/metrics`` would expose, summed over replicas.

    ``waiting`` includes ``unassigned_waiting`` (requests held by the pool while no replica is ready).
    KV and slots count the replicas that can hold work (READY and DRAINING), so ``running <= total_slots``
    and ``kv_used_tokens <= kv_capacity_tokens`` always hold.
    """

    t_s: float
    running: int
    waiting: int
    unassigned_waiting: int
    running_by_tag: Mapping[str, int]
    waiting_by_tag: Mapping[str, int]
    kv_used_tokens: int
    kv_capacity_tokens: int
    ready_replicas: int
    starting_replicas: int
    draining_replicas: int
    max_num_seqs_per_replica: int
    total_slots: int
    replicas: tuple[ReplicaSnapshot, ...]

    @property
    def kv_usage_fraction(self) -> float:
        """vLLM's ``kv_cache_usage_perc`` as a fraction in [0, 1] (0 when no replica holds KV)."""
        return self.kv_used_tokens / self.kv_capacity_tokens if self.kv_capacity_tokens else 0.0
