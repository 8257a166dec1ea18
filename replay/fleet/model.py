"""The fleet simulation: P proxies, each a real ``AdmissionController``, behind a load balancer, on one trace.

An event-time loop over a heap of (time, kind, sequence) events; at equal times a window's tick comes first (it
closes [t − tick_s, t), so what happens at t belongs to the next window), then completions, then update arrivals,
then arrivals; equal kinds keep the order they were scheduled in. Nothing reads a clock: the same trace, config and
seed give the same run, decision for decision.

- an arrival goes to the proxy the balancer picks, whose controller decides it (a ``central`` policy's one
  controller decides every request); a refused request is dropped (open loop, no retries); an admitted one
  completes after its service time and settles its actual usage;
- at every window end the policy turns the window's observation (attempts per (entitlement, proxy) in the window,
  in flight at its end) and its previous grants into new grants, which reach every proxy ``propagation_delay_s``
  later; a proxy applies the shares that changed (``set_limits``, ``set_pool``) — re-applying an unchanged limit
  only splits one bucket refill in two;
- limits are static fleet-wide; the pool's concurrency is the sum of the limits (pool contention does not bind in
  the reference); KV is not modelled: the controllers charge 0 KV bytes per token, so the KV check never binds,
  while the KV limits still travel in the updates (slots × the longest request × 147,456 B) so their size is real.

Under a counts design (a ``CountsDesign``) the tick sends nothing (the limits are static); instead, every
``counts_interval_s`` (at equal times after the tick, before completions) the agents publish the fleet's counts at
that instant (``CountsRecord``: in flight, proxies that saw demand in the last ``demand_window_s``, the fleet bucket
B_e of the meter), which reach every proxy ``propagation_delay_s`` later with what each proxy knew of itself at the
instant (its own in flight, its recent demand). A proxy takes its share of an entitlement from the record in force
lazily, on the first admission or settlement of that entitlement after the record arrived, setting it as of the
arrival time: nothing else touches an entitlement's ledger, so the decisions are those of applying every record to
every entitlement on arrival, at a fraction of the model's cost. The empty fleet's record is in force at time 0.

Runs end at the trace's duration: later events are not processed, requests still in flight count until then.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import NamedTuple

from tokenpools.core.admission import AdmissionController, EntitlementLimits, Ticket
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.spec import EntitlementSpec
from tokenpools.replay.fleet.balancers import BALANCERS
from tokenpools.core.fleet import bucket_level
from tokenpools.replay.fleet.metrics import FleetFigures, FleetMeter
from tokenpools.replay.fleet.policies import (
    CENTRAL, POLICIES, CountsDesign, DistributionPolicy, FleetView, Grants, Observation,
)
from tokenpools.replay.fleet.trace import Trace
from tokenpools.topics.counts import CountsRecord, encode_counts
from tokenpools.topics.codec import encode

KV_BYTES_PER_TOKEN = 147_456  # what the KV limits on the wire are sized by (Qwen3-8B, bf16); never charged here
PRIORITY = 1.0  # one service class (guaranteed), one SLO: every entitlement carries the same priority


class EventKind(IntEnum):
    """What happens at an instant, in the order events at the same instant are processed."""

    TICK = 0
    COUNTS = 1
    COMPLETION = 2
    UPDATE = 3
    ARRIVAL = 4


class _Completion(NamedTuple):
    """An admitted request's end: where it was admitted (enforcer index, proxy) and what it used."""

    enforcer: int
    proxy_id: str
    ticket: Ticket
    used_tokens: int


