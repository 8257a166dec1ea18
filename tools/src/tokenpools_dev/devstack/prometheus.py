"""A real Prometheus server on loopback, scraping the inference sims, for integration tests and CI.

Why a real Prometheus: the autoscaler reads pool signals through PromQL (``rate()``, staleness,
``up``), and only the real server proves those semantics -- a scrape that fails turns ``up`` to 0
and marks the target's series stale, so an instant query stops returning them.

The binary is Debian's ``prometheus`` (2.42), installed by ``scripts/install-prometheus.sh``. This
module is an I/O shell: nothing happens at import time; :class:`PrometheusServer` writes its config
and starts the process only in :meth:`PrometheusServer.start`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml

from tokenpools_dev.devstack import process

RULES_DIR = Path(__file__).resolve().parents[4] / "deploy" / "prometheus" / "rules"  # the checkout's


def project_rule_files() -> list[Path]:
    """The project's alert and recording rules (``deploy/prometheus/rules/*.yaml``), for ``rule_files=``."""
    return sorted(RULES_DIR.glob("*.yaml"))


@dataclass(frozen=True, slots=True)
class ScrapeJob:
    """One job's ``host:port`` targets and how they are scraped: ``interval_s`` None is the server's interval, and
    ``timeout_s`` None the job's interval (Prometheus wants timeout <= interval). A job of a slow ``/metrics`` (real
    vLLM on a busy machine, docs/vllm.md) gets a longer timeout, hence a longer interval."""

    targets: tuple[str, ...]
    scheme: str = "http"
    metrics_path: str = "/metrics"
    interval_s: float | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.scheme not in ("http", "https"):
            raise ValueError(f"`scheme` must be http or https, got {self.scheme!r}")
        if not self.metrics_path.startswith("/"):
            raise ValueError(f"`metrics_path` must start with /, got {self.metrics_path!r}")
        for name, value in (("interval_s", self.interval_s), ("timeout_s", self.timeout_s)):
            if value is not None and value <= 0:
                raise ValueError(f"`{name}` must be positive, got {value}")
        if self.interval_s is not None and self.timeout_s is not None and self.timeout_s > self.interval_s:
            raise ValueError(f"`timeout_s` must be <= `interval_s` ({self.interval_s}), got {self.timeout_s}")


Targets = Mapping[str, Sequence[str] | ScrapeJob]
"""Job name -> ``host:port`` list, or a :class:`ScrapeJob`. One job per pool keeps PromQL ``{job="pool-a"}``
selectors simple."""


def scrape_job(value: Sequence[str] | ScrapeJob) -> ScrapeJob:
    return value if isinstance(value, ScrapeJob) else ScrapeJob(tuple(value))


VLLM_SCRAPE_S = 5.0
"""Real vLLM's scrape interval and timeout, as deploy/prometheus/scrape-config.yaml scrapes it: its ``/metrics`` is
answered by the API server's event loop, which gets little CPU while the engine runs on 2 shared cores (1.4-2.4 s,
once 9.8 s: docs/vllm.md). A timeout of one second turns ``up`` to 0 under load and drops every ``vllm:*`` series;
the controller then reads the proxies' view, but vLLM's own series are better, so give it several seconds."""


def vllm_job(targets: Sequence[str]) -> ScrapeJob:
    return ScrapeJob(tuple(targets), interval_s=VLLM_SCRAPE_S, timeout_s=VLLM_SCRAPE_S)


class PrometheusError(RuntimeError):
    """Binary missing, bad config, the process died, or a wait timed out (message has the log tail)."""


def _find(name: str, env_var: str) -> Path | None:
    if env := os.environ.get(env_var):
        return Path(env)
    found = shutil.which(name)
    return Path(found) if found else None


