"""The reworked tick equals the one it replaced (``tick_reference_support``), output for output, on random pools.

The rework computes the limits in plain numbers, splits each limit across the proxies once per group of equal
demand fraction, holds back on lists aligned by proxy and builds the records once; none of it may change a number.
Outputs are compared as objects and as the bytes they encode to (``1 == 1.0``, but not on the wire): limit updates,
effective limits, scale commands, the pool state as stored.
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

import tick_reference_support
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState, ServiceClass
from tokenpools.core.limits import LimitConfig, compute_limits
from tokenpools.core.split import hold_back_growth, split_across_proxies
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.scaling import ScalingConfig, desired_replicas, pool_demand, protected_floor
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.tick import Signals, TickResult
from tokenpools.streams.table import pool_state
from tokenpools.streams.table import state as table_state
from tokenpools.streams.table.batch import fold
from tokenpools.streams.table.params import StreamParams
from tokenpools.topics.codec import encode
from tokenpools.topics.limits import build_limit_update, paginate
from tokenpools.topics.records import (
    BackendMetricsSample,
    EntitlementLimit,
    LimitUpdate,
    ProxyHeartbeat,
    ProxyShare,
    RequestCompleted,
    RequestDecided,
)

PROPERTY = settings(max_examples=150, deadline=None)
POOLS = settings(max_examples=60, deadline=None)
BASE_MS = 1_700_000_000_000
WIDTH_MS = 1000
POOL = "pool"
FLOORS = st.sampled_from([0.0, 0.1, 0.5, 1.0]) | st.floats(0.0, 1.0)


def same(a: object, b: object) -> bool:
    """Equal, and equal as text (so an int where a float was, or -0.0 where 0.0 was, is a difference)."""
    return a == b and repr(a) == repr(b)


# ---- the parts ----------------------------------------------------------------------------------------------

@PROPERTY
@given(data=st.data())
def test_limits_equal_the_reference(core, data: st.DataObject) -> None:  # noqa: ANN001
    case = data.draw(core.limits_case(max_entitlements=12))
    entitlements = data.draw(st.permutations(case.entitlements))
    config = LimitConfig(lend_idle_protected=case.lend_idle_protected, burst_headroom=case.burst_headroom)
    waiting = data.draw(st.integers(0, 2))
    new = compute_limits(case.capacity, entitlements, case.priorities, case.demand, config, waiting)
    old = tick_reference_support.compute_limits(case.capacity, entitlements, case.priorities, case.demand, config, waiting)
    assert same(new, old)


@PROPERTY
@given(data=st.data(), include_spot=st.booleans())
def test_scaling_equals_the_reference(core, data: st.DataObject, include_spot: bool) -> None:  # noqa: ANN001
    case = data.draw(core.limits_case(max_entitlements=12))
    per_replica = Capacity(case.capacity.tokens_per_s / 4, case.capacity.kv_bytes / 4,
                           float(max(1, int(case.capacity.concurrency) // 4)))
    pool = PoolSpec(POOL, "m", per_replica, min_replicas=1, max_replicas=64, replicas=4)
    config = ScalingConfig(include_spot=include_spot)
    assert same(pool_demand(case.entitlements, case.demand, include_spot),
                tick_reference_support.pool_demand(case.entitlements, case.demand, include_spot))
    assert protected_floor(pool, case.entitlements) == tick_reference_support.protected_floor(pool, case.entitlements)
    assert desired_replicas(pool, case.entitlements, case.demand, config) == \
        tick_reference_support.desired_replicas(pool, case.entitlements, case.demand, config)


SHARES = (st.sampled_from([0.0, 1.0, 2.0, 3.0, 0, 5]) | st.floats(-1.0, 1e4) | st.just(1e-300)
          | st.just(math.nan))


@PROPERTY
@given(limit=st.builds(Capacity, st.floats(0.0, 1e4), st.floats(0.0, 1e12), st.integers(0, 60).map(float)),
       shares=st.dictionaries(st.integers(0, 30).map(lambda i: f"proxy-{i:02d}"), SHARES, max_size=25),
       floor_fraction=FLOORS)
def test_the_split_equals_the_reference(limit: Capacity, shares: dict[str, float], floor_fraction: float) -> None:
    """Many proxies of equal demand (0 above all), a few with their own: the groups the split works on."""
    assert same(split_across_proxies(limit, shares, floor_fraction),
                tick_reference_support.split_across_proxies(limit, shares, floor_fraction))


@PROPERTY
@given(limit=st.integers(0, 40), targets=st.dictionaries(st.sampled_from("abcdefgh"), st.integers(0, 12)),
       held=st.dictionaries(st.sampled_from("abcdefghij"), st.integers(0, 12)))
def test_the_hold_back_equals_the_reference(limit: int, targets: dict[str, int], held: dict[str, int]) -> None:
    assert same(hold_back_growth(limit, targets, held), tick_reference_support.hold_back_growth(limit, targets, held))


@st.composite
def ticks(draw: st.DrawFn) -> TickResult:
    names = draw(st.lists(st.sampled_from([f"e{i}" for i in range(12)]), min_size=1, max_size=8, unique=True))
    limits = {n: draw(st.builds(Capacity, st.floats(0.0, 1e4), st.floats(0.0, 1e12), st.integers(0, 40).map(float)))
              for n in names}
    return TickResult(
        signals={n: Signals(draw(st.floats(0.0, 3.0)), draw(st.floats(-1.0, 1.0))) for n in names},
        priorities={n: draw(st.floats(0.001, 5000.0)) for n in names}, limits=limits,
        contended=draw(st.booleans()), desired_replicas=1, lent=Capacity())


@PROPERTY
@given(tick=ticks(), data=st.data(), floor_fraction=FLOORS)
def test_the_limit_update_equals_the_reference(tick: TickResult, data: st.DataObject, floor_fraction: float) -> None:
    proxies = data.draw(st.lists(st.sampled_from([f"p{i}" for i in range(10)]), max_size=8, unique=True))
    names = [*tick.limits, "not-in-the-tick"]
    demand = {p: data.draw(st.dictionaries(st.sampled_from(names), st.integers(1, 9).map(float) | st.floats(0, 5)))
              for p in proxies}
    capacity = data.draw(st.builds(Capacity, st.floats(0.0, 1e5), st.floats(0.0, 1e13), st.integers(0, 200).map(float)))
    new = build_limit_update(POOL, 7, 7, tick, capacity, 1234.5, demand, 2.0, floor_fraction)
    old = tick_reference_support.build_limit_update(POOL, 7, 7, tick, capacity, 1234.5, demand, 2.0, floor_fraction)
    assert new == old and encode(new) == encode(old)


@settings(max_examples=25, deadline=None)
@given(entitlements=st.integers(0, 400), proxies=st.sampled_from([0, 1, 3, 40]),
       page_bytes=st.sampled_from([2_000, 20_000, 64_000]))
def test_the_pages_equal_the_reference(entitlements: int, proxies: int, page_bytes: int) -> None:
    names = [f"tenant-{i:04d}" for i in range(entitlements)]
    update = LimitUpdate(
        pool=POOL, version=9, t_ms=9, contended=False, mean_slo_ms=1.0, capacity_tokens_per_s=1.0,
        capacity_kv_bytes=1.0, capacity_concurrency=8,
        entitlements=tuple(EntitlementLimit(name=n, priority=1.0, debt=0.0, burst=0.0, tokens_per_s=float(i),
                                            kv_bytes=2.0, concurrency=i % 7) for i, n in enumerate(names)),
        proxies=tuple(ProxyShare(proxy_id=f"p{j}", pool_concurrency=j,
                                 entitlements={n: (j % 3, float(i), 0.5) for i, n in enumerate(reversed(names))
                                               if (i + j) % 5})
                      for j in range(proxies)))
    new, old = paginate(update, page_bytes), tick_reference_support.paginate(update, page_bytes)
    assert [(k, encode(p)) for k, p in new] == [(k, encode(p)) for k, p in old] and new == old


# ---- whole pools --------------------------------------------------------------------------------------------

CLASSES = st.sampled_from(list(ServiceClass))


@st.composite
def entitlement(draw: st.DrawFn, name: str, per_replica: Capacity) -> EntitlementSpec:
    cls = draw(CLASSES)
    baseline = Capacity()
    if cls.has_baseline:
        f = draw(st.sampled_from([0.05, 0.25, 1.0, 3.0]))
        baseline = Capacity(per_replica.tokens_per_s * f, per_replica.kv_bytes * f,
                            float(max(1, math.ceil(per_replica.concurrency * f))))
    ceiling = None
    if cls is not ServiceClass.GUARANTEED and draw(st.booleans()):
        ceiling = baseline + Capacity(draw(st.floats(0.0, 500.0)), draw(st.floats(0.0, 1e10)),
                                      float(draw(st.integers(0, 20))))
    return EntitlementSpec(name, POOL, cls, draw(st.sampled_from([200.0, 500.0, 5_000.0, 30_000.0])), baseline,
                           burst_ceiling=ceiling,
                           expires_at_s=draw(st.sampled_from([None, None, None, BASE_MS / 1000 + 2.5])),
                           state=draw(st.sampled_from([EntitlementState.BOUND] * 5 + [EntitlementState.PENDING])))


@st.composite
def pools(draw: st.DrawFn) -> tuple[pool_state.PoolView, list, StreamParams, dict[str, ProxyHeartbeat], list[int]]:
    """A pool, its entitlements (some not Bound, some expiring), events over five windows at a few proxies,
    backend metrics, heartbeats, the parameters (shares or counts) and the horizons the timer ticks at."""
    per_replica = Capacity(draw(st.sampled_from([240.0, 1000.0])), draw(st.sampled_from([16.0 * 2**30, 4e9])),
                           float(draw(st.integers(1, 32))))
    pool = PoolSpec(POOL, "m", per_replica, min_replicas=1, max_replicas=draw(st.integers(1, 8)), replicas=1)
    names = [f"e{i}" for i in range(draw(st.integers(1, 10)))]
    specs = tuple(draw(entitlement(n, per_replica)) for n in names)
    proxies = [f"proxy-{i}" for i in range(draw(st.integers(1, 7)))]
    events: list[tuple[object, int]] = []
    for k in range(draw(st.integers(0, 60))):
        w, t = draw(st.integers(0, 4)), draw(st.integers(0, WIDTH_MS - 1))
        t_ms, name, proxy = BASE_MS + w * WIDTH_MS + t, draw(st.sampled_from(names)), draw(st.sampled_from(proxies))
        kind = draw(st.sampled_from(["admitted", "admitted", "refused", "completed"]))
        if kind == "completed":
            events.append((RequestCompleted(
                request_id=f"r{k}", pool=POOL, entitlement=name, proxy_id=proxy, t_ms=t_ms, admitted_t_ms=t_ms,
                status="ok", prompt_tokens=draw(st.integers(0, 500)), completion_tokens=draw(st.integers(0, 500)),
                reserved_tokens=100, kv_bytes=draw(st.integers(0, 10**8)), ttft_s=0.1, e2e_s=0.2), t_ms))
        else:
            admitted = kind == "admitted"
            events.append((RequestDecided(
                request_id=f"r{k}", pool=POOL, entitlement=name, proxy_id=proxy, t_ms=t_ms,
                outcome=AdmissionOutcome.ADMITTED if admitted else AdmissionOutcome.REFUSED_CONCURRENCY,
                reason="x", prompt_tokens_est=10, max_tokens=10, cost_tokens=draw(st.integers(0, 2000)),
                kv_bytes=draw(st.integers(0, 10**8)) if admitted else 0, priority=1.0), t_ms))
    for w in draw(st.lists(st.integers(0, 4), max_size=3)):
        t_ms = BASE_MS + w * WIDTH_MS + 100
        events.append((BackendMetricsSample(pool=POOL, t_ms=t_ms, replicas_ready=draw(st.none() | st.integers(0, 8)),
                                            waiting=draw(st.none() | st.floats(0.0, 5.0))), t_ms))
    events.sort(key=lambda e: e[1])
    beats = {p: ProxyHeartbeat(proxy_id=p, t_ms=BASE_MS + draw(st.sampled_from([0, 3000, -60_000])),
                               pools=draw(st.sampled_from([(POOL,), ("other",)])), started_ms=BASE_MS - 1000)
             for p in draw(st.lists(st.sampled_from([*proxies, "proxy-idle"]), unique=True))}
    params = StreamParams(width_ms=WIDTH_MS, grace_ms=300, proxy_shares=draw(st.booleans()),
                          mean_slo_frozen=draw(st.booleans()), max_updates_per_tick=draw(st.sampled_from([1, 12])),
                          limit_config=LimitConfig(draw(st.booleans()), draw(st.sampled_from([0.0, 0.25]))))
    horizons = sorted(draw(st.lists(st.integers(BASE_MS, BASE_MS + 7 * WIDTH_MS), min_size=1, max_size=4)))
    return pool_state.PoolView(pool, specs), events, params, beats, horizons


@POOLS
@given(pools())
def test_a_pool_ticks_as_it_did(case: tuple[pool_state.PoolView, list, StreamParams, dict[str, ProxyHeartbeat], list[int]]
                                ) -> None:
    """Every window closed over the timer's horizons: the same updates, records, scale commands and states."""
    view, events, params, beats, horizons = case
    items = [(record, pool_state.Position("requests/0", i, ts)) for i, (record, ts) in enumerate(events)]
    state, outcomes = fold(pool_state.new(POOL, WIDTH_MS), items, params)
    new = old = pool_state.track_in_flight(state, items, outcomes)
    for horizon in horizons:
        a, b = pool_state.tick(new, view, horizon, params, beats), tick_reference_support.tick(old, view, horizon, params, beats)
        assert a == b
        assert [encode(u) for u in a.updates] == [encode(u) for u in b.updates]
        assert [encode(r) for r in a.effective] == [encode(r) for r in b.effective]
        assert (a.scale and encode(a.scale)) == (b.scale and encode(b.scale))
        assert table_state.to_dict(a.state) == table_state.to_dict(b.state)
        new, old = a.state, b.state
