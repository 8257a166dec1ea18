"""What a live fleet run refused, and whether N proxies hold against one (pure: records in, figures out).

A run is judged on its measured requests only (the schedule's arrivals after the warm-up), by their first and only
attempt: the fleet run sends no retries, so a refusal is one refused request and the two runs count the same
requests. ``errors`` are attempts the proxy never answered with an admission outcome (a transport failure, a
backend error passed through); they are neither admitted nor refused and a sane run has (almost) none.

The comparison, :func:`holds`: the N-proxy run may refuse at most ``factor`` times the single proxy's refusal rate,
applied to its own number of requests, plus ``allowance`` requests. The allowance is what keeps a single-proxy rate
of 0 meaningful: with it, 1.5 × 0 does not turn one refusal into a failure, while a fleet that refuses more than a
handful of requests where one proxy refused none still fails. A few requests is below the noise of the
single-proxy count itself (a few tens of refusals in a run, Poisson: ± their square root).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenpools.replay.load import Arrival
from tokenpools_dev.loadgen.plan import ADMITTED, REFUSALS, LoadResult

FACTOR = 1.5
ALLOWANCE_REQUESTS = 5


@dataclass(frozen=True, slots=True)
class RunFigures:
    """One run (one proxy count) over its measured requests."""

    proxies: int
    scheduled: int  # measured requests in the schedule
    requests: int  # of those, answered by a proxy (admitted or refused)
    admitted: int
    refused_by: Mapping[str, int] = field(default_factory=dict)  # admission outcome → requests
    errors: int = 0  # attempts with no admission outcome
    unsent: int = 0  # scheduled but no attempt recorded (the client never got to send it)
    ok: int = 0  # admitted and streamed to the end
    by_proxy: tuple[int, ...] = ()  # measured requests each proxy received, proxy 0 first
    mean_in_flight: float = 0.0  # admitted requests in flight per entitlement, mean over the measured window
    overshoot_max_slots: int = 0  # the most any entitlement had in flight above its limit, fleet-wide
    overshoot_fraction: float = 0.0  # slot-seconds above the limits ÷ the limits' slot-seconds (measured window)

    @property
    def refused(self) -> int:
        return sum(self.refused_by.values())

    @property
    def refused_fraction(self) -> float:
        return self.refused / self.requests if self.requests else 0.0

    def summary(self) -> dict[str, Any]:
        return {"proxies": self.proxies, "scheduled": self.scheduled, "requests": self.requests,
                "admitted": self.admitted, "refused": self.refused, "refused_fraction": round(self.refused_fraction, 5),
                "refused_by": dict(sorted(self.refused_by.items())), "errors": self.errors, "unsent": self.unsent,
                "ok": self.ok, "by_proxy": list(self.by_proxy), "mean_in_flight": round(self.mean_in_flight, 3),
                "overshoot_max_slots": self.overshoot_max_slots, "overshoot_fraction": round(self.overshoot_fraction, 6)}


def overshoot(intervals: Mapping[str, Sequence[tuple[float, float]]], limit_slots: int) -> tuple[int, float]:
    """(the most any entitlement had in flight above ``limit_slots``, slot-seconds above it summed over them), from
    each entitlement's [admitted, ended) intervals. Ends sort before starts at one instant (a slot handed over)."""
    most, excess = 0, 0.0
    for spans in intervals.values():
        edges = sorted([(end, -1) for _, end in spans] + [(start, 1) for start, _ in spans])
        level, last = 0, 0.0
        for t, step in edges:
            if level > limit_slots:
                excess += (level - limit_slots) * (t - last)
            level, last = level + step, t
            most = max(most, level - limit_slots)
    return most, excess


def figures_of(load: LoadResult, measured: Mapping[str, Arrival], proxies: int, targets: Sequence[str],
               entitlements: int, window_s: float, limit_slots: int = 0) -> RunFigures:
    """``measured``: request id → arrival (``scenario.measured``); ``targets``: the proxies' URLs, proxy 0 first;
    ``window_s``: the measured window's length in experiment seconds; ``limit_slots``: every entitlement's
    concurrency limit (0: overshoot not measured). The overshoot is seen from the client: a request is in flight
    from its admission's answer to its end as the client saw them, a few ms inside the proxy's own interval."""
    first = {a.request_id: a for a in load.attempts if a.attempt == 0 and a.request_id in measured}
    outcomes = Counter(a.outcome for a in first.values())
    index = {t.rstrip("/"): i for i, t in enumerate(targets)}
    per_proxy = Counter(index.get(a.target.rstrip("/"), -1) for a in first.values())
    done = [c for c in load.completions if c.request_id in measured and c.attempt == 0]
    busy_s = sum(max(0.0, c.t_s - c.admitted_s) for c in done)
    spans: dict[str, list[tuple[float, float]]] = {}
    for c in load.completions:
        if c.request_id in measured:
            spans.setdefault(c.entitlement, []).append((c.admitted_s, c.t_s))
    most, excess = overshoot(spans, limit_slots) if limit_slots > 0 else (0, 0.0)
    budget = limit_slots * entitlements * window_s
    return RunFigures(
        proxies=proxies, scheduled=len(measured), requests=sum(n for o, n in outcomes.items() if o != "error"),
        admitted=outcomes.get(ADMITTED, 0), refused_by={o: n for o, n in outcomes.items() if o in REFUSALS},
        errors=outcomes.get("error", 0), unsent=len(measured) - len(first), ok=sum(c.status == "ok" for c in done),
        by_proxy=tuple(per_proxy.get(i, 0) for i in range(proxies)),
        mean_in_flight=busy_s / (window_s * entitlements) if window_s > 0 and entitlements else 0.0,
        overshoot_max_slots=most, overshoot_fraction=excess / budget if budget > 0 else 0.0)


def ratio(one: RunFigures, many: RunFigures) -> float | None:
    """The N-proxy refusal rate ÷ the single proxy's; None when the single proxy refused nothing."""
    return many.refused_fraction / one.refused_fraction if one.refused_fraction > 0 else None


def allowed_refusals(one: RunFigures, many: RunFigures, factor: float = FACTOR,
                     allowance: int = ALLOWANCE_REQUESTS) -> float:
    """The most requests the N-proxy run may refuse (see the module doc)."""
    return factor * one.refused_fraction * many.requests + allowance


def holds(one: RunFigures, many: RunFigures, factor: float = FACTOR, allowance: int = ALLOWANCE_REQUESTS) -> bool:
    return many.refused <= allowed_refusals(one, many, factor, allowance)


def histogram_quantile(buckets: Mapping[float, float], q: float) -> float | None:
    """The upper bound of the bucket that holds quantile ``q`` of a cumulative histogram (upper bound → count,
    ``inf`` included); None when it is empty. What Prometheus' ``histogram_quantile`` gives, without interpolation."""
    if not 0 <= q <= 1:
        raise ValueError(f"`q` must be within [0, 1], got {q}")
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    wanted = q * ordered[-1][1]
    return next(bound for bound, count in ordered if count >= wanted)


def counts_age_buckets(expositions: Sequence[str]) -> dict[float, float]:
    """The proxies' ``counts_age_seconds`` histograms (their /metrics texts), summed over proxies and pools."""
    from prometheus_client.parser import text_string_to_metric_families

    summed: dict[float, float] = {}
    for text in expositions:
        for family in text_string_to_metric_families(text):
            if family.name != "tokenpools_proxy_counts_age_seconds":
                continue
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    bound = float(sample.labels["le"])
                    summed[bound] = summed.get(bound, 0.0) + sample.value
    return summed