class _CountsInForce(NamedTuple):
    """A counts record as the proxies hold it, with what each knew of itself at the counts instant."""

    record: CountsRecord
    t_s: float  # the counts instant
    own: Mapping[str, Mapping[str, int]]  # entitlement → proxy → in flight at the instant
    spent: Mapping[tuple[int, str], int]  # (proxy index, entitlement) → net tokens charged up to the instant
    active: Mapping[str, frozenset[str]]  # entitlement → proxies that saw its requests in the demand window
    pool_own: tuple[int, ...]  # per proxy index: pool in flight at the instant
    pool_active: frozenset[int]  # proxy indices that saw any request in the demand window


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """One run: how many proxies, behind which balancer, with which distribution policy."""

    proxies: int
    policy: str
    balancer: str = "random"
    balancer_options: tuple[tuple[str, int], ...] = ()  # e.g. (("k", 2),) for key_affinity
    tick_s: float = 1.0  # window width: the agents decide at every window's end
    propagation_delay_s: float = 0.1  # from a window's end to its update in force at every proxy
    token_bucket_window_s: float = 10.0  # the pool's: bucket depth = tokens/s limit × this
    measure_updates: bool = True  # encode every tick's update to count its bytes (the costliest part at large P·E)
    counts_interval_s: float = 0.1  # a counts design: how often the agents publish the fleet's counts
    demand_window_s: float = 1.0  # a counts design: a proxy "saw demand recently" if it had a request this recently

    def __post_init__(self) -> None:
        if self.proxies < 1:
            raise ValueError(f"`proxies` must be >= 1, got {self.proxies}")
        if self.balancer not in BALANCERS:
            raise ValueError(f"`balancer` must be one of {sorted(BALANCERS)}, got {self.balancer!r}")
        BALANCERS[self.balancer](self.proxies, random.Random(0), **dict(self.balancer_options))  # options valid
        if self.tick_s <= 0:
            raise ValueError(f"`tick_s` must be positive, got {self.tick_s}")
        if self.propagation_delay_s < 0:
            raise ValueError(f"`propagation_delay_s` must be >= 0, got {self.propagation_delay_s}")
        if self.token_bucket_window_s <= 0:
            raise ValueError(f"`token_bucket_window_s` must be positive, got {self.token_bucket_window_s}")
        if self.counts_interval_s <= 0:
            raise ValueError(f"`counts_interval_s` must be positive, got {self.counts_interval_s}")
        if self.demand_window_s <= 0:
            raise ValueError(f"`demand_window_s` must be positive, got {self.demand_window_s}")


@dataclass(frozen=True, slots=True)
class FleetRun:
    """A run's figures, every decision in arrival order, and the last update a proxy read (encoded)."""

    figures: FleetFigures
    decisions: tuple[AdmissionOutcome, ...]
    last_update: bytes | None


def fleet_view(trace: Trace, proxies: int) -> FleetView:
    """The trace's entitlements as fleet-wide limits, proxies named p0 … p(P−1) (zero-padded: names sort as numbers)."""
    width = len(str(proxies - 1))
    kv_per_slot = (trace.max_tokens + max((r.prompt_tokens for r in trace.requests), default=0)) * KV_BYTES_PER_TOKEN
    limits = {
        e.name: EntitlementLimits(e.concurrency, e.tokens_per_s, float(e.concurrency * kv_per_slot), PRIORITY)
        for e in trace.entitlements
    }
    pool = Capacity(
        sum(lim.tokens_per_s for lim in limits.values()),
        sum(lim.kv_bytes for lim in limits.values()),
        float(sum(lim.concurrency for lim in limits.values())),
    )
    longest = trace.max_tokens + max((r.prompt_tokens for r in trace.requests), default=0)
    return FleetView(tuple(f"p{i:0{width}d}" for i in range(proxies)), limits, pool, max_request_tokens=longest)


def enforcer(fleet: FleetView, trace: Trace, config: FleetConfig, share: Mapping[str, tuple[int, float, float]],
             pool_slots: int) -> AdmissionController:
    """One proxy's controller holding ``share`` of every entitlement (all Bound, guaranteed), at time 0."""
    controller = AdmissionController(pool_concurrency=pool_slots, kv_bytes_per_token=0,
                                     default_max_tokens=trace.max_tokens,
                                     token_bucket_window_s=config.token_bucket_window_s)
    for name, limits in fleet.limits.items():
        spec = EntitlementSpec(name=name, pool="pool", service_class=ServiceClass.GUARANTEED, slo_ms=fleet.mean_slo_ms,
                               baseline=Capacity(limits.tokens_per_s, limits.kv_bytes, float(limits.concurrency)))
        slots, tokens_per_s, kv_bytes = share.get(name, (0, 0.0, 0.0))
        controller.upsert_entitlement(spec, EntitlementLimits(slots, tokens_per_s, kv_bytes, limits.priority), 0.0)
    return controller


def _apply(controller: AdmissionController, fleet: FleetView, before: Mapping[str, tuple[int, float, float]],
           after: Mapping[str, tuple[int, float, float]], pool_slots: int, now_s: float) -> None:
    for name, share in after.items():
        if before.get(name) != share:
            controller.set_limits(name, EntitlementLimits(*share, fleet.limits[name].priority), now_s)
    controller.set_pool(pool_slots, 0)


