"""Outcome metrics of a replay: latency percentiles, queue depth, refusals by reason, debt and priority.

Definitions (the report repeats them):

- P99 is the nearest-rank percentile (``tokenpools.core.quantiles``): the smallest value at or above 99% of the
  samples.
- TTFT is per admitted request, from its admission to its first token (vLLM's own TTFT); the *client* TTFT adds
  the time from the request's first attempt to the attempt that was admitted (refusals and retry waits).
- The waiting queue is exact, not sampled: every admitted request waited from its submission to its first
  scheduling (``queue_s``), and the maximum overlap of those intervals is the largest queue the backend had.
- A phase's refusal rate counts decisions (every attempt, retries included) whose time falls in the phase.
- A decision's time is its final one: a request that waited in the proxy's queue is decided when it was admitted or
  refused, ``queued_s`` after it arrived; its client TTFT includes that wait (its admission is that late).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from tokenpools.core.enforcement import Enforcement, effective
from tokenpools.core.quantiles import p99
from tokenpools.replay.replayer import ReplayResult


def _in(t: float, start: float, end: float) -> bool:
    return start <= t < end


def ttfts(result: ReplayResult, entitlements: Sequence[str], start: float = 0.0, end: float = math.inf,
          client: bool = False) -> list[float]:
    """TTFTs of admitted requests of ``entitlements`` admitted in [start, end)."""
    c = result.completions
    names = set(entitlements)
    out = []
    for ent, admitted, first, ttft in zip(c.entitlement, c.admitted_s, c.first_attempt_s, c.ttft_s):
        if ent in names and _in(admitted, start, end):
            out.append(ttft + (admitted - first if client else 0.0))
    return out


def queue_waits(result: ReplayResult, entitlements: Sequence[str], start: float = 0.0,
                end: float = math.inf) -> list[float]:
    """How long the attempts of ``entitlements`` that waited in the proxy's queue waited, decided in [start, end)."""
    d = result.decisions
    names = set(entitlements)
    return [q for t, ent, q in zip(d.t_s, d.entitlement, d.queued_s) if q > 0 and ent in names and _in(t, start, end)]


def refusals(result: ReplayResult, start: float = 0.0, end: float = math.inf) -> dict[str, dict[str, int]]:
    """entitlement → refusal reason → decisions in [start, end) (every entitlement that had a decision)."""
    return {e: {k: v for k, v in c.items() if k != "admitted"} for e, c in decision_counts(result, start, end).items()}


def refusal_events(result: ReplayResult) -> list[tuple[float, str, str]]:
    """Every attempt's first refusal as (t_s, entitlement, reason), in time order: what a proxy without a queue (the
    paper's) would have refused. An attempt refused at once counts at its decision; one that waited in the proxy's
    queue counts once, at the start of its wait, with the refusal the wait began with (``ReplayResult.wait_starts``),
    whatever became of it (admitted, or refused again at its deadline: that second refusal is not counted again)."""
    d = result.decisions
    at_once = [(t, ent, outcome) for t, ent, outcome, q in zip(d.t_s, d.entitlement, d.outcome, d.queued_s)
               if outcome != "admitted" and q == 0]
    return sorted(at_once + list(result.wait_starts))


def first_refusals(result: ReplayResult, start: float = 0.0, end: float = math.inf) -> dict[str, dict[str, int]]:
    """entitlement → reason → first refusals (``refusal_events``) in [start, end)."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for t, ent, reason in refusal_events(result):
        if _in(t, start, end):
            counts[ent][reason] += 1
    return {e: dict(sorted(v.items())) for e, v in sorted(counts.items())}


def waits_by_reason(result: ReplayResult) -> dict[str, dict[str, int]]:
    """entitlement → the refusal a wait in the proxy's queue began with → waits."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for _, ent, reason in result.wait_starts:
        counts[ent][reason] += 1
    return {e: dict(sorted(v.items())) for e, v in sorted(counts.items())}


def served_between(result: ReplayResult, entitlement: str, start: float, end: float) -> int:
    """Requests of ``entitlement`` that completed in [start, end)."""
    c = result.completions
    return sum(1 for e, t in zip(c.entitlement, c.t_s) if e == entitlement and _in(t, start, end))


def e2es(result: ReplayResult, entitlements: Sequence[str], start: float = 0.0, end: float = math.inf) -> list[float]:
    c = result.completions
    names = set(entitlements)
    return [e2e for ent, admitted, e2e in zip(c.entitlement, c.admitted_s, c.e2e_s) if ent in names and _in(admitted, start, end)]


def waiting_profile(result: ReplayResult) -> list[tuple[float, int]]:
    """(time, waiting after that time) at every change of the backend's waiting queue."""
    c = result.completions
    changes: list[tuple[float, int]] = []
    for admitted, queue in zip(c.admitted_s, c.queue_s):
        if queue > 0:
            changes.append((admitted, 1))
            changes.append((admitted + queue, -1))
    changes.sort(key=lambda x: (x[0], x[1]))
    level, profile = 0, []
    for t, delta in changes:
        level += delta
        profile.append((t, level))
    return profile