def _duration(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def render_config(targets: Targets, scrape_interval: float = 1.0, rule_files: Sequence[Path] = ()) -> dict[str, Any]:
    """The prometheus.yml document: one static job per entry (scrape timeout == interval unless the job says
    otherwise), the rule files (absolute paths: the config lives in a temporary directory) evaluated at the scrape
    interval."""
    interval = _duration(scrape_interval)
    scrape_configs = []
    for name, value in targets.items():
        job = scrape_job(value)
        job_interval = job.interval_s if job.interval_s is not None else scrape_interval
        timeout = job.timeout_s if job.timeout_s is not None else job_interval
        if timeout > job_interval:
            raise ValueError(f"job {name}: scrape timeout {timeout} s is above its interval {job_interval} s")
        scrape_configs.append({
            "job_name": name,
            "scrape_interval": _duration(job_interval),
            "scrape_timeout": _duration(timeout),  # must be <= scrape_interval
            **({"scheme": job.scheme} if job.scheme != "http" else {}),
            **({"metrics_path": job.metrics_path} if job.metrics_path != "/metrics" else {}),
            "static_configs": [{"targets": list(job.targets)}],
        })
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        **({"rule_files": [str(Path(p).resolve()) for p in rule_files]} if rule_files else {}),
        "scrape_configs": scrape_configs,
    }


