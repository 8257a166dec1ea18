"""In flight per proxy in the agents' algebra (streams.pool_state): tracked from the events, used by the tick to hold
back a replica's growth until the others have released the slots it is to take (core.limits.hold_back_growth)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.config import load_config_text
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.streams import pool_state as P
from tokenpools.streams import testing as T
from tokenpools.streams.catalogue import Catalogue
from tokenpools.streams.params import StreamParams
from tokenpools.topics.records import CompletionStatus, LimitUpdate, ProxyHeartbeat, RequestCompleted, RequestDecided

BASE_MS = 1_700_000_000_000
PARAMS = StreamParams(width_ms=1000, grace_ms=300, max_updates_per_tick=1000)
VIEW = Catalogue.from_loaded(load_config_text(T.CONFIG_YAML)).view(T.POOL)
EVENTS = T.scripted_events(BASE_MS, PARAMS.width_ms, T.two_class_phases(8))


def decided(rid: str, t_ms: int, proxy: str, entitlement: str = "copilot",
            outcome: AdmissionOutcome = AdmissionOutcome.ADMITTED) -> RequestDecided:
    return RequestDecided(request_id=rid, pool=T.POOL, entitlement=entitlement, proxy_id=proxy, t_ms=t_ms,
                          outcome=outcome, reason=outcome.value, prompt_tokens_est=36, max_tokens=64, cost_tokens=100,
                          kv_bytes=1000, priority=1.0)


def completed(rid: str, t_ms: int, proxy: str, entitlement: str = "copilot") -> RequestCompleted:
    return RequestCompleted(request_id=rid, pool=T.POOL, entitlement=entitlement, proxy_id=proxy, t_ms=t_ms,
                            admitted_t_ms=t_ms - 10, status=CompletionStatus.OK, prompt_tokens=36, completion_tokens=20,
                            reserved_tokens=100, kv_bytes=1000, ttft_s=0.01, e2e_s=0.01)


def fold_tracked(state: P.PoolState, records: list, start_offset: int = 0) -> P.PoolState:
    items = [(r, P.Position("requests/0", start_offset + i, getattr(r, "t_ms", 0) + 3)) for i, r in enumerate(records)]
    state, outcomes = P.apply_events(state, items, PARAMS)
    return P.track_in_flight(state, items, outcomes)


def test_admissions_minus_completions_per_proxy_refusals_and_duplicates_not_counted() -> None:
    t = BASE_MS + 100
    records = [decided("a", t, "p0"), decided("b", t + 1, "p0"), decided("c", t + 2, "p1"),
               decided("r", t + 3, "p1", outcome=AdmissionOutcome.REFUSED_CONCURRENCY), completed("a", t + 50, "p0")]
    state = fold_tracked(P.new(T.POOL, 1000), records)
    assert state.in_flight == {"copilot": {"p0": 1, "p1": 1}}
    again = fold_tracked(state, records)  # the same offsets re-delivered: duplicates
    assert again.in_flight == state.in_flight
    drained = fold_tracked(state, [completed("b", t + 60, "p0"), completed("c", t + 70, "p1")], start_offset=10)
    assert drained.in_flight == {}


def test_a_late_completion_still_ends_its_request() -> None:
    state = fold_tracked(P.new(T.POOL, 1000), [decided("a", BASE_MS + 100, "p0")])
    state = P.tick(state, VIEW, BASE_MS + 5_000, PARAMS).state
    items = [(completed("a", BASE_MS + 500, "p0"), P.Position("completions/0", 0, BASE_MS + 4_000))]
    state, outcomes = P.apply_events(state, items, PARAMS)
    assert outcomes == [P.Outcome.LATE]
    assert P.track_in_flight(state, items, outcomes).in_flight == {}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, len(EVENTS)), max_size=5))
def test_tracking_in_batches_equals_tracking_at_once(cuts: list[int]) -> None:
    items = [(r, P.Position("requests/0", i, ts)) for i, (r, ts) in enumerate(EVENTS)]
    bounds = sorted({0, len(items), *cuts})
    state = P.new(T.POOL, 1000)
    for lo, hi in zip(bounds, bounds[1:]):
        state, outcomes = P.apply_events(state, items[lo:hi], PARAMS)
        state = P.track_in_flight(state, items[lo:hi], outcomes)
    whole, outcomes = P.apply_events(P.new(T.POOL, 1000), items, PARAMS)
    assert state == P.track_in_flight(whole, items, outcomes)
    assert state.in_flight == {}  # every scripted request completes


def shares(update: LimitUpdate, name: str) -> dict[str, int]:
    return {s.proxy_id: s.entitlements[name][0] for s in update.proxies if name in s.entitlements}


def test_the_tick_grows_a_replica_only_into_slots_the_other_released() -> None:
    """copilot (6 slots): p0 asked for almost all of it in the window, but p1 (live: it heartbeats) still holds the
    3 it admitted in the window before."""
    t0 = BASE_MS
    early = [decided(f"old{i}", t0 + 10 + i, "p1") for i in range(3)]  # p1's three, still running
    burst = [decided(f"new{i}", t0 + 1_100 + i, "p0") for i in range(3)] + [
        decided(f"ref{i}", t0 + 1_200 + i, "p0", outcome=AdmissionOutcome.REFUSED_CONCURRENCY) for i in range(12)]
    state = fold_tracked(P.new(T.POOL, 1000), early + burst)
    raw, _ = P.apply_events(P.new(T.POOL, 1000), [(r, P.Position("requests/0", i, r.t_ms + 3))
                                                    for i, r in enumerate(early + burst)], PARAMS)
    horizon = t0 + 2_000 + PARAMS.grace_ms
    beats = {p: ProxyHeartbeat(proxy_id=p, t_ms=t0 + 1_500, pools=(T.POOL,), started_ms=t0) for p in ("p0", "p1")}
    [*_, held] = P.tick(state, VIEW, horizon, PARAMS, beats).updates
    [*_, unheld] = P.tick(raw, VIEW, horizon, PARAMS, beats).updates  # the same events, no in-flight counts
    limit = next(e.concurrency for e in held.entitlements if e.name == "copilot")
    assert shares(unheld, "copilot")["p0"] + 3 > limit, "the raw split would overshoot"
    assert shares(held, "copilot")["p1"] == shares(unheld, "copilot")["p1"], "the shrinking one shrinks at once"
    assert shares(held, "copilot")["p0"] == limit - 3, "the growing one takes only what p1 does not hold"
    in_flight = state.in_flight["copilot"]
    assert sum(max(shares(held, "copilot")[p], in_flight.get(p, 0)) for p in ("p0", "p1")) <= limit
    pool_in_flight = {"p0": 3, "p1": 3}
    assert sum(max(s.pool_concurrency, pool_in_flight[s.proxy_id]) for s in held.proxies) <= held.capacity_concurrency
