"""What a load run sends and what it records (pure data and functions; the sending is ``loadgen.client``).

Two load models (``LoadMode``, docs/load.md#open-and-closed-loop). Open loop: the experiment's own schedule
(``replay.experiments`` builds it: seeded Poisson arrivals per entitlement, token lengths, the client retry policy),
so the live run sends exactly the first attempts the simulation replays. Closed loop: N clients per entitlement
(``replay.load.ClosedLoad``), each sending its next request (``closed_requests``: the same requests whatever the
system does) when its previous one has ended. Both record the same attempts and completions. Everything here is in
*experiment time*: seconds since the run's origin divided by the time scale, so a run compressed 5× reports the
same numbers (TTFT 1 s, not 0.2 s) as the uncompressed one.

Requests: the prompt is ``prompt_tokens`` words (``tok tok …``: one token each for the simulator's dummy
tokenizer and for the proxy's 4-characters-per-token estimate); ``max_tokens`` is the arrival's, else its output
length, and ``ignore_eos`` makes the backend produce exactly that many tokens.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.quantiles import percentile

ADMITTED = AdmissionOutcome.ADMITTED.value
REFUSALS = {o.value for o in AdmissionOutcome if o is not AdmissionOutcome.ADMITTED}


class LoadMode(StrEnum):
    """How requests are sent: at their scheduled times whatever happens (open), or by clients that each wait for
    their previous request to end (closed)."""

    OPEN = "open"
    CLOSED = "closed"

    @property
    def label(self) -> str:
        """"open loop" / "closed loop", as the reports name the mode beside a number."""
        return f"{self.value} loop"


class RequestEnd(StrEnum):
    """How one request ended for the client that sent it (after all its attempts); a closed-loop client sends its
    next request after any of them but ``PENDING``."""

    SERVED = "served"  # admitted and streamed to its end
    EVICTED = "evicted"  # admitted, then aborted for a protected request
    ERROR = "error"  # admitted and broken, or no answer at all
    GIVEN_UP = "given_up"  # refused and not retried: out of retries, or a refusal with no retry header (401/403)
    PENDING = "pending"  # refused, and its retry was due after the run's end


def prompt_text(tokens: int) -> str:
    return " ".join(["tok"] * max(1, tokens))


def outcome_of(status: int, code: str | None) -> str:
    """The admission outcome a client can tell from the HTTP answer of one attempt.

    A 2xx is ``admitted``; a refusal carries the proxy's outcome as its error ``code``; anything else (a backend
    error passed through, no answer) is ``error``.
    """
    if 200 <= status < 300:
        return ADMITTED
    if code in REFUSALS:
        return str(code)
    return "error"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One HTTP call (a first attempt or a retry) and how admission answered it."""

    t_s: float
    entitlement: str
    request_id: str
    attempt: int
    outcome: str
    reason: str
    retry_after_s: int
    http_status: int
    prompt_tokens: int
    max_tokens: int
    target: str = ""
    proxy_request_id: str = ""
    retry_after_ms: int = 0  # the refusal's retry-after-ms header, 0 when it had none
    retry_wait_s: float = 0.0  # the wait (experiment s, jitter included) the client used before retrying; 0: none
    answered_s: float = 0.0  # when its answer came back: the refusal, the response's headers, or the failure


@dataclass(frozen=True, slots=True)
class Completion:
    """An admitted attempt that ended: ``status`` ok, evicted (aborted for a protected request) or error."""

    request_id: str
    entitlement: str
    attempt: int
    first_attempt_s: float
    admitted_s: float
    t_s: float
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float | None
    e2e_s: float
    status: str = "ok"
    proxy_request_id: str = ""


@dataclass(slots=True)
class LoadResult:
    attempts: list[Attempt] = field(default_factory=list)
    completions: list[Completion] = field(default_factory=list)
    abandoned: dict[str, int] = field(default_factory=dict)  # gave up after max_retries refusals
    pending: dict[str, int] = field(default_factory=dict)  # a retry was still waiting when the run stopped
    time_scale: float = 1.0
    origin_s: float = 0.0  # wall clock (epoch s) of experiment time 0
    end_s: float = 0.0  # experiment time the last request ended

    def ok(self) -> list[Completion]:
        return [c for c in self.completions if c.status == "ok"]


