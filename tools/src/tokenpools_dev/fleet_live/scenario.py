"""The live fleet scenario: one pool, many small guaranteed entitlements, open-loop Poisson load, random balancing.

Everything here is a function of a :class:`FleetScenario` (its seed included), so the 1-proxy and the N-proxy runs
send the very same requests at the very same experiment times; only the proxy a request reaches differs (and with
one proxy there is one choice).

- **Config**: one pool of ``pool_slots`` slots on one simulator replica; ``entitlements`` guaranteed entitlements of
  ``slots`` each (``entitlements × slots`` of ``pool_slots`` promised), concurrency the binding dimension: each
  one's tokens/s is what its slots consume when busy at the simulator's unloaded speed, so a tenant at
  ``load`` of its slots stays well inside its token bucket on one proxy. Demo keys are listed in the header
  comment, as in the examples, for ``loadgen.keys``.
- **Load**: per entitlement, Poisson arrivals (``replay.load.poisson_arrivals``, seeded per entitlement) at
  ``load × slots`` erlangs, i.e. ``load × slots ÷ service_s`` requests per second, with ``service_s`` the time one
  request holds a slot on the simulator at the pool's expected occupancy (``SimProfile``'s latencies).
- **Balancer**: every request goes to a proxy drawn uniformly by ``replay.fleet.balancers.RandomBalancer`` from its
  own seeded generator, in schedule order, as a Kubernetes Service spreads connections.
- **Warm-up**: requests before ``warmup_s`` are sent (they fill the control loop's windows) but not counted.

Times are experiment seconds; the stack's ``time_scale`` compresses them when it runs.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from tokenpools.config import hash_api_key
from tokenpools.replay.fleet.balancers import RandomBalancer
from tokenpools.replay.load import Arrival, Lengths, LoadSpec, poisson_arrivals
from tokenpools_dev.devstack.stack.config import SimProfile

KV_GEOMETRY = {"layers": 36, "kvHeads": 8, "headDim": 128, "bytesPerElement": 2}  # Qwen3-8B in bf16, as examples/


@dataclass(frozen=True, slots=True)
class FleetScenario:
    """What one fleet run sends (experiment seconds); the same for every proxy count."""

    entitlements: int = 20
    slots: int = 2  # concurrency of each entitlement
    pool_slots: int = 64
    load: float = 0.6  # offered erlangs as a fraction of each entitlement's slots
    prompt_tokens: int = 32
    output_tokens: int = 32  # = max_tokens (the simulator ignores EOS: exactly this many)
    duration_s: float = 90.0  # of arrivals, warm-up included
    warmup_s: float = 15.0
    seed: int = 1
    pool_kv_gib: float = 32.0
    model: str = "Qwen/Qwen3-8B"
    sim: SimProfile = SimProfile()

    def __post_init__(self) -> None:
        if self.entitlements < 1 or self.slots < 1:
            raise ValueError(f"`entitlements` and `slots` must be >= 1, got {self.entitlements}, {self.slots}")
        if self.entitlements * self.slots > self.pool_slots:
            raise ValueError(f"{self.entitlements} × {self.slots} slots promised exceed the pool's {self.pool_slots}")
        if not 0 < self.load <= 1:
            raise ValueError(f"`load` must be in (0, 1], got {self.load}")
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(f"token lengths must be >= 1, got {self.prompt_tokens}, {self.output_tokens}")
        if not 0 <= self.warmup_s < self.duration_s:
            raise ValueError(f"`warmup_s` must be in [0, duration_s), got {self.warmup_s} of {self.duration_s}")

    @property
    def names(self) -> list[str]:
        width = len(str(self.entitlements - 1))
        return [f"fleet-{i:0{width}d}" for i in range(self.entitlements)]

    @property
    def pool_name(self) -> str:
        return "fleet"

    @property
    def measured_s(self) -> float:
        return self.duration_s - self.warmup_s


def api_key(name: str) -> str:
    return f"sk-{name}"


def service_s(scenario: FleetScenario, running: float) -> float:
    """Seconds one request holds a simulator slot with ``running`` sequences in flight: the simulator stretches TTFT
    and every inter-token gap by 1 + (factor − 1)(n − 1)/(max − 1)."""
    p, n_max = scenario.sim, scenario.pool_slots
    stretch = 1 + (p.factor_under_load - 1) * max(0.0, running - 1) / max(1, n_max - 1)
    return stretch * (p.ttft_s + (scenario.output_tokens - 1) * p.itl_s)


def expected_service_s(scenario: FleetScenario) -> float:
    """At the pool's expected occupancy: every entitlement at ``load`` of its slots."""
    return service_s(scenario, scenario.load * scenario.slots * scenario.entitlements)


