"""What a load run sends and what it records (pure data and functions; the sending is ``loadgen.client``).

The schedule is the experiment's own (``replay.experiments`` builds it: seeded open-loop Poisson arrivals per
entitlement, token lengths, the client retry policy), so the live run sends exactly the first attempts the
simulation replays. Everything here is in *experiment time*: seconds since the run's origin divided by the time
scale, so a run compressed 5× reports the same numbers (TTFT 1 s, not 0.2 s) as the uncompressed one.

Requests: the prompt is ``prompt_tokens`` words (``tok tok …``: one token each for the simulator's dummy
tokenizer and for the proxy's 4-characters-per-token estimate); ``max_tokens`` is the arrival's, else its output
length, and ``ignore_eos`` makes the backend produce exactly that many tokens.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tokenpools.core.outcomes import AdmissionOutcome

ADMITTED = AdmissionOutcome.ADMITTED.value
REFUSALS = {o.value for o in AdmissionOutcome if o is not AdmissionOutcome.ADMITTED}


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


def percentile(values: Iterable[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else None


def summary_rows(result: LoadResult) -> list[dict[str, object]]:
    """Per entitlement: attempts, admitted, refusals by reason, completions, P50/P99 TTFT and end-to-end."""
    rows = []
    names = sorted({a.entitlement for a in result.attempts})
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
            "p99_e2e_s": percentile([c.e2e_s for c in ok], 0.99),
            "max_in_flight": max_overlap(in_flight_intervals(result).get(name, [])),
        })
    return rows
