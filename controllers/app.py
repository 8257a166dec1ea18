"""The composition root of ``tokenpools controller``: builds every object once and hands each loop what it needs.

Three loops run under one supervisor (``supervisor.run_loops``), each restarted on its own:

- ``entitlements``: custom resources (``CrdWatcher``) or the config file (``FileSource``) → specs topic, inventory,
  status;
- ``metrics``: Prometheus → backend-metrics topic, for the pools in the inventory;
- ``scaler``: scale topic → ``/scale`` of each pool's backend (no Kubernetes: decisions are only logged).

``--dry-run`` keeps reading and publishing to Kafka but never writes to Kubernetes (no scale patch, no status,
no Event). The process ends when every loop has stopped; a loop that failed permanently makes the exit code 1.
The Kafka producer and consumer are the runtime's (``KafkaClients``); time is the runtime's ``Clock``.

With leader election (``main.serve``, ``leader.lead``) the three loops run only on the replica that holds the
Lease — all or nothing: every one of them writes (the scaler ``/scale`` and Events, the entitlements loop status
and the specs topic, the metrics loop the backend-metrics topic), so a standby runs none of them. Each term of
leadership builds the controller afresh (``build_controller``), as a restart would: the inventory, the published
specs and the scaler's stabilisation state of a former term may be stale after another replica led, and the specs
are republished once (harmless on a compacted topic). ``acting`` (the elector's ``leading``) is checked by every
write, so a leader past its deadline writes nothing even before its loops are cancelled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenpools.config import ControllersSettings
from tokenpools.controllers.entitlements_loop import FileSource, Reconciler
from tokenpools.controllers.inventory import Inventory
from tokenpools.controllers.kube import KubeMode
from tokenpools.controllers.leader import Acting
from tokenpools.controllers.lease import LeaseTiming
from tokenpools.controllers.metrics import ControllerMetrics
from tokenpools.controllers.metrics_loop import MetricsLoop, MetricsOptions, PrometheusQuerier
from tokenpools.controllers.promql import QueryConfig
from tokenpools.controllers.publisher import KafkaPublisher, LeaderPublisher, Publisher
from tokenpools.controllers.scaler_loop import Scaler, ScalerLoop, ScalerOptions
from tokenpools.controllers.specs import SpecPublisher
from tokenpools.controllers.supervisor import LoopFactory
from tokenpools.runtime.clock import Clock, SystemClock
from tokenpools.runtime.kafka import KafkaClients


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    """What the command line resolved: the source, the namespace, and the ``controllers`` settings group with the
    flags of the same names applied (its defaults and checks live in the settings, not here)."""

    config_path: Path
    kubernetes: KubeMode | None  # None: --no-kubernetes (the config file is the source)
    kubeconfig: Path | None
    namespace: str  # --namespace, else kubernetes.namespace
    dry_run: bool
    knobs: ControllersSettings
    metrics: MetricsOptions
    file_poll_s: float = 2.0
    instance: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")  # controllers.lease_identity

    def __post_init__(self) -> None:
        if self.file_poll_s <= 0:
            raise ValueError(f"`file_poll_s` must be > 0, got {self.file_poll_s}")

    @classmethod
    def from_settings(cls, settings: Any, config_path: Path, kubernetes: KubeMode | None, *,
                      kubeconfig: Path | None = None, namespace: str | None = None, dry_run: bool = False,
                      **knobs: Any) -> ControllerOptions:
        """``knobs`` (fields of the ``controllers`` group, None: not given) win over the settings of the same names
        and are checked like them (a ValueError names the field); ``namespace`` defaults to kubernetes.namespace."""
        given = {name: value for name, value in knobs.items() if value is not None}
        group = ControllersSettings.model_validate({**settings.controllers.model_dump(), **given})
        metrics = MetricsOptions(group.metrics_interval_s, query_config(group))
        options = cls(config_path, kubernetes, kubeconfig, namespace or settings.kubernetes.namespace, dry_run, group,
                      metrics)
        return dataclasses.replace(options, instance=group.lease_identity) if group.lease_identity else options

    @property
    def resync_s(self) -> float:
        return self.knobs.resync_s

    @property
    def scale_command_max_age_s(self) -> float:
        return self.knobs.scale_command_max_age_s

    @property
    def leader_election(self) -> bool:
        """Whether to act only while holding the Lease: with Kubernetes, unless turned off or a dry run (which
        writes nothing, and so must never take the Lease from a replica that does)."""
        return self.knobs.leader_election and self.kubernetes is not None and not self.dry_run

    @property
    def lease_namespace(self) -> str:
        return self.knobs.lease_namespace or self.namespace

    @property
    def lease_timing(self) -> LeaseTiming:
        k = self.knobs
        return LeaseTiming(k.lease_duration_s, k.lease_renew_deadline_s, k.lease_retry_period_s)


@dataclass(slots=True)
class Controller:
    """The built process: its loops and the objects tests may look into."""

    loops: dict[str, LoopFactory]
    inventory: Inventory
    reconciler: Reconciler
    scaler: Scaler
    scaler_loop: ScalerLoop
    metrics: MetricsLoop
    source: Any  # CrdWatcher or FileSource


def query_config(group: ControllersSettings) -> QueryConfig:
    return QueryConfig(selector=group.metrics_selector, rate_window_s=group.rate_window_s,
                       stale_after_s=group.metrics_stale_after_s, proxy_selector=group.proxy_metrics_selector)


@contextlib.asynccontextmanager
async def build_controller(options: ControllerOptions, settings: Any, publisher: Publisher | None = None,
                           clock: Clock | None = None, acting: Acting | None = None,
                           controller_metrics: ControllerMetrics | None = None) -> AsyncIterator[Controller]:
    """Everything wired; the Kubernetes client, Prometheus session and Kafka producer are closed on exit. ``acting``:
    whether this replica may write now (the elector's ``leading``; None: always). ``controller_metrics``: the
    process's, where the scaler counts what became of each scale command and the reconciler leaves the entitlements'
    states."""
    counted = controller_metrics.count_scale_command if controller_metrics is not None else None
    observed = controller_metrics.set_entitlement_states if controller_metrics is not None else None
    read = controller_metrics.set_readings if controller_metrics is not None else None
    clock = clock or SystemClock()
    kafka = KafkaClients(settings.kafka)
    topics = kafka.topics()
    owned = publisher is None
    if owned:  # a refused login or TLS stops the controller at start-up; an outage is ridden out by its loops
        await kafka.require_access("controller")
    base: Publisher = KafkaPublisher(kafka.producer_factory(
        "controller", acks="all", enable_idempotence=True, linger_ms=5)) if publisher is None else publisher
    pub: Publisher = base if acting is None else LeaderPublisher(base, acting)
    inventory = Inventory()
    reconciler = Reconciler(inventory, SpecPublisher(pub, topics.specs.name, clock), options.namespace, clock,
                            observed=observed)
    token = settings.prometheus.bearer_token
    querier = PrometheusQuerier(settings.prometheus.url, token.get_secret_value() if token else None)
    metrics = MetricsLoop(inventory, querier, pub, topics.backend_metrics.name, options.metrics, clock, observed=read)
    scaler_options = ScalerOptions(settings.scaling.to_config(), options.scale_command_max_age_s, options.dry_run)
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(querier.close)
        if owned:
            stack.push_async_callback(base.close)  # type: ignore[attr-defined]
        if options.kubernetes is None:
            source: Any = FileSource(options.config_path, reconciler, options.file_poll_s, options.resync_s)
            scaler = Scaler(inventory, None, None, scaler_options, clock, counted=counted)
        else:
            from tokenpools.controllers.crd_watch import CrdWatcher, WatchOptions
            from tokenpools.controllers.kube import EventRecorder, ScaleClient, new_api_client
            from tokenpools.controllers.secrets import KeyResolver

            api = await stack.enter_async_context(await new_api_client(options.kubernetes, options.kubeconfig))
            events = None if options.dry_run else EventRecorder(api, options.instance)
            watch_options = WatchOptions(options.namespace, options.resync_s, write_status=not options.dry_run)
            reconciler.keys = KeyResolver(api, options.namespace)  # secretRef API keys, read with get only
            source = CrdWatcher(api, reconciler, watch_options, events, clock, acting=acting,
                                readings=metrics.readings.get)
            metrics.changed = source.poke  # a pool's reading changed: its status shows it
            scaler = Scaler(inventory, ScaleClient(api), events, scaler_options, clock, acting=acting, counted=counted)
        scale_consumer = kafka.consumer_factory("scaler", group_id=None, enable_auto_commit=False,
                                                auto_offset_reset="latest")
        scaler_loop = ScalerLoop(scaler, scale_consumer, topics.scale.name)
        loops: dict[str, LoopFactory] = {"entitlements": source.run, "metrics": metrics.run, "scaler": scaler_loop.run}
        yield Controller(loops, inventory, reconciler, scaler, scaler_loop, metrics, source)