@dataclass(frozen=True, slots=True)
class RequestSpan:
    """One request as its client saw it: from its first attempt to its end, refusals and retry waits included."""

    request_id: str
    entitlement: str
    start_s: float
    end_s: float
    attempts: int
    served: bool


def request_spans(result: LoadResult) -> list[RequestSpan]:
    """Every request's span, by first attempt then id. It ends when its admitted attempt ended (its completion), else
    when the answer to its last attempt came back (a request given up, failed, or pending a retry at the end)."""
    attempts: dict[str, list[Attempt]] = defaultdict(list)
    for a in result.attempts:
        attempts[a.request_id].append(a)
    ended = {c.request_id: c for c in result.completions}
    spans = []
    for rid, tries in attempts.items():
        tries.sort(key=lambda a: a.attempt)
        done = ended.get(rid)
        end_s = done.t_s if done is not None else max(a.answered_s for a in tries)
        spans.append(RequestSpan(rid, tries[0].entitlement, tries[0].t_s, max(end_s, tries[0].t_s), len(tries),
                                 done is not None and done.status == "ok"))
    return sorted(spans, key=lambda s: (s.start_s, s.request_id))


def client_ttfts(result: LoadResult, entitlement: str) -> list[float]:
    """TTFT as the client lived it: from its request's first attempt to the first token, so the time spent refused,
    waiting to retry and waiting at the proxy counts (served requests only; the given-up are counted apart)."""
    return [c.admitted_s - c.first_attempt_s + c.ttft_s for c in result.ok()
            if c.entitlement == entitlement and c.ttft_s is not None]


def in_flight_intervals(result: LoadResult) -> dict[str, list[tuple[float, float]]]:
    """entitlement → [admitted_s, end) of every admitted attempt (whatever its end)."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for c in result.completions:
        out[c.entitlement].append((c.admitted_s, c.t_s))
    return out


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """The largest number of intervals open at one instant (an end at t closes before a start at t)."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    level = best = 0
    for _, delta in events:
        level += delta
        best = max(best, level)
    return best


def count_at(intervals: Sequence[tuple[float, float]], t: float) -> int:
    return sum(1 for a, b in intervals if a <= t < b)


def summary_rows(result: LoadResult) -> list[dict[str, object]]:
    """Per entitlement: attempts, admitted, refusals by reason, completions, P50/P99 TTFT (from sending the admitted
    attempt) and client TTFT (from the first attempt), end-to-end, and the most admitted attempts (``max_in_flight``)
    and requests, retry waits included (``max_open``), at one instant."""
    rows = []
    names = sorted({a.entitlement for a in result.attempts})
    spans = request_spans(result)
    for name in names:
        attempts = [a for a in result.attempts if a.entitlement == name]
        done = [c for c in result.completions if c.entitlement == name]
        ok = [c for c in done if c.status == "ok"]
        refused: dict[str, int] = defaultdict(int)
        for a in attempts:
            if a.outcome != ADMITTED:
                refused[a.outcome] += 1
        ttfts = [c.ttft_s for c in ok if c.ttft_s is not None]
        rows.append({
            "entitlement": name, "attempts": len(attempts), "admitted": sum(a.outcome == ADMITTED for a in attempts),
            "refused": dict(sorted(refused.items())), "ok": len(ok), "evicted": sum(c.status == "evicted" for c in done),
            "errors": sum(c.status == "error" for c in done), "abandoned": result.abandoned.get(name, 0),
            "p50_ttft_s": percentile(ttfts, 0.5), "p99_ttft_s": percentile(ttfts, 0.99),
            "p99_client_ttft_s": percentile(client_ttfts(result, name), 0.99),
            "p99_e2e_s": percentile([c.e2e_s for c in ok], 0.99),
            "max_in_flight": max_overlap(in_flight_intervals(result).get(name, [])),
            "max_open": max_overlap([(s.start_s, s.end_s) for s in spans if s.entitlement == name]),
        })
    return rows
