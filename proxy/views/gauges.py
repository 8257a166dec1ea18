"""The gauges a proxy's metrics read from its live objects at scrape time: per pool and entitlement, the requests in
flight, the bucket, the limits in force and their age, the waiters and how they fared; per budget, the units left
and how long this proxy's spending has waited for the agents; the event pipeline's stages and depths.

A view over admission and the outbox for ``observability.metrics``, which records and renders but reads neither.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from tokenpools.core.waiting import WaitOutcome
from tokenpools.proxy.admission.budgets import BudgetBook
from tokenpools.proxy.admission.pools import LimitsSource, PoolRuntime
from tokenpools.proxy.observability.metrics import PREFIX, ProxyMetrics, counter, gauge
from tokenpools.proxy.outbox.events import EventPipeline
from tokenpools.runtime.clock import Clock


def register_gauges(metrics: ProxyMetrics, pools: dict[str, PoolRuntime], events: EventPipeline,
                    clock: Clock, budgets: BudgetBook | None = None) -> None:
    """Fills ``metrics.gauges``: what the collector reads from the live pools, the budget accounts and the event
    pipeline at scrape time."""
    p = PREFIX

    def pool_gauges() -> Iterator[Metric]:
        now = clock.now_s()
        in_flight: dict[tuple[str, ...], float] = {}
        bucket: dict[tuple[str, ...], float] = {}
        limit: dict[tuple[str, ...], float] = {}
        debt: dict[tuple[str, ...], float] = {}
        for name, rt in pools.items():
            c = rt.controller
            for ent in c.entitlement_names():
                in_flight[(name, ent)] = c.in_flight_of(ent)
                bucket[(name, ent)] = c.bucket_tokens_of(ent, now)
                lim = c.limits_of(ent)
                limit[(name, ent, "concurrency")] = lim.concurrency
                limit[(name, ent, "tokens_per_s")] = lim.tokens_per_s
                limit[(name, ent, "kv_bytes")] = lim.kv_bytes
                limit[(name, ent, "priority")] = lim.priority
                # under static limits the last update's debt is no longer news: none exported
                if rt.in_force.source is LimitsSource.UPDATE and ent in rt.signals:
                    debt[(name, ent)] = rt.signals[ent][0]
        yield gauge(p + "in_flight", "Admitted requests in progress", ("pool", "entitlement"), in_flight)
        yield gauge(p + "bucket_tokens", "Tokens in the entitlement's bucket now", ("pool", "entitlement"), bucket)
        yield gauge(p + "limit", "Limits in force at this proxy", ("pool", "entitlement", "dimension"), limit)
        yield gauge(p + "entitlement_debt", "The agents' service debt of the entitlement in the limit update in force "
                    "(> 0: it got less than its baseline; none while static limits are in force)",
                    ("pool", "entitlement"), debt)
        yield gauge(p + "pool_concurrency", "This proxy's share of the pool's concurrency", ("pool",),
                    {(n,): rt.controller.pool_concurrency for n, rt in pools.items()})
        yield gauge(p + "limits_version", "Version of the last limit update applied (-1: none yet)", ("pool",),
                    {(n,): -1 if rt.in_force.version is None else rt.in_force.version for n, rt in pools.items()})
        yield gauge(p + "limits_age_seconds", "Time since the limits in force were put in force", ("pool",),
                    {(n,): rt.limits_age_s(now) for n, rt in pools.items()})
        yield gauge(p + "limits_static", "1 when static (fail-static) limits are in force", ("pool",),
                    {(n,): float(rt.in_force.source is LimitsSource.STATIC) for n, rt in pools.items()})
        yield gauge(p + "waiters", "Requests waiting for admission", ("pool",),
                    {(n,): len(rt.queue) for n, rt in pools.items()})
        yield counter(p + "queue_outcomes", "How requests that could wait fared: admitted, timed_out, queue_full, "
                      "too_long, withdrawn", ("pool", "outcome"),
                      {(n, o.value): rt.queue.outcomes[o] for n, rt in pools.items() for o in WaitOutcome})

    def budget_gauges() -> Iterator[Metric]:
        if budgets is None:
            return
        now_ms = clock.wall_ms()
        remaining = {(name, ent, spec.name): budgets.state(ent, spec, now_ms, e.tenant).remaining_units
                     for name, rt in pools.items() for ent, e in rt.entitlements.items() for spec in e.budgets}
        yield gauge(p + "budget_remaining_units", "Units a budget has left this period as this proxy sees it (the "
                    "agents' account less its own unpublished spending and reservations; negative: overshot)",
                    ("pool", "entitlement", "budget"), remaining)
        waited = {}
        for name, rt in pools.items():
            for ent, e in rt.entitlements.items():
                for spec in e.budgets:
                    since = budgets.unacknowledged_since(ent, spec.name)
                    waited[(name, ent, spec.name)] = 0.0 if since is None else max(0, now_ms - since) / 1000
        yield gauge(p + "budget_unacknowledged_seconds", "How long this proxy's oldest spending of a budget has waited "
                    "for the agents' record of it (0: none waits); past budgets.stale_after_s the view is stale "
                    "(docs/budgets.md#stale-views)", ("pool", "entitlement", "budget"), waited)

    def event_gauges() -> Iterator[Metric]:
        yield counter(p + "events", "Events by stage: queued, sent, spooled, drained, respooled, dropped",
                      ("stage",), {(k,): v for k, v in events.counts.as_dict().items()})
        yield gauge(p + "event_queue_depth", "Events in memory waiting for the producer", (),
                    {(): events.queue_depth})
        yield gauge(p + "event_in_flight", "Events handed to the producer, not yet acknowledged", (),
                    {(): events.in_flight})
        yield gauge(p + "event_spool_depth", "Events in the spool waiting to be drained", (),
                    {(): events.spool.pending})
        yield gauge(p + "event_spool_corrupt", "Spool lines skipped for a bad checksum", (),
                    {(): events.spool.corrupt})
        yield gauge(p + "events_degraded", "1 while events go to the spool instead of straight to Kafka (broker unreachable, or the spool still draining)", (),
                    {(): float(events.degraded)})

    metrics.gauges[:] = [pool_gauges, budget_gauges, event_gauges]
