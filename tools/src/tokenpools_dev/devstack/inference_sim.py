"""llm-d-inference-sim on loopback: the vLLM stand-in for integration tests and CI.

Why this simulator: it speaks vLLM's OpenAI-compatible HTTP API *and* exposes vLLM's ``vllm:*``
Prometheus metrics (running/waiting requests, KV-cache usage, token counters, latency histograms),
with TTFT/ITL latencies and a max-num-seqs concurrency limit -- which is what the control plane
reads and reacts to. No GPU, no model weights.

The binary is built by ``scripts/install-inference-sim.sh`` into
``${TOKENPOOLS_CACHE:-~/.cache/tokenpools}/bin``. This module is an I/O shell: nothing happens at
import time; :class:`InferenceSim` starts a process only in :meth:`InferenceSim.start`.

``--force-dummy-tokenizer`` is always passed: without it the sim asks huggingface.co whether the
model exists (unreachable in CI) before falling back to the dummy tokenizer.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

from tokenpools_dev.devstack import process

BINARY_NAME = "llm-d-inference-sim"


class InferenceSimError(RuntimeError):
    """The binary is missing, the process died, or readiness timed out (message has the log tail)."""


def find_binary() -> Path:
    """``$TOKENPOOLS_INFERENCE_SIM``, else the cached build, else ``llm-d-inference-sim`` on PATH."""
    if env := os.environ.get("TOKENPOOLS_INFERENCE_SIM"):
        return Path(env)
    cached = process.cache_dir() / "bin" / BINARY_NAME
    if cached.is_file() and os.access(cached, os.X_OK):
        return cached
    if found := shutil.which(BINARY_NAME):
        return Path(found)
    raise InferenceSimError(f"{BINARY_NAME} not found at {cached}: run scripts/install-inference-sim.sh")


def free_port() -> int:
    """A currently free IPv4 TCP port. The sim listens on ``tcp4 :PORT`` (all interfaces), so probe that."""
    return process.free_port(host="")


def go_duration(seconds: float) -> str:
    """Seconds as a Go ``time.Duration`` string (microsecond resolution), e.g. ``0.2`` -> ``200000us``."""
    return f"{round(seconds * 1_000_000)}us"


class InferenceSim:
    """One llm-d-inference-sim process serving ``model`` on ``127.0.0.1:port``.

    Latencies are in seconds. ``port=None`` picks a free port once; :meth:`restart` reuses it, so a
    Prometheus target or a router keeps pointing at the same address across restarts.
    ``enable_kvcache`` turns on the sim's block-level KV-cache model, without which
    ``vllm:kv_cache_usage_perc`` stays 0 (its ZMQ event publisher is disabled here). ``tls`` (a certificate and
    its key, e.g. from ``tokenpools_dev.tls``) serves HTTPS instead: ``base_url`` is then ``https://``. The
    readiness probe does not verify that certificate (it only asks whether the sim is up; verifying is the job of
    the clients under test).
    """

    def __init__(
        self,
        *,
        model: str = "fake-model",
        max_num_seqs: int = 5,
        max_model_len: int = 4096,
        time_to_first_token: float = 0.0,
        time_to_first_token_std_dev: float = 0.0,
        inter_token_latency: float = 0.0,
        inter_token_latency_std_dev: float = 0.0,
        time_factor_under_load: float = 1.0,
        mode: Literal["random", "echo"] = "random",
        seed: int | None = 42,
        enable_kvcache: bool = False,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        binary: Path | str | None = None,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 30.0,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        if time_factor_under_load < 1.0:
            raise ValueError("time_factor_under_load must be >= 1.0 (sim rejects smaller values)")
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.time_to_first_token = time_to_first_token
        self.time_to_first_token_std_dev = time_to_first_token_std_dev
        self.inter_token_latency = inter_token_latency
        self.inter_token_latency_std_dev = inter_token_latency_std_dev
        self.time_factor_under_load = time_factor_under_load
        self.mode = mode
        self.seed = seed
        self.enable_kvcache = enable_kvcache
        self.extra_args = list(extra_args)
        self._requested_port = port
        self._binary = Path(binary) if binary else None
        self._env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.tls = tls
        self._port: int | None = port
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self.startup_seconds: float = 0.0

    # -- addresses -------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._port is None:
            raise InferenceSimError("not started")
        return self._port

    @property
    def host_port(self) -> str:
        """``127.0.0.1:PORT`` -- the form a Prometheus static target wants."""
        return f"127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``, ``https://`` with ``tls`` (the OpenAI client wants ``base_url + "/v1"``)."""
        return f"{'https' if self.tls else 'http'}://{self.host_port}"

    @property
    def log_path(self) -> Path:
        if self._workdir is None:
            raise InferenceSimError("not started")
        return Path(self._workdir.name) / "sim.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def args(self) -> list[str]:
        """The command-line flags (v0.10.2 names, checked against ``--help``)."""
        a = [
            f"--port={self.port}",
            f"--model={self.model}",
            "--force-dummy-tokenizer",
            f"--max-num-seqs={self.max_num_seqs}",
            f"--max-model-len={self.max_model_len}",
            f"--time-to-first-token={go_duration(self.time_to_first_token)}",
            f"--time-to-first-token-std-dev={go_duration(self.time_to_first_token_std_dev)}",
            f"--inter-token-latency={go_duration(self.inter_token_latency)}",
            f"--inter-token-latency-std-dev={go_duration(self.inter_token_latency_std_dev)}",
            f"--time-factor-under-load={self.time_factor_under_load}",
            f"--mode={self.mode}",
        ]
        if self.seed is not None:
            a.append(f"--seed={self.seed}")
        if self.enable_kvcache:
            a += ["--enable-kvcache", "--zmq-endpoint="]
        if self.tls:
            a += [f"--ssl-certfile={self.tls[0]}", f"--ssl-keyfile={self.tls[1]}"]
        return a + self.extra_args

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> Self:
        """Start the process and block until ``/health/ready`` answers 200.

        With an auto-picked port, a lost bind race (another process took the port between probe and
        bind) is retried on a fresh port.
        """
        if self.running:
            return self
        if self._workdir is None:
            self._workdir = tempfile.TemporaryDirectory(prefix="tokenpools-sim-")
        attempts = 1 if self._requested_port is not None else 3
        for attempt in range(attempts):
            if self._port is None or (attempt > 0 and self._requested_port is None):
                self._port = free_port()
            try:
                self._spawn_and_wait()
                return self
            except InferenceSimError:
                self._reap()
                if attempt == attempts - 1 or "address already in use" not in self._log_tail():
                    raise
        raise AssertionError("unreachable")

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful SIGTERM (the sim drains and exits), SIGKILL after ``timeout``."""
        process.stop_process(self._proc, timeout, kill_wait_s=5)
        self._reap()

    def kill(self) -> None:
        """SIGKILL: simulates a crashed or preempted vLLM pod (no graceful shutdown)."""
        process.kill_process(self._proc, wait_s=5)
        self._reap()

    def restart(self) -> Self:
        """Stop (if running) and start again on the same port."""
        self.stop()
        self._requested_port = self.port
        return self.start()

    def close(self) -> None:
        """Stop the process and delete the temp dir (log included)."""
        self.stop()
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------------
    def _spawn_and_wait(self) -> None:
        binary = self._binary or find_binary()
        env = {**os.environ, **self._env}
        context = ssl._create_unverified_context() if self.tls else None  # readiness only (see the class)
        if self.enable_kvcache:
            env.setdefault("POD_IP", "127.0.0.1")  # the sim's KV-cache model refuses to start without it
        # its own session: a Ctrl-C in the test runner must not race our own SIGTERM
        self._proc = process.spawn_logged([str(binary), *self.args()], self.log_path, env=env)
        ready, self.startup_seconds = process.wait_ready(
            self._proc, lambda: process.http_ok(self.base_url + "/health/ready", context=context), self.startup_timeout)
        if ready is process.Readiness.EXITED:
            raise InferenceSimError(f"{binary.name} exited with {self._proc.returncode}:\n{self._log_tail()}")
        if ready is process.Readiness.TIMED_OUT:
            raise InferenceSimError(f"{binary.name} not ready after {self.startup_timeout}s:\n{self._log_tail()}")

    def _reap(self) -> None:
        process.kill_process(self._proc, wait_s=5)
        self._proc = None

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return process.log_tail(self.log_path, lines)
        except InferenceSimError:  # not started: no log dir
            return "<no log>"
