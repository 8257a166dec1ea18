"""What every devstack server does the same way: pick free ports, probe TCP and HTTP, start a process logging to a
file, wait for it to be ready (or to die first), read its log tail, lower its priority, stop it (SIGTERM, then
SIGKILL).

Kafka, llm-d-inference-sim, Prometheus, etcd and kube-apiserver (``devstack.kafka``, ``.inference_sim``,
``.prometheus``, ``.kube``) and the stack's own components (``devstack.stack.components``) all use these; each
keeps only its own command line, readiness probe and error type. Nothing happens at import time.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path

LOOPBACK = "127.0.0.1"


def cache_dir() -> Path:
    """The out-of-repo cache the install scripts build into: ``$TOKENPOOLS_CACHE``, default ``~/.cache/tokenpools``."""
    return Path(os.environ.get("TOKENPOOLS_CACHE") or Path.home() / ".cache" / "tokenpools")


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` distinct TCP ports free on ``host`` now (kernel-picked; a small race remains until bound).

    ``host=""`` asks for a port free on every interface (for a server that listens on ``:PORT``).
    """
    if count < 1:
        raise ValueError(f"`count` must be >= 1, got {count}")
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in socks:  # all held open at once, so the kernel cannot hand out one port twice
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def free_port(host: str = LOOPBACK) -> int:
    return free_ports(1, host)[0]


def tcp_open(port: int, timeout_s: float = 0.2, host: str = LOOPBACK) -> bool:
    """Something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def http_ok(url: str, timeout_s: float = 1.0, context: ssl.SSLContext | None = None) -> bool:
    """``GET url`` answers 200 (an ``https`` URL verified with ``context``, default the system's CAs)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s, context=context) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log, or ``<no log>``."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


def spawn_logged(argv: Sequence[str], log: Path, *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
                 header: str | None = None, truncate: bool = False, new_session: bool = True,
                 nice: int = 0) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stdout and stderr appended to ``log`` (or truncating it), stdin from /dev/null.

    ``header`` is written to the log first (a marker between runs of one log); ``new_session`` puts the process in
    its own session, so a Ctrl-C of the terminal reaches its owner, which stops it in order; ``nice`` lowers its
    CPU priority, and that of its session when it has one of its own (``renice_session``: otherwise the nice would
    order nothing but its own threads). ``env`` is the whole environment (None: this process's).
    """

    def lower() -> None:  # in the child, after setsid
        os.nice(nice)
        if new_session:
            renice_session(os.getpid(), nice)

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb" if truncate else "ab") as out:
        if header is not None:
            out.write(f"\n--- {header} ---\n".encode())
            out.flush()
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=None if env is None else dict(env), cwd=cwd, start_new_session=new_session,
                                preexec_fn=lower if nice else None)


class Readiness(StrEnum):
    READY = "ready"
    EXITED = "exited"  # the process ended before the probe succeeded
    TIMED_OUT = "timed out"


def wait_ready(proc: subprocess.Popen[bytes] | None, probe: Callable[[], bool], timeout_s: float,
               poll_s: float = 0.05) -> tuple[Readiness, float]:
    """Poll ``probe()`` until it is true, the process exits, or ``timeout_s`` pass; (how it ended, seconds waited).

    The process is checked before each probe, so a server that died is reported at once, not at the timeout.
    """
    started = time.monotonic()
    while True:
        if proc is None or proc.poll() is not None:
            return Readiness.EXITED, time.monotonic() - started
        if probe():
            return Readiness.READY, time.monotonic() - started
        if time.monotonic() - started >= timeout_s:
            return Readiness.TIMED_OUT, time.monotonic() - started
        time.sleep(poll_s)


def stop_process(proc: subprocess.Popen[bytes] | None, grace_s: float, kill_wait_s: float | None = None) -> bool:
    """SIGTERM, SIGKILL after ``grace_s``; True if the process ended on SIGTERM (or had already ended)."""
    if proc is None or proc.poll() is not None:
        return True
    proc.terminate()
    try:
        proc.wait(grace_s)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(kill_wait_s)
        return False


def kill_process(proc: subprocess.Popen[bytes] | None, wait_s: float | None = None) -> None:
    """SIGKILL, like a crash, and reap it."""
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait(wait_s)


def renice(pid: int | None, nice: int) -> None:
    """Lower the CPU priority of every thread of ``pid`` (on Linux nice is per thread) by ``nice``, and that of its
    session if ``pid`` leads one (``renice_session``); best effort."""
    if pid is None or nice <= 0:
        return
    renice_session(pid, nice)
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            tid = int(task.name)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
        except (OSError, ValueError):
            pass


def renice_session(pid: int | None, nice: int) -> bool:
    """Lower the CPU weight of the session ``pid`` leads against the machine's other sessions; best effort, False
    where the kernel has no autogroups or ``pid`` leads no session (the group would be its caller's, or another's).

    With Linux's autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``, on by default in most
    distributions) every session is one scheduling group, and CPU time is shared between groups before nice is
    looked at: a nice that ``renice`` sets orders the threads of one session only. A process started in a session
    of its own (``spawn_logged``'s default) then weighs as much as the rest of the machine together, however much
    it is reniced. Its group's nice (``/proc/PID/autogroup``) is what weighs against the others."""
    if pid is None or nice <= 0:
        return False
    try:
        if os.getsid(pid) != pid:
            return False
        Path(f"/proc/{pid}/autogroup").write_text(f"{min(19, nice)}\n")
    except OSError:
        return False
    return True

