"""Leader election on a ``coordination.k8s.io/v1`` Lease: the pure part — what to write, and whether we lead.

Every ``retry_period_s`` a candidate reads the Lease (``observe``), decides (``decide``) and, when the decision
has a record to write, writes it with the resourceVersion it read (``written``): of two candidates acting on the
same version the API server lets one win and answers the other 409 Conflict, so a write never makes two leaders.

Time is two readings, both arguments: ``now_s`` (this process's monotonic clock) decides; ``wall_s`` only fills
the record's acquireTime/renewTime for people and tools to read. Two rules make it safe:

- Another holder's lease is expired when WE have seen its current version unchanged for its
  ``leaseDurationSeconds`` (``Seen.since_s``), not by its renewTime: that was written by another machine's wall
  clock, and clock skew would shorten or stretch the lease.
- A leader leads until ``renew_deadline_s`` after it SENT its last successful write (``Candidate.leading_until_s``).
  The server applied that write later, and anyone else saw it later still, so the leader stops at least
  ``duration_s - renew_deadline_s`` (the margin) before anyone may take over. The margin absorbs clock-rate drift
  and the time the leader takes to cancel its writing loops. A write whose answer did not come (timeout) extends
  nothing: a leader that cannot renew stops at its deadline however the write ended.

A release (graceful shutdown) writes the record with no holder, after the leader stopped acting: the next candidate
to read it takes it at once (``ACQUIRED``), without waiting out the duration.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """The ``controllers.lease_*`` settings (validated there too; this is the check for code that builds one)."""

    duration_s: int  # leaseDurationSeconds: an int32 in the API
    renew_deadline_s: float
    retry_period_s: float

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.duration_s:
            raise ValueError(f"0 < retry_period_s < renew_deadline_s < duration_s is required, got {self}")

    @property
    def margin_s(self) -> float:
        """How long before a standby may take over a leader stops acting (on equal clocks)."""
        return self.duration_s - self.renew_deadline_s


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The fields of a Lease's spec that the election uses."""

    holder: str | None  # holderIdentity; None (or ""): released, free to take
    duration_s: int  # leaseDurationSeconds the holder declared
    acquire_wall_s: float | None  # acquireTime, epoch seconds (for people; never decides)
    renew_wall_s: float | None  # renewTime, epoch seconds (for people; never decides)
    transitions: int  # leaseTransitions: how many times the holder changed


@dataclass(frozen=True, slots=True)
class Seen:
    """The Lease as last read, and since when (our monotonic clock) its current version has been seen unchanged."""

    record: LeaseRecord | None  # None: there is no Lease object
    version: str  # resourceVersion; "" when there is no Lease
    since_s: float


class LeaseOutcome(StrEnum):
    ACQUIRED = "acquired"  # no holder (no Lease, or a released one): take it
    RENEWED = "renewed"  # we hold it: renew it
    HELD_BY_OTHER = "held_by_other"  # another holder's lease has not expired by our observation: stand by
    EXPIRED_TAKEOVER = "expired_takeover"  # another holder did not renew for its duration: take it over
    LOST = "lost"  # we led, and the Lease names another holder, our write conflicted, or our deadline passed
    RELEASED = "released"  # we handed it over (graceful shutdown)


class WriteResult(StrEnum):
    WRITTEN = "written"
    CONFLICT = "conflict"  # 409 (or the object went away): someone else wrote first
    FAILED = "failed"  # no answer or an error: the write may or may not have been applied


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: LeaseOutcome
    write: LeaseRecord | None  # write this with the version read (create when that version is ""); None: nothing
    next_s: float  # when to read the Lease again (monotonic)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One replica's view: what it last saw, and until when it leads (None: it does not)."""

    identity: str
    timing: LeaseTiming
    seen: Seen | None = None
    leading_until_s: float | None = None

    def leading(self, now_s: float) -> bool:
        """Whether this replica may act now (the writing loops run, and each write checks this first)."""
        return self.leading_until_s is not None and now_s < self.leading_until_s


