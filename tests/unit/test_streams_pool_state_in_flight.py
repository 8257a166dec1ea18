"""In flight per proxy in the agents' algebra (streams.pool_state): tracked from the events, used by the tick to hold
back a replica's growth until the others have released the slots it is to take (core.limits.hold_back_growth)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.config import load_config_text
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.runtime.specs import Catalogue
from tokenpools.streams.table import pool_state
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.views import pool_view
from tokenpools.topics.records import LimitUpdate, ProxyHeartbeat, RequestCompleted, RequestDecided
from tokenpools_dev import builders
from tokenpools_dev.streams import scripted

BASE_MS = 1_700_000_000_000
PARAMS = StreamParams(width_ms=1000, grace_ms=300, max_updates_per_tick=1000, proxy_shares=True)  # the shares mode
VIEW = pool_view(Catalogue.from_loaded(load_config_text(scripted.CONFIG_YAML)), scripted.POOL)
EVENTS = scripted.scripted_events(BASE_MS, PARAMS.width_ms, scripted.two_class_phases(8))


def decided(rid: str, t_ms: int, proxy: str, entitlement: str = "copilot",
            outcome: AdmissionOutcome = AdmissionOutcome.ADMITTED) -> RequestDecided:
    return builders.decided(rid, t_ms, pool=scripted.POOL, entitlement=entitlement, proxy_id=proxy, outcome=outcome)


def completed(rid: str, t_ms: int, proxy: str, entitlement: str = "copilot") -> RequestCompleted:
    return builders.completed(rid, t_ms, pool=scripted.POOL, entitlement=entitlement, proxy_id=proxy,
                              admitted_t_ms=t_ms - 10, ttft_s=0.01, e2e_s=0.01)


def fold_tracked(state: pool_state.PoolState, records: list, start_offset: int = 0) -> pool_state.PoolState:
    items = [(r, pool_state.Position("requests/0", start_offset + i, getattr(r, "t_ms", 0) + 3)) for i, r in enumerate(records)]
    state, outcomes = pool_state.apply_events(state, items, PARAMS)
    return pool_state.track_in_flight(state, items, outcomes)


def test_admissions_minus_completions_per_proxy_refusals_and_duplicates_not_counted() -> None:
    t = BASE_MS + 100
    records = [decided("a", t, "p0"), decided("b", t + 1, "p0"), decided("c", t + 2, "p1"),
               decided("r", t + 3, "p1", outcome=AdmissionOutcome.REFUSED_CONCURRENCY), completed("a", t + 50, "p0")]
    state = fold_tracked(pool_state.new(scripted.POOL, 1000), records)
    assert pool_state.in_flight_through(state) == {"copilot": {"p0": 1, "p1": 1}}
    again = fold_tracked(state, records)  # the same offsets re-delivered: duplicates
    assert again == state
    drained = fold_tracked(state, [completed("b", t + 60, "p0"), completed("c", t + 70, "p1")], start_offset=10)
    assert pool_state.in_flight_through(drained) == {}


def test_a_late_completion_still_ends_its_request() -> None:
    state = fold_tracked(pool_state.new(scripted.POOL, 1000), [decided("a", BASE_MS + 100, "p0")])
    state = pool_state.tick(state, VIEW, BASE_MS + 5_000, PARAMS).state
    items = [(completed("a", BASE_MS + 500, "p0"), pool_state.Position("completions/0", 0, BASE_MS + 4_000))]
    state, outcomes = pool_state.apply_events(state, items, PARAMS)
    assert outcomes == [pool_state.Outcome.LATE]
    assert pool_state.track_in_flight(state, items, outcomes).in_flight == {}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, len(EVENTS)), max_size=5))
def test_tracking_in_batches_equals_tracking_at_once(cuts: list[int]) -> None:
    items = [(r, pool_state.Position("requests/0", i, ts)) for i, (r, ts) in enumerate(EVENTS)]
    bounds = sorted({0, len(items), *cuts})
    state = pool_state.new(scripted.POOL, 1000)
    for lo, hi in zip(bounds, bounds[1:]):
        state, outcomes = pool_state.apply_events(state, items[lo:hi], PARAMS)
        state = pool_state.track_in_flight(state, items[lo:hi], outcomes)
    whole, outcomes = pool_state.apply_events(pool_state.new(scripted.POOL, 1000), items, PARAMS)
    assert state == pool_state.track_in_flight(whole, items, outcomes)
    assert pool_state.in_flight_through(state) == {}  # every scripted request completes


def shares(update: LimitUpdate, name: str) -> dict[str, int]:
    return {s.proxy_id: s.entitlements[name][0] for s in update.proxies if name in s.entitlements}


def test_a_moving_split_shrinks_at_once_and_grows_a_tick_later_into_released_slots() -> None:
    """copilot (16 slots): in window 0 only p1 admits (3 requests that keep running); from window 1 on p0 asks for
    almost everything. Window 1: p1 shrinks at once, but p0 may not take what p1 was granted until p1 has that
    update; window 2: p0 grows into every slot p1 neither holds nor is granted."""
    t0 = BASE_MS
    early = [decided(f"old{i}", t0 + 10 + i, "p1") for i in range(3)]  # p1's three, still running
    burst = [decided(f"new{w}{i}", t0 + w * 1_000 + 100 + i, "p0") for w in (1, 2) for i in range(3)] + [
        decided(f"ref{w}{i}", t0 + w * 1_000 + 200 + i, "p0", outcome=AdmissionOutcome.REFUSED_CONCURRENCY)
        for w in (1, 2) for i in range(12)]
    records = sorted(early + burst, key=lambda r: r.t_ms)
    state = fold_tracked(pool_state.new(scripted.POOL, 1000), records)
    horizon = t0 + 3_000 + PARAMS.grace_ms
    beats = {p: ProxyHeartbeat(proxy_id=p, t_ms=t0 + 2_500, pools=(scripted.POOL,), started_ms=t0) for p in ("p0", "p1")}
    first, moved, grown = pool_state.tick(state, VIEW, horizon, PARAMS, beats).updates
    raw, unheld = state, []  # the split's targets: the same ticks with the hold-back's state wiped before each
    for h in (t0 + 1_000 + PARAMS.grace_ms, t0 + 2_000 + PARAMS.grace_ms, horizon):
        out = pool_state.tick(dataclasses.replace(raw, in_flight={}, in_flight_deltas={}, granted={}, pool_granted={}),
                     VIEW, h, PARAMS, beats)
        raw, unheld = out.state, unheld + out.updates
    _, unheld_moved, unheld_grown = unheld
    limit = next(e.concurrency for e in moved.entitlements if e.name == "copilot")
    was = shares(first, "copilot")
    assert was["p1"] > limit // 2, "window 0's split favours p1"
    assert shares(moved, "copilot")["p1"] == shares(unheld_moved, "copilot")["p1"] < was["p1"], "shrinks at once"
    assert shares(unheld_moved, "copilot")["p0"] + was["p1"] > limit, "the raw split would overshoot"
    assert shares(moved, "copilot")["p0"] == limit - was["p1"], "no growth into what p1 may still admit"
    assert shares(grown, "copilot")["p0"] == min(shares(unheld_grown, "copilot")["p0"],
                                                 limit - max(shares(moved, "copilot")["p1"], 3)), "grows a tick later"
    for update, before in ((moved, first), (grown, moved)):
        held = {p: max(3 if p == "p1" else 0, shares(before, "copilot")[p]) for p in ("p0", "p1")}
        now = shares(update, "copilot")
        assert all(now[p] + max(held[q], now[q]) <= limit for p, q in (("p0", "p1"), ("p1", "p0")) if now[p] > held[p])


@settings(max_examples=25, deadline=None)
@given(st.integers(0, len(EVENTS)))
def test_the_hold_back_depends_on_event_time_only_not_on_when_the_worker_ticked(read: int) -> None:
    """Ticking after reading only part of the events, then reading the rest, gives the same updates as reading
    everything first: in-flight levels are taken at each window's end, like the windows themselves."""
    items = [(r, pool_state.Position("requests/0", i, ts)) for i, (r, ts) in enumerate(EVENTS)]
    end_ms = max(ts for _, ts in EVENTS) + 5_000
    beats = {p: ProxyHeartbeat(proxy_id=p, t_ms=end_ms, pools=(scripted.POOL,), started_ms=BASE_MS) for p in ("proxy-1",)}
    whole, outcomes = pool_state.apply_events(pool_state.new(scripted.POOL, 1000), items, PARAMS)
    reference = pool_state.tick(pool_state.track_in_flight(whole, items, outcomes), VIEW, end_ms, PARAMS, beats).updates
    state, updates = pool_state.new(scripted.POOL, 1000), []
    part, outcomes = pool_state.apply_events(state, items[:read], PARAMS)
    state = pool_state.track_in_flight(part, items[:read], outcomes)
    horizon = max((ts for _, ts in EVENTS[:read]), default=BASE_MS)  # what a caught-up worker may close by then
    updates += pool_state.tick(state, VIEW, horizon, PARAMS, beats).updates
    state = pool_state.tick(state, VIEW, horizon, PARAMS, beats).state
    rest, outcomes = pool_state.apply_events(state, items[read:], PARAMS)
    assert pool_state.Outcome.LATE not in outcomes  # the scripted events arrive in order: the comparison is like for like
    state = pool_state.track_in_flight(rest, items[read:], outcomes)
    updates += pool_state.tick(state, VIEW, end_ms, PARAMS, beats).updates
    assert updates == reference


