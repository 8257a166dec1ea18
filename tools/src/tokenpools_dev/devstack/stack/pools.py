"""One pool of the local stack: its simulator replicas, its Service, and the replica set's changes.

The stack plays the part of Kubernetes' controller-manager and kubelet for the pool's Deployment: ``set_replicas``
starts or stops simulators until as many run as asked (a new one joins the Service and the Prometheus targets once
``/health/ready`` answers; a removed one leaves the Service first, then drains and stops), and ``fail``/``restore``
take one replica away like a node failure (SIGKILL: its in-flight requests break; it stays a Prometheus target, so
``up`` is 0 and the controller reports one replica fewer) and bring it back on the same port.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from tokenpools_dev.devstack.process import free_port, tcp_open
from tokenpools_dev.devstack.service import write_members
from tokenpools_dev.devstack.stack.components import LoggedSim, Proc, StackError
from tokenpools_dev.devstack.stack.config import PoolLayout, SimProfile

log = logging.getLogger("tokenpools_dev.devstack")


@dataclass(slots=True)
class Replica:
    index: int
    sim: LoggedSim
    up: bool = True  # False while failed (still a Prometheus target)


class StackPool:
    def __init__(self, layout: PoolLayout, profile: SimProfile, log_dir: Path, state_dir: Path,
                 spare_seqs: int = 0) -> None:
        self.layout, self.profile, self.log_dir, self.spare_seqs = layout, profile, log_dir, spare_seqs
        self.service_port = free_port()
        self.members_file = state_dir / f"service-{layout.name}.json"
        self.replicas: list[Replica] = []
        self.service: Proc | None = None
        self._next = 0
        self._lock = threading.RLock()
        self.on_change: list[object] = []  # callables(pool) run after the replica set changed

    # -- addresses --------------------------------------------------------------------------------------------
    @property
    def service_url(self) -> str:
        return f"http://127.0.0.1:{self.service_port}"

    def targets(self) -> list[str]:
        """Prometheus targets: every replica that exists, failed ones included."""
        return [r.sim.host_port for r in self.replicas]

    def members(self) -> list[str]:
        return [r.sim.host_port for r in self.replicas if r.up and r.sim.running]

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
        with self._lock:
            for r in self.replicas:
                r.sim.close()
            self.replicas.clear()
        if self.service is not None:
            self.service.stop(5.0)

    def _new_sim(self) -> LoggedSim:
        p, n = self.profile, self._next
        self._next += 1
        return LoggedSim(
            log=self.log_dir / f"sim-{self.layout.name}-{n}.log", model=self.layout.model,
            max_num_seqs=self.layout.slots + self.spare_seqs, max_model_len=4096,
            time_to_first_token=p.ttft_s, time_to_first_token_std_dev=p.ttft_s * p.std_dev_fraction,
            inter_token_latency=p.itl_s, inter_token_latency_std_dev=p.itl_s * p.std_dev_fraction,
            time_factor_under_load=p.factor_for(self.layout.slots, self.spare_seqs), seed=42 + n,
        )

    def set_replicas(self, n: int, *, notify: bool = True) -> bool:
        """Run ``n`` replicas (clamped to the layout's bounds). True if the set changed."""
        n = max(self.layout.min_replicas, min(self.layout.max_replicas, n))
        with self._lock:
            if n == len(self.replicas):
                return False
            while len(self.replicas) < n:
                sim = self._new_sim()
                try:
                    sim.start()
                except Exception as exc:  # noqa: BLE001 -- reported with the log
                    raise StackError(f"simulator {sim.log_path.name} of pool {self.layout.name} failed: {exc}") from exc
                self.replicas.append(Replica(len(self.replicas), sim))
                log.info("pool %s: replica %d up on %s", self.layout.name, len(self.replicas) - 1, sim.host_port)
            removed = []
            while len(self.replicas) > n:
                removed.append(self.replicas.pop())
            write_members(self.members_file, self.members())
        for r in removed:  # out of the Service already: let them drain
            log.info("pool %s: replica %d removed", self.layout.name, r.index)
            r.sim.close()
        if notify:
            self._notify()
        return True

    def fail(self, index: int) -> None:
        """Take replica ``index`` away like a failed node (SIGKILL); it stays a Prometheus target."""
        with self._lock:
            replica = self.replicas[index]
            replica.up = False
            write_members(self.members_file, self.members())
            replica.sim.kill()
        log.info("pool %s: replica %d failed", self.layout.name, index)

    def restore(self, index: int) -> None:
        """Start a failed replica again on its port and put it back into the Service."""
        with self._lock:
            replica = self.replicas[index]
            replica.sim.restart()
            replica.up = True
            write_members(self.members_file, self.members())
        log.info("pool %s: replica %d restored", self.layout.name, index)

    def _notify(self) -> None:
        for callback in self.on_change:
            callback(self)  # type: ignore[operator]
