"""Processes of the local stack: a managed subprocess with its own log, and the devstack servers logging to the run dir.

``Proc`` starts a command in its own session (a Ctrl-C of the terminal reaches the stack, which stops the
components in order, not every process at once), appends its output to one log file, waits for a readiness probe
and stops with SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tokenpools.devstack.inference_sim import InferenceSim
from tokenpools.devstack.prometheus import PrometheusServer
from tokenpools.errors import PermanentError


class StackError(PermanentError):
    """A component could not be started or died; the message names it and ends with its log tail."""


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


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
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            out.write(f"\n--- tokenpools up: {' '.join(self.argv)}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          env=self.env, cwd=self.cwd, start_new_session=True,
                                          preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None)
        return self

    def wait_ready(self, probe: Callable[[], bool], timeout_s: float, what: str = "ready") -> float:
        """Seconds until ``probe()`` is true; raises if the process exits first or the time runs out."""
        started = time.monotonic()
        while True:
            if not self.alive:
                raise StackError(f"{self.name} exited with {self.returncode} before it was {what}; "
                                 f"log {self.log}:\n{log_tail(self.log)}")
            if probe():
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise StackError(f"{self.name} not {what} after {timeout_s:.0f} s; log {self.log}:\n{log_tail(self.log)}")
            time.sleep(0.1)

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
        if not self.alive or self._proc is None:
            return
        self._proc.terminate()
        if not self.wait(grace_s):
            self._proc.kill()
            self._proc.wait(5)


def renice(pid: int | None, nice: int) -> None:
    """Lower the CPU priority of every thread of ``pid`` (on Linux nice is per thread) by ``nice``; best effort."""
    if pid is None or nice <= 0:
        return
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            tid = int(task.name)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
        except (OSError, ValueError):
            pass


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
