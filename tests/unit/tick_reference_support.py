"""The policy tick as it was before it was reworked for cost (commit 21ac07d), kept as the reference the reworked
one must equal, output for output (``test_tick_reference.py``). Only the functions whose algorithm changed are here,
verbatim but for their names' module; the ones that did not change are imported from the package.

A later change of the rule itself is written here too, in this module's plain terms, so the comparison keeps
checking the rework and not the rule: issue 30's re-split of what the elastic entitlements hold, by priority ×
baseline up to each one's want (``core.limits.elastic_shares``), after tier 2 in ``_allocate_dimension``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import replace

from tokenpools.core import windows as core_windows
from tokenpools.core.binding import bind_entitlements
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState, ServiceClass
from tokenpools.core.fairshare import Claim, round_down_fair, water_fill
from tokenpools.core.limits import Allocation, LimitConfig
from tokenpools.core.priority import PolicyConstants, pool_mean_slo_ms, priority
from tokenpools.core.scaling import ScalingConfig
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.tick import Signals, TickResult, condition
from tokenpools.core.windows import UsageSample
from tokenpools.streams.capacity import capacity_at, prune
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.counts.hold_back import grants_of
from tokenpools.streams.table.pool_state import PoolState, PoolView, TickOutput, _keep, _of_live, origin
from tokenpools.topics.effective import departed, effective_limits
from tokenpools.topics.limits import PAGE_BYTES, _BYTES_PER_ENTITLEMENT, _BYTES_PER_SHARE
from tokenpools.topics.records import (
    EffectiveLimit,
    EntitlementLimit,
    LimitUpdate,
    ProxyHeartbeat,
    ProxyShare,
    ScaleCommand,
)


def _ceiling(spec: EntitlementSpec, pool_capacity: Capacity) -> Capacity:
    """The most this entitlement may ever be allowed: baseline for guaranteed, else its burst ceiling or the pool."""
    if spec.service_class is ServiceClass.GUARANTEED:
        return spec.baseline
    ceiling = spec.burst_ceiling if spec.burst_ceiling is not None else pool_capacity
    return Capacity(
        max(spec.baseline.tokens_per_s, min(ceiling.tokens_per_s, pool_capacity.tokens_per_s)),
        max(spec.baseline.kv_bytes, min(ceiling.kv_bytes, pool_capacity.kv_bytes)),
        max(spec.baseline.concurrency, min(ceiling.concurrency, pool_capacity.concurrency)),
    )


_TIER_OF_BURST = {
    ServiceClass.DEDICATED: 2,
    ServiceClass.ELASTIC: 2,
    ServiceClass.SPOT: 3,
    ServiceClass.PREEMPTIBLE: 4,
}


def compute_limits(
    capacity: Capacity,
    entitlements: list[EntitlementSpec],
    priorities: Mapping[str, float],
    demand: Mapping[str, Capacity | None],
    config: LimitConfig = LimitConfig(),
    backend_waiting: int = 0,
) -> Allocation:
    """Effective per-entitlement limits for one tick. Pure; the order of ``entitlements`` breaks rounding ties."""
    order = sorted(entitlements, key=lambda e: (-priorities.get(e.name, 0.0), e.name))
    per_dim: list[dict[str, float]] = []
    lent: list[float] = []
    for dim in range(3):
        grants, lent_dim = _allocate_dimension(dim, capacity, order, priorities, demand, config)
        per_dim.append(grants)
        lent.append(lent_dim)
    # concurrency is a whole number of sequences: round the float grants without exceeding their sum
    slot_caps = {e.name: int(_ceiling(e, capacity).concurrency + 1e-9) for e in order}
    slot_total = int(sum(per_dim[2].values()) + 1e-6)
    slots = round_down_fair(per_dim[2], slot_caps, slot_total, [e.name for e in order])
    limits = {
        e.name: Capacity(per_dim[0][e.name], per_dim[1][e.name], float(slots[e.name])) for e in order
    }
    contended = backend_waiting > 0 or _demand_exceeds(capacity, order, demand)
    return Allocation(limits, contended, Capacity.from_tuple(lent))


def _want(spec: EntitlementSpec, dim: int, pool: Capacity, demand: Capacity | None, headroom: float) -> float:
    ceiling = _ceiling(spec, pool).as_tuple()[dim]
    if demand is None:
        return min(ceiling, spec.baseline.as_tuple()[dim])
    asked = demand.as_tuple()[dim] * (1.0 + headroom)
    if dim == 2:  # whole sequences
        asked = math.ceil(asked - 1e-9)
    return min(ceiling, asked)


def _allocate_dimension(
    dim: int,
    capacity: Capacity,
    order: list[EntitlementSpec],
    priorities: Mapping[str, float],
    demand: Mapping[str, Capacity | None],
    config: LimitConfig,
) -> tuple[dict[str, float], float]:
    total = capacity.as_tuple()[dim]
    grants = {e.name: 0.0 for e in order}
    protected = [e for e in order if e.service_class.protected]
    reserved = sum(e.baseline.as_tuple()[dim] for e in protected)
    lent = 0.0
    for e in protected:
        base = e.baseline.as_tuple()[dim]
        grants[e.name] = base
        d = demand.get(e.name)
        if config.lend_idle_protected and d is not None:
            lent += max(0.0, base - d.as_tuple()[dim])
    lent = min(lent, reserved)
    # what the pool has beyond the protected baselines *in use*: when the pool is smaller than the baselines
    # (outage, scaled below them) an idle baseline is only lendable as far as the pool physically has it
    free = max(0.0, total - (reserved - lent))
    weight = {e.name: max(priorities.get(e.name, 0.0), 1e-12) for e in order}
    ceilings = {e.name: _ceiling(e, capacity).as_tuple()[dim] for e in order}
    wants = {e.name: _want(e, dim, capacity, demand.get(e.name), config.burst_headroom) for e in order}

    def fill(members: list[EntitlementSpec], target: Mapping[str, float]) -> None:
        nonlocal free
        claims = {e.name: Claim(weight[e.name], max(0.0, target[e.name] - grants[e.name])) for e in members}
        for name, extra in water_fill(free, claims).items():
            grants[name] += extra
            free -= extra
        free = max(0.0, free)

    elastic = [e for e in order if e.service_class is ServiceClass.ELASTIC]
    fill(elastic, {e.name: min(wants[e.name], e.baseline.as_tuple()[dim]) for e in elastic})
    for tier in (2, 3, 4):
        members = [e for e in order if _TIER_OF_BURST.get(e.service_class) == tier]
        fill(members, wants)
        if tier == 2 and len(elastic) > 1:  # issue 30: what elastic holds is re-split by priority × baseline
            held = sum(grants[e.name] for e in elastic)
            claims = {e.name: Claim(weight[e.name] * (b if (b := e.baseline.as_tuple()[dim]) > 0 else 1e-9),
                                    wants[e.name]) for e in elastic}
            for name, share in water_fill(held, claims).items():
                grants[name] = share
    fill([e for e in order if e.service_class.may_burst], ceilings)
    return grants, lent


def _demand_exceeds(capacity: Capacity, order: list[EntitlementSpec], demand: Mapping[str, Capacity | None]) -> bool:
    totals = [0.0, 0.0, 0.0]
    for e in order:
        d = demand.get(e.name)
        values = e.baseline.as_tuple() if d is None else d.as_tuple()
        for i in range(3):
            totals[i] += values[i]
    return any(t > c * (1 + 1e-9) for t, c in zip(totals, capacity.as_tuple()) if c > 0)


def split_across_proxies(limit: Capacity, demand_share: Mapping[str, float], floor_fraction: float = 0.1) -> dict[str, Capacity]:
    """Split one entitlement's limit across proxy replicas by their recent share of its demand.

    Every live proxy first gets ``floor_fraction``/N of the limit (so a replica that sees its first request can
    still admit it); the rest follows the demand shares (equal when none is known). Tokens/s and KV add up to the
    limit exactly; concurrency is whole slots adding up to the limit, each proxy getting at least one while the
    limit has one per proxy.
    """
    if not demand_share:
        return {}
    if not 0 <= floor_fraction <= 1:
        raise ValueError(f"`floor_fraction` must be in [0, 1], got {floor_fraction}")
    proxies = sorted(demand_share)
    n = len(proxies)
    positive = {p: max(0.0, demand_share[p]) for p in proxies}
    total_share = sum(positive.values())
    fractions = {
        p: floor_fraction / n + (1 - floor_fraction) * (positive[p] / total_share if total_share > 0 else 1 / n)
        for p in proxies
    }
    slots_total = int(limit.concurrency + 1e-9)
    if slots_total >= n:
        base = {p: 1 for p in proxies}
        extra = {p: fractions[p] * (slots_total - n) for p in proxies}
        extra_int = round_down_fair(extra, {p: slots_total for p in proxies}, slots_total - n,
                                    sorted(proxies, key=lambda p: -fractions[p]))
        slots = {p: base[p] + extra_int[p] for p in proxies}
    else:  # fewer slots than proxies: one each to the proxies with the largest shares
        ranked = sorted(proxies, key=lambda p: -fractions[p])
        slots = {p: 1 if i < slots_total else 0 for i, p in enumerate(ranked)}
    return {
        p: Capacity(limit.tokens_per_s * fractions[p], limit.kv_bytes * fractions[p], float(slots[p])) for p in proxies
    }


def hold_back_growth(limit_slots: int, targets: Mapping[str, int], in_flight: Mapping[str, int]) -> dict[str, int]:
    """The concurrency each proxy may be granted now, so that a moving split never puts more than the limit in flight.

    A proxy enforces its share on new admissions only: when the split moves (say 3/3 → 5/1) the replica whose share
    shrank keeps what it admitted under the old share until those requests end, and a replica granted its new share
    at once would put up to limit + Δshare in flight. So a proxy may grow only into slots no other proxy holds::

        grant_p = max(0, min(target_p, limit − Σ_{q≠p} max(target_q, in_flight_q)))

    ``targets`` are the split's whole slots per proxy (``split_across_proxies``); ``in_flight`` what each proxy has
    admitted and not yet completed, as last reported (a proxy absent from ``targets`` holds its in-flight and gets
    nothing; absent from ``in_flight`` means none). A shrinking proxy gets its new target at once; a growing one
    gets the rest of its target on a later tick, as the others' requests end.

    Invariant (tests/unit/test_core_limits_split.py): grant_p ≤ target_p, and whenever the in-flight reports are
    current, Σ_p max(grant_p, in_flight_p) ≤ max(limit, Σ_p in_flight_p) — what the proxies can have in flight
    together never exceeds the limit, unless it already did before this split (then nobody grows).
    """
    if limit_slots < 0:
        raise ValueError(f"`limit_slots` must be >= 0, got {limit_slots}")
    for name, mapping in (("targets", targets), ("in_flight", in_flight)):
        if any(v < 0 for v in mapping.values()):
            raise ValueError(f"`{name}` must be >= 0 per proxy, got {dict(mapping)}")
    held = {p: max(targets.get(p, 0), in_flight.get(p, 0)) for p in {*targets, *in_flight}}
    total_held = sum(held.values())
    return {p: max(0, min(t, limit_slots - (total_held - held[p]))) for p, t in targets.items()}


def pool_demand(entitlements: list[EntitlementSpec], demand: Mapping[str, Capacity | None], include_spot: bool) -> Capacity:
    total = Capacity()
    for e in entitlements:
        observed = demand.get(e.name)
        if e.service_class.protected:
            total = total + e.baseline
        elif e.service_class is ServiceClass.ELASTIC:
            seen = observed or e.baseline
            total = total + Capacity(*(max(b, o) for b, o in zip(e.baseline.as_tuple(), seen.as_tuple())))
        elif include_spot and observed is not None:
            total = total + observed
    return total


def replicas_for(amount: Capacity, per_replica: Capacity, utilization: float = 1.0) -> int:
    need = 0
    for want, have in zip(amount.as_tuple(), per_replica.as_tuple()):
        if have > 0 and want > 0:
            need = max(need, math.ceil(want / (have * utilization) - 1e-9))
    return need


def protected_floor(pool: PoolSpec, entitlements: list[EntitlementSpec]) -> int:
    """Replicas the Bound baselines need: promised never exceeds provisioned."""
    promised = _total([e.baseline for e in entitlements if e.service_class.has_baseline])
    return replicas_for(promised, pool.per_replica)


def desired_replicas(
    pool: PoolSpec, entitlements: list[EntitlementSpec], demand: Mapping[str, Capacity | None], config: ScalingConfig
) -> int:
    want = replicas_for(pool_demand(entitlements, demand, config.include_spot), pool.per_replica, config.target_utilization)
    want = max(want, protected_floor(pool, entitlements))
    return min(pool.max_replicas, max(pool.min_replicas, want))


def _total(items: list[Capacity]) -> Capacity:
    result = Capacity()
    for item in items:
        result = result + item
    return result


def control_tick(
    pool: PoolSpec,
    entitlements: list[EntitlementSpec],
    previous: Mapping[str, Signals],
    samples: Mapping[str, UsageSample | None],
    capacity: Capacity,
    mean_slo_ms: float,
    backend_waiting: int = 0,
    constants: PolicyConstants = PolicyConstants(),
    limit_config: LimitConfig = LimitConfig(),
    scaling: ScalingConfig = ScalingConfig(),
) -> TickResult:
    """Entitlements are the pool's Bound ones; the others neither get limits nor count towards demand."""
    signals = {e.name: condition(e, previous.get(e.name, Signals()), samples.get(e.name), constants) for e in entitlements}
    priorities = {
        e.name: priority(e.service_class, e.slo_ms, mean_slo_ms, signals[e.name].burst, signals[e.name].debt, constants)
        for e in entitlements
    }
    demand = {e.name: (s.demand if (s := samples.get(e.name)) is not None else None) for e in entitlements}
    allocation = compute_limits(capacity, entitlements, priorities, demand, limit_config, backend_waiting)
    replicas = desired_replicas(pool, entitlements, demand, scaling)
    return TickResult(signals, priorities, allocation.limits, allocation.contended, replicas, allocation.lent)


