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

Fleet counts (docs/fleet.md): while the agents' counts records (``topics.counts``) arrive, the proxy enforces, per
entitlement and for the pool, its own in flight at the counts instant plus a bounded growth, and lowers its token
bucket to what the fleet's bucket leaves it (``core.fleet``, with what ``OwnLedger`` knows of itself). A limit
update then sets the fleet-wide limits the counts divide. Counts that are older than ``counts_ttl_s`` on arrival,
that name a limit update this proxy does not hold, or that stop coming for ``counts_ttl_s`` are not followed: the
per-proxy shares of the last update are (then static limits after ``ttl_s``, as above). A sharded pool's counts
come as one record per shard (docs/scaling.md#the-two-stage-topology): the proxy follows them once it holds a fresh
record of every shard, each entitlement's row from the shard that owns it, the pool's in flight summed and its
active proxies counted once each over the shards' ids; one shard whose record is older than ``counts_ttl_s`` stops
the following as a single record's does.

Waiting (docs/queueing.md): ``queue``, the pool's ``AdmissionQueue`` over its controller, is where a request refused
for a moment may wait; the proxy's asyncio shell (``waiting.py``) drains it after every release and limit change.
Time is always an argument; the shell supplies it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any
from enum import StrEnum

from tokenpools.core.admission import AdmissionController, EntitlementLimits
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState
from tokenpools.core.fleet import bucket_level, slot_share, token_budget
from tokenpools.core.limits import LimitConfig, split_across_proxies, yielding
from tokenpools.core.priority import PolicyConstants, mean_slo_ms
from tokenpools.core.reservation import OutputEstimator, ReservationConfig
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.tick import static_limits, static_priorities
from tokenpools.core.waiting import AdmissionQueue, QueueConfig, WaitRoom
from tokenpools.proxy.admission.own_ledger import OwnAt, OwnLedger
from tokenpools.topics.counts import CountsRecord, owned, pool_active_of
from tokenpools.topics.limits import limits_for_proxy
from tokenpools.topics.records import LimitUpdate


class UpdateResult(StrEnum):
    APPLIED = "applied"
    STALE = "stale"  # version not newer than the one in force
    EXPIRED = "expired"  # older than the TTL on arrival
    NOT_FOR_ME = "not_for_me"  # shares that do not include this proxy
    UNKNOWN_POOL = "unknown_pool"
    UNKNOWN_VERSION = "unknown_version"  # counts in the order of a limit update this proxy does not hold
    INCOMPLETE = "incomplete"  # a page of a limit update whose other pages have not all arrived yet


@dataclass(frozen=True, slots=True)
class FleetOptions:
    """How a proxy divides the limits with the other replicas (``policy.fleet_enforcement``, the ``proxy`` group's
    ``counts_ttl_s`` and ``growth_fraction``, the ``streams`` group's ``demand_window_s``)."""

    follow_counts: bool = True  # False: the strict mode, the shares of each limit update
    counts_ttl_s: float = 2.0
    growth_fraction: float = 2.0
    demand_window_ms: int = 1_000

    def __post_init__(self) -> None:
        if self.counts_ttl_s <= 0 or self.growth_fraction < 1 or self.demand_window_ms < 0:
            raise ValueError(f"fleet options out of range: {self}")

    @classmethod
    def from_settings(cls, settings: Any, proxy: Any) -> FleetOptions:
        """``settings``: a ``Settings``; ``proxy``: its (possibly overridden) ``proxy`` group."""
        return cls(settings.policy.fleet_enforcement == "counts", proxy.counts_ttl_s, proxy.growth_fraction,
                   round(settings.streams.demand_window_s * 1000))


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
                 limit_config: LimitConfig = LimitConfig(), mean_slo: float | None = None,
                 fleet: FleetOptions = FleetOptions(), reservation: ReservationConfig = ReservationConfig(),
                 queue: QueueConfig = QueueConfig(), room: WaitRoom | None = None) -> None:
        self.pool = pool
        self.proxy_id = proxy_id
        self.ttl_s = ttl_s
        self.constants = constants
        self.limit_config = limit_config
        self.entitlements = {e.name: _local_expiry(e, now_s, wall_s) for e in entitlements if e.pool == pool.name}
        self.bound = [e for e in self.entitlements.values() if e.state is EntitlementState.BOUND]
        self._mean_slo_given = mean_slo
        self.mean_slo_ms = mean_slo if mean_slo else (mean_slo_ms(e.slo_ms for e in self.bound) if self.bound else 1.0)
        self.controller = AdmissionController(
            pool_concurrency=int(pool.capacity().concurrency),
            kv_bytes_per_token=pool.kv_bytes_per_token,
            default_max_tokens=pool.default_max_tokens,
            token_bucket_window_s=pool.token_bucket_window_s,
            retry_after_s=retry_after_s,
            estimator=OutputEstimator(reservation),
            enforcement=pool.enforcement,
        )
        self.fleet = fleet
        self.fleet_size = 1
        self.last_proxies: tuple[str, ...] = ()
        self.in_force = InForce(LimitsSource.STATIC, None, now_s, None)
        self.own = OwnLedger(fleet.demand_window_ms, round(fleet.counts_ttl_s * 1000))
        self._fleet_limits: dict[str, EntitlementLimits] = {}  # the last update's fleet-wide limits
        self.signals: dict[str, tuple[float, float]] = {}  # the last update's (debt, burst) per entitlement
        self._orders: dict[int, tuple[str, ...]] = {}  # limit update version → its entitlements' order (recent ones)
        self._shares: tuple[dict[str, EntitlementLimits], int] | None = None  # the last update's share for me
        self.counts: CountsRecord | None = None  # the counts followed (a sharded pool's: its newest shard's), if any
        self._shard_counts: dict[int, tuple[CountsRecord, float]] = {}  # shard → its newest record, when taken
        self.fleet_size = 1  # the live proxies of the pool in the last counts followed
        self.counts_applied_s: float | None = None
        static, concurrency = self.static_limits()
        for spec in self.entitlements.values():
            self.controller.upsert_entitlement(spec, static.get(spec.name, _ZERO), now_s)
        self.controller.set_pool(concurrency, 0)
        self._pool_capacity = int(pool.capacity().concurrency)
        self._backend_waiting = 0
        # ``room``: the proxy's one WaitRoom, shared by all its pools. A proxy with no room never waits, so no
        # entitlement is given a timeout (a refusal is then just a refusal, not a full queue).
        self.queue = AdmissionQueue(self.controller, queue, room if room is not None else WaitRoom())
        if self.queue.room.capacity > 0:
            for spec in self.entitlements.values():
                self.queue.set_spec(spec)

    # ---- live specs (docs/tenancy.md) -----------------------------------------------------------------------------
    def replace_specs(self, pool: PoolSpec, entitlements: list[EntitlementSpec], now_s: float,
                      wall_s: float) -> list[str]:
        """Put the pool's spec and its entitlements in force now, from the next decision on.

        A new entitlement starts on the limits a new one gets (the last update's share if it names it, else static);
        a changed one keeps its in-flight requests, bucket and limits, its new spec (class, state, expiry) deciding
        from now; the pool's limits are recomputed the way they were made (static, or the last update's shares and
        counts). A removed entitlement is not forgotten yet: it is marked Pending so that its waiters are refused at
        the next drain, and returned; ``forget`` it after that drain (``live_specs``). Its requests in flight
        settle into its detached ledger (``AdmissionController.release``)."""
        if pool.name != self.pool.name:
            raise ValueError(f"pool {self.pool.name}: cannot take the spec of pool {pool.name}")
        self._set_pool(pool)
        new = {e.name: _local_expiry(e, now_s, wall_s) for e in entitlements if e.pool == pool.name}
        removed = [name for name in self.entitlements if name not in new]
        controller = self.controller
        for name in removed:
            spec = dataclasses.replace(self.entitlements[name], state=EntitlementState.PENDING)
            controller.upsert_entitlement(spec, controller.limits_of(name), now_s)
        self.entitlements = new
        self.bound = [e for e in new.values() if e.state is EntitlementState.BOUND]
        if not self._mean_slo_given and self.in_force.source is LimitsSource.STATIC:
            self.mean_slo_ms = mean_slo_ms(e.slo_ms for e in self.bound) if self.bound else 1.0
        static, concurrency = self.static_limits()
        known = set(controller.entitlement_names())
        for name, spec in new.items():
            limits = controller.limits_of(name) if name in known else static.get(name, _ZERO)
            controller.upsert_entitlement(spec, limits, now_s)
            if self.queue.room.capacity > 0:
                self.queue.set_spec(spec)
        if self.in_force.source is LimitsSource.STATIC:
            for name in new:
                controller.set_limits(name, static.get(name, _ZERO), now_s)
            controller.set_pool(concurrency, 0)
        elif self._shares is not None:
            self._apply_shares(self._shares, now_s)
            if self.counts is not None:
                self._follow_shards(now_s)
        return removed

    def forget(self, names: list[str]) -> None:
        """Drop removed entitlements' admission state (after their waiters were refused); in flight still settles."""
        for name in names:
            if name not in self.entitlements:
                self.controller.remove_entitlement(name)

    def _set_pool(self, pool: PoolSpec) -> None:
        if pool == self.pool:
            return
        self.pool = pool
        controller = self.controller
        controller.kv_bytes_per_token = pool.kv_bytes_per_token
        controller.default_max_tokens = pool.default_max_tokens
        controller.token_bucket_window_s = pool.token_bucket_window_s
        controller.enforcement = pool.enforcement  # shadow ↔ enforce: from the next decision on (docs/shadow.md)
        if self.in_force.source is LimitsSource.STATIC:
            self._pool_capacity = int(pool.capacity().concurrency)

    # ---- static (fail-static) limits ------------------------------------------------------------------------
    def static_limits(self) -> tuple[dict[str, EntitlementLimits], int]:
        """Static limits for the Bound entitlements and the pool concurrency, this proxy's share of them."""
        if not self.bound:
            return {}, int(self.pool.capacity().concurrency)
        caps = static_limits(self.pool, self.bound, self.mean_slo_ms, self.constants, self.limit_config)
        priorities = static_priorities(self.bound, self.mean_slo_ms, self.constants)
        pool_cap = self.pool.capacity()
        if len(self.last_proxies) > 1 and self.proxy_id in self.last_proxies:  # my part of an exact split
            equal = {p: 1.0 for p in self.last_proxies}
            caps = {name: split_across_proxies(c, equal, 1.0)[self.proxy_id] for name, c in caps.items()}
            pool_cap = split_across_proxies(pool_cap, equal, 1.0)[self.proxy_id]
        elif self.fleet_size > 1:  # replicas known only by number (counts): an equal part, rounded up
            caps = {name: _equal_part(c, self.fleet_size) for name, c in caps.items()}
            pool_cap = _equal_part(pool_cap, self.fleet_size)
        limits = {name: _limits(c, priorities[name]) for name, c in caps.items()}
        return limits, max(1, int(pool_cap.concurrency))


    def fall_back(self, now_s: float) -> None:
        self.counts = self.counts_applied_s = None
        self._shard_counts.clear()
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
        yielded = yielding([spec for e in update.entitlements if (spec := self.entitlements.get(e.name)) is not None],
                           {e.name: Capacity(e.tokens_per_s, e.kv_bytes, float(e.concurrency))
                            for e in update.entitlements},
                           {e.name: e.priority for e in update.entitlements}, update.contended)
        self._fleet_limits = {e.name: EntitlementLimits(e.concurrency, e.tokens_per_s, e.kv_bytes, e.priority,
                                                        e.name in yielded)
                              for e in update.entitlements}
        if yielded:  # the share this proxy enforces carries the fleet's mark (docs/semantics.md#elastic-shares)
            mine = ({name: dataclasses.replace(lim, yields=True) if name in yielded else lim for name, lim in mine[0].items()},
                    mine[1])
        self.signals = {e.name: (e.debt, e.burst) for e in update.entitlements}
        self._orders[update.version] = tuple(e.name for e in update.entitlements)
        for old in sorted(self._orders)[:-4]:
            del self._orders[old]
        self._pool_capacity = update.capacity_concurrency
        self._backend_waiting = int(update.backend_waiting)
        self._shares = mine
        self.last_proxies = tuple(p.proxy_id for p in update.proxies)
        if update.mean_slo_ms > 0:
            self.mean_slo_ms = update.mean_slo_ms
        self.in_force = InForce(LimitsSource.UPDATE, update.version, now_s, update.t_ms)
        if self.counts is None or not self._follow_shards(now_s, wall_ms):
            self._apply_shares(mine, now_s)
        return UpdateResult.APPLIED

    def _apply_shares(self, mine: tuple[dict[str, EntitlementLimits], int], now_s: float) -> None:
        """The last update's share for this proxy; an update without shares (counts) is divided equally among the
        replicas the last counts named, until counts are followed again."""
        limits, pool_concurrency = mine
        if not self.last_proxies and self.fleet_size > 1:
            n = self.fleet_size
            limits = {name: _equal_limits(lim, n) for name, lim in limits.items()}
            pool_concurrency = max(1, int(_equal_part(Capacity(1.0, 1.0, float(pool_concurrency)), n).concurrency))
        static, _ = self.static_limits() if any(n not in limits for n in self.entitlements) else ({}, 0)
        for name, spec in self.entitlements.items():
            if spec.state is not EntitlementState.BOUND:
                continue
            self.controller.set_limits(name, limits.get(name) or static.get(name, _ZERO), now_s)
        self.controller.set_pool(pool_concurrency, self._backend_waiting)

    # ---- fleet counts -----------------------------------------------------------------------------------------
    def apply_counts(self, record: CountsRecord, now_s: float, wall_ms: int) -> UpdateResult:
        """Follow the fleet's counts of ``record`` (docs/fleet.md) if they are newer, fresh and in a known order.

        A sharded pool's record is its shard's: taken (APPLIED) and followed, with the other shards' latest, once
        every shard has a fresh one; newer and fresh are judged per shard."""
        if record.pool != self.pool.name:
            return UpdateResult.UNKNOWN_POOL
        held = self._shard_counts.get(record.shard)
        if held is not None and record.t_ms <= held[0].t_ms:
            return UpdateResult.STALE
        if wall_ms - record.t_ms > self.fleet.counts_ttl_s * 1000:
            return UpdateResult.EXPIRED
        names = self._orders.get(record.limits_version)
        if (self.in_force.source is not LimitsSource.UPDATE or names is None or record.shards != self.pool.shards
                or len(owned(names, record.shard, record.shards)) != len(record.in_flight)):
            return UpdateResult.UNKNOWN_VERSION  # (another sharding's arrays: an order this proxy does not hold)
        self._shard_counts[record.shard] = (record, now_s)
        shards = self._current(now_s)
        if shards is None:
            return UpdateResult.APPLIED  # waiting for the other shards' records
        self._follow(shards, now_s, wall_ms)
        self.counts, self.fleet_size = record, max(r.proxies for r in shards)
        self.counts_applied_s = min(self._shard_counts[r.shard][1] for r in shards)
        return UpdateResult.APPLIED

    def _current(self, now_s: float) -> list[CountsRecord] | None:
        """The latest record of every shard of the pool, by shard, when each was taken within ``counts_ttl_s``."""
        shards = self.pool.shards
        out = []
        for k in range(shards):
            held = self._shard_counts.get(k)
            if held is None or held[0].shards != shards or now_s - held[1] > self.fleet.counts_ttl_s:
                return None
            out.append(held[0])
        return out

    def _follow_shards(self, now_s: float, wall_ms: int | None = None) -> bool:
        shards = self._current(now_s)
        return shards is not None and self._follow(shards, now_s, wall_ms)

    def _follow(self, records: list[CountsRecord], now_s: float, wall_ms: int | None = None) -> bool:
        """Set every Bound entitlement's limits and bucket, and the pool's concurrency, from ``records``: one per
        shard, by shard (one for a pool of one shard). An entitlement's row is in the record of the shard that owns
        it (``topics.counts.owned``), read with what this proxy knew of itself at that record's instant; the pool's
        row is read at the oldest instant of them: its in flight the sum of the shards' subtotals, its active
        proxies the distinct ids over the shards' records (``topics.counts.pool_active_of``)."""
        if self.in_force.source is not LimitsSource.UPDATE:
            return False
        rows = []
        for record in records:
            names = self._orders.get(record.limits_version)
            if names is None:
                return False
            mine = owned(names, record.shard, record.shards)
            if len(mine) != len(record.in_flight):
                return False  # not the arrays of this order (another sharding): not followed
            rows.append((record, mine))
        f, proxies = self.fleet.growth_fraction, max(r.proxies for r in records)
        largest = float(max(self.own.largest_reservation_tokens, self.pool.default_max_tokens))
        controller = self.controller
        at: dict[int, OwnAt] = {}  # one look at the ledger per instant (the shards' instants are mostly one)
        for record, names in rows:
            own = at.get(record.t_ms) or at.setdefault(record.t_ms, self.own.at(record.t_ms))
            since_s = max(0.0, ((wall_ms if wall_ms is not None else record.t_ms) - record.t_ms) / 1000)
            for i, name in enumerate(names):
                spec = self.entitlements.get(name)
                fleet = self._fleet_limits.get(name)
                if spec is None or fleet is None or spec.state is not EntitlementState.BOUND:
                    continue
                was_active = name in own.active
                slots = slot_share(fleet.concurrency, record.in_flight[i], own.in_flight.get(name, 0),
                                   record.active[i], proxies, was_active, f)
                kv = fleet.kv_bytes * slots / fleet.concurrency if fleet.concurrency > 0 else fleet.kv_bytes
                limits = EntitlementLimits(slots, fleet.tokens_per_s, kv, fleet.priority, fleet.yields)
                if limits != controller.limits_of(name):  # most records change few entitlements' limits
                    controller.set_limits(name, limits, now_s)
                budget = token_budget(float(record.bucket_tokens[i]), record.active[i], proxies, was_active, f,
                                      largest)
                level = bucket_level(controller.bucket_tokens_of(name, now_s), budget, fleet.tokens_per_s, since_s,
                                     own.spent_since.get(name, 0))
                controller.set_bucket_tokens(name, level, now_s)
        first = min(r.t_ms for r in records)
        own = at.get(first) or self.own.at(first)
        pool_slots = slot_share(self._pool_capacity, sum(r.pool_in_flight for r in records), own.pool_in_flight,
                                pool_active_of(records), proxies, own.pool_active, f)
        controller.set_pool(pool_slots, self._backend_waiting)
        return True

    def check_counts(self, now_s: float) -> bool:
        """Stop following counts that stopped coming (``counts_ttl_s``): back to the last update's share. True when
        it just did."""
        if self.counts is None or self.counts_applied_s is None:
            return False
        if now_s - self.counts_applied_s <= self.fleet.counts_ttl_s:
            return False
        self.counts = self.counts_applied_s = None
        self._shard_counts.clear()
        if self.in_force.source is LimitsSource.UPDATE and self._shares is not None:
            self._apply_shares(self._shares, now_s)
        return True

    @property
    def replicas(self) -> int:
        """The replicas this proxy divides the pool's limits with, as it knows them: those the last update named
        (shares), else the live proxies of the counts it follows, else 1."""
        if self.last_proxies:
            return len(self.last_proxies)
        return self.fleet_size if self.counts is not None else 1

    def fleet_limits_of(self, name: str) -> EntitlementLimits | None:
        """The last update's fleet-wide limits of ``name`` (None: no update named it yet)."""
        return self._fleet_limits.get(name)

    def limits_age_s(self, now_s: float) -> float:
        return max(0.0, now_s - self.in_force.applied_s)

    @property
    def limits_version(self) -> int | None:
        """The version of the limit update in force (a decision's ``limits_version``); None on static limits: none
        applied yet, or fallen back (the version kept through a fallback is not in force)."""
        return self.in_force.version if self.in_force.source is LimitsSource.UPDATE else None


def _equal_limits(lim: EntitlementLimits, replicas: int) -> EntitlementLimits:
    return _limits(_equal_part(Capacity(lim.tokens_per_s, lim.kv_bytes, float(lim.concurrency)), replicas),
                   lim.priority)


def _equal_part(c: Capacity, replicas: int) -> Capacity:
    """One of ``replicas`` equal parts, the largest (slots do not divide evenly; a fallback errs towards admitting)."""
    return split_across_proxies(c, {str(i): 1.0 for i in range(replicas)}, 1.0)["0"]


def _limits(c: Capacity, priority: float) -> EntitlementLimits:
    return EntitlementLimits(int(c.concurrency + 1e-9), c.tokens_per_s, c.kv_bytes, priority)


def _local_expiry(spec: EntitlementSpec, now_s: float, wall_s: float) -> EntitlementSpec:
    """The core compares ``expires_at_s`` with the ``now_s`` it is given; the proxy's ``now_s`` is monotonic, so
    the epoch expiry is moved into that time base once, here."""
    if spec.expires_at_s is None:
        return spec
    return dataclasses.replace(spec, expires_at_s=spec.expires_at_s - wall_s + now_s)
