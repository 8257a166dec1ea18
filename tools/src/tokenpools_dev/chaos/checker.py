"""The chaos run's checker, pure: the history a run leaves → its figures and its findings (docs/chaos.md).

The history is what the clients saw (each attempt, each admitted request's end), what the topics hold (the proxies'
decisions and completion events, the agents' ledger and budget account), what the faults were and when, and the
proxies' in-flight gauges once the load has ended. The figures:

- ``lost``: a request a proxy answered with no decision on the topic (or without the request id that names it);
  an admitted request whose end the proxy saw with no completion event; an attempt no proxy answered outside a
  fault of its proxy; the ledger counting fewer requests than the distinct completion events. A request in flight at a proxy that was SIGKILLed (its process gone
  before it could report the end) is ``interrupted``, reported apart: nothing can report it, and the agents release
  its slot when the proxy's heartbeat expires.
- ``double_counted``: the ledger counting more requests than the distinct completion events, plus a request the
  proxies reported as two completions (two identities for one request id). A record the broker holds twice (the same
  identity at two offsets, a spool re-send) is ``held_twice``: expected after a broker outage, and counted once.
- ``budget_overshoot_ratio``: (spent − allowance)⁺ ÷ allowance of the budget the load exhausts, checked against the
  bound docs/budgets.md states for a fleet whose records stop (``on_stale: spend``).
- ``concurrency_overshoot``: the most slots an entitlement held above its limit, seen from the clients, checked against
  docs/fleet.md's worst-case growth bound.
- ``slots_held_after``: the proxies' in-flight gauges summed after the load.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from tokenpools_dev.chaos.schedule import FaultKind
from tokenpools_dev.loadgen.plan import max_overlap


@dataclass(frozen=True, slots=True)
class SentAttempt:
    """One HTTP attempt a client sent, and how it was answered (``proxy_request_id`` empty: no answer at all)."""

    request_id: str
    target: int  # the proxy's index
    sent_ms: int
    answered_ms: int
    proxy_request_id: str  # the answer's ``x-request-id``: the decision's request id
    outcome: str  # the client's reading (``admitted``, a refusal code, ``error``)
    http_status: int  # 0: no answer at all


@dataclass(frozen=True, slots=True)
class AdmittedEnd:
    """An admitted attempt as its client saw it end."""

    proxy_request_id: str
    entitlement: str
    target: int
    admitted_ms: int
    end_ms: int
    status: str  # ok, evicted or error (the stream broke)


@dataclass(frozen=True, slots=True)
class CompletionEvent:
    request_id: str
    entitlement: str
    proxy_id: str
    proxy_start_ms: int | None
    sequence: int | None
    offset: tuple[int, int]  # (partition, offset): where the broker holds it

    @property
    def identity(self) -> tuple[object, ...]:
        if self.sequence is None:  # no identity: each record is its own
            return ("offset", *self.offset)
        return (self.proxy_id, self.proxy_start_ms, self.entitlement, self.sequence)


@dataclass(frozen=True, slots=True)
class FaultWindow:
    kind: FaultKind
    target: int
    start_ms: int
    end_ms: int  # when the component served again

    def covers(self, t_ms: int, slack_ms: int) -> bool:
        return self.start_ms - slack_ms <= t_ms <= self.end_ms + slack_ms


@dataclass(frozen=True, slots=True)
class Budget:
    entitlement: str
    allowance_units: int
    spent_units: int  # of the distinct completion events, at the budget's weights


@dataclass(frozen=True, slots=True)
class History:
    attempts: Sequence[SentAttempt]
    ends: Sequence[AdmittedEnd]
    decided: frozenset[str]  # request ids with a decision on the requests topic
    completions: Sequence[CompletionEvent]
    ledger_requests: Mapping[str, int]  # entitlement → requests in the agents' newest usage records
    faults: Sequence[FaultWindow]
    in_flight_after: Mapping[int, float]  # proxy index → its in-flight gauges summed after the load
    limits: Mapping[str, int]  # entitlement → concurrency limit
    proxies: int
    budget: Budget | None = None
    reconciled: bool = False  # ``tokenpools usage --log LOG --reconcile`` exited 0
    slack_ms: int = 2000  # how far around a fault window a symptom still belongs to it


class Finding(StrEnum):
    LOST = "lost"
    DOUBLE_COUNTED = "double_counted"
    SLOTS_HELD = "slots_held_after"
    NOT_RECONCILED = "not_reconciled"
    BUDGET_OVERSHOOT = "budget_overshoot"
    CONCURRENCY_OVERSHOOT = "concurrency_overshoot"


@dataclass(frozen=True, slots=True)
class Figures:
    requests: int
    admitted: int
    completions: int  # distinct completion events
    held_twice: int
    lost: int
    lost_detail: Mapping[str, int]
    interrupted: int
    unanswered_in_faults: int
    double_counted: int
    slots_held_after: float
    reconciled: bool
    budget_overshoot_ratio: float | None
    budget_bound_ratio: float | None
    concurrency_overshoot: int
    concurrency_bound: int
    refused_by: Mapping[str, int] = field(default_factory=dict)  # the clients' refusals by outcome
    findings: tuple[Finding, ...] = field(default=())


def figures(h: History) -> Figures:
    """The figures of a history and the checks it fails (``findings``: empty when every check holds)."""
    kills = [f for f in h.faults if f.kind is FaultKind.PROXY_KILL]
    down = [f for f in h.faults if f.kind in (FaultKind.PROXY_KILL, FaultKind.PROXY_PAUSE)]

    def in_fault(windows: Sequence[FaultWindow], target: int, start_ms: int, end_ms: int) -> bool:
        return any(w.target == target and w.start_ms - h.slack_ms <= end_ms and start_ms <= w.end_ms + h.slack_ms
                   for w in windows)

    lost: Counter[str] = Counter()
    answered = [a for a in h.attempts if a.http_status]
    lost["unidentified"] = sum(1 for a in answered if not a.proxy_request_id)  # an answer no decision can be found for
    lost["undecided"] = sum(1 for a in answered if a.proxy_request_id and a.proxy_request_id not in h.decided)
    unanswered = [a for a in h.attempts if not a.http_status]
    in_faults = sum(1 for a in unanswered if in_fault(down, a.target, a.sent_ms, a.answered_ms))
    lost["unanswered"] = len(unanswered) - in_faults

    by_request: dict[str, set[tuple[object, ...]]] = defaultdict(set)
    for c in h.completions:
        by_request[c.request_id].add(c.identity)
    interrupted = 0
    for e in h.ends:
        if e.proxy_request_id in by_request:
            continue
        if in_fault(kills, e.target, e.admitted_ms, e.end_ms):
            interrupted += 1
        else:
            lost["uncompleted"] += 1

    identities = {c.identity: c for c in h.completions}
    held_twice = len(h.completions) - len(identities)
    distinct: Counter[str] = Counter(c.entitlement for c in identities.values())
    over = under = 0
    for ent in set(distinct) | set(h.ledger_requests):
        diff = h.ledger_requests.get(ent, 0) - distinct.get(ent, 0)
        over, under = over + max(0, diff), under + max(0, -diff)
    lost["ledger_missing"] = under
    twice_reported = sum(len(ids) - 1 for ids in by_request.values())
    double = over + twice_reported

    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in h.ends:
        intervals[e.entitlement].append((e.admitted_ms, e.end_ms))
    excess = {ent: max_overlap(spans) - h.limits[ent] for ent, spans in intervals.items() if ent in h.limits}
    concurrency = max([0, *excess.values()])
    bound = max([0, *((h.proxies - 1) * h.limits[ent] for ent in intervals if ent in h.limits)])

    ratio = bound_ratio = None
    budget_ok = True
    if h.budget is not None:
        b = h.budget
        ratio = max(0, b.spent_units - b.allowance_units) / b.allowance_units
        bound_ratio = float(h.proxies - 1)  # (N − 1) × what the last record left, which is at most the allowance
        budget_ok = ratio <= bound_ratio

    held = sum(h.in_flight_after.values())
    total_lost = sum(lost.values())
    findings = [f for f, bad in ((Finding.LOST, total_lost > 0), (Finding.DOUBLE_COUNTED, double > 0),
                                 (Finding.SLOTS_HELD, held > 0), (Finding.NOT_RECONCILED, not h.reconciled),
                                 (Finding.BUDGET_OVERSHOOT, not budget_ok),
                                 (Finding.CONCURRENCY_OVERSHOOT, concurrency > bound)) if bad]
    return Figures(
        requests=len({a.request_id for a in h.attempts}), admitted=len(h.ends), completions=len(identities),
        held_twice=held_twice, lost=total_lost, lost_detail={k: v for k, v in sorted(lost.items())},
        interrupted=interrupted, unanswered_in_faults=in_faults, double_counted=double, slots_held_after=held,
        reconciled=h.reconciled, budget_overshoot_ratio=None if ratio is None else round(ratio, 5),
        budget_bound_ratio=bound_ratio, concurrency_overshoot=concurrency, concurrency_bound=bound,
        refused_by=dict(sorted(Counter(a.outcome for a in answered if a.outcome not in ("admitted", "error")).items())),
        findings=tuple(findings))
