"""Prometheus metrics of one controller process and its ``/healthz``, on a port of their own (``controllers.http_*``).

A registry per process (no globals). ``tokenpools_controller_is_leader`` is read at scrape time from whoever
decides it (the elector: 1 while this replica may act; without leader election always 1), so a leader whose
deadline passed between two renewals reads 0 at once. ``tokenpools_controller_leader_transitions_total`` counts
every change of leadership by the outcome that made it (``LeaseOutcome``: acquired, expired_takeover, renewed
after a lapse, lost, released). ``tokenpools_controller_scale_commands_total`` counts the scale commands the
scaler handled, by pool and what became of them (``ScaleOutcome``, or ``CommandFailure``: failed, unknown_pool),
so a scaler that cannot patch a pool's workload is seen, not only logged.
``tokenpools_controller_entitlement_state`` is 1 for each entitlement's state in force (``EntitlementState``) and 0
for the others, from the acting replica's last evaluation; a standby exports none.
``tokenpools_controller_metrics_state{pool,state}`` and ``tokenpools_controller_metrics_source{pool,source}`` are
likewise 1 for the state of vLLM's series (``MetricsState``: fresh, stale, frozen) and the source of the load
(``MetricsSource``: vllm, proxies, none) in the metrics loop's last reading of each pool. ``/healthz`` answers 200 on a
leader and on a standby alike (a standby is healthy: it is what makes a rolling update safe) and says which it is,
in JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tokenpools.controllers.lease import LeaseOutcome
from tokenpools.controllers.reading import PoolReading
from tokenpools.controllers.scaler_policy import CommandFailure, ScaleOutcome
from tokenpools.core.classes import EntitlementState
from tokenpools.topics.records import MetricsSource, MetricsState

log = logging.getLogger("tokenpools.controllers")


class ControllerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.is_leader = Gauge("tokenpools_controller_is_leader",
                               "1 while this replica holds the Lease and runs the loops that write, else 0", registry=r)
        self.leader_transitions = Counter("tokenpools_controller_leader_transitions_total",
                                          "changes of this replica's leadership, by the outcome that made them",
                                          ["outcome"], registry=r)
        self.scale_commands = Counter("tokenpools_controller_scale_commands_total",
                                      "scale commands handled, by pool and what became of them (a scale outcome, "
                                      "or failed, unknown_pool)", ["pool", "outcome"], registry=r)
        self.entitlement_states: dict[tuple[str, str], EntitlementState] = {}  # (pool, entitlement) → state
        r.register(_EntitlementStates(self))  # type: ignore[arg-type]
        self.readings: dict[str, tuple[MetricsState, MetricsSource]] = {}  # pool → its last reading's
        r.register(_MetricsReadings(self))  # type: ignore[arg-type]

    def leading_from(self, leading: Callable[[], bool]) -> None:
        self.is_leader.set_function(lambda: 1.0 if leading() else 0.0)

    def count_transition(self, outcome: LeaseOutcome) -> None:
        self.leader_transitions.labels(outcome.value).inc()

    def count_scale_command(self, pool: str, outcome: ScaleOutcome | CommandFailure) -> None:
        self.scale_commands.labels(pool, outcome.value).inc()

    def set_entitlement_states(self, states: Mapping[tuple[str, str], EntitlementState]) -> None:
        """The states of the last evaluation, (pool, entitlement) → state; empty when this replica stops acting."""
        self.entitlement_states = dict(states)

    def set_readings(self, readings: Mapping[str, PoolReading]) -> None:
        """The metrics loop's last reading of each pool; empty when this replica stops acting."""
        self.readings = {pool: (r.state, r.source) for pool, r in readings.items()}

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class _EntitlementStates:
    """``tokenpools_controller_entitlement_state``, read at scrape time: every state of every entitlement, 1 for the
    one in force (so ``{state!="Bound"} == 1`` selects those that are not Bound)."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("tokenpools_controller_entitlement_state",
                                   "1 for the entitlement's state in force (Pending, Bound, Degraded, Expired), 0 "
                                   "for the others; exported by the replica that acts",
                                   labels=["pool", "entitlement", "state"])
        for (pool, name), current in sorted(self._m.entitlement_states.items()):
            for state in EntitlementState:
                family.add_metric([pool, name, state.value], 1.0 if state is current else 0.0)
        yield family


class _MetricsReadings:
    """``tokenpools_controller_metrics_state`` and ``_source``, read at scrape time: every state and source of every
    pool, 1 for the one in force (so ``tokenpools_controller_metrics_source{source="proxies"} == 1`` selects the
    pools whose load is read from the proxies)."""

    def __init__(self, metrics: ControllerMetrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        states = GaugeMetricFamily("tokenpools_controller_metrics_state",
                                   "1 for the state of the pool's vLLM series in the last reading (fresh; stale: no "
                                   "target, a failed scrape, old scrapes, no load series; frozen: counters still "
                                   "while the proxies see requests end), 0 for the others", labels=["pool", "state"])
        sources = GaugeMetricFamily("tokenpools_controller_metrics_source",
                                    "1 for where the pool's load came from in the last reading (vllm: its own "
                                    "series; proxies: their view, vLLM's not fresh; none: unknown), 0 for the others",
                                    labels=["pool", "source"])
        for pool, (current, source) in sorted(self._m.readings.items()):
            for state in MetricsState:
                states.add_metric([pool, state.value], 1.0 if state is current else 0.0)
            for each in MetricsSource:
                sources.add_metric([pool, each.value], 1.0 if each is source else 0.0)
        yield states
        yield sources


async def serve(metrics: ControllerMetrics, health: Callable[[], Mapping[str, Any]], host: str,
                port: int) -> tuple[Any, int]:
    """Start ``GET /metrics`` and ``GET /healthz`` on host:port (0: a free port); (aiohttp runner, bound port)."""
    from aiohttp import web

    async def handle_metrics(_: web.Request) -> web.Response:
        body, content_type = metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def handle_health(_: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(health()), content_type="application/json")

    app = web.Application()
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/healthz", handle_health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1] if runner.addresses else port
    log.info("controller /healthz and /metrics on http://%s:%d", host, bound)
    return runner, int(bound)