def lapse(candidate: Candidate, now_s: float) -> Candidate:
    """A leader whose deadline passed without a renewal no longer leads (whatever the Lease says)."""
    if candidate.leading_until_s is not None and now_s >= candidate.leading_until_s:
        return dataclasses.replace(candidate, leading_until_s=None)
    return candidate


def observe(candidate: Candidate, record: LeaseRecord | None, version: str, now_s: float) -> Candidate:
    """Take in a read: a version seen before keeps the instant it was first seen (``now_s``: when the read returned,
    the later and so the safer end of the read)."""
    seen = candidate.seen
    if seen is not None and seen.version == version and seen.record == record:
        return candidate
    return dataclasses.replace(candidate, seen=Seen(record, version, now_s))


def decide(candidate: Candidate, now_s: float, wall_s: float) -> tuple[Candidate, Decision]:
    """What to do about the Lease last observed; a LOST or HELD_BY_OTHER decision takes leadership away at once."""
    seen, me, timing = candidate.seen, candidate.identity, candidate.timing
    if seen is None:
        raise ValueError("decide() needs an observed Lease (observe() first)")
    record, retry_s = seen.record, now_s + timing.retry_period_s
    if record is None:
        fresh = LeaseRecord(me, timing.duration_s, wall_s, wall_s, 0)
        return candidate, Decision(LeaseOutcome.ACQUIRED, fresh, retry_s)
    if record.holder == me:
        renewed = dataclasses.replace(record, duration_s=timing.duration_s, renew_wall_s=wall_s,
                                      acquire_wall_s=record.acquire_wall_s if record.acquire_wall_s is not None else wall_s)
        return candidate, Decision(LeaseOutcome.RENEWED, renewed, retry_s)
    taken = LeaseRecord(me, timing.duration_s, wall_s, wall_s, record.transitions + 1)
    if not record.holder:
        return candidate, Decision(LeaseOutcome.ACQUIRED, taken, retry_s)
    expires_s = seen.since_s + record.duration_s
    if candidate.leading_until_s is not None:  # we thought we led; someone else holds it now
        return dataclasses.replace(candidate, leading_until_s=None), Decision(LeaseOutcome.LOST, None, min(retry_s, expires_s))
    if now_s < expires_s:
        return candidate, Decision(LeaseOutcome.HELD_BY_OTHER, None, min(retry_s, expires_s))
    return candidate, Decision(LeaseOutcome.EXPIRED_TAKEOVER, taken, retry_s)


def written(candidate: Candidate, decision: Decision, result: WriteResult, version: str, sent_s: float,
            now_s: float) -> tuple[Candidate, LeaseOutcome | None]:
    """Take in the answer to ``decision.write`` sent at ``sent_s``; the outcome it made (None: a failed write, which
    tells nothing and changes nothing — the deadline still runs)."""
    if decision.write is None:
        raise ValueError(f"{decision.outcome} wrote nothing")
    if result is WriteResult.WRITTEN:
        ours = decision.write.holder == candidate.identity
        leading_until = sent_s + candidate.timing.renew_deadline_s if ours else None
        return (dataclasses.replace(candidate, seen=Seen(decision.write, version, now_s), leading_until_s=leading_until),
                decision.outcome)
    if result is WriteResult.CONFLICT:
        was_leading = candidate.leading_until_s is not None
        return (dataclasses.replace(candidate, leading_until_s=None),
                LeaseOutcome.LOST if was_leading else LeaseOutcome.HELD_BY_OTHER)
    return candidate, None


def release(candidate: Candidate, wall_s: float) -> Decision | None:
    """The write that hands the Lease over, when the last read says we hold it (None: nothing of ours to release).
    The caller has already stopped acting: leadership ends before the write is sent."""
    seen = candidate.seen
    if seen is None or seen.record is None or seen.record.holder != candidate.identity:
        return None
    freed = dataclasses.replace(seen.record, holder=None, renew_wall_s=wall_s)
    return Decision(LeaseOutcome.RELEASED, freed, 0.0)
