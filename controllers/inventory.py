"""What the loops of one controller process share: the valid pools, their scale targets and protected floors.

The entitlements loop is the only writer (after every evaluation); the metrics loop reads which pools to query,
the scaler reads bounds, targets and floors. Plain data, replaced whole, no I/O: an object built by ``main`` and
passed to each loop (no module state).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass

from tokenpools.core.spec import PoolSpec


@dataclass(frozen=True, slots=True)
class ScaleTarget:
    """The workload whose ``/scale`` the scaler patches: a pool's ``backendRef`` with its namespace resolved."""

    api_version: str
    kind: str
    name: str
    namespace: str

    @property
    def group_version(self) -> tuple[str, str]:
        group, _, version = self.api_version.rpartition("/")
        return group, version

    def involved_object(self) -> dict[str, str]:
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "namespace": self.namespace}

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PoolEntry:
    spec: PoolSpec
    namespace: str
    target: ScaleTarget
    floor_replicas: int  # what the Bound baselines need at this moment


class Inventory:
    def __init__(self) -> None:
        self._pools: dict[str, PoolEntry] = {}
        self.ready = asyncio.Event()  # set after the first evaluation

    @property
    def pools(self) -> Mapping[str, PoolEntry]:
        return self._pools

    def get(self, pool: str) -> PoolEntry | None:
        return self._pools.get(pool)

    def replace(self, pools: Mapping[str, PoolEntry]) -> None:
        self._pools = dict(pools)
        self.ready.set()
