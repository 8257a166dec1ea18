"""Counting each decision and completion once when the broker holds it twice: pure.

docs/budgets.md#re-sent-decisions-and-completions.

A proxy process numbers the completions of each (pool, entitlement) it sends: ``sequence`` 1, 2, 3, … in the
order it settles them, under an identity of the process (``proxy_id`` and ``proxy_start_ms``, the wall clock when
it started); and, with a counter of their own, its decisions of each (pool, entitlement), in the order it emits
them. A re-send (the spool's, after an outage longer than the producer's timeout) repeats the very record, so its
identity too; the broker may then hold it twice, at two offsets. Everyone that counts these events passes each one
through :func:`sight` in the order it reads them and counts only a ``FIRST`` sighting: the agents' ledger and
``tokenpools usage --reconcile`` count completions (a stream: one proxy process's completions of one entitlement
in one pool, ``stream_key``), the agents' pool state counts decisions and completions (its streams tell the two
kinds apart: ``streams.pool_state.resend_stream``).

The state of one stream is ``Seen``: the sequence up to which every number was seen (``through``) and the numbers
above it seen out of order (``ahead``: the spool re-appends a batch that failed again behind newer events, so a
stream can arrive with gaps that fill later). Memory is bounded: ``ahead`` holds at most ``max_ahead`` numbers;
one more gives up the lowest gap (its numbers count as seen: were one of them to arrive still, it would not be
counted). A stream whose newest event
is older than the counter's retention is forgotten whole (``forget``): a re-send of it could only be late.

A record without an identity (written before the fields existed, or built by the replay) is counted as it always
was: by the reader's own position (the ledger, the pool state) or its request id (the log).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

MAX_AHEAD = 4096


class Sighting(StrEnum):
    """What one event's identity is to the counter that reads it."""

    FIRST = "first"  # never seen: count it
    AGAIN = "again"  # seen already (a re-send the broker holds twice), or in a gap given up on: do not count it


@dataclass(frozen=True, slots=True)
class Seen:
    """One stream's sequence numbers seen: all of 1..``through``, and those in ``ahead`` (each > through + 1)."""

    through: int = 0
    ahead: frozenset[int] = field(default_factory=frozenset)
    t_ms: int = 0  # the newest event time seen in the stream

    def __post_init__(self) -> None:
        if self.through < 0:
            raise ValueError(f"`through` must be >= 0, got {self.through}")


def stream_key(proxy_id: str, proxy_start_ms: int | None, sequence: int | None) -> str | None:
    """The proxy process an event was numbered by, within its (pool, entitlement) (and, for the pool state, its
    kind); None: it carries no identity."""
    if proxy_start_ms is None or sequence is None:
        return None
    return f"{proxy_id}@{proxy_start_ms}"


def sight(seen: Seen | None, sequence: int, t_ms: int, max_ahead: int = MAX_AHEAD) -> tuple[Seen, Sighting]:
    """The stream's state after the event numbered ``sequence`` (event time ``t_ms``), and whether it is new.

    Invariants (tests/unit/test_resends.py): whatever the order and the copies of a stream's events, none is
    counted twice; while no more than ``max_ahead`` numbers wait above a gap, each is counted exactly once."""
    if max_ahead < 0:
        raise ValueError(f"`max_ahead` must be >= 0, got {max_ahead}")
    if sequence < 1:
        raise ValueError(f"`sequence` must be >= 1, got {sequence}")
    seen = seen if seen is not None else Seen()
    newest = max(seen.t_ms, t_ms)
    if sequence <= seen.through or sequence in seen.ahead:
        return (seen if newest == seen.t_ms else Seen(seen.through, seen.ahead, newest)), Sighting.AGAIN
    through = seen.through
    if sequence == through + 1 and not seen.ahead:  # the common case: in order, nothing waiting
        return Seen(sequence, seen.ahead, newest), Sighting.FIRST
    ahead = set(seen.ahead)
    ahead.add(sequence)
    while True:
        while through + 1 in ahead:
            through += 1
            ahead.discard(through)
        if len(ahead) <= max_ahead:
            break
        through = min(ahead) - 1  # give up the lowest gap: its numbers count as seen
    return Seen(through, frozenset(ahead), newest), Sighting.FIRST


def forget(streams: Mapping[str, Seen], cutoff_ms: int) -> dict[str, Seen]:
    """``streams`` without those whose newest event is older than ``cutoff_ms`` (any re-send of them is late)."""
    return {key: seen for key, seen in streams.items() if seen.t_ms >= cutoff_ms}


def encode_seen(seen: Seen) -> list[object]:
    return [seen.through, sorted(seen.ahead), seen.t_ms]


def decode_seen(data: list[object]) -> Seen:
    through, ahead, t_ms = data
    return Seen(int(through), frozenset(int(n) for n in ahead), int(t_ms))  # type: ignore[arg-type, union-attr]
