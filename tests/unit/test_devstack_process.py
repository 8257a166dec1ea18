"""The helpers every devstack server shares (tokenpools_dev.devstack.process), on real sockets and real processes."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest

from tokenpools_dev.devstack import process
from tokenpools_dev.devstack.stack.state import ComponentState, StackState, pid_runs, stop_recorded

PY = sys.executable


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = process.free_ports(5)
    assert len(set(ports)) == 5
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((process.LOOPBACK, port))
    with pytest.raises(ValueError, match="count"):
        process.free_ports(0)


def test_tcp_open_sees_a_listener_and_nothing_else() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((process.LOOPBACK, 0))
        s.listen()
        port = s.getsockname()[1]
        assert process.tcp_open(port)
    assert not process.tcp_open(port)


def test_a_spawned_process_logs_after_its_header_and_is_waited_for(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "server.log"
    marker = tmp_path / "ready"
    proc = process.spawn_logged([PY, "-c", f"import pathlib, time; print('hello', flush=True); "
                                           f"pathlib.Path({str(marker)!r}).touch(); time.sleep(30)"],
                                log, header="first run")
    try:
        ready, waited = process.wait_ready(proc, marker.exists, timeout_s=20)
        assert ready is process.Readiness.READY and waited < 20
    finally:
        assert process.stop_process(proc, grace_s=5), "a Python process ends on SIGTERM"
    text = log.read_text()
    assert text.index("--- first run ---") < text.index("hello")
    assert process.log_tail(log, 1) == "hello"
    assert process.log_tail(tmp_path / "missing.log") == "<no log>"


def test_waiting_reports_an_early_exit_and_a_timeout(tmp_path: Path) -> None:
    died = process.spawn_logged([PY, "-c", "raise SystemExit(3)"], tmp_path / "died.log")
    ready, _ = process.wait_ready(died, lambda: False, timeout_s=20)
    assert ready is process.Readiness.EXITED and died.returncode == 3
    slow = process.spawn_logged([PY, "-c", "import time; time.sleep(30)"], tmp_path / "slow.log")
    try:
        ready, waited = process.wait_ready(slow, lambda: False, timeout_s=0.3)
        assert ready is process.Readiness.TIMED_OUT and waited >= 0.3
    finally:
        process.kill_process(slow)
    assert slow.poll() is not None
    assert process.wait_ready(None, lambda: True, timeout_s=1)[0] is process.Readiness.EXITED


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    marker = tmp_path / "armed"
    stubborn = process.spawn_logged([PY, "-c", f"import pathlib, signal, time; signal.signal(signal.SIGTERM, "
                                               f"signal.SIG_IGN); pathlib.Path({str(marker)!r}).touch(); "
                                               f"time.sleep(30)"], tmp_path / "stubborn.log")
    assert process.wait_ready(stubborn, marker.exists, timeout_s=20)[0] is process.Readiness.READY
    assert not process.stop_process(stubborn, grace_s=0.3)
    assert stubborn.returncode == -9
    assert process.stop_process(stubborn, grace_s=0.3), "already ended: nothing to do"


def test_down_without_up_stops_what_a_component_left_in_its_process_group(tmp_path: Path) -> None:
    """``tokenpools down`` after ``up`` died: a recorded component that leads its own group (as ``vllm serve``, whose
    engine core is its child) is stopped with its children, not only its own pid."""
    child_pid = tmp_path / "child.pid"
    leader = process.spawn_logged([PY, "-c", "import pathlib, subprocess, sys, time; "
                                             "child = subprocess.Popen([sys.executable, '-c', 'import time; "
                                             "time.sleep(60)']); "
                                             f"pathlib.Path({str(child_pid)!r}).write_text(str(child.pid)); "
                                             "time.sleep(60)  # leader-marker"], tmp_path / "leader.log")
    try:
        assert process.wait_ready(leader, child_pid.exists, timeout_s=20)[0] is process.Readiness.READY
        child = int(child_pid.read_text())
        component = ComponentState("vllm-p-0", "vllm", leader.pid, "", "", "running", "leader-marker")
        state = StackState(str(tmp_path), 0, "ready", 0.0, "c.yaml", (component,))  # pid 0: no `up` process
        assert stop_recorded(state) == ["vllm-p-0"]
        assert leader.wait(5) is not None
        deadline = time.monotonic() + 5
        while pid_runs(child, "") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_runs(child, ""), "the child of the group's leader was left running"
    finally:
        process.kill_process(leader)


def _autogroup_nice(pid: int) -> int | None:
    try:
        words = Path(f"/proc/{pid}/autogroup").read_text().split()  # "/autogroup-123 nice 7"
    except OSError:
        return None
    return int(words[-1]) if words else None


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="this kernel has no autogroup scheduling")
def test_a_niced_process_in_a_session_of_its_own_weighs_less_as_a_whole(tmp_path: Path) -> None:
    """With autogroups CPU is shared between sessions before nice is looked at: a niced server in its own session
    must lower its session's group, or it weighs as much as everything else together."""
    ours = _autogroup_nice(os.getpid())
    niced = process.spawn_logged([PY, "-c", "import time; time.sleep(30)"], tmp_path / "niced.log", nice=7)
    plain = process.spawn_logged([PY, "-c", "import time; time.sleep(30)"], tmp_path / "plain.log")
    shared = process.spawn_logged([PY, "-c", "import time; time.sleep(30)"], tmp_path / "shared.log",
                                  new_session=False)
    try:
        process.wait_ready(niced, lambda: _autogroup_nice(niced.pid) == 7, timeout_s=10)
        assert _autogroup_nice(niced.pid) == 7
        assert _autogroup_nice(plain.pid) == 0
        process.renice(plain.pid, 5)  # a session leader started plain, lowered later
        assert _autogroup_nice(plain.pid) == 5
        assert not process.renice_session(shared.pid, 9)  # it leads no session: ours would be lowered
        process.renice(shared.pid, 9)
        assert _autogroup_nice(os.getpid()) == ours == _autogroup_nice(shared.pid)
    finally:
        for proc in (niced, plain, shared):
            process.kill_process(proc, wait_s=5)
