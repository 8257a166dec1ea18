"""A command on a pseudo-terminal, read back as a user sees it: for the tests that drive ``tokenpools top``."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import termios
import threading
import time

ANSI = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[()][0-9A-B]|\x1b[=>]")


class Terminal:
    """A process on a pseudo-terminal of ``columns`` × ``lines``, and everything it has drawn, escapes removed.

    A thread reads the terminal all the time, as a terminal emulator does: a screen nobody reads fills the
    terminal's buffer and blocks the process in its next write (and then it cannot even leave on Ctrl-C)."""

    def __init__(self, command: list[str], columns: int = 200, lines: int = 200) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
        env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(columns), "LINES": str(lines)}
        self.process = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
        os.close(slave)
        self._screen = b""
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the process closed the terminal
                return
            if not chunk:
                return
            with self._lock:
                self._screen += chunk

    def text(self) -> str:
        with self._lock:
            return ANSI.sub(b"", self._screen).decode("utf-8", "replace")

    def wait_for(self, pattern: str, timeout_s: float = 60.0) -> re.Match[str]:
        """The first match of ``pattern`` in what has been drawn since the last ``wait_for``."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = re.search(pattern, self.text())
            if found:
                with self._lock:
                    self._screen = b""
                return found
            if time.monotonic() > deadline or not self._reader.is_alive():
                raise AssertionError(f"{pattern!r} not drawn within {timeout_s} s; the screen:\n{self.text()[-4000:]}")
            time.sleep(0.1)

    def close(self) -> int:
        """Ctrl-C (SIGINT, as the terminal sends it), then the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        finally:
            self._reader.join(timeout=10)
            os.close(self.master)


def row(pool: str, entitlement: str, *cells: str) -> str:
    """A pattern for a row of the entitlements table: its pool, entitlement, then ``cells`` in order."""
    return r"│ " + r"\s*│\s+".join(re.escape(c) for c in (pool, entitlement, *cells)) + r"\s"
