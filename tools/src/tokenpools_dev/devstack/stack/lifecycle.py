"""The whole local stack as subprocesses: Kafka, backend replicas behind a Service per pool, Prometheus,
kube-apiserver, the agents, the controller and N proxy replicas — started in dependency order with a readiness check
each, one log per component under ``RUN_DIR/logs``, a state file for ``tokenpools down``, and a clean shutdown in
reverse order.

The backend replicas are simulators or real vLLM (``StackOptions.backend``, ``devstack.stack.backend``); with a
``--backend URL`` the stack starts none and every pool's endpoint is that server (checked first: it answers
``/v1/models`` and lists every pool's model; Prometheus scrapes its ``/metrics`` if it has one).

Readiness, in order: Kafka answers Metadata and the declared topics exist (created here, as ``tokenpools.topics``
declares them, before anyone can auto-create them wrong); every replica answers its readiness probe (the
simulator's ``/health/ready``; vLLM's ``/health`` and its model in ``/v1/models``) and the Service accepts
connections; Prometheus sees every target up; the apiserver is ready and holds the CRDs, the pools'
Deployments and the config's custom resources; the agents serve ``/metrics``; the controller has published a
backend-metrics sample for every pool; every proxy answers ``/healthz`` and, when the agents run, enforces limits
from a limit update that names all the replicas (until then a fleet could admit ``limit × replicas``).

With Kubernetes a reconcile thread plays kubelet for the Deployments: it reads each one's ``spec.replicas`` (what
the scaler set) every ``poll_s`` and runs as many simulators (``StackPool.set_replicas``), updating the Service, the
Prometheus targets and the Deployment's status.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from types import TracebackType
from pathlib import Path
from typing import Self

from tokenpools.config import LoadedConfig, load_config, load_settings
from tokenpools.proxy.access.auth import upstream_authorization
from tokenpools.topics.declarations import topics_for
from tokenpools_dev.devstack import kube_objects as ko
from tokenpools_dev.devstack.kafka import KafkaBroker
from tokenpools_dev.devstack.process import free_port, http_ok, renice
from tokenpools_dev.devstack.prometheus import ScrapeJob
from tokenpools_dev.devstack.stack import probes
from tokenpools_dev.devstack.stack.backend import REAL_SCRAPE_TIMEOUT_S, BackendKind, scrape_timing, url_scrape
from tokenpools_dev.devstack.stack.components import LoggedPrometheus, Proc, StackError, sim_replica, vllm_replica
from tokenpools_dev.devstack.stack.config import (
    StackOptions,
    derive_documents,
    dump_documents,
    pool_layouts,
    scaled_settings,
)
from tokenpools_dev.devstack.stack.pools import ServerFactory, StackPool
from tokenpools_dev.devstack.stack.state import ComponentState, StackState, pids_running, status_of, write_state
from tokenpools_dev.devstack.vllm import VLLMError, VLLMInstall

log = logging.getLogger("tokenpools_dev.devstack")


class Stack:
    def __init__(self, options: StackOptions, *, publish_pointer: bool = False, poll_s: float = 0.25) -> None:
        self.options = options
        self.run_dir = options.run_dir.resolve()
        self.log_dir = self.run_dir / "logs"
        self.source = load_config(options.config)
        kafka = load_settings(self.source.settings_values, self.options.overrides).kafka  # as the agents get them
        self.topics = topics_for(kafka.topic_prefix, kafka.topic_partitions)  # so the agents find what they declare
        self.layouts = pool_layouts(self.source, options.split)
        self.backend = options.backend
        self.backend_metrics = False  # a --backend URL answers /metrics: Prometheus scrapes it
        self._make_server: ServerFactory | None = None
        self._backend_checked = False
        self.publish_pointer, self.poll_s = publish_pointer, poll_s
        self.kafka: KafkaBroker | None = None
        self.prometheus: LoggedPrometheus | None = None
        self.kube: object | None = None
        self.kube_api: ko.KubeRest | None = None
        self.pools: dict[str, StackPool] = {}
        self.agents: Proc | None = None  # the first agents worker (the one whose /metrics readiness waits for)
        self.agents_workers: list[Proc] = []  # every agents worker, the first included (``agents_workers``)
        self.controller: Proc | None = None
        self.proxies: list[Proc] = []
        self.proxy_ports: list[int] = []
        self.config_path = self.run_dir / "config.yaml"
        self.proxy_config_path = self.run_dir / ("config-proxy.yaml" if options.proxies_bind_all else "config.yaml")
        self.loaded: LoadedConfig | None = None
        self.status = "new"
        self.message = ""
        self.started_s = time.time()
        self._stop_reconcile = threading.Event()
        self._reconciler: threading.Thread | None = None
        self._targets_lock = threading.Lock()
        self._state_lock = threading.Lock()

    # -- addresses ----------------------------------------------------------------------------------------------
    @property
    def proxy_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.proxy_ports]

    @property
    def kafka_bootstrap(self) -> str:
        assert self.kafka is not None
        return self.kafka.bootstrap

    @property
    def prometheus_url(self) -> str:
        assert self.prometheus is not None
        return self.prometheus.url

    def pool(self, name: str | None = None) -> StackPool:
        return self.pools[name] if name is not None else next(iter(self.pools.values()))

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> Self:
        o = self.options
        self.log_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.run_dir / "kafka" / "data", ignore_errors=True)  # a fresh broker: no old specs or state
        self.status = "starting"
        self.write_state()
        try:
            self.check_backend()
            self.kafka = KafkaBroker(workdir=self.run_dir / "kafka", startup_timeout_s=o.ready_timeout_s)
            self.prometheus = LoggedPrometheus(scrape_interval=o.scrape_s, port=free_port(),
                                               log=self.log_dir / "prometheus.log")
            if self._make_server is not None:
                self.pools = {n: StackPool(lay, self._make_server, self.log_dir, self.run_dir)
                              for n, lay in self.layouts.items()}
            with ThreadPoolExecutor(max_workers=3, thread_name_prefix="stack-start") as pool:
                kafka = pool.submit(self._start_kafka)
                kube = pool.submit(self._start_kube) if o.kubernetes else None
                for p in self.pools.values():
                    p.on_progress.append(lambda _pool: self.write_state())
                    p.start()
                    p.on_change.append(self._replicas_changed)
                self.prometheus.set_targets(self._scrape_targets(), wait=False)
                self.prometheus.start()
                renice(self.prometheus.pid, o.background_nice)
                self.write_state()
                kafka.result()
                if kube is not None:
                    kube.result()
            self._write_config()
            self.prometheus.wait_for_targets(health="up", timeout=30.0)
            self._start_control_plane()
            if o.kubernetes and self.pools:
                self._reconciler = threading.Thread(target=self._reconcile_loop, name="stack-reconcile", daemon=True)
                self._reconciler.start()
            self.status = "ready"
        except BaseException as exc:
            self.status, self.message = "failed", str(exc)[:2000]
            self.write_state()
            self.stop()
            self.status = "failed"
            self.write_state()
            raise
        self.write_state()
        return self

    def stop(self) -> None:
        if self.status in ("stopped",):
            return
        self.status = "stopping"
        self.write_state()
        self._stop_reconcile.set()
        if self._reconciler is not None:
            self._reconciler.join(5.0)
        for proc in reversed(self.proxies):
            proc.signal()
        for proc in reversed(self.proxies):
            proc.stop(10.0)
        for proc in (*reversed(self.agents_workers), self.controller):
            if proc is not None:
                proc.stop(15.0)
        for p in self.pools.values():
            p.stop()
        if self.prometheus is not None:
            self.prometheus.stop()
        if self.kube is not None:
            probes.keep_kube_logs(self.kube, self.log_dir)
            self.kube.stop()  # type: ignore[attr-defined]
        if self.kafka is not None:
            self.kafka.stop()
        self.status = "stopped"
        self.write_state()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # -- start-up steps -----------------------------------------------------------------------------------------
    def check_backend(self) -> None:
        """Check the backend before anything is started (``start`` does, if not done yet): a missing vLLM install
        (``StackError``) or a ``--backend URL`` that does not answer (``StackError``) or does not serve every pool's
        model (``ConfigError``) fails at once, in one line. Idempotent."""
        if self._backend_checked:
            return
        o = self.options
        match self.backend.kind:
            case BackendKind.SIM:
                self._make_server = partial(sim_replica, log_dir=self.log_dir, profile=o.sim.scaled(o.time_scale),
                                            spare_seqs=o.sim_spare_seqs)
            case BackendKind.VLLM:
                try:
                    install = VLLMInstall.find()
                except VLLMError as exc:
                    raise StackError(str(exc)) from None
                self._make_server = partial(vllm_replica, log_dir=self.log_dir, install=install,
                                            ready_timeout_s=o.replica_ready_timeout_s)
            case BackendKind.URL:
                self._check_url()
        self._backend_checked = True

    def _check_url(self) -> None:
        url = self.backend.url
        proxy = load_settings(self.source.settings_values, self.options.overrides).proxy
        probes.check_backend_url(url, {n: lay.model for n, lay in self.layouts.items()},
                                 authorization=upstream_authorization(proxy.upstream_api_key_env, os.environ))
        self.backend_metrics = http_ok(url + "/metrics", timeout_s=REAL_SCRAPE_TIMEOUT_S)
        log.info("backend %s serves every pool's model; its /metrics %s", url,
                 "answers: Prometheus scrapes it" if self.backend_metrics else "does not answer: not scraped")
        for lay in self.layouts.values():
            if self.backend_metrics and lay.replicas != 1:
                log.warning("pool %s: %d replicas in its spec, but %s is one Prometheus target: the controller "
                            "will report 1 ready replica", lay.name, lay.replicas, url)

    def _scrape_targets(self) -> dict[str, ScrapeJob]:
        """One Prometheus job per pool: its replicas, or the ``--backend URL`` when it answers ``/metrics``."""
        o = self.options
        if self.pools:
            interval, timeout = scrape_timing(self.backend.kind, o.scrape_s)
            return {n: ScrapeJob(tuple(p.targets()), interval_s=interval, timeout_s=timeout)
                    for n, p in self.pools.items()}
        if not self.backend_metrics:
            return {}
        s = url_scrape(self.backend.url, o.scrape_s)
        return {n: ScrapeJob((s.host_port,), s.scheme, s.metrics_path, s.interval_s, s.timeout_s) for n in self.layouts}

    def _start_kafka(self) -> None:
        from tokenpools.streams.admin import ensure_topics
        from tokenpools_dev.kafka import local_kafka

        assert self.kafka is not None
        self.kafka.start()
        renice(self.kafka.pid, self.options.background_nice)
        asyncio.run(ensure_topics(local_kafka(self.kafka.bootstrap), self.topics, client="devstack"))

    def _start_kube(self) -> None:
        from tokenpools_dev.devstack.kube import KubeAPIServer

        kube = KubeAPIServer()
        self.kube = kube
        kube.start()
        self.kube_api = api = ko.KubeRest(kube.server_url, kube.admin_token)
        try:
            ko.apply_crds(api, ko.crd_documents())
        except ko.KubeRequestError as exc:  # the repository's CRDs are refused: say so, serve with minimal ones
            log.warning("deploy/base/crds refused by the apiserver (%s); using schema-less CRDs instead", exc)
            self.message = f"deploy/base/crds refused: {exc}"[:2000]
            ko.apply_crds(api, ko.minimal_crds())
        for lay in self.layouts.values():
            ko.apply_namespace(api, lay.namespace)
            api.create(f"/apis/apps/v1/namespaces/{lay.namespace}/deployments",
                       ko.deployment(lay.deployment, lay.namespace, lay.name, lay.replicas, lay.model))

    def _write_config(self) -> None:
        o = self.options
        namespace = next(iter(self.layouts.values())).namespace if self.layouts else None
        kubeconfig = self.kube.kubeconfig_path if self.kube is not None else None  # type: ignore[attr-defined]
        settings = scaled_settings(self.source.settings_values, o.time_scale, kafka_bootstrap=self.kafka_bootstrap,
                                   prometheus_url=self.prometheus_url, spool_dir=self.run_dir / "spool",
                                   kubeconfig=kubeconfig, namespace=namespace)
        endpoints = ({n: [p.service_url] for n, p in self.pools.items()} if self.backend.runs_replicas
                     else {n: [self.backend.url] for n in self.layouts})
        documents = derive_documents(self.source.raw_documents, time_scale=o.time_scale, split=o.split,
                                     endpoints=endpoints, settings=settings, states=o.initial_states)
        self.config_path.write_text(dump_documents(documents))
        if o.proxies_bind_all:
            self.proxy_config_path.write_text(dump_documents(derive_documents(
                self.source.raw_documents, time_scale=o.time_scale, split=o.split, endpoints=endpoints,
                settings=settings, drop_states=True)))
        self.loaded = load_config(self.config_path)
        if self.kube_api is not None and namespace is not None:
            ko.apply_custom_resources(self.kube_api, documents, namespace)

    def _tokenpools(self, name: str, *args: str, nice: int = 0, config: Path | None = None,
                    cwd: Path | None = None) -> Proc:
        argv = [sys.executable, "-m", "tokenpools", *args, "--config", str(config or self.config_path),
                *(f"--set={item}" for item in self.options.overrides)]
        return Proc(name, argv, self.log_dir / f"{name}.log", env={"PYTHONUNBUFFERED": "1"}, cwd=cwd or self.run_dir,
                    nice=nice)

    def _start_control_plane(self) -> None:
        o, t = self.options, self.options.ready_timeout_s
        k = o.time_scale
        agents_port = free_port()
        scrape_s = scrape_timing(self.backend.kind, o.scrape_s)[0]  # the backends' scrape interval
        if o.agents:
            self.agents = self._tokenpools("agents", "agents", f"--http-port={agents_port}", "--fast-join",
                                           nice=o.background_nice).start()
            self.agents_workers = [self.agents]
            for i in range(1, o.agents_workers):  # more workers of the same group, each in a directory of its own
                cwd = self.run_dir / f"agents-{i}"
                cwd.mkdir(exist_ok=True)
                self.agents_workers.append(self._tokenpools(f"agents-{i}", "agents", f"--http-port={free_port()}",
                                                            "--fast-join", nice=o.background_nice, cwd=cwd).start())
            self.write_state()
        if o.controller:
            mode = ["--no-kubernetes"] if self.kube is None else ["--kubeconfig", str(self.kube.kubeconfig_path)]  # type: ignore[attr-defined]
            namespace = next(iter(self.layouts.values())).namespace if self.layouts else "default"
            self.controller = self._tokenpools(
                "controller", "controller", *mode, f"--namespace={namespace}",
                f"--metrics-interval-s={max(0.2, k):g}", f"--rate-window-s={max(30 * k, 4 * scrape_s):g}",
                f"--resync-s={max(1.0, 30 * k):g}", f"--scale-command-max-age-s={max(2.0, 30 * k):g}",
                nice=o.background_nice).start()
            self.write_state()
        for i in range(o.proxies):
            port = free_port()
            self.proxy_ports.append(port)
            self.proxies.append(self._tokenpools(f"proxy-{i}", "proxy", f"--port={port}", f"--proxy-id=proxy-{i}",
                                                 config=self.proxy_config_path).start())
        self.write_state()
        if self.agents is not None:
            self.agents.wait_ready(lambda: http_ok(f"http://127.0.0.1:{agents_port}/metrics"), t, "serving /metrics")
        if self.controller is not None:
            metrics = self.topics.backend_metrics
            self.controller.wait_ready(lambda: probes.backend_metrics_seen(self.kafka_bootstrap, metrics), t,
                                       "publishing metrics")
        for proc, url in zip(self.proxies, self.proxy_urls):
            proc.wait_ready(lambda u=url: http_ok(u + "/healthz"), t, "answering /healthz")
        if self.agents is not None and self.controller is not None and self.proxies:
            # the agents tick windows that have content; without the controller's backend metrics (or traffic)
            # there is none, and the proxies stay on their static limits until the first requests. Ready: every
            # proxy enforces the agents' limits divided among all of them (shares naming each, or counts counting each)
            n = len(self.proxies)
            self.agents.wait_ready(lambda: all(probes.proxy_divides_among(u, n) for u in self.proxy_urls), t,
                                   "dividing the limits among every proxy")

    # -- replicas -----------------------------------------------------------------------------------------------
    def _replicas_changed(self, pool: StackPool) -> None:
        with self._targets_lock:
            if self.prometheus is not None:
                self.prometheus.set_targets(self._scrape_targets(), wait=False)
            if self.kube_api is not None:
                lay = pool.layout
                probes.quietly(ko.report_ready, self.kube_api, lay.namespace, lay.deployment, pool.ready_replicas)
        self.write_state()

    def _reconcile_loop(self) -> None:
        assert self.kube_api is not None
        while not self._stop_reconcile.wait(self.poll_s):
            for name, pool in self.pools.items():
                lay = pool.layout
                wanted = probes.quietly(ko.desired_replicas, self.kube_api, lay.namespace, lay.deployment)
                if wanted is not None:
                    wanted = max(lay.min_replicas, min(lay.max_replicas, wanted))
                if wanted is not None and wanted != len(pool.replicas):
                    log.info("pool %s: Deployment %s/%s wants %d replicas (running %d)", name, lay.namespace,
                             lay.deployment, wanted, len(pool.replicas))
                    try:
                        pool.set_replicas(wanted)
                    except StackError as exc:
                        log.error("%s", exc)

    # -- state --------------------------------------------------------------------------------------------------
    def components(self) -> list[ComponentState]:
        """Every component as the state file records it, in start order (``tokenpools down`` stops them reversed)."""
        out: list[ComponentState] = []
        if self.kafka is not None:
            out.append(ComponentState("kafka", "kafka", self.kafka.pid, self.kafka.bootstrap, str(self.kafka.log_path),
                                      "running" if self.kafka.is_running else "stopped", "kafka.Kafka"))
        for name, pool in self.pools.items():
            if pool.service is not None:
                out.append(ComponentState(pool.service.name, "service", pool.service.pid, pool.service_url,
                                          str(pool.service.log), status_of(pool.service.alive),
                                          "tokenpools_dev.devstack.service"))
            for r in list(pool.replicas):
                server = r.server
                status = ("down" if not r.up else "starting" if not r.ready
                          else "running" if server.running else "stopped")
                address = probes.quietly(lambda s=server: s.host_port) or ""  # no port yet: its start has not run
                out.append(ComponentState(r.name, server.KIND, server.pid, address, str(server.log_path), status,
                                          server.CMD_MARKER))
        prom = self.prometheus
        if prom is not None:
            url = probes.quietly(lambda: prom.url) or ""
            out.append(ComponentState("prometheus", "prometheus", prom.pid, url, str(prom.log_path),
                                      status_of(prom.pid is not None), "prometheus"))
        if self.kube is not None:
            url = getattr(self.kube, "_server_url", None) or ""
            work = probes.quietly(lambda: str(self.kube.work_dir)) or ""  # type: ignore[union-attr]
            for name, binary in (("etcd", "etcd"), ("kube-apiserver", "kube-apiserver")):
                pids = pids_running(binary, work) if work else []
                log_path = Path(work) / f"{name}.log" if pids else self.log_dir / f"{name}.log"  # copied there at stop
                out.append(ComponentState(name, "kube", pids[0] if pids else None, url if name != "etcd" else "",
                                          str(log_path), "running" if pids else "stopped", work))
        for proc in [*self.agents_workers, self.controller, *self.proxies]:
            if proc is None:
                continue
            address = self.proxy_urls[int(proc.name.split("-")[1])] if proc.name.startswith("proxy-") else ""
            out.append(ComponentState(proc.name, proc.name.split("-")[0], proc.pid, address, str(proc.log),
                                      status_of(proc.alive, proc.returncode), "tokenpools"))
        return out

    def write_state(self) -> None:
        backends = ({n: p.backend_urls() for n, p in self.pools.items()} if self.backend.runs_replicas
                    else {n: [self.backend.url] for n in self.layouts})
        urls = {"proxies": self.proxy_urls, "services": {n: p.service_url for n, p in self.pools.items()},
                "backend": str(self.backend), "backends": backends,
                "kafka": self.kafka.bootstrap if self.kafka else None,
                "prometheus": probes.quietly(lambda: self.prometheus.url) if self.prometheus else None,
                "kube": getattr(self.kube, "_server_url", None), "config": str(self.config_path),
                "time_scale": self.options.time_scale}
        with self._state_lock:
            state = StackState(str(self.run_dir), os.getpid(), self.status, self.started_s, str(self.options.config),
                               tuple(self.components()), urls, self.message)
            write_state(state, pointer=self.publish_pointer)
