"""The composition root: ``build_app`` makes every object of one proxy and wires them; nothing is global.

Kafka is reached only through the two factories (producer, consumer), so component tests pass in-memory fakes and
``kafka_enabled=False`` runs the proxy with static limits and every event kept in the spool.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tokenpools.proxy.aio import bounded
from tokenpools.proxy.auth import KeyTable
from tokenpools.proxy.clock import Clock, SystemClock
from tokenpools.proxy.events import EventPipeline
from tokenpools.proxy.forward import Upstream
from tokenpools.proxy.handlers import Handlers
from tokenpools.proxy.heartbeat import beat
from tokenpools.proxy.limits_consumer import LimitsApplier, consume, watchdog
from tokenpools.proxy.metrics import ProxyMetrics
from tokenpools.proxy.metrics_gauges import register_gauges
from tokenpools.proxy.options import ProxyConfig, ProxyOptions
from tokenpools.proxy.pools import PoolRuntime
from tokenpools.proxy.producer import KeyPartitioner, Producer, kafka_producer_factory
from tokenpools.proxy.responses import error_response
from tokenpools.proxy.spool import Spool
from tokenpools.proxy.upstream import UpstreamPool
from tokenpools.topics.declarations import topics_for


@dataclass
class Proxy:
    """Everything one proxy holds, for the handlers, the tests and ``/healthz``."""

    options: ProxyOptions
    pools: dict[str, PoolRuntime]
    metrics: ProxyMetrics
    clock: Clock
    events: EventPipeline | None = None
    handlers: Handlers | None = None
    limits: LimitsApplier | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


PROXY = web.AppKey("proxy", Proxy)


def kafka_consumer_factory(options: ProxyOptions) -> Callable[[], Any]:
    from aiokafka import AIOKafkaConsumer

    def make() -> Any:
        return AIOKafkaConsumer(bootstrap_servers=options.bootstrap_servers, group_id=None,
                                client_id=f"tokenpools-proxy-{options.proxy_id}-limits", enable_auto_commit=False,
                                auto_offset_reset="earliest", request_timeout_ms=10_000, retry_backoff_ms=500)

    return make


def build_app(config: ProxyConfig, options: ProxyOptions, *, clock: Clock | None = None,
              producer_factory: Callable[[], Producer] | None = None,
              consumer_factory: Callable[[], Any] | None = None) -> web.Application:
    """The aiohttp app of one proxy. Factories default to real Kafka when ``options.kafka_enabled``."""
    clock = clock or SystemClock()
    if options.kafka_enabled:
        producer_factory = producer_factory or kafka_producer_factory(options)
        consumer_factory = consumer_factory or kafka_consumer_factory(options)
    now_s, wall_s = clock.now_s(), clock.wall_ms() / 1000
    entitlements = list(config.entitlements.values())
    pools = {
        name: PoolRuntime(pool, entitlements, proxy_id=options.proxy_id, ttl_s=options.limits_ttl_s,
                          retry_after_s=options.retry_after_s, now_s=now_s, wall_s=wall_s,
                          constants=config.constants, limit_config=config.limit_config,
                          mean_slo=config.mean_slo_ms.get(name))
        for name, pool in config.pools.items()
    }
    proxy = Proxy(options, pools, ProxyMetrics(), clock)
    app = web.Application(client_max_size=options.max_body_bytes)
    app[PROXY] = proxy
    app.cleanup_ctx.append(_lifecycle(config, producer_factory, consumer_factory))
    app.router.add_post("/v1/chat/completions", _route(proxy, "chat"))
    app.router.add_post("/v1/completions", _route(proxy, "completions"))
    app.router.add_get("/v1/models", _route(proxy, "models"))
    app.router.add_get("/healthz", _bound(_healthz, proxy))
    app.router.add_get("/metrics", _bound(_metrics, proxy))
    app.router.add_route("*", "/v1/{tail:.*}", _not_found)
    return app


def _route(proxy: Proxy, name: str) -> Callable[[web.Request], Any]:
    async def handler(request: web.Request) -> web.StreamResponse:
        assert proxy.handlers is not None
        return await getattr(proxy.handlers, name)(request)

    return handler


def _bound(view: Callable[[Proxy], Any], proxy: Proxy) -> Callable[[web.Request], Any]:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await view(proxy)  # type: ignore[no-any-return]

    return handler


def _lifecycle(config: ProxyConfig, producer_factory: Callable[[], Producer] | None,
               consumer_factory: Callable[[], Any] | None) -> Callable[[web.Application], Any]:
    @contextlib.asynccontextmanager
    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        proxy = app[PROXY]
        options = proxy.options
        topics = topics_for(options.topic_prefix)
        spool = Spool(options.spool_dir / f"{options.proxy_id}.spool")
        events = EventPipeline(producer_factory, spool, queue_size=options.event_queue_size,
                               batch_size=options.event_batch_size, partitioner=KeyPartitioner(),
                               call_timeout_s=options.producer_request_timeout_ms / 1000 + 2.0)
        proxy.events = events
        proxy.limits = LimitsApplier(proxy.pools, proxy.metrics, proxy.clock, events, topics.dead_letters.name,
                                     f"proxy/{options.proxy_id}")
        register_gauges(proxy.metrics, proxy.pools, events, proxy.clock)
        upstream_pool = UpstreamPool(options.upstream_connect_timeout_s, options.upstream_read_timeout_s)
        entitlement_pool = {name: spec.pool for name, spec in config.entitlements.items()}
        proxy.handlers = Handlers(
            proxy_id=options.proxy_id, keys=KeyTable(config.key_digests), pools=proxy.pools,
            entitlement_pool=entitlement_pool, upstream=Upstream(upstream_pool, dict(config.endpoints), proxy.clock),
            events=events, topics=topics, metrics=proxy.metrics, clock=proxy.clock,
            max_body_bytes=options.max_body_bytes)
        await events.start()
        proxy.tasks = [
            asyncio.create_task(watchdog(proxy.limits, options.watchdog_interval_s), name="limits-watchdog"),
            asyncio.create_task(beat(events, topics.heartbeats.name, options.proxy_id, tuple(proxy.pools),
                                     proxy.clock, options.heartbeat_interval_s), name="heartbeat"),
        ]
        if consumer_factory is not None:
            proxy.tasks.append(asyncio.create_task(consume(proxy.limits, consumer_factory, topics.limits.name),
                                                   name="limits-consumer"))
        try:
            yield
        finally:
            for task in proxy.tasks:
                task.cancel()
            await bounded(asyncio.gather(*proxy.tasks, return_exceptions=True), 10.0, "background tasks")
            await upstream_pool.close()
            await events.stop(options.shutdown_flush_s)

    return lifecycle


async def _healthz(proxy: Proxy) -> web.Response:
    now = proxy.clock.now_s()
    events = proxy.events
    body = {
        "status": "ok",
        "proxy_id": proxy.options.proxy_id,
        "pools": {
            name: {"limits": rt.in_force.source.value, "version": rt.in_force.version,
                   "limits_age_s": round(rt.limits_age_s(now), 3), "in_flight": rt.controller.in_flight}
            for name, rt in proxy.pools.items()
        },
        "events": None if events is None else {
            "degraded": events.degraded, "queue": events.queue_depth, "spool": events.spool.pending,
            "in_flight": events.in_flight, **events.counts.as_dict()},
    }
    return web.Response(body=orjson.dumps(body), content_type="application/json")


async def _metrics(proxy: Proxy) -> web.Response:
    return web.Response(body=proxy.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4"})


async def _not_found(request: web.Request) -> web.Response:
    return error_response(404, f"{request.method} {request.path} is not served by this proxy",
                          "invalid_request_error", "not_found")
