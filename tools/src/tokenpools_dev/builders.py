"""Test data, built one way for every tier: pools and entitlements as the core's specs and as the documents
(custom resources) a file, the API server or the specs topic holds; the proxies' decision and completion events.

Each builder gives the smallest valid object with the figures most tests share, and takes what a test varies as
arguments (anything else a spec or a document has passes through as a keyword). The specs:

- ``pool_spec``: a pool of one replica by default, ``per_replica`` the paper's 16-slot replica;
- ``entitlement_spec``: an entitlement of the pool ``"pool"`` with a 1 s SLO and the baseline given by
  ``slots``, ``tokens_per_s`` and ``kv_bytes`` (0 for classes without one).

The events, as a proxy sends them (``request_id`` and ``t_ms`` given; the rest of the record's fields as
keywords):

- ``decided``: a ``RequestDecided`` of entitlement ``"e"`` in pool ``"pool"`` at proxy ``"proxy-1"``, admitted by
  default (its reason the outcome's value), of 36 prompt tokens capped at 64, costing 100 tokens and 1000 KV bytes,
  at priority 1;
- ``completed``: the ``RequestCompleted`` that ends such a request without error 200 ms after its admission (or at
  0), its 100 reserved tokens used as 36 prompt and 20 completion tokens, no first token timed.

The documents, as the API server returns them (``metadata`` merged over the name):

- ``pool_doc``: a pool of ``slots`` per replica at 480 tokens/s and 8 GiB of KV, with Qwen3-8B's KV geometry (or
  ``kvBytesPerToken`` when ``kv_bytes_per_token`` is given);
- ``entitlement_doc``: an entitlement whose tenant is its own name, with ``slots`` slots at 30 tokens/s each and
  1 GiB of KV when its class has a baseline;
- ``config_text``: documents as one YAML config (the text a config file holds or ``load_config_text`` reads).

The specs topic's record, as the controllers publish a document:

- ``spec_record``: a ``SpecRecord`` of a kind and name, its spec (none by default) in the documents' camelCase
  form, at ``t_ms`` 1; a pool's record names the pool itself, an entitlement's the pool ``"pool"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import yaml

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.topics.records import CompletionStatus, RequestCompleted, RequestDecided, SpecRecord

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


def decided(request_id: str, t_ms: int, *, pool: str = "pool", entitlement: str | None = "e",
            proxy_id: str = "proxy-1", outcome: AdmissionOutcome = AdmissionOutcome.ADMITTED,
            reason: str | None = None, prompt_tokens_est: int = 36, max_tokens: int = 64, cost_tokens: int = 100,
            kv_bytes: int = 1000, priority: float = 1.0, **fields: Any) -> RequestDecided:
    """A ``RequestDecided``; ``reason`` defaults to the outcome's value."""
    return RequestDecided(request_id=request_id, pool=pool, entitlement=entitlement, proxy_id=proxy_id, t_ms=t_ms,
                          outcome=outcome, reason=outcome.value if reason is None else reason,
                          prompt_tokens_est=prompt_tokens_est, max_tokens=max_tokens, cost_tokens=cost_tokens,
                          kv_bytes=kv_bytes, priority=priority, **fields)


def completed(request_id: str, t_ms: int, *, pool: str = "pool", entitlement: str = "e", proxy_id: str = "proxy-1",
              admitted_t_ms: int | None = None, status: CompletionStatus = CompletionStatus.OK,
              prompt_tokens: int = 36, completion_tokens: int = 20, reserved_tokens: int = 100, kv_bytes: int = 1000,
              ttft_s: float | None = None, e2e_s: float = 0.2, **fields: Any) -> RequestCompleted:
    """A ``RequestCompleted``; ``admitted_t_ms`` defaults to 200 ms before ``t_ms`` (0 at the earliest)."""
    return RequestCompleted(request_id=request_id, pool=pool, entitlement=entitlement, proxy_id=proxy_id, t_ms=t_ms,
                            admitted_t_ms=max(0, t_ms - 200) if admitted_t_ms is None else admitted_t_ms,
                            status=status, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                            reserved_tokens=reserved_tokens, kv_bytes=kv_bytes, ttft_s=ttft_s, e2e_s=e2e_s, **fields)


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


def config_text(*documents: dict[str, Any]) -> str:
    """The documents as one multi-document YAML text, in the order given."""
    return yaml.safe_dump_all(documents, sort_keys=False)


def spec_record(kind: Literal["TokenPool", "TokenEntitlement"], name: str, spec: Mapping[str, Any] | None = None, *,
                pool: str | None = None, t_ms: int = 1, **fields: Any) -> SpecRecord:
    """A ``SpecRecord`` (state, deleted, generation, reason as keywords); ``pool`` defaults to the pool's own name,
    or ``"pool"`` for an entitlement."""
    if pool is None:
        pool = name if kind == "TokenPool" else "pool"
    return SpecRecord(kind=kind, name=name, pool=pool, spec=dict(spec or {}), t_ms=t_ms, **fields)
