"""The local stack's components as processes: a managed subprocess with its own log, and the devstack servers
logging to the run dir (the primitives they share are ``devstack.process``'s).

``Proc`` starts a command in its own session (a Ctrl-C of the terminal reaches the stack, which stops the
components in order, not every process at once), appends its output to one log file, waits for a readiness probe
and stops with SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tokenpools.errors import PermanentError
from tokenpools_dev.devstack.inference_sim import InferenceSim
from tokenpools_dev.devstack.process import Readiness, log_tail, spawn_logged, stop_process, wait_ready
from tokenpools_dev.devstack.prometheus import PrometheusServer


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


class LoggedSim(InferenceSim):
    """An ``InferenceSim`` whose log is a file of the run dir (the base class keeps it in a temp dir)."""

    def __init__(self, *, log: Path, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._log = log

    @property
    def log_path(self) -> Path:
        return self._log

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None


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
