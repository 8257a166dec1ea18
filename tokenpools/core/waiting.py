"""Waiting instead of refusing: the admission queue of one pool at one proxy (docs/queueing.md).

A request the checks refuse for a slot (concurrency, KV, low priority) or for the token budget may wait, up to its
entitlement's timeout, for the check to pass, instead of going back to its client with a 429. It is admitted the
moment ``AdmissionController.admit`` passes for it: the shell calls ``drain`` after every release, limit change and
at ``next_wake_s`` (when a waiting token budget refills, or a deadline comes). Time is always an argument.

Rules:
- each entitlement has one line, first come first served: a request of an entitlement that has waiters joins the
  back of its line instead of trying its luck (no overtaking inside a tenant);
- ``drain`` tries the lines' heads in priority order (the entitlement's current priority, highest first; then the
  oldest head), so a slot that frees goes to the highest-priority waiter that fits it, and a waiter of a lower class
  never takes a slot before one of a higher class;
- once a head is refused for low priority in a contended pool, every line of the same or a lower priority would be
  too (the pool stays contended and its floor does not fall by admitting): those lines are only checked for
  deadlines, so a drain costs one ``admit`` per line above the floor (a refusal for the slots kept for protected
  limits is not such a floor: the pool is not full, and a protected line below may take its kept slot);
- a request whose token budget cannot refill before its deadline at the current rate (the refusal's exact
  ``retry_after_ms``), or whose cost is above the bucket's depth, does not wait: its client learns at once;
- likewise a request refused for a slot whose estimated release (``AdmissionController.slot_estimate_ms``: the
  k × S ÷ n of its refusal, uncapped) comes after its deadline: such a wait would most likely time out, and the
  timeout would be added to its client's retry wait. With no estimate yet (nothing released) it waits;
- a request refused against a limit of 0 (a spot or preemptible entitlement before the agents lend it anything)
  does not wait: only the agents can raise that limit, and they learn of the demand from refusals, which a waiter
  would hide until its deadline;
- memory is bounded: at most ``max_waiters_per_entitlement`` in a line and ``WaitRoom.capacity`` at the proxy,
  beyond which the request is refused at once (``WaitOutcome.QUEUE_FULL``);
- a waiter whose deadline passes is refused with the check's latest refusal, its wait estimate fresh.

Every resolution is counted per ``WaitOutcome`` in ``outcomes`` for the shell's metrics.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from tokenpools.core.admission import AdmissionController, Decision
from tokenpools.core.classes import ServiceClass
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.spec import EntitlementSpec

WAITABLE: Final[frozenset[AdmissionOutcome]] = frozenset({
    AdmissionOutcome.REFUSED_CONCURRENCY, AdmissionOutcome.REFUSED_TOKEN_BUDGET, AdmissionOutcome.REFUSED_KV,
    AdmissionOutcome.REFUSED_LOW_PRIORITY,
})
# (Final module constants: compiled, C statics; ``decision.admitted``, an enum member or a plain module name are
# lookups at run time, and ``drain`` checks a head after every release)
_ADMITTED: Final = AdmissionOutcome.ADMITTED
_LOW_PRIORITY: Final = AdmissionOutcome.REFUSED_LOW_PRIORITY
_TOKEN_BUDGET: Final = AdmissionOutcome.REFUSED_TOKEN_BUDGET
SLOT_REFUSALS: Final[frozenset[AdmissionOutcome]] = WAITABLE - {_TOKEN_BUDGET}  # they wait for a release, not a refill


class WaitOutcome(StrEnum):
    """How a request's wait ended (or why it did not wait although its refusal could have)."""

    ADMITTED = "admitted"  # the check passed while it waited
    TIMED_OUT = "timed_out"  # its deadline came first: refused with the check's latest refusal
    QUEUE_FULL = "queue_full"  # no room in its line or at the proxy: refused at once
    TOO_LONG = "too_long"  # its token budget refills only after its deadline: refused at once
    ZERO_LIMIT = "zero_limit"  # its limit is 0: only the agents can raise it, and they see demand only in refusals
    WITHDRAWN = "withdrawn"  # the client went away, or the entitlement was removed


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """``slo_fraction``: an entitlement without its own ``queue_timeout_ms`` waits up to this fraction of its SLO,
    at most ``max_timeout_ms``; 0 turns waiting off. ``classes``: the service classes that may wait.
    ``max_waiters_per_entitlement``: the length of one line."""

    slo_fraction: float = 0.5
    max_timeout_ms: int = 10_000
    classes: frozenset[ServiceClass] = frozenset(ServiceClass)
    max_waiters_per_entitlement: int = 64

    def __post_init__(self) -> None:
        if not 0 <= self.slo_fraction <= 1:
            raise ValueError(f"`slo_fraction` must be in [0, 1], got {self.slo_fraction}")
        if self.max_timeout_ms < 0:
            raise ValueError(f"`max_timeout_ms` must be >= 0, got {self.max_timeout_ms}")
        if self.max_waiters_per_entitlement < 1:
            raise ValueError(f"`max_waiters_per_entitlement` must be >= 1, got {self.max_waiters_per_entitlement}")

    def timeout_ms(self, spec: EntitlementSpec) -> int:
        """How long a request of ``spec`` may wait: its own ``queue_timeout_ms`` if set, else 0 for a class that
        does not wait, else ``slo_fraction`` × its SLO, at most ``max_timeout_ms``."""
        if spec.queue_timeout_ms is not None:
            return spec.queue_timeout_ms
        if spec.service_class not in self.classes:
            return 0
        return min(self.max_timeout_ms, math.floor(self.slo_fraction * spec.slo_ms))