def max_waiting(result: ReplayResult, start: float = 0.0, end: float = math.inf) -> int:
    best, level = 0, 0
    for t, value in waiting_profile(result):
        if t >= end:
            break
        level = value
        if t >= start:
            best = max(best, level)
    return best


def decision_counts(result: ReplayResult, start: float = 0.0, end: float = math.inf) -> dict[str, dict[str, int]]:
    """entitlement → outcome → decisions in [start, end)."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    d = result.decisions
    for t, ent, outcome in zip(d.t_s, d.entitlement, d.outcome):
        if _in(t, start, end):
            counts[ent][outcome] += 1
    return {e: dict(sorted(v.items())) for e, v in sorted(counts.items())}


def shadow_counts(result: ReplayResult) -> dict[str, dict[str, int]]:
    """Per entitlement in shadow (docs/shadow.md): ``served`` (its admissions) and, by reason, the admissions enforce
    would have refused. Empty when no entitlement of the scenario is in shadow."""
    scenario = result.scenario
    shadowed = {e.name for e in scenario.entitlements
                if effective(e.enforcement, scenario.pool.enforcement) is Enforcement.SHADOW}
    if not shadowed:
        return {}
    counts: dict[str, dict[str, int]] = {name: {"served": 0} for name in sorted(shadowed)}
    d = result.decisions
    would_refuse = d.would_refuse or [""] * len(d.outcome)  # (rows assembled without the column: none)
    for ent, outcome, would in zip(d.entitlement, d.outcome, would_refuse):
        if ent in shadowed and outcome == "admitted":
            row = counts[ent]
            row["served"] += 1
            if would:
                row[would] = row.get(would, 0) + 1
    return counts


def refusal_rate(result: ReplayResult, entitlement: str, start: float, end: float, first_only: bool = False) -> float | None:
    d = result.decisions
    total = refused = 0
    for t, ent, outcome, attempt in zip(d.t_s, d.entitlement, d.outcome, d.attempt):
        if ent == entitlement and _in(t, start, end) and (attempt == 0 or not first_only):
            total += 1
            refused += outcome != "admitted"
    return refused / total if total else None


def mean_running(result: ReplayResult, entitlement: str, start: float, end: float) -> float | None:
    values = [running for t, ent, running, _, _ in result.samples.by_entitlement if ent == entitlement and _in(t, start, end)]
    return sum(values) / len(values) if values else None


def served(result: ReplayResult, entitlement: str) -> int:
    return sum(1 for e in result.completions.entitlement if e == entitlement)


def output_tokens_per_s(result: ReplayResult, entitlement: str, start: float, end: float) -> float:
    c = result.completions
    total = sum(n for e, t, n in zip(c.entitlement, c.t_s, c.completion_tokens) if e == entitlement and _in(t, start, end))
    return total / (end - start) if end > start else 0.0


def ticks_of(result: ReplayResult, entitlement: str) -> list:
    return [t for t in result.entitlement_ticks if t.entitlement == entitlement]


def mean_demand(result: ReplayResult, entitlement: str, start: float, end: float) -> float | None:
    """The mean demand (served + refused tokens/s) the ticks in [start, end) measured for ``entitlement``."""
    values = [t.demand_tokens_per_s for t in ticks_of(result, entitlement) if _in(t.t_s, start, end)]
    return sum(values) / len(values) if values else None


def first_priority(result: ReplayResult, entitlement: str) -> float | None:
    """w_e at the entitlement's first tick (no burst, no debt yet: the paper's quoted priorities)."""
    ticks = ticks_of(result, entitlement)
    return ticks[0].priority if ticks else None


def peak_debt(result: ReplayResult, entitlement: str) -> tuple[float, float] | None:
    """(max d_e, when)."""
    ticks = ticks_of(result, entitlement)
    if not ticks:
        return None
    best = max(ticks, key=lambda t: (t.debt, -t.t_s))
    return best.debt, best.t_s


def debt_decay_s(result: ReplayResult, recovery_s: float, until_s: float, threshold: float = 0.05,
                 absolute: bool = False) -> float | None:
    """Seconds after ``recovery_s`` from which every entitlement's debt stays below ``threshold`` until ``until_s``
    (``absolute``: |d_e|, so credit from bursting counts too). None if that never happens."""
    by_time: dict[float, float] = defaultdict(float)
    for tick in result.entitlement_ticks:
        if recovery_s <= tick.t_s < until_s:
            value = abs(tick.debt) if absolute else tick.debt
            by_time[tick.t_s] = max(by_time[tick.t_s], value)
    settled = None
    for t in sorted(by_time):
        if by_time[t] < threshold:
            if settled is None:
                settled = t
        else:
            settled = None
    return None if settled is None else settled - recovery_s


def abandoned_share(result: ReplayResult, entitlement: str) -> float | None:
    arrivals = sum(1 for a in result.scenario.arrivals if a.entitlement == entitlement)
    return result.abandoned.get(entitlement, 0) / arrivals if arrivals else None
