"""What the pool-state algebra needs of the settings, in the units it computes in (integer milliseconds).

Built once by the composition root from ``Settings`` (``from_settings``); the pure modules never see pydantic.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenpools.core.limits import LimitConfig
from tokenpools.core.priority import PolicyConstants
from tokenpools.core.scaling import ScalingConfig


@dataclass(frozen=True, slots=True)
class StreamParams:
    width_ms: int = 5_000  # the usage window and the control tick
    grace_ms: int = 2_000  # an event may arrive this long after its window ended
    staleness_ms: int = 15_000  # a backend-metrics sample older than this is unknown
    heartbeat_ttl_ms: int = 30_000  # a proxy silent this long gets no share
    mean_slo_frozen: bool = True  # ℓ̄*: keep the first value (the paper's numbers) or recompute
    constants: PolicyConstants = field(default_factory=PolicyConstants)
    limit_config: LimitConfig = field(default_factory=LimitConfig)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    max_updates_per_tick: int = 12  # a catch-up computes every window but publishes only the newest this many
    counts_interval_ms: int = 100  # the fleet's counts go to the proxies this often
    proxy_shares: bool = False  # policy.fleet_enforcement = shares: each update carries every proxy's share
    demand_window_ms: int = 1_000  # a proxy with a request of an entitlement this recent is active for it
    shard_grace_ms: int = 10_000  # a sharded pool's decision stops waiting for a shard silent this long (wall clock)

    def __post_init__(self) -> None:
        if self.width_ms <= 0:
            raise ValueError(f"`width_ms` must be positive, got {self.width_ms}")
        if self.counts_interval_ms <= 0:
            raise ValueError(f"`counts_interval_ms` must be positive, got {self.counts_interval_ms}")
        for name in ("grace_ms", "staleness_ms", "heartbeat_ttl_ms", "demand_window_ms", "shard_grace_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"`{name}` must be >= 0, got {getattr(self, name)}")
        if self.max_updates_per_tick < 1:
            raise ValueError(f"`max_updates_per_tick` must be >= 1, got {self.max_updates_per_tick}")


def from_settings(settings: object) -> StreamParams:
    """``settings`` is a ``tokenpools.config.Settings`` (typed loosely so this module stays import-light)."""
    s = settings.streams  # type: ignore[attr-defined]
    policy = settings.policy  # type: ignore[attr-defined]
    return StreamParams(
        width_ms=round(s.tick_s * 1000),
        grace_ms=round(s.grace_s * 1000),
        staleness_ms=round(s.metrics_staleness_s * 1000),
        heartbeat_ttl_ms=round(s.proxy_heartbeat_ttl_s * 1000),
        counts_interval_ms=max(1, round(s.counts_interval_s * 1000)),
        demand_window_ms=round(s.demand_window_s * 1000),
        # a shard's worker silent for the session timeout is replaced; its successor restores and ticks within two
        shard_grace_ms=round(s.session_timeout_s * 1000) + 2 * round(s.tick_s * 1000),
        proxy_shares=policy.fleet_enforcement == "shares",
        mean_slo_frozen=policy.mean_slo == "frozen",
        constants=policy.to_constants(),
        limit_config=policy.to_limit_config(),
        scaling=settings.scaling.to_config(),  # type: ignore[attr-defined]
    )