class PrometheusServer:
    """One Prometheus process on ``127.0.0.1:port`` with a throw-away TSDB.

    ``--web.enable-lifecycle`` is on so :meth:`set_targets` can hot-reload the scrape config (pools
    appear and disappear during a test) without losing the TSDB. ``rule_files`` (e.g. the project's
    ``deploy/prometheus/rules/*.yaml``) are loaded and evaluated like a deployed Prometheus would.
    """

    def __init__(
        self,
        targets: Targets | None = None,
        *,
        scrape_interval: float = 1.0,
        port: int | None = None,
        binary: Path | str | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
        rule_files: Sequence[Path | str] = (),
    ) -> None:
        self._targets: dict[str, ScrapeJob] = {j: scrape_job(v) for j, v in (targets or {}).items()}
        self.rule_files = [Path(p) for p in rule_files]
        self.scrape_interval = scrape_interval
        self._requested_port = port
        self._port: int | None = port
        self._binary = Path(binary) if binary else None
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self.startup_seconds: float = 0.0

    # -- addresses -------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        if self._port is None:
            raise PrometheusError("not started")
        return self._port

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` -- pass to ``PrometheusConnect(url=...)``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def targets(self) -> dict[str, list[str]]:
        return {j: list(job.targets) for j, job in self._targets.items()}

    @property
    def config_path(self) -> Path:
        return self._dir / "prometheus.yml"

    @property
    def log_path(self) -> Path:
        return self._dir / "prometheus.log"

    @property
    def _dir(self) -> Path:
        if self._workdir is None:
            raise PrometheusError("not started")
        return Path(self._workdir.name)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> Self:
        """Write and validate the config, start Prometheus, block until ``/-/ready`` is 200."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        binary = self._binary or _find("prometheus", "TOKENPOOLS_PROMETHEUS")
        if binary is None:
            raise PrometheusError("prometheus not on PATH: run scripts/install-prometheus.sh")
        self._workdir = tempfile.TemporaryDirectory(prefix="tokenpools-prom-")
        self._write_config()
        if self._port is None:
            self._port = process.free_port()
        self._proc = process.spawn_logged([
            str(binary),
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self._dir / 'tsdb'}",
            "--storage.tsdb.retention.time=1h",
            f"--web.listen-address=127.0.0.1:{self._port}",
            "--web.enable-lifecycle",
            *self.extra_args,
        ], self.log_path)
        self.startup_seconds = self._wait(lambda: self._get("/-/ready") is not None, self.startup_timeout, "/-/ready")
        return self

    def set_targets(self, targets: Targets, *, wait: bool = True, timeout: float = 15.0) -> None:
        """Replace the scrape targets and hot-reload (``POST /-/reload``).

        With ``wait`` (default) this returns only once ``/api/v1/targets`` shows exactly the new
        targets: Prometheus applies reloaded discovery asynchronously (up to ~5 s on 2.42).
        """
        self._targets = {j: scrape_job(v) for j, v in targets.items()}
        if self._proc is None:
            return  # not started: start() writes the config
        self._write_config()
        req = urllib.request.Request(self.url + "/-/reload", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                r.read()
        except urllib.error.HTTPError as e:
            raise PrometheusError(f"reload failed: {e.code} {e.read()!r}\n{self._log_tail()}") from e
        if wait:
            self.wait_for_targets(timeout=timeout)

    def active_targets(self) -> list[dict[str, Any]]:
        """``/api/v1/targets`` activeTargets (each has ``labels.job``, ``scrapeUrl``, ``health``)."""
        body = self._get("/api/v1/targets?state=active")
        if body is None:
            raise PrometheusError(f"/api/v1/targets failed\n{self._log_tail()}")
        return list(json.loads(body)["data"]["activeTargets"])

    def rule_groups(self) -> list[dict[str, Any]]:
        """``/api/v1/rules`` groups (each has ``name``, ``file`` and ``rules`` with ``name``, ``type``, ``health``)."""
        body = self._get("/api/v1/rules")
        if body is None:
            raise PrometheusError(f"/api/v1/rules failed\n{self._log_tail()}")
        return list(json.loads(body)["data"]["groups"])

    def wait_for_targets(self, *, health: str | None = None, timeout: float = 15.0) -> None:
        """Until the active targets equal the configured ones (and, if given, all have ``health``)."""
        want = {(name, host) for name, job in self._targets.items() for host in job.targets}

        def done() -> bool:
            active = self.active_targets()
            have = {(t["labels"]["job"], t["labels"]["instance"]) for t in active}
            return have == want and (health is None or all(t["health"] == health for t in active))

        self._wait(done, timeout, f"targets {sorted(want)} health={health}")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (Prometheus flushes the head block and exits), SIGKILL after ``timeout``."""
        process.stop_process(self._proc, timeout, kill_wait_s=5)
        self._proc = None
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None
        self._port = self._requested_port

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- internals -------------------------------------------------------------------------------
    def _write_config(self) -> None:
        """Write atomically (reload must never read a half-written file) and check with promtool."""
        doc = render_config(self._targets, self.scrape_interval, self.rule_files)
        tmp = self.config_path.with_suffix(".yml.tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        promtool = _find("promtool", "TOKENPOOLS_PROMTOOL")
        if promtool is not None:
            check = subprocess.run(
                [str(promtool), "check", "config", str(tmp)], capture_output=True, text=True, check=False
            )
            if check.returncode != 0:
                raise PrometheusError(f"promtool rejected the config:\n{check.stdout}{check.stderr}")
        os.replace(tmp, self.config_path)

    def _get(self, path: str) -> bytes | None:
        """Body of a 200 response, None on any failure (used for polling)."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=2.0) as r:
                return bytes(r.read()) if r.status == 200 else None
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return None

    def _wait(self, cond: Callable[[], bool], timeout: float, what: str) -> float:
        """Seconds until ``cond()``; raises if Prometheus exits first or ``timeout`` passes."""
        ready, waited = process.wait_ready(self._proc, cond, timeout, poll_s=0.1)
        if ready is process.Readiness.EXITED:
            code = None if self._proc is None else self._proc.returncode
            raise PrometheusError(f"prometheus exited ({code}) waiting for {what}:\n{self._log_tail()}")
        if ready is process.Readiness.TIMED_OUT:
            raise PrometheusError(f"timed out after {timeout}s waiting for {what}:\n{self._log_tail()}")
        return waited

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return process.log_tail(self.log_path, lines)
        except PrometheusError:  # not started: no log dir
            return "<no log>"
