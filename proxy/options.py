"""What one proxy process needs to know, as frozen data built once by ``main`` (from the project's config file and
settings) or directly by tests. Nothing here reads files or the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tokenpools.core.limits import LimitConfig
from tokenpools.core.priority import PolicyConstants
from tokenpools.core.spec import EntitlementSpec, PoolSpec


@dataclass(frozen=True, slots=True)
class ProxyOptions:
    """Runtime knobs, each in the unit its name says."""

    proxy_id: str = "proxy-0"
    host: str = "127.0.0.1"
    port: int = 8080
    bootstrap_servers: str = "127.0.0.1:9092"
    topic_prefix: str = "tokenpools."
    limits_ttl_s: float = 30.0  # no limit update for this long → fall back to static limits
    max_body_bytes: int = 1 << 20  # larger request bodies get 413
    retry_after_s: int = 1  # Retry-After for refusals that have no better estimate
    event_queue_size: int = 10_000  # in-memory events before overflow goes straight to the spool
    spool_dir: Path = Path(".run/spool")
    heartbeat_interval_s: float = 2.0
    watchdog_interval_s: float = 1.0
    upstream_connect_timeout_s: float = 5.0
    upstream_read_timeout_s: float = 600.0  # between two reads from the backend
    producer_linger_ms: int = 5
    producer_request_timeout_ms: int = 30_000  # also the wait for a partition leader (settings: exactly once)
    event_batch_size: int = 500  # records per producer/spool batch
    shutdown_flush_s: float = 5.0
    kafka_enabled: bool = True
    watermark_interval_s: float = 0.1  # an idle (topic, pool) gets a watermark-only record this often

    def __post_init__(self) -> None:
        checks = {
            "limits_ttl_s": self.limits_ttl_s > 0,
            "max_body_bytes": self.max_body_bytes > 0,
            "retry_after_s": self.retry_after_s >= 1,
            "event_queue_size": self.event_queue_size >= 1,
            "heartbeat_interval_s": self.heartbeat_interval_s > 0,
            "watchdog_interval_s": self.watchdog_interval_s > 0,
            "event_batch_size": self.event_batch_size >= 1,
            "watermark_interval_s": self.watermark_interval_s > 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"`{name}` is out of range, got {getattr(self, name)}")
        if not self.proxy_id:
            raise ValueError("`proxy_id` must not be empty")


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """The pools this proxy fronts, their backends, the entitlements and the API key digests that map to them."""

    pools: dict[str, PoolSpec]
    endpoints: dict[str, tuple[str, ...]]  # pool → backend base URLs ("http://host:port", no /v1)
    entitlements: dict[str, EntitlementSpec]
    key_digests: dict[str, str]  # lowercase sha256 hex of an API key → entitlement name
    constants: PolicyConstants = field(default_factory=PolicyConstants)
    limit_config: LimitConfig = field(default_factory=LimitConfig)
    mean_slo_ms: dict[str, float] = field(default_factory=dict)  # pool → ℓ̄* for static priorities (else computed)

    def __post_init__(self) -> None:
        for name, pool in self.pools.items():
            if not self.endpoints.get(name):
                raise ValueError(f"pool {name}: no backend endpoint configured")
            if pool.name != name:
                raise ValueError(f"pool key {name!r} differs from its spec name {pool.name!r}")
        for name, spec in self.entitlements.items():
            if spec.pool not in self.pools:
                raise ValueError(f"entitlement {name}: pool {spec.pool!r} is not served by this proxy")
        for digest, name in self.key_digests.items():
            if name not in self.entitlements:
                raise ValueError(f"an API key maps to unknown entitlement {name!r}")
            if len(digest) != 64 or digest != digest.lower():
                raise ValueError("API key digests must be lowercase sha256 hex")
