"""One pool of the local stack: its backend replicas (simulators or vLLM), its Service, and the replica set's changes.

The stack plays the part of Kubernetes' controller-manager and kubelet for the pool's Deployment: ``set_replicas``
starts or stops replicas until as many run as asked (new ones start concurrently and each joins the Service and the
Prometheus targets once it is ready; a removed one leaves the Service first, then drains and stops), and
``fail``/``restore`` take one replica away like a node failure (SIGKILL: its in-flight requests break; it stays a
Prometheus target, so ``up`` is 0 and the controller reports one replica fewer) and bring it back on the same port.

A replica is listed from the moment it starts (``ready`` False: the state file shows it starting), so a start that
takes a minute (vLLM) is visible while it runs; ``on_progress`` callbacks run at each replica's start and readiness.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from tokenpools_dev.devstack.process import free_port, tcp_open
from tokenpools_dev.devstack.service import write_members
from tokenpools_dev.devstack.stack.components import Proc, ReplicaServer, StackError
from tokenpools_dev.devstack.stack.config import PoolLayout

log = logging.getLogger("tokenpools_dev.devstack")

ServerFactory = Callable[[PoolLayout, int], ReplicaServer]
"""Builds (does not start) a pool's ``serial``-th replica server: ``components.sim_replica`` or ``vllm_replica``
with the stack's settings bound."""

HEARTBEAT_S = 15.0
"""While replicas start, a log line every this many seconds names those still starting."""


@dataclass(slots=True)
class Replica:
    pool: str
    index: int
    server: ReplicaServer
    ready: bool = False  # answered its readiness probe once: a Service member and a Prometheus target from then on
    up: bool = True  # False while failed (still a Prometheus target)

    @property
    def name(self) -> str:
        """Its name in the state file: ``sim-POOL-0``, ``vllm-POOL-1``."""
        return f"{self.server.KIND}-{self.pool}-{self.index}"