def run(trace: Trace, config: FleetConfig, rng: random.Random,
        policies: Mapping[str, DistributionPolicy] = POLICIES) -> FleetRun:
    """Run ``trace`` through the fleet; ``rng`` drives the balancer (the only random choice in a run)."""
    if config.policy not in policies:
        raise ValueError(f"`policy` must be one of {sorted(policies)}, got {config.policy!r}")
    policy = policies[config.policy]
    fleet = fleet_view(trace, config.proxies)
    balancer = BALANCERS[config.balancer](config.proxies, rng, **dict(config.balancer_options))
    enforcers = (CENTRAL,) if policy.central else fleet.proxies
    grants = policy.initial(fleet)
    controllers = [enforcer(fleet, trace, config, grants.shares[e], grants.pool_slots[e]) for e in enforcers]
    in_force = [grants.shares[e] for e in enforcers]  # what each enforcer applied last
    meter = FleetMeter(fleet.limits, config.token_bucket_window_s)
    attempts: dict[str, dict[str, int]] = {}  # this window's, entitlement → proxy
    in_flight: dict[str, dict[str, int]] = {}  # entitlement → proxy
    decisions: list[AdmissionOutcome] = []
    last_update: bytes | None = None
    ticks = 0
    counts = policy if isinstance(policy, CountsDesign) else None
    names = sorted(fleet.limits)
    index_of = {name: i for i, name in enumerate(names)}
    last_seen: dict[str, dict[str, float]] = {}  # entitlement → proxy → its latest request (counts designs)
    pool_seen: dict[int, float] = {}  # proxy index → its latest request
    counts_in_force: _CountsInForce | None = None
    counts_at_s = 0.0
    counts_version = 0
    applied: list[dict[str, int]] = [{} for _ in enforcers]  # per proxy: entitlement → counts version applied
    spent: dict[tuple[int, str], int] = {}  # (proxy index, entitlement) → net tokens charged so far (counts designs)

    def take_share(i: int, name: str) -> None:
        """Apply the counts in force to proxy i's entitlement ``name`` if it has not yet (see the module doc)."""
        assert counts is not None and counts_in_force is not None
        if applied[i].get(name) == counts_version:
            return
        applied[i][name] = counts_version
        proxy_id = fleet.proxies[i]
        limits = fleet.limits[name]
        slots, budget = counts.entitlement_share(
            fleet, limits, counts_in_force.record, index_of[name],
            counts_in_force.own.get(name, {}).get(proxy_id, 0), proxy_id in counts_in_force.active.get(name, ()))
        controller = controllers[i]
        if controller.limits_of(name).concurrency != slots:
            controller.set_limits(name, EntitlementLimits(slots, limits.tokens_per_s, limits.kv_bytes,
                                                          limits.priority), counts_at_s)
        level = bucket_level(controller.bucket_tokens_of(name, counts_at_s), budget, limits.tokens_per_s,
                             counts_at_s - counts_in_force.t_s,
                             spent.get((i, name), 0) - counts_in_force.spent.get((i, name), 0))
        controller.set_bucket_tokens(name, level, counts_at_s)

    def counts_now(t_s: float) -> _CountsInForce:
        """The agents' counts at ``t_s`` and what each proxy knows of itself then."""
        assert counts is not None
        since = t_s - config.demand_window_s
        own = {name: dict(c) for name, c in in_flight.items() if c}
        active: dict[str, frozenset[str]] = {}
        for name, seen_at in last_seen.items():
            for proxy_id in [p for p, at in seen_at.items() if at <= since]:
                del seen_at[proxy_id]
        for name in set(last_seen) | set(own):
            proxies = set(last_seen.get(name, ())) | set(own.get(name, ()))
            if proxies:
                active[name] = frozenset(proxies)
        for i in [i for i, at in pool_seen.items() if at <= since]:
            del pool_seen[i]
        pool_own = tuple(c.in_flight for c in controllers)
        pool_active = frozenset(pool_seen) | {i for i, n in enumerate(pool_own) if n}
        record = counts.publish(fleet, {n: sum(c.values()) for n, c in own.items()},
                                {n: len(a) for n, a in active.items()},
                                {n: meter.bucket_of(n, t_s) for n in names}, sum(pool_own), len(pool_active),
                                round(t_s * 1000))
        return _CountsInForce(record, t_s, own, dict(spent), active, pool_own, pool_active)

    def counts_arrive(update: _CountsInForce, t_s: float) -> None:
        nonlocal counts_in_force, counts_at_s, counts_version
        assert counts is not None
        counts_in_force, counts_at_s, counts_version = update, t_s, counts_version + 1
        for i, controller in enumerate(controllers):
            controller.set_pool(counts.pool_share(fleet, update.record, update.pool_own[i], i in update.pool_active), 0)

    if counts is not None:
        counts_arrive(counts_now(0.0), 0.0)
        schedule_first_counts = True
    else:
        schedule_first_counts = False
    requests = trace.requests
    end_s = trace.duration_s
    heap: list[tuple[float, int, int, object]] = []
    sequence = 0

    def schedule(t_s: float, kind: EventKind, payload: object) -> None:
        nonlocal sequence
        heapq.heappush(heap, (t_s, kind, sequence, payload))
        sequence += 1

    if requests:
        schedule(requests[0].t_s, EventKind.ARRIVAL, 0)
    if not policy.central:
        schedule(config.tick_s, EventKind.TICK, 1)
    if schedule_first_counts:
        schedule(config.counts_interval_s, EventKind.COUNTS, 1)
    while heap:
        t_s, kind, _, payload = heapq.heappop(heap)
        if t_s >= end_s:
            break
        if kind is EventKind.ARRIVAL:
            index = payload
            assert isinstance(index, int)
            request = requests[index]
            if index + 1 < len(requests):
                schedule(requests[index + 1].t_s, EventKind.ARRIVAL, index + 1)
            name = request.entitlement
            proxy = balancer.pick(name)
            which = 0 if policy.central else proxy
            proxy_id = fleet.proxies[proxy]
            if counts is not None:
                take_share(which, name)
                last_seen.setdefault(name, {})[proxy_id] = t_s
                pool_seen[which] = t_s
            decision = controllers[which].admit(name, request.request_id, request.prompt_tokens,
                                                request.max_tokens, t_s)
            meter.decided(name, decision.outcome, request.cost_tokens, t_s)
            decisions.append(decision.outcome)
            per_proxy = attempts.setdefault(name, {})
            per_proxy[proxy_id] = per_proxy.get(proxy_id, 0) + 1
            if decision.ticket is not None:
                held = in_flight.setdefault(name, {})
                held[proxy_id] = held.get(proxy_id, 0) + 1
                if counts is not None:
                    spent[which, name] = spent.get((which, name), 0) + request.cost_tokens
                schedule(t_s + request.service_s, EventKind.COMPLETION,
                         _Completion(which, proxy_id, decision.ticket, request.used_tokens))
        elif kind is EventKind.COMPLETION:
            assert isinstance(payload, _Completion)
            ticket = payload.ticket
            if counts is not None:
                take_share(payload.enforcer, ticket.entitlement)
            refund = controllers[payload.enforcer].release(ticket, payload.used_tokens, t_s)
            meter.released(ticket.entitlement, refund, t_s)
            if counts is not None:
                spent[payload.enforcer, ticket.entitlement] -= refund
            held = in_flight[ticket.entitlement]
            held[payload.proxy_id] -= 1
            if not held[payload.proxy_id]:
                del held[payload.proxy_id]
        elif kind is EventKind.COUNTS:
            update = counts_now(t_s)
            if config.measure_updates:
                last_update = encode_counts(update.record)
                meter.update_read(len(last_update))
            schedule(t_s + config.propagation_delay_s, EventKind.UPDATE, update)
            assert isinstance(payload, int)
            schedule((payload + 1) * config.counts_interval_s, EventKind.COUNTS, payload + 1)
        elif kind is EventKind.TICK:
            ticks += 1
            assert isinstance(payload, int)
            if counts is not None:  # the limits are static: the tick sends nothing a counts design reads
                schedule((payload + 1) * config.tick_s, EventKind.TICK, payload + 1)
                continue
            seen = Observation(attempts, {e: dict(c) for e, c in in_flight.items() if c})
            grants = policy.decide(fleet, seen, grants)
            attempts = {}
            if config.measure_updates:
                record = policy.wire(fleet, grants, round(t_s * 1000))
                if record is not None:
                    last_update = encode(record)
                    meter.update_read(len(last_update))
            schedule(t_s + config.propagation_delay_s, EventKind.UPDATE, grants)
            schedule((payload + 1) * config.tick_s, EventKind.TICK, payload + 1)
        elif isinstance(payload, _CountsInForce):  # UPDATE: counts arrive
            counts_arrive(payload, t_s)
        else:  # UPDATE: grants arrive
            assert isinstance(payload, Grants)
            for i, enforcer_id in enumerate(enforcers):
                after = payload.shares[enforcer_id]
                _apply(controllers[i], fleet, in_force[i], after, payload.pool_slots[enforcer_id], t_s)
                in_force[i] = after
    return FleetRun(meter.finish(end_s, ticks), tuple(decisions), last_update)