def build_limit_update(
    pool: str,
    version: int,
    t_ms: int,
    tick: TickResult,
    capacity: Capacity,
    mean_slo_ms: float,
    proxy_demand: Mapping[str, Mapping[str, float]],
    backend_waiting: float = 0.0,
    floor_fraction: float = 0.1,
) -> LimitUpdate:
    """``proxy_demand`` maps proxy id → entitlement → that proxy's recent demand (e.g. attempts in the window);
    every live proxy must appear, with an empty mapping if it saw nothing.
    """
    entitlements = tuple(
        EntitlementLimit(
            name=name,
            priority=tick.priorities[name],
            debt=tick.signals[name].debt,
            burst=tick.signals[name].burst,
            tokens_per_s=limit.tokens_per_s,
            kv_bytes=limit.kv_bytes,
            concurrency=int(limit.concurrency),
        )
        for name, limit in sorted(tick.limits.items())
    )
    proxies: tuple[ProxyShare, ...] = ()
    if proxy_demand:
        shares: dict[str, dict[str, tuple[int, float, float]]] = {p: {} for p in proxy_demand}
        totals = {p: sum(d.values()) for p, d in proxy_demand.items()}
        pool_split = split_across_proxies(capacity, totals, floor_fraction)
        for name, limit in tick.limits.items():
            split = split_across_proxies(limit, {p: d.get(name, 0.0) for p, d in proxy_demand.items()}, floor_fraction)
            for proxy_id, part in split.items():
                shares[proxy_id][name] = (int(part.concurrency), part.tokens_per_s, part.kv_bytes)
        proxies = tuple(
            ProxyShare(proxy_id=p, pool_concurrency=int(pool_split[p].concurrency), entitlements=shares[p])
            for p in sorted(shares)
        )
    return LimitUpdate(
        pool=pool,
        version=version,
        t_ms=t_ms,
        contended=tick.contended,
        backend_waiting=backend_waiting,
        mean_slo_ms=mean_slo_ms,
        capacity_tokens_per_s=capacity.tokens_per_s,
        capacity_kv_bytes=capacity.kv_bytes,
        capacity_concurrency=int(capacity.concurrency),
        entitlements=entitlements,
        proxies=proxies,
    )


