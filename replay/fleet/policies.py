"""Distribution policies: how the fleet-wide limits become what each proxy enforces.

A policy is a pure function of what the agents observe at a window's end: per (entitlement, proxy), the attempts
in the window and the requests in flight at its end, plus the grants it made at the previous window's end. It
returns each proxy's share (concurrency slots, tokens/s, KV bytes per entitlement, and pool slots), which the
proxies apply after the propagation delay, and the record each proxy reads to learn it (for the update cost).

- ``exact``: no split. One ``AdmissionController`` holds the fleet-wide limits and sees every request: the
  reference every design is measured against (``central``; it makes no updates).
- ``shares`` (``policy.fleet_enforcement=shares``), as the agents apply it: ``core.limits.split_across_proxies``
  of every entitlement's limit and of the pool by the proxies' attempts, then ``core.limits.hold_back_growth`` so a proxy grows only into
  slots no other proxy holds (in flight, or granted by the previous update). It calls the core functions directly
  (replay does not import the agents); tests/unit/test_replay_fleet_split.py checks it against the agents' own
  ``hold_back`` of the ``LimitUpdate`` that ``build_limit_update`` makes. Before the first update arrives each
  proxy holds the split of a window with no attempts (equal shares).
- ``counts``: fleet-wide counts instead of shares (``core.fleet`` has the rules and their bounds). Every
  ``counts_interval_s`` the agents publish one ``CountsRecord`` per pool (``publish``): per entitlement the fleet
  in flight, the active proxies (recent demand or in flight) and the fleet token bucket level, and the same for
  the pool. A proxy holds, per entitlement, its own in flight at that instant plus a bounded growth
  (``entitlement_share``), spends a token budget derived from the fleet bucket, and takes the pool's concurrency
  the same way (``pool_share``). The control tick sends the limits alone (static in this model), so it sends nothing here.
  ``growth_fraction`` (f) trades refusals for overshoot; ``counts_greedy`` is the unbounded variant (every proxy
  may take the whole headroom, f = ∞), kept to measure what the bound costs.

``POLICIES`` maps each name to its policy object; a new design is measured by adding one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tokenpools.core.admission import EntitlementLimits
from tokenpools.core.capacity import Capacity
from tokenpools.core.fleet import slot_share, token_budget
from tokenpools.core.limits import hold_back_growth, split_across_proxies
from tokenpools.replay.fleet.wire import limit_update
from tokenpools.topics.counts import CountsRecord, counts_record
from tokenpools.topics.records import Record

CENTRAL = "fleet"  # the one enforcer of a central policy


@dataclass(frozen=True, slots=True)
class FleetView:
    """What the agents know beside the observations: the live proxies, the fleet-wide limits and the pool."""

    proxies: tuple[str, ...]
    limits: Mapping[str, EntitlementLimits]  # entitlement → fleet-wide limits (static in this model)
    pool: Capacity  # the pool's capacity: large enough that pool-level contention does not bind
    mean_slo_ms: float = 1000.0
    max_request_tokens: int = 0  # the largest reservation one request makes (longest prompt + max_tokens)

    def __post_init__(self) -> None:
        if not self.proxies or len(set(self.proxies)) != len(self.proxies):
            raise ValueError(f"`proxies` must be distinct and at least one, got {self.proxies}")


@dataclass(frozen=True, slots=True)
class Observation:
    """What the agents saw in one window, per entitlement → proxy (absent means 0)."""

    attempts: Mapping[str, Mapping[str, int]]  # requests decided (admitted or refused) in the window
    in_flight: Mapping[str, Mapping[str, int]]  # admitted and not yet completed at the window's end


Share = tuple[int, float, float]  # (concurrency slots, tokens/s, KV bytes), as a ProxyShare carries it


@dataclass(frozen=True, slots=True)
class Grants:
    """Each enforcer's share: enforcer → entitlement → Share, and enforcer → pool slots."""

    shares: Mapping[str, Mapping[str, Share]]
    pool_slots: Mapping[str, int]


