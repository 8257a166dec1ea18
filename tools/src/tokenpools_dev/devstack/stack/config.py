"""What a local stack runs, derived from a config file (pure: data in, data out; nothing is started here).

``tokenpools up --config FILE`` does not hand FILE to the processes as it is. The stack writes a *derived* config
(``RUN_DIR/config.yaml``) that every component reads:

- each pool's ``endpoints`` become the stack's pool service (``devstack.service``: one stable address per pool that
  balances over the replicas currently up, as a Kubernetes Service does), so replicas can come and go; with
  ``--backend URL`` they become that URL (``devstack.stack.backend``);
- ``split`` runs each configured replica as several smaller simulator processes (16 slots → 2 × 8): a replica can
  then fail and come back while the rest keeps serving — the Exp-2 outage is a lost replica, visible to the control
  plane through Prometheus (``up`` = 0), not a number changed behind its back;
- ``time_scale`` k < 1 compresses the run: every latency of the simulators and every time constant of the control
  loop is multiplied by k, every rate (tokens/s) divided by k, so the dynamics are those of the uncompressed
  experiment, k times faster (ratios — slots, priorities, debt per tick — are unchanged);
- a TokenPoolsSettings document carries the stack's Kafka and Prometheus addresses and the scaled time settings,
  so every process reads the same values from the same file.

API keys are kept: clients use the keys of the original file.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tokenpools.config import LoadedConfig, Settings, load_settings
from tokenpools_dev.devstack.stack.backend import VLLM_READY_TIMEOUT_S, Backend, BackendKind

TIME_SETTINGS: dict[str, tuple[str, ...]] = {
    "streams": ("tick_s", "grace_s", "metrics_staleness_s", "proxy_heartbeat_ttl_s", "demand_window_s"),
    "proxy": ("limits_ttl_s", "heartbeat_interval_s", "watchdog_interval_s"),
    "scaling": ("scale_down_stabilization_s", "cooldown_s"),
    "policy": ("queue_max_timeout_ms",),
}
"""Settings in experiment time (seconds, or milliseconds for a name ending in ``_ms``): multiplied by the time
scale. (The queue's default wait, a fraction of the SLO, follows the SLOs, which the stack scales too.)"""


@dataclass(frozen=True, slots=True)
class SimProfile:
    """Latencies of one simulated vLLM replica, in seconds of experiment time.

    Calibrated on ``replay/backend/model.py`` (the paper's testbed): a decode step at batch B takes
    30 ms + 2.3 ms·B, i.e. 32.3 ms alone and 66.8 ms with 16 sequences (≈ 240 output tokens/s); the simulator's
    inter-token latency is ``itl_s × (1 + (factor − 1)(n − 1)/(max_num_seqs − 1))`` with n running, so
    itl 32.3 ms and factor 2.068 give the same two end points. TTFT (prefill plus the first step) scales alike.
    """

    ttft_s: float = 0.040
    itl_s: float = 0.0323
    factor_under_load: float = 2.068
    std_dev_fraction: float = 0.05

    def scaled(self, k: float) -> SimProfile:
        return SimProfile(self.ttft_s * k, self.itl_s * k, self.factor_under_load, self.std_dev_fraction)

    def factor_for(self, slots: int, spare: int) -> float:
        """``--time-factor-under-load`` for a simulator of ``slots + spare`` sequences that slows down with n running
        exactly as one of ``slots`` would (the factor is linear in (n − 1)/(max − 1)).

        Spare sequences exist for evicted requests: llm-d-inference-sim 0.10.2 keeps generating a stream whose
        client went away (vLLM aborts it and frees its KV), so without them a request admitted in place of an
        evicted one would wait in the simulator's queue until the evicted one would have ended.
        """
        if spare <= 0 or slots <= 1:
            return self.factor_under_load
        return 1 + (self.factor_under_load - 1) * (slots + spare - 1) / (slots - 1)


@dataclass(frozen=True, slots=True)
class PoolLayout:
    """One pool as the stack runs it: backend processes (simulators or vLLM) of ``slots`` sequences each."""

    name: str
    model: str
    namespace: str
    deployment: str
    replicas: int  # simulators at start
    min_replicas: int
    max_replicas: int
    slots: int  # --max-num-seqs of each simulator or vLLM
    engine_priority: bool = False  # the pool's enginePriority: vLLM runs --scheduling-policy priority


@dataclass(frozen=True, slots=True)
class StackOptions:
    """Everything ``Stack`` needs to know; built by ``tokenpools up`` or the live experiment runner."""

    config: Path
    run_dir: Path
    proxies: int = 1
    kubernetes: bool = True
    agents: bool = True
    agents_workers: int = 1  # agents processes in one consumer group (the pools' partitions divided among them)
    controller: bool = True
    time_scale: float = 1.0
    split: Mapping[str, int] = field(default_factory=dict)  # pool → simulators per configured replica
    sim: SimProfile = field(default_factory=SimProfile)
    scrape_interval_s: float | None = None  # default: one experiment second, at least 0.2 s of wall time
    overrides: tuple[str, ...] = ()  # --set items for every component
    ready_timeout_s: float = 120.0
    background_nice: int = 0  # nice of Kafka, Prometheus, kube, agents, controller: the request path goes first
    sim_spare_seqs: int = 0  # extra simulator sequences for evicted requests (see SimProfile.factor_for)
    initial_states: Mapping[str, str] = field(default_factory=dict)  # entitlement → state for agents/controller
    proxies_bind_all: bool = False  # the proxies' config drops every `spec.state`: they hold all entitlements Bound
    backend: Backend = field(default_factory=Backend)  # what serves the pools (devstack.stack.backend)

    def __post_init__(self) -> None:
        if not 0 < self.time_scale <= 10:
            raise ValueError(f"`time_scale` must be in (0, 10], got {self.time_scale}")
        if self.backend.kind is not BackendKind.SIM and self.time_scale != 1:
            raise ValueError(f"--time-scale scales the simulator's latencies; --backend {self.backend} runs at its "
                             f"own speed, so the time scale must be 1, got {self.time_scale:g}")
        if self.backend.kind is not BackendKind.SIM and self.split:
            raise ValueError(f"--split divides a simulated replica; it does not apply to --backend {self.backend}")
        if self.proxies < 0:
            raise ValueError(f"`proxies` must be >= 0, got {self.proxies}")
        if self.agents_workers < 1:
            raise ValueError(f"`agents_workers` must be >= 1, got {self.agents_workers}")
        for pool, n in self.split.items():
            if n < 1:
                raise ValueError(f"split of pool {pool} must be >= 1, got {n}")

    @property
    def scrape_s(self) -> float:
        return self.scrape_interval_s if self.scrape_interval_s is not None else max(0.2, round(self.time_scale, 3))

    @property
    def replica_ready_timeout_s(self) -> float:
        """How long a backend replica may take to be ready: ``ready_timeout_s``, at least ``VLLM_READY_TIMEOUT_S``
        for vLLM."""
        if self.backend.kind is BackendKind.VLLM:
            return max(self.ready_timeout_s, VLLM_READY_TIMEOUT_S)
        return self.ready_timeout_s


def settings_of(loaded: LoadedConfig) -> Settings:
    """The settings a config file's TokenPoolsSettings document gives (defaults for the rest)."""
    return load_settings(loaded.settings_values)


def pool_layouts(loaded: LoadedConfig, split: Mapping[str, int] | None = None) -> dict[str, PoolLayout]:
    """Per pool: how many simulators of how many slots (``split`` divides each replica, see the module doc)."""
    unknown = sorted(set(split or {}) - set(loaded.pool_documents))
    if unknown:
        raise ValueError(f"--split names pools the config lacks: {', '.join(unknown)} (it has: "
                         f"{', '.join(loaded.pool_documents) or 'none'})")
    out: dict[str, PoolLayout] = {}
    for name, doc in loaded.pool_documents.items():
        s = (split or {}).get(name, 1)
        spec = doc.spec
        if spec.per_replica.concurrency % s:
            raise ValueError(f"pool {name}: {spec.per_replica.concurrency} slots per replica cannot split into {s}")
        ref = loaded.backend_refs[name]
        namespace = ref.namespace or doc.metadata.namespace or "default"
        out[name] = PoolLayout(name, spec.model, namespace, ref.name, spec.scaling.initial_replicas * s,
                               spec.scaling.min_replicas * s, spec.scaling.max_replicas * s,
                               spec.per_replica.concurrency // s, spec.engine_priority)
    return out


def _scale_resources(resources: dict[str, Any] | None, k: float, s: int = 1) -> None:
    """In place: tokens/s ÷ k (and everything ÷ s for a split replica)."""
    if not resources:
        return
    if "tokensPerSecond" in resources:
        resources["tokensPerSecond"] = float(resources["tokensPerSecond"]) / k / s
    if s > 1:
        resources["kvCacheGiB"] = float(resources["kvCacheGiB"]) / s
        resources["concurrency"] = int(resources["concurrency"]) // s


def derive_documents(raw_documents: Sequence[Mapping[str, Any]], *, time_scale: float,
                     endpoints: Mapping[str, Sequence[str]], split: Mapping[str, int] | None = None,
                     settings: Mapping[str, Any] | None = None, drop_states: bool = False,
                     states: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The derived config's documents (see the module doc). ``settings`` replaces the TokenPoolsSettings spec.

    ``states`` sets entitlements' ``state`` overrides (who is not a member yet when the stack starts);
    ``drop_states`` removes every override instead. A live experiment gives the proxies a config with none (they
    hold every entitlement Bound from the start) and the agents and the controller one with the timeline's initial
    states; it then changes membership through the specs topic (``live.control``)."""
    k, out = time_scale, []
    for raw in raw_documents:
        doc = copy.deepcopy(dict(raw))
        kind, spec = doc.get("kind"), doc.get("spec") or {}
        name = (doc.get("metadata") or {}).get("name", "")
        if kind == "TokenPool":
            s = (split or {}).get(name, 1)
            spec["endpoints"] = list(endpoints.get(name, spec.get("endpoints", [])))
            _scale_resources(spec.get("perReplica"), k, s)
            scaling = spec.setdefault("scaling", {})
            for key in ("minReplicas", "maxReplicas", "replicas"):
                if key in scaling:
                    scaling[key] = int(scaling[key]) * s
            if s > 1 and "minReplicas" not in scaling:
                scaling["minReplicas"] = s
            if "tokenBucketWindowSeconds" in spec or k != 1:
                spec["tokenBucketWindowSeconds"] = float(spec.get("tokenBucketWindowSeconds", 10.0)) * k
        elif kind == "TokenEntitlement":
            if drop_states:
                spec.pop("state", None)
            elif states and name in states:
                spec["state"] = states[name]
            _scale_resources(spec.get("resources"), k)
            _scale_resources(spec.get("burstCeiling"), k)
            qos = spec.get("qos") or {}
            if "sloTargetMs" in qos:
                qos["sloTargetMs"] = float(qos["sloTargetMs"]) * k
            if qos.get("queueTimeoutMs") is not None:  # a wait is experiment time too
                qos["queueTimeoutMs"] = round(int(qos["queueTimeoutMs"]) * k)
        elif kind == "TokenPoolsSettings":
            continue  # replaced below
        out.append(doc)
    if settings is not None:
        out.append({"apiVersion": "tokenpools.io/v1alpha1", "kind": "TokenPoolsSettings",
                    "metadata": {"name": "devstack"}, "spec": dict(settings)})
    return out


def scaled_settings(file_values: Mapping[str, Any], time_scale: float, *, kafka_bootstrap: str,
                    prometheus_url: str, spool_dir: Path, kubeconfig: Path | None = None,
                    namespace: str | None = None) -> dict[str, Any]:
    """The file's settings with the stack's addresses and every time setting (defaults included) × ``time_scale``."""
    effective = load_settings(dict(file_values)).model_dump(mode="json")
    values = copy.deepcopy(dict(file_values))
    for group, names in TIME_SETTINGS.items():
        for name in names:
            scaled = float(effective[group][name]) * time_scale
            values.setdefault(group, {})[name] = round(scaled) if name.endswith("_ms") else round(scaled, 6)
    values.setdefault("kafka", {})["bootstrap_servers"] = kafka_bootstrap
    values.setdefault("prometheus", {})["url"] = prometheus_url
    values.setdefault("proxy", {})["spool_dir"] = str(spool_dir)
    if kubeconfig is not None:
        values.setdefault("kubernetes", {})["kubeconfig"] = str(kubeconfig)
    if namespace is not None:
        values.setdefault("kubernetes", {})["namespace"] = namespace
    return values


def dump_documents(documents: Sequence[Mapping[str, Any]]) -> str:
    header = ("# Written by `tokenpools up` (tokenpools_dev.devstack.stack.config): "
              "the stack's view of the config file.\n")
    return header + yaml.safe_dump_all([dict(d) for d in documents], sort_keys=False)