def test_each_proxys_reserved_tokens_follow_its_requests_and_a_drained_cell_starts_again() -> None:
    """The state keeps, per (entitlement, proxy), the tokens its requests in flight reserved: an admission's cost in,
    a completion's reservation out; refusals and duplicates count nothing. A cell left with nothing in flight is
    dropped, whatever its sum (here a completion of a request the state never saw admitted), and a tick keeps the
    sums as they are."""
    t = BASE_MS + 100
    records = [decided("a", t, "p0"), decided("b", t + 1, "p0"), decided("c", t + 2, "p1"),
               decided("r", t + 3, "p1", outcome=AdmissionOutcome.REFUSED_CONCURRENCY), completed("a", t + 50, "p0")]
    state = fold_tracked(pool_state.new(scripted.POOL, 1000), records)
    assert state.reserved == {"copilot": {"p0": 100, "p1": 100}}
    assert fold_tracked(state, records).reserved == state.reserved  # re-delivered: duplicates
    stray = fold_tracked(state, [completed("b", t + 60, "p0"), completed("x", t + 70, "p0")], start_offset=10)
    assert stray.reserved == {"copilot": {"p1": 100}}
    again = fold_tracked(stray, [decided("d", t + 80, "p0")], start_offset=20)  # -1 + 1: nothing in flight yet
    assert again.reserved == {"copilot": {"p1": 100}}
    after = fold_tracked(again, [decided("e", t + 90, "p0")], start_offset=30)  # from nothing: only its own cost
    assert after.reserved == {"copilot": {"p0": 100, "p1": 100}}
    assert pool_state.tick(after, VIEW, BASE_MS + 1_500, PARAMS).state.reserved == after.reserved


