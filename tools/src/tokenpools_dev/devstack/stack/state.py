"""The stack's state file, so that ``tokenpools down`` in another process (or shell) can stop it.

``RUN_DIR/stack.json`` names the ``up`` process and every component (pid, address, log) and is rewritten on each
change; ``$TOKENPOOLS_CACHE/stack-current`` holds the path of the newest run dir for a bare ``tokenpools down``.

``down`` sends SIGTERM to the ``up`` process, which stops the components in order. If that process is gone (it
crashed, or was SIGKILLed) the components it left are stopped one by one from the file — each only after checking
that its pid still runs the command that was recorded, so a recycled pid is never signalled — and so is what is left
of the process group of each that leads one (vLLM's engine core, a child of ``vllm serve``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tokenpools_dev.devstack.process import cache_dir

STATE_FILE = "stack.json"


@dataclass(frozen=True, slots=True)
class ComponentState:
    name: str
    kind: str
    pid: int | None
    address: str
    log: str
    status: str  # starting, running, ready, failed, stopped, down (a replica taken away), exited N
    cmd_marker: str = ""  # a substring of /proc/<pid>/cmdline that identifies the process


@dataclass(frozen=True, slots=True)
class StackState:
    run_dir: str
    pid: int  # the `tokenpools up` process
    status: str  # starting, ready, stopping, stopped, failed
    started_s: float
    config: str
    components: tuple[ComponentState, ...] = ()
    urls: dict[str, Any] = field(default_factory=dict)
    message: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @staticmethod
    def from_json(text: str) -> StackState:
        data = json.loads(text)
        data["components"] = tuple(ComponentState(**c) for c in data.get("components", ()))
        return StackState(**data)


SLOW_KINDS = frozenset({"vllm"})
"""Components whose start takes long enough (vLLM: 30-65 s, more on a busy machine) that ``up --detach`` reports
their progress."""


@dataclass(frozen=True, slots=True)
class Progress:
    """What a watcher of a starting stack has reported so far about its slow components: their last status, and
    when (seconds since it began watching) it last printed a line."""

    statuses: Mapping[str, str] = field(default_factory=dict)
    said_s: float = 0.0

    def after(self, state: StackState, elapsed_s: float, every_s: float = 15.0) -> tuple[Progress, list[str]]:
        """The next progress and its lines: one per slow component that appeared or changed status, else, every
        ``every_s``, one naming those still starting."""
        slow = [c for c in state.components if c.kind in SLOW_KINDS]
        at = f"{elapsed_s:4.0f} s"
        lines = []
        for c in slow:
            if self.statuses.get(c.name) != c.status:
                detail = f" (log {c.log})" if c.status == "starting" else f" on {c.address}" if c.status == "running" else ""
                lines.append(f"{at}  {c.name}: {c.status}{detail}")
        starting = [c.name for c in slow if c.status == "starting"]
        if not lines and starting and elapsed_s - self.said_s >= every_s:
            lines.append(f"{at}  still starting: {', '.join(starting)}")
        statuses = {c.name: c.status for c in slow}
        return Progress(statuses, elapsed_s if lines else self.said_s), lines


def pointer_path() -> Path:
    return cache_dir() / "stack-current"


def write_state(state: StackState, *, pointer: bool = False) -> None:
    """Write ``RUN_DIR/stack.json``; with ``pointer`` (``tokenpools up`` only) also ``stack-current``."""
    path = Path(state.run_dir) / STATE_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(state.to_json())
    os.replace(tmp, path)
    if not pointer:
        return
    pointer_file = pointer_path()
    pointer_file.parent.mkdir(parents=True, exist_ok=True)
    pointer_file.write_text(str(Path(state.run_dir).resolve()) + "\n")


def read_state(run_dir: Path | None = None) -> StackState | None:
    if run_dir is None:
        try:
            run_dir = Path(pointer_path().read_text().strip())
        except OSError:
            return None
    try:
        return StackState.from_json((run_dir / STATE_FILE).read_text())
    except (OSError, ValueError, TypeError):
        return None


def pid_runs(pid: int | None, marker: str) -> bool:
    """True if ``pid`` is alive and (when ``marker`` is given) its command line contains ``marker``."""
    if pid is None or pid <= 0:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return marker in cmdline if marker else True


def pids_running(binary: str, marker: str) -> list[int]:
    """Pids whose command is ``binary`` and whose arguments contain ``marker`` (a work dir of this stack only)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and Path(argv[0].decode(errors="replace")).name == binary and marker.encode() in b" ".join(argv):
            found.append(int(proc.name))
    return sorted(found)


def status_of(alive: bool, returncode: int | None = None) -> str:
    """A component's status as the state file names it: running, exited N, or stopped."""
    return "running" if alive else (f"exited {returncode}" if returncode is not None else "stopped")


def _wait_gone(pid: int, marker: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_runs(pid, marker):
            return True
        time.sleep(0.1)
    return not pid_runs(pid, marker)


def stop_recorded(state: StackState, timeout_s: float = 60.0) -> list[str]:
    """Stop the stack the state file describes; the names of what had to be stopped here (not by ``up``)."""
    stopped: list[str] = []
    if pid_runs(state.pid, " up ") and state.pid != os.getpid():
        os.kill(state.pid, signal.SIGTERM)
        if not _wait_gone(state.pid, " up ", timeout_s):
            os.kill(state.pid, signal.SIGKILL)
            _wait_gone(state.pid, " up ", 5.0)
    for component in reversed(state.components):  # started last, stopped first
        if component.pid is None or not pid_runs(component.pid, component.cmd_marker):
            continue
        leads_group = _group_of(component.pid) == component.pid  # started in its own session
        os.kill(component.pid, signal.SIGTERM)
        if not _wait_gone(component.pid, component.cmd_marker, 15.0):
            os.kill(component.pid, signal.SIGKILL)
        if leads_group:  # its children (vLLM's engine core): the group's id is not reused while they live
            try:
                os.killpg(component.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        stopped.append(component.name)
    return stopped


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None