@dataclass(slots=True)
class WaitRoom:
    """The waiters one proxy may hold over all its pools' queues (``proxy.max_waiters``)."""

    capacity: int = 1024
    used: int = 0

    def __post_init__(self) -> None:
        if self.capacity < 0:
            raise ValueError(f"`capacity` must be >= 0, got {self.capacity}")

    @property
    def full(self) -> bool:
        return self.used >= self.capacity


@dataclass(slots=True, eq=False)
class Waiter:
    """A request waiting for its check. ``decision`` is its latest refusal while it waits, then its final decision
    (``outcome`` set) once ``drain`` or ``withdraw`` resolves it."""

    request_id: str
    entitlement: str
    prompt_tokens: int
    max_tokens: int | None
    arrived_s: float
    deadline_s: float
    seq: int
    decision: Decision
    decided_s: float  # when ``decision`` was taken
    outcome: WaitOutcome | None = None
    resolved_s: float = 0.0

    @property
    def waited_s(self) -> float:
        return max(0.0, self.resolved_s - self.arrived_s)


@dataclass(slots=True)
class AdmissionQueue:
    """The waiting lines of one pool at one proxy, in front of its ``AdmissionController``."""

    controller: AdmissionController
    config: QueueConfig = field(default_factory=QueueConfig)
    room: WaitRoom = field(default_factory=WaitRoom)
    outcomes: Counter[WaitOutcome] = field(default_factory=Counter)
    _lines: dict[str, deque[Waiter]] = field(default_factory=dict)
    _timeouts_ms: dict[str, int] = field(default_factory=dict)
    _below_floor: set[str] = field(default_factory=set)  # lines the last drain only checked for deadlines
    _unordered: set[str] = field(default_factory=set)  # lines whose deadlines are out of line order (a timeout was shortened)
    _seq: int = 0

    # ---- entitlements ------------------------------------------------------------------------------------
    def set_spec(self, spec: EntitlementSpec) -> None:
        """Learn (or relearn) how long ``spec``'s requests may wait; waiters already in line keep their deadline."""
        self._timeouts_ms[spec.name] = self.config.timeout_ms(spec)

    def timeout_ms_of(self, entitlement: str) -> int:
        return self._timeouts_ms.get(entitlement, 0)

    # ---- the request path --------------------------------------------------------------------------------
    def admit(self, entitlement: str | None, request_id: str, prompt_tokens: int, max_tokens: int | None,
              now_s: float) -> Decision | Waiter:
        """The controller's decision, or a ``Waiter`` when the request waits for it (resolved later by ``drain``).

        A request of an entitlement with waiters joins their line without trying the check (first come, first
        served); any other runs the check at once, and waits only if it was refused for a reason that can pass
        before its deadline.
        """
        line = self._lines.get(entitlement) if entitlement is not None else None
        if line:
            assert entitlement is not None  # (a line exists only for a named entitlement)
            head = line[0].decision
            if self.room.full or len(line) >= self.config.max_waiters_per_entitlement:
                self.outcomes[WaitOutcome.QUEUE_FULL] += 1
                return _behind(head, entitlement, len(line))
            return self._join(line, entitlement, request_id, prompt_tokens, max_tokens, now_s, head)
        decision = self.controller.admit(entitlement, request_id, prompt_tokens, max_tokens, now_s)
        if decision.outcome not in WAITABLE or entitlement is None:
            return decision
        timeout_ms = self._timeouts_ms.get(entitlement, 0)
        if timeout_ms <= 0:
            return decision
        limits = self.controller.limits_of(entitlement)
        if limits.concurrency == 0 or limits.tokens_per_s <= 0 or limits.kv_bytes <= 0:
            self.outcomes[WaitOutcome.ZERO_LIMIT] += 1
            return decision
        if decision.outcome is _TOKEN_BUDGET and (decision.retry_after_ms > timeout_ms or not self.controller.fits_bucket(
                entitlement, prompt_tokens, max_tokens)):
            self.outcomes[WaitOutcome.TOO_LONG] += 1
            return decision
        if decision.outcome in SLOT_REFUSALS:
            estimate_ms = self.controller.slot_estimate_ms(entitlement, decision.outcome)
            if estimate_ms is not None and estimate_ms > timeout_ms:  # its slot frees after its deadline: go now
                self.outcomes[WaitOutcome.TOO_LONG] += 1
                return decision
        if self.room.full or self.config.max_waiters_per_entitlement < 1:
            self.outcomes[WaitOutcome.QUEUE_FULL] += 1
            return decision
        line = self._lines[entitlement] = deque()
        self._below_floor.discard(entitlement)  # (a new line: the last drain never saw it)
        self._unordered.discard(entitlement)
        return self._join(line, entitlement, request_id, prompt_tokens, max_tokens, now_s, decision)

    def _join(self, line: deque[Waiter], entitlement: str, request_id: str, prompt_tokens: int,
              max_tokens: int | None, now_s: float, decision: Decision) -> Waiter:
        self._seq += 1
        waiter = Waiter(request_id, entitlement, prompt_tokens, max_tokens, now_s,
                        now_s + self._timeouts_ms.get(entitlement, 0) / 1000, self._seq, decision,
                        line[0].decided_s if line else now_s)
        if line and waiter.deadline_s < line[-1].deadline_s:  # its timeout was shortened since the last one joined
            self._unordered.add(entitlement)
        line.append(waiter)
        self.room.used += 1
        return waiter

    def withdraw(self, waiter: Waiter, now_s: float) -> bool:
        """Take a waiter out of its line (its client went away). False when it was no longer waiting."""
        line = self._lines.get(waiter.entitlement)
        if waiter.outcome is not None or line is None:
            return False
        try:
            line.remove(waiter)
        except ValueError:
            return False
        if not line:
            del self._lines[waiter.entitlement]
            self._unordered.discard(waiter.entitlement)
        self._resolve(waiter, WaitOutcome.WITHDRAWN, waiter.decision, now_s)
        return True

    def withdraw_entitlement(self, entitlement: str, decision: Decision, now_s: float) -> list[Waiter]:
        """Resolve every waiter of ``entitlement`` with ``decision`` (it was removed or is no longer Bound)."""
        line = self._lines.pop(entitlement, None)
        self._unordered.discard(entitlement)
        if not line:
            return []
        for waiter in line:
            self._resolve(waiter, WaitOutcome.WITHDRAWN, decision, now_s)
        return list(line)

    # ---- waking up ---------------------------------------------------------------------------------------
    def drain(self, now_s: float) -> list[Waiter]:
        """Admit every waiter whose check passes now, in priority order, and time out those past their deadline.
        Returns the waiters resolved, each with its final ``decision`` and ``outcome``."""
        lines = self._lines
        if not lines:
            return []
        if len(lines) == 1:  # (the common case: nothing to order)
            order = list(lines.items())
        else:
            limits_of = self.controller.limits_of
            order = sorted(lines.items(), key=lambda item: (-limits_of(item[0]).priority, item[1][0].seq))
        resolved: list[Waiter] = []
        floor_reached = False  # a head was refused for low priority: lower lines cannot pass either
        below = self._below_floor
        below.clear()
        for name, line in order:
            if floor_reached:
                below.add(name)
                self._expire(line, now_s, resolved, None)
            else:
                floor_reached = self._serve(name, line, now_s, resolved)
            if not line:
                del lines[name]
                self._unordered.discard(name)
        return resolved

    def _serve(self, name: str, line: deque[Waiter], now_s: float, resolved: list[Waiter]) -> bool:
        """Admit the line's heads while they pass; True when the head stays refused for low priority."""
        controller = self.controller  # (its method called on it: compiled, a native call, not a bound method's)
        while line:
            head = line[0]
            decision = controller.admit(name, head.request_id, head.prompt_tokens, head.max_tokens, now_s)
            if decision.outcome is _ADMITTED:
                line.popleft()
                self._resolve(head, WaitOutcome.ADMITTED, decision, now_s)
                resolved.append(head)
                continue
            if decision.outcome not in WAITABLE:  # no longer waits for capacity (e.g. its entitlement expired)
                line.popleft()
                self._resolve(head, WaitOutcome.WITHDRAWN, decision, now_s)
                resolved.append(head)
                continue
            head.decision, head.decided_s = decision, now_s
            if head.deadline_s <= now_s:
                line.popleft()
                self._resolve(head, WaitOutcome.TIMED_OUT, decision, now_s)
                resolved.append(head)
                continue
            self._expire(line, now_s, resolved, decision)
            # the pool's floor: only a refusal of a full (contended) pool holds for every lower line; one for slots
            # kept for protected limits does not hold for a protected line below
            return decision.outcome is _LOW_PRIORITY and self.controller.contended
        return False

    def _expire(self, line: deque[Waiter], now_s: float, resolved: list[Waiter], head: Decision | None) -> None:
        """Time out the waiters of ``line`` past their deadline; ``head``: the head's fresh refusal, if known."""
        if self._earliest_deadline_s(line) > now_s:
            return
        keep: list[Waiter] = []
        for position, waiter in enumerate(line):
            if waiter.deadline_s > now_s:
                keep.append(waiter)
                continue
            if position == 0 and head is None:  # the head's refusal, fresh at its deadline
                head = self.controller.admit(waiter.entitlement, waiter.request_id, waiter.prompt_tokens,
                                             waiter.max_tokens, now_s)
                if head.outcome is _ADMITTED:  # (below the floor nothing passes; a lower line's head may fit its own way)
                    self._resolve(waiter, WaitOutcome.ADMITTED, head, now_s)
                    resolved.append(waiter)
                    continue
                final = head
            else:
                final = waiter.decision if position == 0 else _behind(head or waiter.decision, waiter.entitlement,
                                                                      position)
            self._resolve(waiter, WaitOutcome.TIMED_OUT, final, now_s)
            resolved.append(waiter)
        line.clear()
        line.extend(keep)

    def _resolve(self, waiter: Waiter, outcome: WaitOutcome, decision: Decision, now_s: float) -> None:
        waiter.outcome, waiter.decision, waiter.resolved_s = outcome, decision, now_s
        self.room.used -= 1
        self.outcomes[outcome] += 1

    def next_wake_s(self) -> float | None:
        """When ``drain`` next has something to do without a release or a limit change: the earliest deadline, or
        the moment a head refused for its token budget would pass (its refusal's exact ``retry_after_ms``). A line
        the last drain found below the pool's priority floor waits for a release (which drains anyway), not for its
        bucket: only its deadlines count."""
        wake: float | None = None
        below = self._below_floor
        for name, line in self._lines.items():
            deadline_s = self._earliest_deadline_s(line)
            if wake is None or deadline_s < wake:
                wake = deadline_s
            head = line[0]
            if head.decision.outcome is _TOKEN_BUDGET and name not in below:
                due = head.decided_s + head.decision.retry_after_ms / 1000
                if wake is None or due < wake:
                    wake = due
        return wake

    def _earliest_deadline_s(self, line: deque[Waiter]) -> float:
        """The earliest deadline in a (non-empty) line: its head's, unless a shortened timeout broke their order."""
        if line[0].entitlement not in self._unordered:
            return line[0].deadline_s
        return min(w.deadline_s for w in line)

    # ---- views -------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return sum(len(line) for line in self._lines.values())

    def waiting_of(self, entitlement: str) -> int:
        line = self._lines.get(entitlement)
        return len(line) if line else 0


def _behind(head: Decision, entitlement: str, ahead: int) -> Decision:
    """A refusal for a request behind ``ahead`` waiters of its entitlement: the head's, with its wait estimate."""
    return Decision(head.outcome, f"{ahead} earlier requests of entitlement {entitlement} are waiting ({head.reason})",
                    head.retry_after_s, retry_after_ms=head.retry_after_ms)