def test_the_reserved_sums_are_the_requests_in_flight_whatever_the_batches() -> None:
    """Over the scripted run, cut anywhere: exactly the cells with requests in flight have a sum, and it is the cost
    of their admitted requests not yet completed (every request reserves what its completion gives back)."""
    items = [(r, pool_state.Position("requests/0", i, ts)) for i, (r, ts) in enumerate(EVENTS)]
    for cut in (len(items) // 3, len(items) // 2, len(items)):
        state, outcomes = pool_state.apply_events(pool_state.new(scripted.POOL, PARAMS.width_ms), items[:cut], PARAMS)
        state = pool_state.track_in_flight(state, items[:cut], outcomes)
        open_cost: dict[tuple[str, str], int] = {}
        for record, _ in items[:cut]:
            if isinstance(record, RequestDecided) and record.outcome is AdmissionOutcome.ADMITTED:
                key = (record.entitlement, record.proxy_id)
                open_cost[key] = open_cost.get(key, 0) + record.cost_tokens
            elif isinstance(record, RequestCompleted):
                key = (record.entitlement, record.proxy_id)
                open_cost[key] = open_cost.get(key, 0) - record.reserved_tokens
        in_flight = pool_state.in_flight_through(state)
        assert bool(in_flight) == (cut < len(items))  # the run ends drained
        assert {(e, p): n for e, c in state.reserved.items() for p, n in c.items()} == {
            (e, p): open_cost[e, p] for e, c in in_flight.items() for p in c}
