"""What one proxy process needs to know, as frozen data built once by ``main`` (from the project's config file and
settings) or directly by tests. Nothing here reads files or the environment; the knobs themselves are the ``proxy``
settings group (``tokenpools.config``), never re-declared here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tokenpools.config import ProxySettings, Settings
from tokenpools.core.limits import LimitConfig
from tokenpools.core.priority import PolicyConstants
from tokenpools.core.reservation import ReservationConfig
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.waiting import QueueConfig
from tokenpools.proxy.admission.pools import FleetOptions

if TYPE_CHECKING:
    from tokenpools.config import BudgetsSettings


@dataclass(frozen=True, slots=True)
class ProxyOptions:
    """One proxy's knobs: its ``proxy`` settings group (each knob, its unit, its default and its check live there)
    plus what only start-up resolves. Nothing here has a default of its own."""

    settings: ProxySettings
    proxy_id: str  # this replica's id, resolved at start-up (flag, proxy.proxy_id, else <hostname>-<pid>)
    topic_prefix: str  # kafka.topic_prefix: spooled events name their topics even while Kafka is off
    fleet: FleetOptions  # policy.fleet_enforcement, proxy.counts_ttl_s and growth_fraction, streams.demand_window_s
    queue: QueueConfig  # policy.queue_*: who may wait for admission and how long (the room is proxy.max_waiters)
    budgets: BudgetsSettings  # the `budgets` group: the refusal's longest Retry-After (docs/budgets.md#enforcement)

    def __post_init__(self) -> None:
        if not self.proxy_id:
            raise ValueError("`proxy_id` must not be empty")

    @classmethod
    def from_settings(cls, settings: Settings, proxy_id: str, **flags: Any) -> ProxyOptions:
        """``flags`` (``host``, ``port``, ``kafka_enabled``; None: not given) win over the settings of the same
        names and are checked like them (a ValueError names the field)."""
        given = {name: value for name, value in flags.items() if value is not None}
        group = ProxySettings.model_validate({**settings.proxy.model_dump(), **given, "proxy_id": proxy_id})
        return cls(group, proxy_id, settings.kafka.topic_prefix, FleetOptions.from_settings(settings, group),
                   settings.policy.to_queue_config(), settings.budgets)


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """The pools this proxy fronts, their backends, the entitlements and the API key digests that map to them."""

    pools: dict[str, PoolSpec]
    endpoints: dict[str, tuple[str, ...]]  # pool → backend base URLs ("http://host:port", no /v1)
    entitlements: dict[str, EntitlementSpec]
    key_digests: Mapping[str, str | tuple[str, ...]]  # sha256 hex of an API key → its entitlement(s), one per pool
    constants: PolicyConstants = field(default_factory=PolicyConstants)
    limit_config: LimitConfig = field(default_factory=LimitConfig)
    reservation: ReservationConfig = field(default_factory=ReservationConfig)  # output estimate (policy.reservation_*)
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
        for digest, names in self.key_digests.items():
            for name in (names,) if isinstance(names, str) else names:
                if name not in self.entitlements:
                    raise ValueError(f"an API key maps to unknown entitlement {name!r}")
            if len(digest) != 64 or digest != digest.lower():
                raise ValueError("API key digests must be lowercase sha256 hex")
