"""A live pass as a ``ReplayResult``, so the simulation's own summaries and figures apply to it unchanged.

Mapping (everything in experiment seconds since the pass's origin):

- decisions: one per attempt the load generator made, with the outcome the proxy answered (``error`` for an
  attempt that got no answer); the priority a request carried is not visible to a client (0);
- waits at the proxy, which a client sees only as a slow answer, from the proxies' own decisions (joined by the
  proxy's request id): an attempt's ``queued_s`` is its final decision's ``queued_ms``, and every ``waits``
  decision is a wait's start with the refusal it began with (``ReplayResult.wait_starts``), so the first-refusal
  counts (``metrics.refusal_events``) mean what they mean in the simulation;
- completions: the admitted attempts that finished (TTFT and latency measured by the client, from sending the
  admitted attempt); ``queue_s``, the time a request waited in the backend's queue, is estimated per request as its
  TTFT above the backend's full-load TTFT, and only while Prometheus saw a waiting queue (else 0) — a client cannot
  see the queue, and a slow client loop must not be mistaken for one. The summaries' ``max_waiting`` keys are then
  replaced by the backend's own maximum from Prometheus (``runner``);
- samples: the pool's running/waiting/slots from Prometheus; per entitlement, the admitted requests in flight at each
  ``sample_s`` (running = in flight minus those estimated to be queued);
- ticks: the agents' limit updates (priority, debt, burst, limits) as they were published.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from tokenpools.replay.policy import EntitlementTick, PoolTick
from tokenpools.replay.replayer import Completions, Decisions, ReplayResult, Samples
from tokenpools.replay.scenario import Scenario
from tokenpools.topics.records import LimitUpdate, RequestDecided
from tokenpools_dev.loadgen.plan import LoadResult, count_at


def _waiting_at(pool: Sequence[tuple[float, int, int, int]]) -> tuple[list[float], list[int]]:
    return [p[0] for p in pool], [p[2] for p in pool]


def queue_estimate(ttft_s: float | None, admitted_s: float, reference_ttft_s: float,
                   times: Sequence[float], waiting: Sequence[int], scrape_s: float) -> float:
    """Backend queueing of one request (see the module doc)."""
    if ttft_s is None or not times:
        return 0.0
    lo = bisect.bisect_left(times, admitted_s - scrape_s)
    hi = bisect.bisect_right(times, admitted_s + ttft_s + scrape_s)
    if not any(waiting[i] > 0 for i in range(lo, min(hi, len(waiting)))):
        return 0.0
    return max(0.0, ttft_s - reference_ttft_s)


def ticks_of(updates: Sequence[LimitUpdate], origin_s: float, time_scale: float) -> tuple[list[EntitlementTick], list[PoolTick]]:
    ents, pools = [], []
    for u in sorted(updates, key=lambda u: u.version):
        t = (u.t_ms / 1000 - origin_s) / time_scale
        if t < 0:
            continue
        for e in u.entitlements:
            ents.append(EntitlementTick(round(t, 3), e.name, e.priority, e.debt, e.burst, e.concurrency,
                                        e.tokens_per_s * time_scale, 0.0, 0.0, 0.0))
        pools.append(PoolTick(round(t, 3), u.contended, int(u.backend_waiting), u.capacity_concurrency,
                              u.mean_slo_ms / time_scale, 0, 0))
    return ents, pools


def proxy_waits(decided: Sequence[RequestDecided], origin_s: float,
                time_scale: float) -> tuple[dict[str, float], list[tuple[float, str, str]]]:
    """The waits at the proxy, from its decisions: experiment seconds waited by proxy request id (final decisions
    after a wait), and (start, entitlement, the refusal it began with) of every wait, in time order."""
    queued: dict[str, float] = {}
    starts: list[tuple[float, str, str]] = []
    for d in decided:
        if d.entitlement is None:
            continue
        if d.waits:
            starts.append((round((d.t_ms / 1000 - origin_s) / time_scale, 4), d.entitlement, d.outcome.value))
        elif d.queued_ms:
            queued[d.request_id] = d.queued_ms / 1000 / time_scale
    return queued, sorted(starts)


def to_replay_result(scenario: Scenario, policy: str, load: LoadResult, pool: Sequence[tuple[float, int, int, int]],
                     updates: Sequence[LimitUpdate] = (), reference_ttft_s: float = 0.1, scrape_s: float = 1.0,
                     sample_s: float = 0.5, decided: Sequence[RequestDecided] = ()) -> ReplayResult:
    """``pool``: (t, running, waiting, slots) rows from ``observe.pool_samples``; ``scrape_s`` in experiment s;
    ``decided``: the proxies' decisions of the pass (none: no wait at the proxy is known)."""
    k = load.time_scale
    queued_at_proxy, wait_starts = proxy_waits(decided, load.origin_s, k)
    dec, comp, samples = Decisions(), Completions(), Samples(pool=list(pool))
    for a in sorted(load.attempts, key=lambda a: (a.t_s, a.request_id, a.attempt)):
        dec.t_s.append(round(a.t_s, 4))
        dec.entitlement.append(a.entitlement)
        dec.request_id.append(a.request_id)
        dec.attempt.append(a.attempt)
        dec.outcome.append(a.outcome)
        dec.reason.append(a.reason)
        dec.retry_after_s.append(a.retry_after_s)
        dec.retry_after_ms.append(round(a.retry_after_ms / k))  # the header is wall ms; the replay's, experiment ms
        dec.retry_wait_s.append(a.retry_wait_s)
        dec.prompt_tokens.append(a.prompt_tokens)
        dec.max_tokens.append(a.max_tokens)
        dec.priority.append(0.0)
        dec.queued_s.append(round(queued_at_proxy.get(a.proxy_request_id, 0.0), 4) if a.proxy_request_id else 0.0)
    times, waiting = _waiting_at(pool)
    queued: dict[str, list[tuple[float, float]]] = {}
    flights: dict[str, list[tuple[float, float]]] = {}
    for c in sorted(load.completions, key=lambda c: (c.admitted_s, c.request_id)):
        flights.setdefault(c.entitlement, []).append((c.admitted_s, c.t_s))
        if c.status != "ok":
            continue
        q = queue_estimate(c.ttft_s, c.admitted_s, reference_ttft_s, times, waiting, scrape_s)
        queued.setdefault(c.entitlement, []).append((c.admitted_s, c.admitted_s + q))
        for column, value in ((comp.request_id, c.request_id), (comp.entitlement, c.entitlement),
                              (comp.attempt, c.attempt), (comp.first_attempt_s, round(c.first_attempt_s, 4)),
                              (comp.admitted_s, round(c.admitted_s, 4)), (comp.t_s, round(c.t_s, 4)),
                              (comp.prompt_tokens, c.prompt_tokens), (comp.completion_tokens, c.completion_tokens),
                              (comp.ttft_s, round(c.ttft_s if c.ttft_s is not None else c.e2e_s, 4)),
                              (comp.e2e_s, round(c.e2e_s, 4)), (comp.queue_s, round(q, 4))):
            column.append(value)  # type: ignore[attr-defined]
    names = [e.name for e in scenario.entitlements]
    end = max(scenario.duration_s, load.end_s)
    t = 0.0
    while t <= end:
        for name in names:
            n = count_at(flights.get(name, []), t)
            samples.by_entitlement.append((round(t, 3), name, n - count_at(queued.get(name, []), t),
                                           count_at(queued.get(name, []), t), n))
        t += sample_s
    ent_ticks, pool_ticks = ticks_of(updates, load.origin_s, k) if policy == "token-pools" else ([], [])
    evicted = sum(1 for c in load.completions if c.status == "evicted")
    return ReplayResult(scenario, policy, dec, comp, samples, ent_ticks, pool_ticks, dict(load.abandoned),
                        dict(load.pending), 0, evicted, load.end_s, wait_starts=wait_starts)