def slot_tokens_per_s(scenario: FleetScenario) -> float:
    """Prompt + completion tokens/s one slot moves at the simulator's unloaded speed (the most it can consume)."""
    return (scenario.prompt_tokens + scenario.output_tokens) / service_s(scenario, 1)


def documents(scenario: FleetScenario) -> list[dict[str, Any]]:
    """The TokenPool and the TokenEntitlements (API keys as SHA-256 digests)."""
    s = scenario
    per_slot = round(slot_tokens_per_s(s), 3)
    pool = {
        "apiVersion": "tokenpools.io/v1alpha1", "kind": "TokenPool", "metadata": {"name": s.pool_name},
        "spec": {"model": s.model,
                 "backendRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"{s.pool_name}-vllm"},
                 "scaling": {"minReplicas": 1, "maxReplicas": 1},
                 "perReplica": {"tokensPerSecond": round(per_slot * s.pool_slots, 3), "kvCacheGiB": s.pool_kv_gib,
                                "concurrency": s.pool_slots},
                 "kvGeometry": dict(KV_GEOMETRY), "defaults": {"maxTokens": s.output_tokens},
                 "tokenBucketWindowSeconds": 10, "endpoints": ["http://127.0.0.1:8000"]},
    }
    out = [pool]
    for name in s.names:
        out.append({
            "apiVersion": "tokenpools.io/v1alpha1", "kind": "TokenEntitlement", "metadata": {"name": name},
            "spec": {"tenantId": name, "poolRef": {"name": s.pool_name},
                     "qos": {"serviceClass": "guaranteed", "sloTargetMs": 5000},
                     "resources": {"tokensPerSecond": round(per_slot * s.slots, 3),
                                   "kvCacheGiB": round(s.pool_kv_gib * s.slots / s.pool_slots, 6),
                                   "concurrency": s.slots},
                     "apiKeys": [{"sha256": hash_api_key(api_key(name))}]},
        })
    return out


def config_text(scenario: FleetScenario) -> str:
    """The config file ``tokenpools up`` reads, with the demo keys in its header comment."""
    header = [f"# Live fleet scenario (tokenpools_dev.fleet_live.scenario): {scenario.entitlements} guaranteed "
              f"entitlements of {scenario.slots} slots on a {scenario.pool_slots}-slot pool.",
              "# Demo API keys (clear text, for the load generator only; the file stores their SHA-256):"]
    header += [f"#   {name}: {api_key(name)}" for name in scenario.names]
    return "\n".join(header) + "\n" + yaml.safe_dump_all(documents(scenario), sort_keys=False)


def keys(scenario: FleetScenario) -> dict[str, str]:
    return {name: api_key(name) for name in scenario.names}


def rate_per_s(scenario: FleetScenario) -> float:
    """Requests/s of one entitlement: ``load × slots`` erlangs at the expected service time."""
    return scenario.load * scenario.slots / expected_service_s(scenario)


def schedule(scenario: FleetScenario) -> list[Arrival]:
    """Every request of the run, sorted by time then id (the same for any proxy count)."""
    s = scenario
    specs = [LoadSpec(name, rate_per_s(s), Lengths(s.prompt_tokens, s.prompt_tokens),
                      Lengths(s.output_tokens, s.output_tokens), max_tokens=s.output_tokens) for name in s.names]
    return poisson_arrivals(specs, s.duration_s, s.seed)


def routes(arrivals: Sequence[Arrival], proxies: int, seed: int) -> dict[str, int]:
    """request id → proxy index, drawn uniformly in schedule order from a generator seeded by ``seed``."""
    balancer = RandomBalancer(proxies, random.Random(f"{seed}:balancer"))
    return {a.request_id: balancer.pick(a.entitlement) for a in arrivals}


def measured(arrivals: Sequence[Arrival], scenario: FleetScenario) -> Mapping[str, Arrival]:
    """The requests that count: arrivals at or after the warm-up, by id."""
    return {a.request_id: a for a in arrivals if a.t_s >= scenario.warmup_s}