def paginate(update: LimitUpdate, page_bytes: int = PAGE_BYTES) -> list[tuple[str, LimitUpdate]]:
    """(record key, page) for every page of ``update``: one page keyed by the pool when it is small, else slices
    of the entitlements (in name order) sized so each page stays under about ``page_bytes``, keyed ``pool``,
    ``pool#1``, ``pool#2``, ... Each page carries the pool's own fields and, in shares mode, every proxy's shares
    of its entitlements only."""
    if page_bytes <= 0:
        raise ValueError(f"`page_bytes` must be positive, got {page_bytes}")
    per = _BYTES_PER_ENTITLEMENT + _BYTES_PER_SHARE * len(update.proxies)
    size = max(1, page_bytes // per)
    slices = [update.entitlements[i:i + size] for i in range(0, len(update.entitlements), size)] or [()]
    if len(slices) == 1:
        return [(update.pool, update)]
    pages = []
    for i, chunk in enumerate(slices):
        names = {e.name for e in chunk}
        proxies = tuple(s.model_copy(update={"entitlements": {n: v for n, v in s.entitlements.items() if n in names}})
                        for s in update.proxies)
        page = update.model_copy(update={"entitlements": chunk, "proxies": proxies, "page": i, "pages": len(slices)})
        pages.append((update.pool if i == 0 else f"{update.pool}#{i}", page))
    return pages


def in_flight_through(state: PoolState, index: int | None = None) -> dict[str, dict[str, int]]:
    """The per-proxy in-flight level at the end of window ``index`` (None: with every tracked event counted)."""
    level = {e: dict(p) for e, p in state.in_flight.items()}
    for i, per_window in state.in_flight_deltas.items():
        if index is None or i <= index:
            for entitlement, per_proxy in per_window.items():
                into = level.setdefault(entitlement, {})
                for proxy, n in per_proxy.items():
                    into[proxy] = into.get(proxy, 0) + n
    return _nonzero({e: {p: max(0, n) for p, n in c.items()} for e, c in level.items()})


def _nonzero(counts: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    kept = {e: {p: n for p, n in c.items() if n} for e, c in counts.items()}
    return {e: c for e, c in kept.items() if c}


def tick(state: PoolState, view: PoolView | None, horizon_ms: int, params: StreamParams,
         proxies: Mapping[str, ProxyHeartbeat] | None = None) -> TickOutput:
    """Close every window whose end + grace ≤ ``horizon_ms``; one control tick per closed window, in order."""
    last = (horizon_ms - params.grace_ms) // state.width_ms - 1
    first = origin(state) if state.closed_through is None else state.closed_through + 1
    if first is None or last < first:
        return TickOutput(state, [], None)
    updates: deque[LimitUpdate] = deque(maxlen=params.max_updates_per_tick)
    effective: deque[list[EffectiveLimit]] = deque(maxlen=params.max_updates_per_tick)
    scale = None
    before = set(state.signals)  # the entitlements the last tick published
    for index in range(first, last + 1):
        state, update, command, records = _tick_window(state, view, index, params, proxies or {})
        if update is not None:
            updates.append(update)
            effective.append(records)
            scale = command
    closed = last - first + 1
    computed = closed if view is not None else 0
    published = [r for window in effective for r in window]
    gone = departed(before, (r.entitlement for r in published), state.signals)
    return TickOutput(state, list(updates), scale, closed, max(0, computed - len(updates)), published, gone)


def _tick_window(state: PoolState, view: PoolView | None, index: int, params: StreamParams,
                 proxies: Mapping[str, ProxyHeartbeat]
                 ) -> tuple[PoolState, LimitUpdate | None, ScaleCommand | None, list[EffectiveLimit]]:
    end_ms = (index + 1) * state.width_ms
    windows: dict[str, core_windows.WindowState] = {}
    samples: dict[str, core_windows.UsageSample | None] = {}
    for name, window in state.windows.items():
        window, closed = core_windows.close(window, end_ms + params.grace_ms, params.grace_ms)
        windows[name] = window
        samples[name] = closed[-1] if closed else None
    attempts = {i: a for i, a in state.attempts.items() if i > index}
    in_window = state.attempts.get(index, {})
    metrics = prune(state.metrics, end_ms)
    if view is None:  # the pool is not (yet) in the specs: keep counting, decide nothing
        return replace(state, closed_through=index, windows=_keep(windows, set()), attempts=attempts,
                       metrics=metrics, in_flight=in_flight_through(state, index),
                       in_flight_deltas={i: d for i, d in state.in_flight_deltas.items() if i > index}), None, None, []
    pool = view.pool
    binding = bind_entitlements(pool, list(view.entitlements), end_ms / 1000.0)
    members = [e for e in view.entitlements if binding[e.name].state is EntitlementState.BOUND]
    mean_slo = state.mean_slo_ms
    if members:
        previous = state.mean_slo_ms if params.mean_slo_frozen else None
        mean_slo = pool_mean_slo_ms(previous, [e.slo_ms for e in members], params.mean_slo_frozen)
    cap = capacity_at(pool, state.metrics, end_ms, params.staleness_ms)
    waiting = cap.backend_waiting or 0.0
    result = control_tick(pool, members, state.signals, samples, cap.capacity, mean_slo or 1.0, math.ceil(waiting),
                          params.constants, params.limit_config, params.scaling)
    demand = _proxy_demand(pool.name, members, in_window, proxies, end_ms, params.heartbeat_ttl_ms)
    shares = demand if params.proxy_shares else {}  # under counts the proxies divide the limits themselves
    update = build_limit_update(pool.name, end_ms, end_ms, result, cap.capacity, mean_slo or 0.0, shares, waiting)
    in_flight = in_flight_through(state, index)
    update = hold_back(update, in_flight, state.granted, state.pool_granted)
    granted, pool_granted = grants_of(update)
    records = effective_limits(update, members, samples, state.width_ms)
    command = ScaleCommand(
        pool=pool.name, version=end_ms, t_ms=end_ms, desired_replicas=result.desired_replicas,
        current_replicas=cap.replicas, floor_replicas=protected_floor(pool, members),
        reason="capacity from backend metrics" if cap.fresh else "backend metrics stale: spec replicas assumed")
    names = {e.name for e in members}
    state = replace(state, closed_through=index, windows=_keep(windows, names), attempts=attempts,
                    signals={e.name: result.signals[e.name] for e in members}, mean_slo_ms=mean_slo,
                    last_version=end_ms, metrics=metrics, in_flight=_of_live(in_flight, set(demand)),
                    in_flight_deltas={i: d for i, d in state.in_flight_deltas.items() if i > index},
                    granted=granted, pool_granted=pool_granted)
    return state, update, command, records


def hold_back(update: LimitUpdate, in_flight: Mapping[str, Mapping[str, int]],
              granted: Mapping[str, Mapping[str, int]] | None = None,
              pool_granted: Mapping[str, int] | None = None) -> LimitUpdate:
    """The update with each proxy's concurrency shares held back to what the other proxies may hold.

    What a proxy may hold is the larger of its in-flight level and its previous grant (``granted``: entitlement →
    proxy → slots of the last update; ``pool_granted``: proxy → pool slots): until this update reaches it, a
    proxy keeps admitting under its previous grant. So a split that moves shrinks the one replica at once and
    lets the other grow on the next tick, into slots the first no longer holds.
    """
    if not update.proxies:
        return update
    granted, pool_granted = granted or {}, pool_granted or {}
    shares = {s.proxy_id: dict(s.entitlements) for s in update.proxies}
    for e in update.entitlements:
        targets = {s.proxy_id: s.entitlements[e.name][0] for s in update.proxies if e.name in s.entitlements}
        levels, before = in_flight.get(e.name, {}), granted.get(e.name, {})
        held = {p: max(levels.get(p, 0), before.get(p, 0)) for p in shares}
        for proxy, slots in hold_back_growth(e.concurrency, targets, held).items():
            _, tokens_per_s, kv_bytes = shares[proxy][e.name]
            shares[proxy][e.name] = (slots, tokens_per_s, kv_bytes)
    pool_held = {p: max(sum(c.get(p, 0) for c in in_flight.values()), pool_granted.get(p, 0)) for p in shares}
    pool_targets = {s.proxy_id: s.pool_concurrency for s in update.proxies}
    pool_shares = hold_back_growth(update.capacity_concurrency, pool_targets, pool_held)
    proxies = tuple(s.model_copy(update={"pool_concurrency": pool_shares[s.proxy_id],
                                         "entitlements": shares[s.proxy_id]}) for s in update.proxies)
    return update.model_copy(update={"proxies": proxies})


def _proxy_demand(pool: str, members: list[EntitlementSpec], in_window: Mapping[str, Mapping[str, int]],
                  proxies: Mapping[str, ProxyHeartbeat], end_ms: int, ttl_ms: int) -> dict[str, dict[str, float]]:
    """Live proxies (seen in the window, or a heartbeat for this pool within the TTL) → attempts per entitlement."""
    live = {p for per_proxy in in_window.values() for p in per_proxy}
    live |= {p.proxy_id for p in proxies.values()
             if pool in p.pools and p.started_ms <= end_ms and end_ms - p.t_ms <= ttl_ms}
    return {
        proxy: {e.name: float(n) for e in members if (n := in_window.get(e.name, {}).get(proxy, 0)) > 0}
        for proxy in sorted(live)
    }
