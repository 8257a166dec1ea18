"""What serves the local stack's pools (``tokenpools up --backend``), decided from the option and from what a server
answers (pure: text and parsed JSON in, decisions out; the probes that fetch them are ``probes``').

- ``sim`` (the default): one llm-d-inference-sim per pool replica, latencies from ``SimProfile`` and ``--time-scale``;
- ``vllm``: one real ``vllm serve`` per pool replica (the CPU build and tiny model of ``scripts/install-vllm.sh``,
  docs/vllm.md), serving the pool's ``spec.model`` name, ``--max-num-seqs`` its per-replica concurrency, with
  ``--scheduling-policy priority`` when the pool has ``enginePriority: true`` (else ``fcfs``);
- an ``http(s)://`` URL: an OpenAI-compatible server the operator already runs. No backend process is started; every
  pool's endpoint is that URL, which must answer ``/v1/models`` and list every pool's model.

A real backend runs at its own speed: ``--time-scale`` (which scales the simulator's latencies with the control
loop's) and ``--split`` (which divides a simulated replica) apply to ``sim`` only.

Prometheus scrapes a real backend's ``/metrics`` (a URL's only when it answers one) with a timeout of
``REAL_SCRAPE_TIMEOUT_S``: vLLM answers ``/metrics`` from the event loop that streams tokens, and on 2 shared cores
a poll took 1.4–2.4 s during generation, once 9.8 s (docs/vllm.md). A timed-out scrape sets ``up`` to 0, which the
controller reports as a replica lost, and the agents then cut the pool's capacity.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit


class BackendKind(StrEnum):
    SIM = "sim"
    VLLM = "vllm"
    URL = "url"


REAL_SCRAPE_TIMEOUT_S = 10.0
"""Scrape timeout (and least interval) of a vLLM or URL backend's ``/metrics``, seconds (see the module doc)."""

VLLM_READY_TIMEOUT_S = 600.0
"""The least time a vLLM replica is given to answer ``/health`` and list its model, seconds: on the shared 2-core
machine a start took 38–100 s with torch.compile's cache warm and 200 s with it empty (docs/vllm.md)."""


@dataclass(frozen=True, slots=True)
class Backend:
    """The ``--backend`` choice; ``url`` (``BackendKind.URL`` only) is the server's base URL, without ``/v1``."""

    kind: BackendKind = BackendKind.SIM
    url: str = ""

    def __post_init__(self) -> None:
        if (self.kind is BackendKind.URL) != bool(self.url):
            raise ValueError(f"a backend URL goes with kind `url` only, got kind {self.kind} and url {self.url!r}")

    @property
    def runs_replicas(self) -> bool:
        """The stack starts a server per pool replica (else it fronts the operator's server)."""
        return self.kind is not BackendKind.URL

    def __str__(self) -> str:
        return self.url or self.kind.value


def parse_backend(text: str) -> Backend:
    """``sim``, ``vllm`` or an ``http(s)://host[:port][/path]`` base URL (a trailing ``/`` or ``/v1`` is dropped: the
    proxies and the probes add ``/v1/...``). ValueError, one line, for anything else."""
    value = text.strip()
    if value in (BackendKind.SIM.value, BackendKind.VLLM.value):
        return Backend(BackendKind(value))
    parts = urlsplit(value)
    expected = f"--backend takes sim, vllm or the http(s):// URL of an OpenAI-compatible server, got {text!r}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(expected)
    try:
        parts.port  # noqa: B018 -- raises on a port that is not a number in 0..65535
    except ValueError:
        raise ValueError(f"--backend: the URL's port must be a number in 0..65535, got {text!r}") from None
    if parts.query or parts.fragment:
        raise ValueError(f"--backend: the URL may not have a query or a fragment, got {text!r}")
    path = parts.path.rstrip("/")
    path = path.removesuffix("/v1")
    return Backend(BackendKind.URL, f"{parts.scheme}://{parts.netloc}{path}")


@dataclass(frozen=True, slots=True)
class ScrapeSettings:
    """How Prometheus scrapes one backend: ``host:port``, scheme, path, interval and timeout (seconds)."""

    host_port: str
    scheme: str
    metrics_path: str
    interval_s: float
    timeout_s: float


def scrape_timing(kind: BackendKind, stack_interval_s: float) -> tuple[float, float]:
    """(interval, timeout) of a backend's scrapes: the stack's interval for the simulator (it answers at once), at
    least ``REAL_SCRAPE_TIMEOUT_S`` for both otherwise (Prometheus wants timeout <= interval)."""
    if kind is BackendKind.SIM:
        return stack_interval_s, stack_interval_s
    return max(stack_interval_s, REAL_SCRAPE_TIMEOUT_S), REAL_SCRAPE_TIMEOUT_S


def url_scrape(url: str, stack_interval_s: float) -> ScrapeSettings:
    """The scrape of a URL backend's ``/metrics`` (beside its OpenAI paths: ``URL/metrics``)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    interval, timeout = scrape_timing(BackendKind.URL, stack_interval_s)
    return ScrapeSettings(f"{parts.hostname}:{port}", parts.scheme, f"{parts.path}/metrics", interval, timeout)


def served_models(answer: Any) -> list[str]:
    """The model ids of an OpenAI ``GET /v1/models`` answer; ValueError if it is not one."""
    data = answer.get("data") if isinstance(answer, Mapping) else None
    if not isinstance(data, list) or not all(isinstance(m, Mapping) and isinstance(m.get("id"), str) for m in data):
        raise ValueError("its /v1/models answer is not an OpenAI model list ({\"data\": [{\"id\": ...}]})")
    return [str(m["id"]) for m in data]


def unserved(models: Mapping[str, str], served: Iterable[str]) -> dict[str, str]:
    """Pool → model, for every pool whose ``spec.model`` is not among ``served``."""
    have = set(served)
    return {pool: model for pool, model in models.items() if model not in have}


def unserved_message(url: str, missing: Mapping[str, str], served: Iterable[str]) -> str:
    pools = ", ".join(f"pool {pool}'s model {model}" for pool, model in missing.items())
    return f"--backend {url} does not serve {pools} (it serves: {', '.join(served) or 'no model'})"
