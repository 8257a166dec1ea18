"""Distribution policies: how the fleet-wide limits become what each proxy enforces.

A policy is a pure function of what the agents observe at a window's end: per (entitlement, proxy), the attempts
in the window and the requests in flight at its end, plus the grants it made at the previous window's end. It
returns each proxy's share (concurrency slots, tokens/s, KV bytes per entitlement, and pool slots), which the
proxies apply after the propagation delay, and the record each proxy reads to learn it (for the update cost).

- ``exact``: no split. One ``AdmissionController`` holds the fleet-wide limits and sees every request: the
  reference every design is measured against (``central``; it makes no updates).
- ``split``: today's design, as the agents apply it: ``core.limits.split_across_proxies`` of every entitlement's
  limit and of the pool by the proxies' attempts, then ``core.limits.hold_back_growth`` so a proxy grows only into
  slots no other proxy holds (in flight, or granted by the previous update). It calls the core functions directly
  (replay does not import the agents); tests/unit/test_replay_fleet_split.py checks it against the agents' own
  ``hold_back`` of the ``LimitUpdate`` that ``build_limit_update`` makes. Before the first update arrives each
  proxy holds the split of a window with no attempts (equal shares).
- ``counts`` (a what-if for the concurrency dimension only): every tick each proxy may hold what the limit leaves
  after the *other* proxies' in flight at the window's end, ``L − (N − own)``, so a proxy admits whenever the fleet
  was below the limit when it last heard. Tokens/s and the pool are not split (every proxy holds the fleet's), so
  its token and pool figures mean nothing; it measures how far fresh fleet-wide counts carry concurrency. It sends
  nothing measurable yet (the record that would carry the counts is not designed).

``POLICIES`` maps each name to its policy object; a new design is measured by adding one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from tokenpools.core.admission import EntitlementLimits
from tokenpools.core.capacity import Capacity
from tokenpools.core.limits import hold_back_growth, split_across_proxies
from tokenpools.replay.fleet.wire import limit_update
from tokenpools.topics.records import Record

CENTRAL = "fleet"  # the one enforcer of a central policy


@dataclass(frozen=True, slots=True)
class FleetView:
    """What the agents know beside the observations: the live proxies, the fleet-wide limits and the pool."""

    proxies: tuple[str, ...]
    limits: Mapping[str, EntitlementLimits]  # entitlement → fleet-wide limits (static in this model)
    pool: Capacity  # the pool's capacity: large enough that pool-level contention does not bind
    mean_slo_ms: float = 1000.0

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
    """Today's design: split by attempts (``floor_fraction`` spread evenly first), then hold growth back."""

    name: str = "split"
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


@dataclass(frozen=True, slots=True)
class Counts:
    """Concurrency from the fleet-wide in-flight counts: share_p = max(0, L − (N − own_p)); tokens/s, KV and pool
    slots whole at every proxy (see the module docstring: a what-if for concurrency alone)."""

    name: str = "counts"
    central: bool = False

    def initial(self, fleet: FleetView) -> Grants:
        whole = {name: _whole(limits) for name, limits in fleet.limits.items()}
        return Grants({p: dict(whole) for p in fleet.proxies}, {p: int(fleet.pool.concurrency) for p in fleet.proxies})

    def decide(self, fleet: FleetView, seen: Observation, previous: Grants) -> Grants:
        shares: dict[str, dict[str, Share]] = {p: {} for p in fleet.proxies}
        for name, limits in fleet.limits.items():
            held = seen.in_flight.get(name, {})
            total = sum(held.values())
            for proxy in fleet.proxies:
                others = total - held.get(proxy, 0)
                shares[proxy][name] = (max(0, limits.concurrency - others), limits.tokens_per_s, limits.kv_bytes)
        return Grants(shares, dict(previous.pool_slots))

    def wire(self, fleet: FleetView, grants: Grants, t_ms: int) -> Record | None:
        return None


def _capacity(limits: EntitlementLimits) -> Capacity:
    return Capacity(limits.tokens_per_s, limits.kv_bytes, float(limits.concurrency))


POLICIES: dict[str, DistributionPolicy] = {"exact": Exact(), "split": Split(), "counts": Counts()}
