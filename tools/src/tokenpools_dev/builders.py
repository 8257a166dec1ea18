"""Test data, built one way for every tier: pools and entitlements as the core's specs and as the documents
(custom resources) a file, the API server or the specs topic holds.

Each builder gives the smallest valid object with the figures most tests share, and takes what a test varies as
arguments (anything else a spec or a document has passes through as a keyword). The specs:

- ``pool_spec``: a pool of one replica by default, ``per_replica`` the paper's 16-slot replica;
- ``entitlement_spec``: an entitlement of the pool ``"pool"`` with a 1 s SLO and the baseline given by
  ``slots``, ``tokens_per_s`` and ``kv_bytes`` (0 for classes without one).

The documents, as the API server returns them (``metadata`` merged over the name):

- ``pool_doc``: a pool of ``slots`` per replica at 480 tokens/s and 8 GiB of KV, with Qwen3-8B's KV geometry (or
  ``kvBytesPerToken`` when ``kv_bytes_per_token`` is given);
- ``entitlement_doc``: an entitlement whose tenant is its own name, with ``slots`` slots at 30 tokens/s each and
  1 GiB of KV when its class has a baseline.
"""

from __future__ import annotations

from typing import Any

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec

API_VERSION = "tokenpools.io/v1alpha1"
PAPER_REPLICA = Capacity(240.0, 16e9, 16.0)  # one replica of the paper's pool: 16 slots, ~240 tokens/s
QWEN3_8B_KV_GEOMETRY = {"layers": 36, "kvHeads": 8, "headDim": 128, "bytesPerElement": 2}  # 147,456 bytes a token
_WITH_BASELINE = ("guaranteed", "elastic", "dedicated")


def pool_spec(name: str = "pool", per_replica: Capacity = PAPER_REPLICA, *, model: str = "Qwen/Qwen3-8B",
              min_replicas: int = 1, max_replicas: int = 1, replicas: int | None = None, **spec: Any) -> PoolSpec:
    """A ``PoolSpec``; ``replicas`` defaults to ``min_replicas``."""
    return PoolSpec(name, model, per_replica, min_replicas=min_replicas, max_replicas=max_replicas,
                    replicas=min_replicas if replicas is None else replicas, **spec)


def entitlement_spec(name: str, service_class: ServiceClass = ServiceClass.ELASTIC, slots: float = 0.0,
                     tokens_per_s: float = 0.0, kv_bytes: float = 0.0, *, pool: str = "pool", slo_ms: float = 1000.0,
                     **spec: Any) -> EntitlementSpec:
    """An ``EntitlementSpec`` of ``pool`` whose baseline is (``tokens_per_s``, ``kv_bytes``, ``slots``)."""
    return EntitlementSpec(name=name, pool=pool, service_class=service_class, slo_ms=slo_ms,
                           baseline=Capacity(tokens_per_s, kv_bytes, slots), **spec)


def pool_doc(name: str = "pool", *, slots: int = 16, min_replicas: int = 1, max_replicas: int = 1, model: str = "m",
             backend: dict[str, str] | None = None, kv_bytes_per_token: int | None = None,
             metadata: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """A TokenPool document; ``backend`` is its ``backendRef`` (default: the Service ``NAME-backend``)."""
    kv = ({"kvGeometry": dict(QWEN3_8B_KV_GEOMETRY)} if kv_bytes_per_token is None
          else {"kvBytesPerToken": kv_bytes_per_token})
    body: dict[str, Any] = {
        "model": model, "backendRef": backend or {"name": f"{name}-backend"},
        "scaling": {"minReplicas": min_replicas, "maxReplicas": max_replicas},
        "perReplica": {"tokensPerSecond": 480, "kvCacheGiB": 8, "concurrency": slots},
        **kv,
    }
    body.update(spec)
    return {"apiVersion": API_VERSION, "kind": "TokenPool", "metadata": {"name": name, **(metadata or {})},
            "spec": body}


def entitlement_doc(name: str, pool: str = "pool", *, slots: int = 6, service_class: str = "guaranteed",
                    slo_ms: int = 1000, metadata: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """A TokenEntitlement document of tenant ``name`` in ``pool``; ``spec`` items replace the built ones (e.g.
    ``apiKeys``, ``resources``, ``tenantId``)."""
    body: dict[str, Any] = {"tenantId": name, "poolRef": {"name": pool},
                            "qos": {"serviceClass": service_class, "sloTargetMs": slo_ms}}
    if service_class in _WITH_BASELINE:
        body["resources"] = {"tokensPerSecond": 30 * slots, "kvCacheGiB": 1, "concurrency": slots}
    body.update(spec)
    return {"apiVersion": API_VERSION, "kind": "TokenEntitlement", "metadata": {"name": name, **(metadata or {})},
            "spec": body}
