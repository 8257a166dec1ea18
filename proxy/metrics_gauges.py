"""Gauges read from the live objects at scrape time: in flight, buckets, limits in force and their age, events."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric

from tokenpools.proxy.events import EventPipeline
from tokenpools.proxy.metrics import ProxyMetrics, counter, gauge
from tokenpools.proxy.pools import LimitsSource, PoolRuntime
from tokenpools.runtime.clock import Clock

P = "tokenpools_proxy_"


def register_gauges(metrics: ProxyMetrics, pools: dict[str, PoolRuntime], events: EventPipeline,
                    clock: Clock) -> None:
    def pool_gauges() -> Iterator[Metric]:
        now = clock.now_s()
        in_flight: dict[tuple[str, ...], float] = {}
        bucket: dict[tuple[str, ...], float] = {}
        limit: dict[tuple[str, ...], float] = {}
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
        yield gauge(P + "in_flight", "Admitted requests in progress", ("pool", "entitlement"), in_flight)
        yield gauge(P + "bucket_tokens", "Tokens in the entitlement's bucket now", ("pool", "entitlement"), bucket)
        yield gauge(P + "limit", "Limits in force at this proxy", ("pool", "entitlement", "dimension"), limit)
        yield gauge(P + "pool_concurrency", "This proxy's share of the pool's concurrency", ("pool",),
                    {(n,): rt.controller.pool_concurrency for n, rt in pools.items()})
        yield gauge(P + "limits_version", "Version of the last limit update applied (-1: none yet)", ("pool",),
                    {(n,): -1 if rt.in_force.version is None else rt.in_force.version for n, rt in pools.items()})
        yield gauge(P + "limits_age_seconds", "Time since the limits in force were put in force", ("pool",),
                    {(n,): rt.limits_age_s(now) for n, rt in pools.items()})
        yield gauge(P + "limits_static", "1 when static (fail-static) limits are in force", ("pool",),
                    {(n,): float(rt.in_force.source is LimitsSource.STATIC) for n, rt in pools.items()})

    def event_gauges() -> Iterator[Metric]:
        yield counter(P + "events", "Events by stage: queued, sent, spooled, drained, respooled, dropped",
                      ("stage",), {(k,): v for k, v in events.counts.as_dict().items()})
        yield gauge(P + "event_queue_depth", "Events in memory waiting for the producer", (),
                    {(): events.queue_depth})
        yield gauge(P + "event_in_flight", "Events handed to the producer, not yet acknowledged", (),
                    {(): events.in_flight})
        yield gauge(P + "event_spool_depth", "Events in the spool waiting to be drained", (),
                    {(): events.spool.pending})
        yield gauge(P + "event_spool_corrupt", "Spool lines skipped for a bad checksum", (),
                    {(): events.spool.corrupt})
        yield gauge(P + "events_degraded", "1 while events go to the spool instead of straight to Kafka (broker unreachable, or the spool still draining)", (),
                    {(): float(events.degraded)})

    metrics.gauges[:] = [pool_gauges, event_gauges]