class StackPool:
    def __init__(self, layout: PoolLayout, make_server: ServerFactory, log_dir: Path, state_dir: Path) -> None:
        self.layout, self.make_server, self.log_dir = layout, make_server, log_dir
        self.service_port = free_port()
        self.members_file = state_dir / f"service-{layout.name}.json"
        self.replicas: list[Replica] = []
        self.service: Proc | None = None
        self._next = 0
        self._lock = threading.RLock()
        self.on_change: list[Callable[[StackPool], None]] = []  # run after the replica set changed
        self.on_progress: list[Callable[[StackPool], None]] = []  # run when a replica starts or becomes ready

    # -- addresses --------------------------------------------------------------------------------------------
    @property
    def service_url(self) -> str:
        return f"http://127.0.0.1:{self.service_port}"

    def targets(self) -> list[str]:
        """Prometheus targets: every replica that was ready once, failed ones included."""
        return [r.server.host_port for r in self.replicas if r.ready]

    def members(self) -> list[str]:
        return [r.server.host_port for r in self.replicas if r.ready and r.up and r.server.running]

    def backend_urls(self) -> list[str]:
        """The base URLs of the replicas in the Service now."""
        return [r.server.base_url for r in self.replicas if r.ready and r.up and r.server.running]

    @property
    def ready_replicas(self) -> int:
        return len(self.members())

    # -- lifecycle --------------------------------------------------------------------------------------------
    def start(self) -> None:
        write_members(self.members_file, [])
        self.service = Proc(f"service-{self.layout.name}",
                            [sys.executable, "-m", "tokenpools_dev.devstack.service",
                             f"--listen=127.0.0.1:{self.service_port}", f"--members={self.members_file}"],
                            self.log_dir / f"service-{self.layout.name}.log").start()
        self.set_replicas(self.layout.replicas, notify=False)
        self.service.wait_ready(lambda: tcp_open(self.service_port), 20.0, "listening")

    def stop(self) -> None:
        for r in list(self.replicas):  # first, without the lock: a replica still starting (a scale-up) then fails fast
            if not r.ready:
                r.server.kill()
        with self._lock:
            for r in self.replicas:
                r.server.close()
            self.replicas.clear()
        if self.service is not None:
            self.service.stop(5.0)

    def set_replicas(self, n: int, *, notify: bool = True) -> bool:
        """Run ``n`` replicas (clamped to the layout's bounds). True if the set changed."""
        n = max(self.layout.min_replicas, min(self.layout.max_replicas, n))
        with self._lock:
            if n == len(self.replicas):
                return False
            added: list[Replica] = []
            while len(self.replicas) + len(added) < n:
                index = len(self.replicas) + len(added)
                added.append(Replica(self.layout.name, index, self.make_server(self.layout, self._next)))
                self._next += 1
            self.replicas.extend(added)
            try:
                self._start_concurrently(added)
            except BaseException:
                for r in added:
                    r.server.close()
                    self.replicas.remove(r)
                raise
            removed: list[Replica] = []
            while len(self.replicas) > n:
                removed.append(self.replicas.pop())
            write_members(self.members_file, self.members())
        for r in removed:  # out of the Service already: let them drain
            log.info("pool %s: replica %d removed", self.layout.name, r.index)
            r.server.close()
        if notify:
            self._notify()
        return True

    def _start_concurrently(self, replicas: list[Replica]) -> None:
        """Start ``replicas`` at once, each in a thread; raise the first failure (the others are killed). An
        interrupt (Ctrl-C) kills them too: a thread still in ``start`` returns once its process is gone. Progress
        is reported when a replica's process appears and when it is ready."""
        if not replicas:
            return
        started = heartbeat = time.monotonic()
        executor = ThreadPoolExecutor(max_workers=len(replicas), thread_name_prefix=f"start-{self.layout.name}")
        futures: dict[Future[object], Replica] = {executor.submit(r.server.start): r for r in replicas}
        for r in replicas:
            log.info("pool %s: starting %s (log %s)", self.layout.name, r.name, r.server.log_path)
        pids = [r.server.pid for r in replicas]
        self._progress()
        try:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                now = [r.server.pid for r in replicas]
                if now != pids:  # a process appeared: the state file names its pid (``down`` can stop it)
                    pids = now
                    self._progress()
                for future in done:
                    r = futures[future]
                    if (exc := future.exception()) is not None:
                        raise StackError(f"{r.name} of pool {self.layout.name} failed: {exc}") from exc
                    r.ready = True
                    write_members(self.members_file, self.members())
                    log.info("pool %s: %s ready on %s in %.1f s", self.layout.name, r.name, r.server.host_port,
                             r.server.startup_seconds)
                    self._progress()
                if pending and time.monotonic() - heartbeat >= HEARTBEAT_S:
                    heartbeat = time.monotonic()
                    log.info("pool %s: after %.0f s still starting: %s", self.layout.name, heartbeat - started,
                             ", ".join(futures[f].name for f in pending))
        except BaseException:
            while not all(f.done() for f in futures):  # a kill before a thread's spawn is repeated after it
                for f, r in futures.items():
                    if not f.done():
                        r.server.kill()  # a server still starting has nothing to shut down gracefully
                wait(futures, timeout=0.5)
            raise
        finally:
            executor.shutdown(wait=True)

    def fail(self, index: int) -> None:
        """Take replica ``index`` away like a failed node (SIGKILL); it stays a Prometheus target."""
        with self._lock:
            replica = self.replicas[index]
            replica.up = False
            write_members(self.members_file, self.members())
            replica.server.kill()
        log.info("pool %s: replica %d failed", self.layout.name, index)

    def restore(self, index: int) -> None:
        """Start a failed replica again on its port and put it back into the Service."""
        with self._lock:
            replica = self.replicas[index]
            replica.server.restart()
            replica.up = True
            write_members(self.members_file, self.members())
        log.info("pool %s: replica %d restored", self.layout.name, index)

    def _notify(self) -> None:
        for callback in self.on_change:
            callback(self)

    def _progress(self) -> None:
        for callback in self.on_progress:
            callback(self)
