"""Real vLLM (its CPU build) on loopback, serving the tiny model ``scripts/install-vllm.sh`` made: the backend of
the tests that check what the inference sim can only imitate (vLLM's own API server, scheduler, errors, metrics).

``scripts/install-vllm.sh`` installs vLLM into its own venv and writes the model, both under
``${TOKENPOOLS_CACHE:-~/.cache/tokenpools}/vllm`` (docs/vllm.md). This module is an I/O shell: nothing happens at
import time; :class:`VLLMServer` starts ``vllm serve`` only in :meth:`VLLMServer.start`. A start costs about a
minute on 2 cores (engine start-up and torch.compile of the model; the compile cache lives in the same folder),
so a test session starts one and shares it.

``--scheduling-policy priority`` by default (the proxy writes a request's priority when its pool has
``enginePriority``; ``tokenpools up --backend vllm`` asks for ``fcfs`` when it has not), a KV cache of
``kv_cache_gib`` (vLLM's CPU default takes most of the machine's memory) and ``--host 127.0.0.1``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Self

from tokenpools_dev.devstack import process
from tokenpools_dev.devstack.vllm_model import EMBEDDING_DIR

MODEL_NAME = "tiny-llama"
"""The name the tests use (``--served-model-name``); without it vLLM names the model by its directory."""


class SchedulingPolicy(StrEnum):
    """vLLM's ``--scheduling-policy``: ``priority`` serves the lowest ``priority`` value first, ``fcfs`` ignores it."""

    FCFS = "fcfs"
    PRIORITY = "priority"


class VLLMError(RuntimeError):
    """Not installed, the process died, or readiness timed out (message has the log tail)."""


@dataclass(frozen=True)
class VLLMInstall:
    """Where ``scripts/install-vllm.sh`` put vLLM and the model."""

    vllm: Path
    model: Path
    cache: Path

    @classmethod
    def find(cls, root: Path | None = None) -> Self:
        """The install under ``root`` (default the tokenpools cache), or :class:`VLLMError` saying how to make it.

        Installed means the install script's stamp is there: it is written last, after the venv and the model.
        """
        root = root or process.cache_dir() / "vllm"
        vllm, stamp = root / "venv" / "bin" / "vllm", root / "installed"
        models = sorted(root.glob("model-*/config.json"), key=lambda p: int(p.parent.name.split("-")[1]))
        if not (stamp.is_file() and vllm.is_file() and models):
            raise VLLMError(f"vLLM is not installed in {root}: run scripts/install-vllm.sh (or make services)")
        return cls(vllm=vllm, model=models[-1].parent, cache=root / "cache")

    @property
    def embedding_model(self) -> Path:
        """The tiny BERT for ``/v1/embeddings`` (served with ``--runner pooling``); absent in a model-1 install."""
        return self.model / EMBEDDING_DIR


