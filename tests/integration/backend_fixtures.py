"""Fixtures and helpers for tests that need the inference sim and/or Prometheus.

Import the fixtures you use into the test module (``from backend_fixtures import ...``); pytest puts
this directory on ``sys.path`` because it has no ``__init__.py``. The binaries are NOT built here:
a multi-minute Go build or an apt install must be its own visible CI step
(``scripts/install-inference-sim.sh``, ``scripts/install-prometheus.sh``), so a missing binary fails
with the command to run instead of silently hijacking the test run.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tokenpools_dev.devstack.inference_sim import InferenceSimError, find_binary

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def inference_sim_binary() -> Path:
    try:
        return find_binary()
    except InferenceSimError as e:
        pytest.fail(f"{e} (from {REPO})", pytrace=False)


@pytest.fixture(scope="session")
def prometheus_binary() -> Path:
    found = shutil.which("prometheus")
    if not found:
        pytest.fail(f"prometheus not on PATH: run {REPO}/scripts/install-prometheus.sh", pytrace=False)
    return Path(found)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)")


def scrape(base_url: str) -> dict[str, float]:
    """The sim's own ``/metrics`` as ``{'name{k="v",...}': value}``, names exactly as exposed.

    Hand-parsed on purpose: ``prometheus_client.parser`` renames counter samples to ``*_total``
    (``vllm:prefix_cache_queries`` would become ``vllm:prefix_cache_queries_total``), which is
    not what Prometheus stores. The Go client already sorts labels, so keys are stable.
    """
    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if m := _SAMPLE.match(line):
            out[m[1] + (m[2] or "{}")] = float(m[3])
    return out


def metric(samples: dict[str, float], name: str, model: str) -> float:
    """One sample by name for ``model_name=model`` (the sim labels everything with model_name)."""
    return samples[f'{name}{{model_name="{model}"}}']


@dataclass
class MetricsRecorder:
    """Samples the sim's ``/metrics`` every ``period`` s in a thread, with wall-clock timestamps.

    Lets a test ask "what did the sim itself report around time t?" and compare that with what
    Prometheus stored for the scrape at t -- the only fair comparison for values that move.
    """

    base_url: str
    period: float = 0.05
    history: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> MetricsRecorder:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.time()
            try:
                samples = scrape(self.base_url)
            except OSError:
                samples = {}
            if samples:
                self.history.append(((t0 + time.time()) / 2, samples))
            self._stop.wait(self.period)

    def values_between(self, key: str, start: float, end: float) -> list[float]:
        return [s[key] for t, s in list(self.history) if start <= t <= end and key in s]
