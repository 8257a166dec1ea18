"""The composition root: ``build_app`` makes every object of one proxy and wires them; nothing is global.
``listening`` serves it with the proxy's own HTTP server (``server.py``).

Specs are live (docs/tenancy.md): with Kafka and a ``catalogue`` the proxy follows the specs topic; without Kafka and
with ``watch`` (its --config file) it watches the file. ``live_specs`` puts a change in force.

Kafka is reached only through the factories (producer, consumers), made by the runtime's ``KafkaClients`` from
the ``kafka`` settings (security included), so component tests pass in-memory fakes and ``proxy.kafka_enabled=False``
runs the proxy with static limits and every event kept in the spool.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.waiting import WaitRoom
from tokenpools.proxy.aio import bounded
from tokenpools.proxy.access.auth import upstream_authorization
from tokenpools.proxy.inputs.budget_follower import BudgetFollower
from tokenpools.proxy.admission.budgets import BudgetBook, StaleRule
from tokenpools.proxy.outbox.events import EventPipeline
from tokenpools.proxy.backends.forward import Upstream
from tokenpools.proxy.observability.genai_metrics import MetricNames
from tokenpools.proxy.admission.handlers import Handlers
from tokenpools.proxy.outbox.heartbeat import beat
from tokenpools.proxy.http.http_limits import HttpLimits
from tokenpools.proxy.inputs.limits_consumer import LimitsApplier, consume, watchdog
from tokenpools.proxy.inputs.live_specs import LiveSpecs, tenancy_of
from tokenpools.proxy.observability.metrics import ProxyMetrics
from tokenpools.proxy.views.gauges import register_gauges
from tokenpools.proxy.options import ProxyConfig, ProxyOptions
from tokenpools.proxy.admission.pools import PoolRuntime
from tokenpools.proxy.outbox.producer import KeyPartitioner, Producer, kafka_producer_factory
from tokenpools.proxy.views.read_api import ReadApi
from tokenpools.proxy.admission.retries import RetryLinker
from tokenpools.proxy.http.messages import Request, Response, StreamResponse, error_response
from tokenpools.proxy.http.server import HttpServer
from tokenpools.proxy.inputs.spec_sources import ConfigWatcher, SpecsFollower
from tokenpools.proxy.outbox.spool import Spool
from tokenpools.proxy.backends.upstream import UpstreamPool
from tokenpools.proxy.admission.waiting import Waits
from tokenpools.proxy.outbox.watermarks import WatermarkOptions
from tokenpools.runtime.clock import Clock, SystemClock
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.runtime.specs import Catalogue
from tokenpools.runtime.tls import client_context
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.shards import keys_of


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
    waits: Waits | None = None
    specs: LiveSpecs | None = None
    budgets: BudgetBook = field(default_factory=BudgetBook)  # the budget accounts (docs/budgets.md#enforcement)
    budget_follower: BudgetFollower | None = None
    follower: SpecsFollower | None = None
    watcher: ConfigWatcher | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


def kafka_consumer_factory(kafka: KafkaClients, proxy_id: str) -> Callable[[], Any]:
    """The limits consumer: no group, every partition from the beginning (``limits_consumer.consume``)."""
    return kafka.consumer_factory(f"proxy-{proxy_id}-limits", group_id=None, enable_auto_commit=False,
                                  auto_offset_reset="earliest", request_timeout_ms=10_000, retry_backoff_ms=500)


def kafka_specs_consumer_factory(kafka: KafkaClients, proxy_id: str) -> Callable[[], Any]:
    """The specs consumer: no group, every partition from the beginning (the topic is compacted)."""
    return kafka.consumer_factory(f"proxy-{proxy_id}-specs", group_id=None, enable_auto_commit=False,
                                  auto_offset_reset="earliest", request_timeout_ms=10_000, retry_backoff_ms=500,
                                  fetch_max_wait_ms=100)


def kafka_budgets_consumer_factory(kafka: KafkaClients, proxy_id: str) -> Callable[[], Any]:
    """The budgets consumer: no group, every partition from the beginning (the topic is compacted: every account)."""
    return kafka.consumer_factory(f"proxy-{proxy_id}-budgets", group_id=None, enable_auto_commit=False,
                                  auto_offset_reset="earliest", request_timeout_ms=10_000, retry_backoff_ms=500,
                                  fetch_max_wait_ms=100)


def kafka_counts_consumer_factory(kafka: KafkaClients, proxy_id: str) -> Callable[[], Any]:
    """The counts consumer: no group, every partition from the newest record (older counts are not followed)."""
    return kafka.consumer_factory(f"proxy-{proxy_id}-counts", group_id=None, enable_auto_commit=False,
                                  auto_offset_reset="latest", request_timeout_ms=10_000, retry_backoff_ms=500,
                                  fetch_max_wait_ms=50)


class ProxyApp:
    """One proxy's objects plus its routes. ``start`` brings up the event pipeline, the handlers and the background
    tasks; ``stop`` takes them down (after the HTTP server has stopped taking requests: see ``listening``)."""

    def __init__(self, proxy: Proxy, config: ProxyConfig, producer_factory: Callable[[], Producer] | None,
                 consumer_factory: Callable[[], Any] | None,
                 counts_consumer_factory: Callable[[], Any] | None = None,
                 upstream_tls: ssl.SSLContext | None = None, *,
                 make_runtime: Callable[[PoolSpec, list[EntitlementSpec], float, float], PoolRuntime] | None = None,
                 catalogue: Catalogue | None = None, specs_consumer_factory: Callable[[], Any] | None = None,
                 watch: Path | None = None, budgets_consumer_factory: Callable[[], Any] | None = None,
                 upstream_authorization: str | None = None) -> None:
        self.proxy = proxy
        self._upstream_tls = upstream_tls  # how https:// backends are reached (built at start-up: build_app)
        self._upstream_auth = upstream_authorization  # what the backends get as Authorization (auth.py); None: none
        self._config = config
        self._producer_factory = producer_factory
        self._consumer_factory = consumer_factory
        self._counts_consumer_factory = counts_consumer_factory
        self._make_runtime = make_runtime
        self._catalogue = catalogue
        self._specs_consumer_factory = specs_consumer_factory
        self._watch = watch
        self._budgets_consumer_factory = budgets_consumer_factory
        self._upstream_pool: UpstreamPool | None = None
        self._routes: dict[tuple[str, str], Callable[[Request], Awaitable[Response | StreamResponse]]] = {}
        self._methods: dict[str, tuple[str, ...]] = {}

    async def start(self) -> None:
        proxy, config = self.proxy, self._config
        proxy_id, settings = proxy.options.proxy_id, proxy.options.settings
        topics = topics_for(proxy.options.topic_prefix)
        spool = Spool(settings.spool_dir / f"{proxy_id}.spool")
        pools = proxy.pools
        events = EventPipeline(self._producer_factory, spool, queue_size=settings.event_queue_size,
                               batch_size=settings.event_batch_size, partitioner=KeyPartitioner(),
                               call_timeout_s=settings.producer_request_timeout_ms / 1000 + 2.0,
                               watermarks=WatermarkOptions(proxy_id, (topics.requests.name, topics.completions.name),
                                                           tuple(k for name, rt in pools.items()
                                                                 for k in keys_of(name, rt.pool.shards)),
                                                           settings.watermark_interval_s),
                               clock=proxy.clock,
                               shards=lambda pool: rt.pool.shards if (rt := pools.get(pool)) is not None else 1)
        proxy.events = events
        waits = proxy.waits = Waits(proxy.clock, proxy.metrics)
        proxy.limits = LimitsApplier(proxy.pools, proxy.metrics, proxy.clock, events, topics.dead_letters.name,
                                     f"proxy/{proxy_id}", wake=waits.wake)
        proxy.budget_follower = BudgetFollower(proxy.budgets, proxy.pools, proxy.metrics, proxy.clock, events,
                                               topics.dead_letters.name, f"proxy/{proxy_id}/budgets")
        register_gauges(proxy.metrics, proxy.pools, events, proxy.clock, proxy.budgets)
        self._upstream_pool = UpstreamPool(settings.upstream_connect_timeout_s, settings.upstream_read_timeout_s,
                                           tls=self._upstream_tls)
        upstream = Upstream(self._upstream_pool, dict(config.endpoints), proxy.clock, self._upstream_auth)
        handlers = proxy.handlers = Handlers(
            proxy_id=proxy_id, tenancy=tenancy_of(config, 0), pools=proxy.pools, upstream=upstream,
            events=events, topics=topics, metrics=proxy.metrics, clock=proxy.clock,
            max_body_bytes=settings.max_body_bytes, waits=waits, budgets=proxy.budgets,
            budget_retry_cap_ms=proxy.options.budgets.retry_after_max_s * 1000,
            budget_stale=StaleRule.of(proxy.options.budgets),
            retries=RetryLinker(settings.retry_window_ms / 1000, settings.retry_max_entries))
        read_api = ReadApi(proxy_id=proxy_id, handlers=handlers, pools=proxy.pools, clock=proxy.clock,
                           admin_key_sha256=settings.admin_key_sha256)
        if self._make_runtime is not None:
            proxy.specs = LiveSpecs(proxy.pools, handlers, upstream, self._make_runtime, waits, proxy.metrics,
                                    proxy.clock, proxy.limits, config)
            if self._catalogue is not None:
                proxy.follower = SpecsFollower(self._catalogue, proxy.specs, events, topics.dead_letters.name,
                                               f"proxy/{proxy_id}/specs", proxy.clock)
            if self._watch is not None:
                proxy.watcher = ConfigWatcher(self._watch, proxy.specs, settings.config_poll_interval_s)
        self._routes = {
            ("POST", "/v1/chat/completions"): handlers.chat,
            ("POST", "/v1/completions"): handlers.completions,
            ("POST", "/v1/embeddings"): handlers.embeddings,
            ("POST", "/v1/responses"): handlers.responses,
            ("GET", "/v1/models"): handlers.models,
            ("GET", "/v1/tokenpools/limits"): read_api.limits,
            ("GET", "/v1/tokenpools/admin/limits"): read_api.admin_limits,
            ("GET", "/healthz"): self._healthz,
            ("HEAD", "/healthz"): self._healthz,
            ("GET", "/readyz"): self._readyz,
            ("HEAD", "/readyz"): self._readyz,
            ("GET", "/metrics"): self._metrics,
            ("HEAD", "/metrics"): self._metrics,
        }
        methods: dict[str, list[str]] = {}
        for method, path in self._routes:
            methods.setdefault(path, []).append(method)
        self._methods = {path: tuple(m) for path, m in methods.items()}
        await events.start()
        proxy.tasks = [
            asyncio.create_task(watchdog(proxy.limits, settings.watchdog_interval_s), name="limits-watchdog"),
            asyncio.create_task(beat(events, topics.heartbeats.name, proxy_id, proxy.pools,
                                     proxy.clock, settings.heartbeat_interval_s), name="heartbeat"),
        ]
        if self._consumer_factory is not None:
            proxy.tasks.append(asyncio.create_task(
                consume(proxy.limits.handle, self._consumer_factory, topics.limits.name), name="limits-consumer"))
        if proxy.follower is not None and self._specs_consumer_factory is not None:
            handlers.specs_loaded = False  # until the topic is read to its end (docs/tenancy.md)
            proxy.tasks.append(asyncio.create_task(
                consume(proxy.follower.handle, self._specs_consumer_factory, topics.specs.name,
                        caught_up=proxy.follower.caught_up), name="specs-consumer"))
        if self._budgets_consumer_factory is not None:
            proxy.tasks.append(asyncio.create_task(
                consume(proxy.budget_follower.handle, self._budgets_consumer_factory, topics.budgets.name),
                name="budgets-consumer"))
        if proxy.watcher is not None:
            proxy.tasks.append(asyncio.create_task(proxy.watcher.run(), name="config-watch"))
        if self._counts_consumer_factory is not None:
            proxy.tasks.append(asyncio.create_task(
                consume(proxy.limits.handle_counts, self._counts_consumer_factory, topics.counts.name),
                name="counts-consumer"))

    async def stop(self) -> None:
        proxy = self.proxy
        for task in proxy.tasks:
            task.cancel()
        await bounded(asyncio.gather(*proxy.tasks, return_exceptions=True), 10.0, "background tasks")
        if proxy.waits is not None:
            proxy.waits.close()
        if self._upstream_pool is not None:
            await self._upstream_pool.close()
        if proxy.events is not None:
            await proxy.events.stop(proxy.options.settings.shutdown_flush_s)

    async def handle(self, request: Request) -> Response | StreamResponse:
        """The router: exact paths; anything else under /v1 is 404, a known path with another method 405."""
        route = self._routes.get((request.method, request.path))
        if route is not None:
            return await route(request)
        allowed = self._methods.get(request.path)
        if allowed is not None:
            return error_response(405, f"{request.method} {request.path} is not allowed (use {', '.join(allowed)})",
                                  "invalid_request_error", "method_not_allowed", None, {"Allow": ", ".join(allowed)})
        return error_response(404, f"{request.method} {request.path} is not served by this proxy",
                              "invalid_request_error", "not_found")

    async def _healthz(self, request: Request) -> Response:
        proxy = self.proxy
        now = proxy.clock.now_s()
        events = proxy.events
        body = {
            "status": "ok",
            "proxy_id": proxy.options.proxy_id,
            "specs_version": proxy.metrics.spec_version,
            "specs_loaded": self.ready,
            "pools": {
                name: {"limits": rt.in_force.source.value, "version": rt.in_force.version,
                       "limits_age_s": round(rt.limits_age_s(now), 3), "in_flight": rt.controller.in_flight,
                       "waiting": len(rt.queue),
                       "replicas": rt.replicas, "counts_t_ms": rt.counts.t_ms if rt.counts is not None else None}
                for name, rt in proxy.pools.items()
            },
            "events": None if events is None else {
                "degraded": events.degraded, "queue": events.queue_depth, "spool": events.spool.pending,
                "in_flight": events.in_flight, **events.counts.as_dict()},
        }
        return Response(200, orjson.dumps(body), content_type="application/json")

    @property
    def ready(self) -> bool:
        """Whether the specs are loaded: always from a file; from the specs topic once it has been read to its end
        (``SpecsFollower.caught_up``)."""
        return self.proxy.handlers is not None and self.proxy.handlers.specs_loaded

    async def _readyz(self, request: Request) -> Response:
        """Readiness (a Kubernetes readinessProbe): 200 once the specs are loaded, else 503 and why. ``/healthz`` is
        liveness: it answers 200 while the proxy runs, ready or not."""
        if self.ready:
            body = {"status": "ready", "specs_version": self.proxy.metrics.spec_version, "pools": len(self.proxy.pools)}
            return Response(200, orjson.dumps(body), content_type="application/json")
        body = {"status": "not ready", "reason": "specs not loaded: the specs topic has not been read to its end yet"}
        return Response(503, orjson.dumps(body), content_type="application/json")

    async def _metrics(self, request: Request) -> Response:
        return Response(200, self.proxy.metrics.render(), content_type="text/plain; version=0.0.4; charset=utf-8")


def build_app(config: ProxyConfig, options: ProxyOptions, *, clock: Clock | None = None,
              kafka: KafkaClients | None = None, producer_factory: Callable[[], Producer] | None = None,
              consumer_factory: Callable[[], Any] | None = None, catalogue: Catalogue | None = None,
              specs_consumer_factory: Callable[[], Any] | None = None, watch: Path | None = None,
              budgets_consumer_factory: Callable[[], Any] | None = None) -> ProxyApp:
    """The app of one proxy. With ``proxy.kafka_enabled`` the factories not given are made by ``kafka``.

    Live specs (docs/tenancy.md): ``catalogue`` (the documents ``config`` was made from) is followed on the specs
    topic when Kafka is on (``specs_consumer_factory``, else made by ``kafka``); ``watch`` (the --config file) is
    watched when Kafka is off. Neither: the specs stay as started (``proxy.specs`` can still apply a change).

    Budgets (docs/budgets.md#enforcement): with Kafka the budgets topic is followed (``budgets_consumer_factory``,
    else made by ``kafka``); without, the proxy enforces from its own spending alone."""
    clock = clock or SystemClock()
    settings = options.settings
    if settings.kafka_enabled and (producer_factory is None or consumer_factory is None):
        if kafka is None:
            raise ValueError("proxy.kafka_enabled: build_app needs the KafkaClients (or both factories)")
        producer_factory = producer_factory or kafka_producer_factory(kafka, options.proxy_id, settings)
        consumer_factory = consumer_factory or kafka_consumer_factory(kafka, options.proxy_id)
    follow_counts = settings.kafka_enabled and options.fleet.follow_counts
    counts_factory = kafka_counts_consumer_factory(kafka, options.proxy_id) if kafka is not None and follow_counts else None
    if settings.kafka_enabled and budgets_consumer_factory is None and kafka is not None:
        budgets_consumer_factory = kafka_budgets_consumer_factory(kafka, options.proxy_id)
    now_s, wall_s = clock.now_s(), clock.wall_ms() / 1000
    entitlements = list(config.entitlements.values())
    room = WaitRoom(settings.max_waiters)  # one for the whole proxy: its pools' waiters share it

    def make_runtime(pool: PoolSpec, members: list[EntitlementSpec], now_s: float, wall_s: float) -> PoolRuntime:
        return PoolRuntime(pool, members, proxy_id=options.proxy_id, ttl_s=settings.limits_ttl_s,
                           retry_after_s=settings.retry_after_s, now_s=now_s, wall_s=wall_s,
                           constants=config.constants, limit_config=config.limit_config,
                           reservation=config.reservation, mean_slo=config.mean_slo_ms.get(pool.name),
                           fleet=options.fleet, queue=options.queue, room=room)

    pools = {name: make_runtime(pool, entitlements, now_s, wall_s) for name, pool in config.pools.items()}
    follow_specs = settings.kafka_enabled and catalogue is not None
    if follow_specs and specs_consumer_factory is None and kafka is not None:
        specs_consumer_factory = kafka_specs_consumer_factory(kafka, options.proxy_id)
    upstream_tls = client_context(group="proxy", prefix="upstream_ssl_", cafile=settings.upstream_ssl_cafile,
                                  certfile=settings.upstream_ssl_certfile, keyfile=settings.upstream_ssl_keyfile,
                                  check_hostname=settings.upstream_ssl_check_hostname)
    upstream_auth = upstream_authorization(settings.upstream_api_key_env, os.environ)
    metrics = ProxyMetrics(MetricNames(settings.metric_names))
    proxy = Proxy(options, pools, metrics, clock, budgets=BudgetBook(proxy_id=options.proxy_id))
    return ProxyApp(proxy, config, producer_factory, consumer_factory, counts_factory, upstream_tls,
                    make_runtime=make_runtime, catalogue=catalogue if follow_specs else None,
                    specs_consumer_factory=specs_consumer_factory,
                    watch=None if settings.kafka_enabled else watch,
                    budgets_consumer_factory=budgets_consumer_factory if settings.kafka_enabled else None,
                    upstream_authorization=upstream_auth)


@contextlib.asynccontextmanager
async def listening(app: ProxyApp, host: str, port: int, *, grace_s: float = 10.0) -> AsyncIterator[str]:
    """Start ``app`` and serve it on host:port (0: a free port) for the block; yields ``http://host:port``.

    On exit the server stops taking requests and lets those in progress finish (``grace_s``), then the app stops
    (background tasks, backend connections, a last flush of the events)."""
    await app.start()
    server = HttpServer(app.handle, HttpLimits.from_settings(app.proxy.options.settings), app.proxy.metrics.connections)
    try:
        bound_host, bound_port = await server.start(host, port)
    except BaseException:
        await app.stop()
        raise
    try:
        yield f"http://{bound_host}:{bound_port}"
    finally:
        await server.close(grace_s)
        await app.stop()