class DistributionPolicy(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def central(self) -> bool:
        """True: one enforcer (``CENTRAL``) with the fleet limits decides every request, and nothing is sent."""
        ...

    def initial(self, fleet: FleetView) -> Grants:
        """What the enforcers hold before the first update arrives."""
        ...

    def decide(self, fleet: FleetView, seen: Observation, previous: Grants) -> Grants:
        """The grants for the next window, from the window that just ended and the grants made at its start."""
        ...

    def wire(self, fleet: FleetView, grants: Grants, t_ms: int) -> Record | None:
        """The record one proxy reads to learn ``grants`` (None: nothing is sent)."""
        ...


def _whole(limits: EntitlementLimits) -> Share:
    return (limits.concurrency, limits.tokens_per_s, limits.kv_bytes)


@dataclass(frozen=True, slots=True)
class Exact:
    """The reference: every request is decided by one controller with the fleet limits."""

    name: str = "exact"
    central: bool = True

    def initial(self, fleet: FleetView) -> Grants:
        shares = {CENTRAL: {name: _whole(limits) for name, limits in fleet.limits.items()}}
        return Grants(shares, {CENTRAL: int(fleet.pool.concurrency)})

    def decide(self, fleet: FleetView, seen: Observation, previous: Grants) -> Grants:
        return previous

    def wire(self, fleet: FleetView, grants: Grants, t_ms: int) -> Record | None:
        return None


@dataclass(frozen=True, slots=True)
class Split:
    """The shares design: split by attempts (``floor_fraction`` spread evenly first), then hold growth back."""

    name: str = "shares"
    central: bool = False
    floor_fraction: float = 0.1

    def initial(self, fleet: FleetView) -> Grants:
        nothing = Observation({}, {})
        return self.decide(fleet, nothing, Grants({p: {} for p in fleet.proxies}, {}))

    def decide(self, fleet: FleetView, seen: Observation, previous: Grants) -> Grants:
        proxies = fleet.proxies
        shares: dict[str, dict[str, Share]] = {p: {} for p in proxies}
        for name, limits in sorted(fleet.limits.items()):
            attempts = seen.attempts.get(name, {})
            demand = {p: float(attempts.get(p, 0)) for p in proxies}
            split = split_across_proxies(_capacity(limits), demand, self.floor_fraction)
            targets = {p: int(part.concurrency) for p, part in split.items()}
            levels = seen.in_flight.get(name, {})
            held = {p: max(levels.get(p, 0), previous.shares.get(p, {}).get(name, (0, 0.0, 0.0))[0]) for p in proxies}
            for proxy, slots in hold_back_growth(limits.concurrency, targets, held).items():
                part = split[proxy]
                shares[proxy][name] = (slots, part.tokens_per_s, part.kv_bytes)
        totals = {p: 0.0 for p in proxies}
        in_flight = {p: 0 for p in proxies}
        for name in fleet.limits:
            for proxy, n in seen.attempts.get(name, {}).items():
                totals[proxy] += n
            for proxy, n in seen.in_flight.get(name, {}).items():
                in_flight[proxy] += n
        pool_split = split_across_proxies(fleet.pool, totals, self.floor_fraction)
        pool_targets = {p: int(part.concurrency) for p, part in pool_split.items()}
        pool_held = {p: max(in_flight[p], previous.pool_slots.get(p, 0)) for p in proxies}
        pool_slots = hold_back_growth(int(fleet.pool.concurrency), pool_targets, pool_held)
        return Grants(shares, pool_slots)

    def wire(self, fleet: FleetView, grants: Grants, t_ms: int) -> Record | None:
        return limit_update(fleet.limits, fleet.pool, fleet.mean_slo_ms, grants.shares, grants.pool_slots, t_ms)


@runtime_checkable
class CountsDesign(Protocol):
    """A design whose proxies follow fleet counts (published every ``counts_interval_s``, not by the tick): what the
    agents publish, what a proxy makes of it. The model recognises one by these methods."""

    def publish(self, fleet: FleetView, in_flight: Mapping[str, int], active: Mapping[str, int],
                bucket_tokens: Mapping[str, float], pool_in_flight: int, pool_active: int,
                t_ms: int) -> CountsRecord: ...

    def entitlement_share(self, fleet: FleetView, limits: EntitlementLimits, record: CountsRecord, index: int,
                          own: int, was_active: bool) -> tuple[int, float]: ...

    def pool_share(self, fleet: FleetView, record: CountsRecord, own: int, was_active: bool) -> int: ...


@dataclass(frozen=True, slots=True)
class Counts:
    """Fleet counts and bounded growth (module docstring; rules in ``core.fleet``)."""

    name: str = "counts"
    central: bool = False
    growth_fraction: float = 2.0  # f; math.inf: a proxy may take the whole headroom (unbounded)
    limits_version: int = 0  # the static limits' version (the record's entitlement order)

    def __post_init__(self) -> None:
        if not self.growth_fraction >= 1:
            raise ValueError(f"`growth_fraction` must be >= 1 (else one proxy is not the exact enforcer), "
                             f"got {self.growth_fraction}")

    def initial(self, fleet: FleetView) -> Grants:
        """The controllers start with the whole limits; the counts of the empty fleet at time 0 apply at once."""
        whole = {name: _whole(limits) for name, limits in fleet.limits.items()}
        return Grants({p: dict(whole) for p in fleet.proxies}, {p: int(fleet.pool.concurrency) for p in fleet.proxies})

    def decide(self, fleet: FleetView, seen: Observation, previous: Grants) -> Grants:
        return previous  # the limits are static; the counts do the rest

    def wire(self, fleet: FleetView, grants: Grants, t_ms: int) -> Record | None:
        return None

    def publish(self, fleet: FleetView, in_flight: Mapping[str, int], active: Mapping[str, int],
                bucket_tokens: Mapping[str, float], pool_in_flight: int, pool_active: int,
                t_ms: int) -> CountsRecord:
        """The agents' record at ``t_ms``, entitlements in name order (absent counts are 0); buckets in whole tokens,
        rounded up (so a proxy's cap never falls below the exact level) and saturated to the wire's i32."""
        return counts_record("pool", self.limits_version, t_ms, sorted(fleet.limits), in_flight=in_flight,
                             active=active, bucket_tokens=bucket_tokens, pool_in_flight=pool_in_flight,
                             pool_active=pool_active, proxies=len(fleet.proxies))

    def entitlement_share(self, fleet: FleetView, limits: EntitlementLimits, record: CountsRecord, index: int,
                          own: int, was_active: bool) -> tuple[int, float]:
        """(concurrency, token budget) of one proxy for the entitlement at ``index`` in the record."""
        proxies = record.proxies
        active = record.active[index]
        slots = slot_share(limits.concurrency, record.in_flight[index], own, active, proxies, was_active,
                           self.growth_fraction)
        budget = token_budget(float(record.bucket_tokens[index]), active, proxies, was_active,
                              self.growth_fraction, float(fleet.max_request_tokens))
        return slots, budget

    def pool_share(self, fleet: FleetView, record: CountsRecord, own: int, was_active: bool) -> int:
        """The pool concurrency one proxy enforces: its own pool in flight plus its growth."""
        return slot_share(int(fleet.pool.concurrency), record.pool_in_flight, own, record.pool_active,
                          record.proxies, was_active, self.growth_fraction)


def _capacity(limits: EntitlementLimits) -> Capacity:
    return Capacity(limits.tokens_per_s, limits.kv_bytes, float(limits.concurrency))


POLICIES: dict[str, DistributionPolicy] = {
    "exact": Exact(), "shares": Split(), "counts": Counts(),
    "counts_greedy": Counts(name="counts_greedy", growth_fraction=math.inf),
}
