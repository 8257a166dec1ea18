"""One pool at one proxy: the core's admission controller plus the limits in force and where they came from.

Rules (docs/semantics.md#fail-static):
- start on *static* limits (``core.tick.static_limits``: the policy run with no measurement) — never unlimited;
- a limit update is applied only if its version is greater than the one in force for the pool; a replayed or
  stale one is ignored (and counted);
- an update older than the TTL when it arrives (by its ``t_ms``) is not applied: after a restart the proxy does
  not revive limits the agents stopped renewing;
- if no update has been applied for ``ttl_s`` (local monotonic time), fall back to static limits. With several
  proxies the static limits are split across the replicas the last update named (equal shares), so a fleet in
  fallback still enforces the pool's limits, not ``limits × replicas``.
Time is always an argument; the shell supplies it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

from tokenpools.core.admission import AdmissionController, EntitlementLimits
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState
from tokenpools.core.limits import LimitConfig, split_across_proxies
from tokenpools.core.priority import PolicyConstants, mean_slo_ms
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.tick import static_limits, static_priorities
from tokenpools.topics.limits import limits_for_proxy
from tokenpools.topics.records import LimitUpdate


class UpdateResult(StrEnum):
    APPLIED = "applied"
    STALE = "stale"  # version not newer than the one in force
    EXPIRED = "expired"  # older than the TTL on arrival
    NOT_FOR_ME = "not_for_me"  # shares that do not include this proxy
    UNKNOWN_POOL = "unknown_pool"


class LimitsSource(StrEnum):
    STATIC = "static"
    UPDATE = "update"


@dataclass(frozen=True, slots=True)
class InForce:
    source: LimitsSource
    version: int | None  # the newest version applied so far (kept through a fallback)
    applied_s: float  # local monotonic time the current limits were put in force
    update_t_ms: int | None  # tick time of the last applied update


_ZERO = EntitlementLimits(0, 0.0, 0.0, 0.0)


class PoolRuntime:
    """Admission state and limits of one pool. Not thread-safe; lives on the event loop."""

    def __init__(self, pool: PoolSpec, entitlements: list[EntitlementSpec], *, proxy_id: str, ttl_s: float,
                 retry_after_s: int, now_s: float, wall_s: float, constants: PolicyConstants = PolicyConstants(),
                 limit_config: LimitConfig = LimitConfig(), mean_slo: float | None = None) -> None:
        self.pool = pool
        self.proxy_id = proxy_id
        self.ttl_s = ttl_s
        self.constants = constants
        self.limit_config = limit_config
        self.entitlements = {e.name: _local_expiry(e, now_s, wall_s) for e in entitlements if e.pool == pool.name}
        self.bound = [e for e in self.entitlements.values() if e.state is EntitlementState.BOUND]
        self.mean_slo_ms = mean_slo if mean_slo else (mean_slo_ms(e.slo_ms for e in self.bound) if self.bound else 1.0)
        self.controller = AdmissionController(
            pool_concurrency=int(pool.capacity().concurrency),
            kv_bytes_per_token=pool.kv_bytes_per_token,
            default_max_tokens=pool.default_max_tokens,
            token_bucket_window_s=pool.token_bucket_window_s,
            retry_after_s=retry_after_s,
        )
        self.last_proxies: tuple[str, ...] = ()
        self.in_force = InForce(LimitsSource.STATIC, None, now_s, None)
        static, concurrency = self.static_limits()
        for spec in self.entitlements.values():
            self.controller.upsert_entitlement(spec, static.get(spec.name, _ZERO), now_s)
        self.controller.set_pool(concurrency, 0)

    # ---- static (fail-static) limits ------------------------------------------------------------------------
    def static_limits(self) -> tuple[dict[str, EntitlementLimits], int]:
        """Static limits for the Bound entitlements and the pool concurrency, this proxy's share of them."""
        if not self.bound:
            return {}, int(self.pool.capacity().concurrency)
        caps = static_limits(self.pool, self.bound, self.mean_slo_ms, self.constants, self.limit_config)
        priorities = static_priorities(self.bound, self.mean_slo_ms, self.constants)
        pool_cap = self.pool.capacity()
        if len(self.last_proxies) > 1 and self.proxy_id in self.last_proxies:
            equal = {p: 1.0 for p in self.last_proxies}
            caps = {name: split_across_proxies(c, equal, 1.0)[self.proxy_id] for name, c in caps.items()}
            pool_cap = split_across_proxies(pool_cap, equal, 1.0)[self.proxy_id]
        limits = {name: _limits(c, priorities[name]) for name, c in caps.items()}
        return limits, max(1, int(pool_cap.concurrency))

    def fall_back(self, now_s: float) -> None:
        limits, concurrency = self.static_limits()
        for name in self.entitlements:
            self.controller.set_limits(name, limits.get(name, _ZERO), now_s)
        self.controller.set_pool(concurrency, 0)
        self.in_force = dataclasses.replace(self.in_force, source=LimitsSource.STATIC, applied_s=now_s)

    def check_ttl(self, now_s: float) -> bool:
        """Fall back to static limits if the update in force is older than the TTL. True when it just did."""
        if self.in_force.source is LimitsSource.UPDATE and now_s - self.in_force.applied_s > self.ttl_s:
            self.fall_back(now_s)
            return True
        return False

    # ---- limit updates ----------------------------------------------------------------------------------------
    def apply_update(self, update: LimitUpdate, now_s: float, wall_ms: int) -> UpdateResult:
        if update.pool != self.pool.name:
            return UpdateResult.UNKNOWN_POOL
        if self.in_force.version is not None and update.version <= self.in_force.version:
            return UpdateResult.STALE
        if wall_ms - update.t_ms > self.ttl_s * 1000:
            return UpdateResult.EXPIRED
        mine = limits_for_proxy(update, self.proxy_id)
        if mine is None:
            return UpdateResult.NOT_FOR_ME
        limits, pool_concurrency = mine
        static, _ = self.static_limits() if any(n not in limits for n in self.entitlements) else ({}, 0)
        for name, spec in self.entitlements.items():
            if spec.state is not EntitlementState.BOUND:
                continue
            self.controller.set_limits(name, limits.get(name) or static.get(name, _ZERO), now_s)
        self.controller.set_pool(pool_concurrency, int(update.backend_waiting))
        self.last_proxies = tuple(p.proxy_id for p in update.proxies)
        if update.mean_slo_ms > 0:
            self.mean_slo_ms = update.mean_slo_ms
        self.in_force = InForce(LimitsSource.UPDATE, update.version, now_s, update.t_ms)
        return UpdateResult.APPLIED

    def limits_age_s(self, now_s: float) -> float:
        return max(0.0, now_s - self.in_force.applied_s)


def _limits(c: Capacity, priority: float) -> EntitlementLimits:
    return EntitlementLimits(int(c.concurrency + 1e-9), c.tokens_per_s, c.kv_bytes, priority)


def _local_expiry(spec: EntitlementSpec, now_s: float, wall_s: float) -> EntitlementSpec:
    """The core compares ``expires_at_s`` with the ``now_s`` it is given; the proxy's ``now_s`` is monotonic, so
    the epoch expiry is moved into that time base once, here."""
    if spec.expires_at_s is None:
        return spec
    return dataclasses.replace(spec, expires_at_s=spec.expires_at_s - wall_s + now_s)
