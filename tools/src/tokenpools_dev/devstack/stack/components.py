"""The local stack's components as processes: a managed subprocess with its own log, and the devstack servers
logging to the run dir (the primitives they share are ``devstack.process``'s).

``Proc`` starts a command in its own session (a Ctrl-C of the terminal reaches the stack, which stops the
components in order, not every process at once), appends its output to one log file, waits for a readiness probe
and stops with SIGTERM, then SIGKILL after a grace period.

A pool replica is a ``LoggedSim`` (llm-d-inference-sim) or a ``LoggedVLLM`` (real vLLM): both are a
``ReplicaServer``, built by ``sim_replica`` or ``vllm_replica`` from the pool's layout.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Protocol, Self

from tokenpools.errors import PermanentError
from tokenpools_dev.devstack.inference_sim import InferenceSim
from tokenpools_dev.devstack.process import LOOPBACK, Readiness, log_tail, spawn_logged, stop_process, wait_ready
from tokenpools_dev.devstack.prometheus import PrometheusServer
from tokenpools_dev.devstack.stack.config import PoolLayout, SimProfile
from tokenpools_dev.devstack.vllm import SchedulingPolicy, VLLMInstall, VLLMServer


VLLM_ENGINE_NICE = 10
"""The nice of a stack vLLM's engine core and CPU worker (``VLLMServer(engine_nice=...)``, as every test vLLM): on
a few shared cores its API server, which streams the tokens, takes requests and answers ``/metrics``, must get the
CPU when it has work, or it answers seconds late (docs/vllm.md#vllms-api-server-on-2-busy-cores)."""


def worker_cpu(serial: int, cpus: Sequence[int]) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` of a pool's ``serial``-th vLLM: one of the machine's allowed CPUs in turn.

    vLLM's default (``auto``) binds the CPU worker of every server on one socket to the same core (core 0 here; it
    keeps the last for the API servers), so two replicas started together shared one core and each warm-up took 50 s
    instead of 10 (docs/vllm.md). The first replica keeps core 0, as ``auto`` gave it."""
    if not cpus:
        raise ValueError("no CPU to bind vLLM's worker to")
    ordered = sorted(cpus)
    return str(ordered[serial % len(ordered)])


class StackError(PermanentError):
    """A component could not be started or died; the message names it and ends with its log tail."""


class Proc:
    """One subprocess of the stack."""

    def __init__(self, name: str, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None, nice: int = 0) -> None:
        self.name, self.argv, self.log, self.nice = name, list(argv), log, nice
        self.env = {**os.environ, **(env or {})}
        self.cwd = cwd
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def start(self) -> Proc:
        self._proc = spawn_logged(self.argv, self.log, env=self.env, cwd=self.cwd, nice=self.nice,
                                  header=f"tokenpools up: {' '.join(self.argv)}")
        return self

    def wait_ready(self, probe: Callable[[], bool], timeout_s: float, what: str = "ready") -> float:
        """Seconds until ``probe()`` is true; raises if the process exits first or the time runs out."""
        ready, waited = wait_ready(self._proc, probe, timeout_s, poll_s=0.1)
        if ready is Readiness.EXITED:
            raise StackError(f"{self.name} exited with {self.returncode} before it was {what}; "
                             f"log {self.log}:\n{log_tail(self.log, 25)}")
        if ready is Readiness.TIMED_OUT:
            raise StackError(f"{self.name} not {what} after {timeout_s:.0f} s; log {self.log}:\n{log_tail(self.log, 25)}")
        return waited

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.alive and self._proc is not None:
            self._proc.send_signal(sig)

    def wait(self, timeout_s: float) -> bool:
        if self._proc is None:
            return True
        try:
            self._proc.wait(timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False

    def stop(self, grace_s: float = 10.0) -> None:
        stop_process(self._proc, grace_s, kill_wait_s=5)


class ReplicaServer(Protocol):
    """One backend replica of a pool, as ``StackPool`` drives it. ``start`` blocks until it is ready (and may be
    called in a thread: ``stop`` from another thread makes it return); ``kill`` is a crash (SIGKILL); ``restart``
    starts it again on the same port. ``KIND`` names it in the state file, ``CMD_MARKER`` is a substring of its
    command line (``tokenpools down`` checks it before signalling a recorded pid)."""

    KIND: ClassVar[str]
    CMD_MARKER: ClassVar[str]

    @property
    def host_port(self) -> str: ...
    @property
    def base_url(self) -> str: ...
    @property
    def running(self) -> bool: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def log_path(self) -> Path: ...
    @property
    def startup_seconds(self) -> float: ...

    def start(self) -> Self: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...
    def kill(self) -> None: ...
    def restart(self) -> Self: ...


class LoggedSim(InferenceSim):
    """An ``InferenceSim`` whose log is a file of the run dir (the base class keeps it in a temp dir)."""

    KIND: ClassVar[str] = "sim"
    CMD_MARKER: ClassVar[str] = "llm-d-inference-sim"

    def __init__(self, *, log: Path, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._log = log

    @property
    def log_path(self) -> Path:
        return self._log

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None


class LoggedVLLM(VLLMServer):
    """A ``VLLMServer`` whose log is a file of the run dir, with what a pool replica has besides."""

    KIND: ClassVar[str] = "vllm"
    CMD_MARKER: ClassVar[str] = "vllm serve"

    def __init__(self, *, log: Path, **kwargs: object) -> None:
        super().__init__(workdir=log.parent, **kwargs)  # type: ignore[arg-type]
        self._log = log

    @property
    def log_path(self) -> Path:
        return self._log

    @property
    def host_port(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None

    def restart(self) -> Self:
        self.stop()
        return self.start()


def sim_replica(layout: PoolLayout, serial: int, log_dir: Path, profile: SimProfile, spare_seqs: int = 0) -> LoggedSim:
    """The ``serial``-th simulator of a pool: ``slots`` (+ spare) sequences, the profile's latencies, its own seed."""
    p = profile
    return LoggedSim(
        log=log_dir / f"sim-{layout.name}-{serial}.log", model=layout.model,
        max_num_seqs=layout.slots + spare_seqs, max_model_len=4096,
        time_to_first_token=p.ttft_s, time_to_first_token_std_dev=p.ttft_s * p.std_dev_fraction,
        inter_token_latency=p.itl_s, inter_token_latency_std_dev=p.itl_s * p.std_dev_fraction,
        time_factor_under_load=p.factor_for(layout.slots, spare_seqs), seed=42 + serial,
    )


def vllm_replica(layout: PoolLayout, serial: int, log_dir: Path, install: VLLMInstall,
                 ready_timeout_s: float) -> LoggedVLLM:
    """The ``serial``-th vLLM of a pool: the tiny model served under the pool's model name, ``slots`` sequences,
    priority scheduling when the pool has ``enginePriority``, its engine reniced (``VLLM_ENGINE_NICE``) and its CPU
    worker on a core of its own where there are enough (``worker_cpu``)."""
    policy = SchedulingPolicy.PRIORITY if layout.engine_priority else SchedulingPolicy.FCFS
    return LoggedVLLM(log=log_dir / f"vllm-{layout.name}-{serial}.log", install=install, model_name=layout.model,
                      max_num_seqs=layout.slots, scheduling_policy=policy, startup_timeout=ready_timeout_s,
                      engine_nice=VLLM_ENGINE_NICE,
                      env={"VLLM_CPU_OMP_THREADS_BIND": worker_cpu(serial, sorted(os.sched_getaffinity(0)))})


class LoggedPrometheus(PrometheusServer):
    """A ``PrometheusServer`` whose log is a file of the run dir."""

    def __init__(self, *args: object, log: Path, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._log = log

    @property
    def log_path(self) -> Path:
        return self._log

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None
