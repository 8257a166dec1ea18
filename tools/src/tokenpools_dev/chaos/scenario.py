"""What a chaos run sends, pure: the config (one simulated pool, a few tenants, one with a daily budget the load
exhausts) and the closed-loop clients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from tokenpools.config import hash_api_key
from tokenpools.replay.load import ClosedLoad, Lengths
from tokenpools_dev.devstack.stack.config import SimProfile
from tokenpools_dev.fleet_live.scenario import KV_GEOMETRY


@dataclass(frozen=True, slots=True)
class ChaosScenario:
    tenants: int = 3
    slots: int = 4  # each entitlement's concurrency
    clients: int = 6  # closed-loop clients per entitlement (more than its slots: the limit binds)
    pool_slots: int = 16
    prompt_tokens: int = 32
    output_tokens: int = 32
    think_s: float = 0.2
    budget_fraction: float = 0.3  # the budget, as a fraction of what its tenant's slots could spend in the run
    duration_s: float = 360.0  # experiment seconds of load
    model: str = "Qwen/Qwen3-8B"
    sim: SimProfile = SimProfile()

    def __post_init__(self) -> None:
        if self.tenants < 2 or self.slots < 1 or self.clients < 1:
            raise ValueError(f"need >= 2 tenants and >= 1 slot and client, got {self.tenants}, {self.slots}, "
                             f"{self.clients}")
        if self.tenants * self.slots > self.pool_slots:
            raise ValueError(f"{self.tenants} × {self.slots} slots exceed the pool's {self.pool_slots}")
        if not 0 < self.budget_fraction < 1:
            raise ValueError(f"`budget_fraction` must be in (0, 1), got {self.budget_fraction}")

    @property
    def names(self) -> list[str]:
        return [f"chaos-{chr(ord('a') + i)}" for i in range(self.tenants)]

    @property
    def budgeted(self) -> str:
        return self.names[0]

    @property
    def service_s(self) -> float:
        p = self.sim
        return p.ttft_s + (self.output_tokens - 1) * p.itl_s * p.factor_under_load  # a loaded pool: the slower end

    @property
    def budget_units(self) -> int:
        per_s = self.slots * (self.prompt_tokens + self.output_tokens) / self.service_s
        return int(self.budget_fraction * per_s * self.duration_s)


def api_key(name: str) -> str:
    return f"sk-{name}"


def keys(s: ChaosScenario) -> dict[str, str]:
    return {n: api_key(n) for n in s.names}


def limits(s: ChaosScenario) -> dict[str, int]:
    return {n: s.slots for n in s.names}


def documents(s: ChaosScenario) -> list[dict[str, Any]]:
    per_slot = round((s.prompt_tokens + s.output_tokens) / (s.sim.ttft_s + (s.output_tokens - 1) * s.sim.itl_s), 3)
    pool = {"apiVersion": "tokenpools.io/v1alpha1", "kind": "TokenPool", "metadata": {"name": "chaos"},
            "spec": {"model": s.model, "backendRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chaos"},
                     "scaling": {"minReplicas": 1, "maxReplicas": 1},
                     "perReplica": {"tokensPerSecond": round(per_slot * s.pool_slots, 3), "kvCacheGiB": 16,
                                    "concurrency": s.pool_slots},
                     "kvGeometry": dict(KV_GEOMETRY), "defaults": {"maxTokens": s.output_tokens},
                     "tokenBucketWindowSeconds": 10, "endpoints": ["http://127.0.0.1:8000"]}}
    out = [pool]
    for name in s.names:
        spec: dict[str, Any] = {
            "tenantId": name, "poolRef": {"name": "chaos"}, "qos": {"serviceClass": "guaranteed", "sloTargetMs": 5000},
            "resources": {"tokensPerSecond": round(per_slot * s.slots, 3),
                          "kvCacheGiB": round(16 * s.slots / s.pool_slots, 6), "concurrency": s.slots},
            "apiKeys": [{"sha256": hash_api_key(api_key(name))}]}
        if name == s.budgeted:
            spec["budgets"] = [{"name": "daily", "period": "day", "timeZone": "UTC", "amount": s.budget_units}]
        out.append({"apiVersion": "tokenpools.io/v1alpha1", "kind": "TokenEntitlement", "metadata": {"name": name},
                    "spec": spec})
    return out


def config_text(s: ChaosScenario) -> str:
    header = ["# Chaos run (tokenpools_dev.chaos.scenario). Demo API keys (clear text, for the load generator only):"]
    header += [f"#   {n}: {api_key(n)}" for n in s.names]
    return "\n".join(header) + "\n" + yaml.safe_dump_all(documents(s), sort_keys=False)


def clients(s: ChaosScenario) -> tuple[ClosedLoad, ...]:
    lengths_in, lengths_out = Lengths(s.prompt_tokens, s.prompt_tokens), Lengths(s.output_tokens, s.output_tokens)
    return tuple(ClosedLoad(n, s.clients, lengths_in, lengths_out, end_s=s.duration_s, max_tokens=s.output_tokens,
                            think_s=s.think_s, stagger_s=s.service_s / s.clients) for n in s.names)