class VLLMServer:
    """One ``vllm serve`` process for the tiny model on ``127.0.0.1:port`` (``port=None``: a free one).

    ``max_num_seqs`` is vLLM's own concurrency limit; ``max_model_len`` the context length its 400s are about.
    ``model`` is the model's folder (default: the install's chat model). ``engine_nice`` (> 0) lowers the CPU
    priority of the engine core and its workers once ready, so that on a few busy cores the API server (which takes
    requests, notices disconnects and answers ``/metrics``) is not starved by the engine's busy polling
    (docs/vllm.md).
    """

    def __init__(
        self,
        install: VLLMInstall | None = None,
        *,
        model_name: str = MODEL_NAME,
        model: Path | None = None,
        max_model_len: int = 2048,
        max_num_seqs: int = 8,
        kv_cache_gib: float = 1.0,
        scheduling_policy: SchedulingPolicy = SchedulingPolicy.PRIORITY,
        engine_nice: int = 0,
        extra_args: Sequence[str] = (),
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        startup_timeout: float = 300.0,
        workdir: Path | None = None,
    ) -> None:
        if kv_cache_gib <= 0:
            raise ValueError(f"`kv_cache_gib` must be positive, got {kv_cache_gib}")
        self._install = install
        self.model_name = model_name
        self._model = model
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.kv_cache_gib = kv_cache_gib
        self.scheduling_policy = SchedulingPolicy(scheduling_policy)
        self.engine_nice = engine_nice
        self.extra_args = list(extra_args)
        self._port = port
        self._env = dict(env or {})
        self.startup_timeout = startup_timeout
        self._workdir = workdir
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.startup_seconds: float = 0.0

    @property
    def install(self) -> VLLMInstall:
        if self._install is None:
            self._install = VLLMInstall.find()
        return self._install

    @property
    def port(self) -> int:
        if self._port is None:
            raise VLLMError("not started")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` (the OpenAI client wants ``base_url + "/v1"``)."""
        return f"http://{process.LOOPBACK}:{self.port}"

    @property
    def log_path(self) -> Path:
        if self._workdir is None:
            raise VLLMError("not started")
        return self._workdir / "vllm.log"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def args(self) -> list[str]:
        return [
            str(self.install.vllm), "serve", str(self._model or self.install.model),
            "--served-model-name", self.model_name,
            "--host", process.LOOPBACK, "--port", str(self.port),
            "--dtype", "bfloat16",
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--scheduling-policy", self.scheduling_policy.value,
            *self.extra_args,
        ]

    def environment(self) -> dict[str, str]:
        """This process's environment plus vLLM's CPU settings; no ``PROMETHEUS_MULTIPROC_DIR`` (docs/vllm.md)."""
        env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
        env.update({
            "VLLM_CPU_KVCACHE_SPACE": f"{self.kv_cache_gib:g}",  # GiB; the default is most of the machine
            "VLLM_CACHE_ROOT": str(self.install.cache),  # torch.compile's cache: the second start is faster
            # vLLM 0.32 with torch >= 2.10 (ours: 2.13) saves the compiled model as an AOT artifact that its CPU
            # build then fails to load ("Compiling model again due to a load failure ... no attribute
            # 'finalize_loading'"): every start compiled again. Without AOT the same graph goes to torch.compile's
            # own cache, which loads (engine init 6 s instead of 16 s, docs/vllm.md)
            "VLLM_USE_AOT_COMPILE": "0",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_DO_NOT_TRACK": "1",
            "HF_HUB_OFFLINE": "1",  # the model is a local directory: never ask a hub
            "TRANSFORMERS_OFFLINE": "1",
        })
        env.update(self._env)
        return env

    def start(self) -> Self:
        """Start ``vllm serve`` and block until ``/health`` is 200 and ``/v1/models`` lists the model."""
        if self.running:
            return self
        if self._workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="tokenpools-vllm-")
            self._workdir = Path(self._tmp.name)
        if self._port is None:
            self._port = process.free_port()
        # `proc`, not `self._proc`, from here on: another thread may stop() this server while it starts
        proc = self._proc = process.spawn_logged(self.args(), self.log_path, env=self.environment(),
                                                 header=f"vllm serve on port {self.port}")
        ready, self.startup_seconds = process.wait_ready(proc, self._ready, self.startup_timeout, poll_s=0.5)
        if ready is process.Readiness.EXITED:
            raise VLLMError(f"vllm serve exited with {proc.poll()}:\n{process.log_tail(self.log_path)}")
        if ready is process.Readiness.TIMED_OUT:
            self.stop()
            raise VLLMError(f"vllm serve not ready after {self.startup_timeout} s:\n"
                            f"{process.log_tail(self.log_path)}")
        if self.engine_nice > 0:
            for pid in _descendants(_engine_core(proc.pid)):
                process.renice(pid, self.engine_nice)
            # vLLM runs in a session of its own: against the test and the other services only its group's nice
            # weighs (the API server, at nice 0, still comes first within the group)
            process.renice_session(proc.pid, self.engine_nice)
        return self

    def _ready(self) -> bool:
        if not process.http_ok(self.base_url + "/health"):
            return False
        try:
            with urllib.request.urlopen(self.base_url + "/v1/models", timeout=5) as r:
                return any(m.get("id") == self.model_name for m in json.load(r).get("data", []))
        except (OSError, ValueError):
            return False

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (vLLM shuts its engine process down), SIGKILL of the whole group after ``timeout``.

        ``vllm serve`` runs in its own session and starts its engine core as a child: the group is killed so an
        engine left behind by a failed shutdown does not keep the port or the memory.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        process.stop_process(proc, timeout, kill_wait_s=10)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # what is left of its session, if anything
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """SIGKILL of the whole process group, like a crashed node (no graceful shutdown); the port is kept."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        process.kill_process(proc, wait_s=10)

    def kill_engine(self) -> int:
        """A fault: SIGKILL vLLM's engine core process (``VLLM::EngineCore``, a child of ``vllm serve``); its pid.

        vLLM's API server then fails the requests in flight itself (500, or an error event in a stream) and exits.
        """
        if self._proc is None:
            raise VLLMError("not started")
        engine = _engine_core(self._proc.pid)
        os.kill(engine, signal.SIGKILL)
        return engine

    def close(self) -> None:
        """Stop the process and delete the temporary workdir (log included) if this object made it."""
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self._workdir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _engine_core(serve_pid: int) -> int:
    """The pid of the engine core (``VLLM::EngineCore``) among the children of ``vllm serve`` (``serve_pid``)."""
    for pid in _children(serve_pid):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if title.startswith(b"VLLM::EngineCore"):
            return pid
    raise VLLMError(f"no engine core among the children of vllm serve ({serve_pid})")


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (the engine core: its CPU workers)."""
    found, todo = [], [pid]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(_children(pid))
    return found


def _children(pid: int) -> list[int]:
    """The pids of ``pid``'s child processes (Linux: ``/proc/<pid>/task/<tid>/children``)."""
    out: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out.extend(int(child) for child in children.read_text().split())
        except OSError:
            continue
    return out
