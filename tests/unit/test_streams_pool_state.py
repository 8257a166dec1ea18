"""The per-pool algebra of the stream agents (streams.pool_state), as pure code: no Faust, no Kafka, no clock."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.config import load_config_text
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.runtime.specs import Catalogue
from tokenpools.streams.table import pool_state
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.views import pool_view
from tokenpools.topics.records import BackendMetricsSample, ProxyHeartbeat
from tokenpools_dev import builders
from tokenpools_dev.streams import scripted

BASE_MS = 1_700_000_000_000  # a multiple of every width used here
PARAMS = StreamParams(width_ms=1000, grace_ms=300, max_updates_per_tick=1000, proxy_shares=True)  # the shares mode
LOADED = load_config_text(scripted.CONFIG_YAML)
VIEW = pool_view(Catalogue.from_loaded(LOADED), scripted.POOL)
EVENTS = scripted.scripted_events(BASE_MS, PARAMS.width_ms, scripted.two_class_phases(8))
END_MS = BASE_MS + 12_000


def fold(events, params=PARAMS, start=None, track_in_flight=True):
    state = start or pool_state.new(scripted.POOL, params.width_ms)
    for i, (record, ts) in enumerate(events):
        position = pool_state.Position("requests/0", i, ts)
        state, outcome = pool_state.apply_event(state, record, params, position)
        if track_in_flight:  # as the agent does after each fold
            state = pool_state.track_in_flight(state, [(record, position)], [outcome])
    return state


def positioned(events):
    return [(r, pool_state.Position("requests/0", i, ts)) for i, (r, ts) in enumerate(events)]


def decided(t_ms, entitlement="copilot", proxy="proxy-1", outcome=AdmissionOutcome.ADMITTED, cost=100):
    return builders.decided(f"r{t_ms}", t_ms, pool=scripted.POOL, entitlement=entitlement, proxy_id=proxy,
                            outcome=outcome, cost_tokens=cost, kv_bytes=cost * 10)


def test_limit_updates_equal_the_core_run_directly():
    """The scripted two-class stream gives, window for window, what the core's functions give on the same input."""
    out = pool_state.tick(fold(EVENTS), VIEW, END_MS, PARAMS)
    expected = scripted.reference_updates(LOADED.pools[scripted.POOL], LOADED.entitlements_of(scripted.POOL), [r for r, _ in EVENTS],
                                   PARAMS, (END_MS - PARAMS.grace_ms) // PARAMS.width_ms - 1)
    assert out.updates == expected
    versions = [u.version for u in out.updates]
    assert versions == sorted(set(versions)) and all(u.t_ms == u.version for u in out.updates)
    assert {e.name for e in out.updates[-1].entitlements} == {"copilot", "batch"}
    assert any(u.contended for u in out.updates) and not out.updates[0].contended


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, len(EVENTS)), max_size=6))
def test_one_call_with_many_events_equals_many_calls(cuts):
    """apply_events over the whole stream == the same events in any split of batches, one by one."""
    bounds = sorted({0, len(EVENTS), *cuts})
    items = positioned(EVENTS)
    whole, outcomes = pool_state.apply_events(pool_state.new(scripted.POOL, 1000), items, PARAMS)
    state = pool_state.new(scripted.POOL, 1000)
    for lo, hi in zip(bounds, bounds[1:]):
        state, _ = pool_state.apply_events(state, items[lo:hi], PARAMS)
    assert state == whole
    assert pool_state.track_in_flight(whole, items, outcomes) == fold(EVENTS)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(BASE_MS, END_MS), max_size=8))
def test_ticks_spread_over_time_give_the_updates_of_one_tick(horizons):
    """Whatever the timer's schedule (many small ticks, one catch-up tick), the updates and the state are the same."""
    state = fold(EVENTS)
    spread = []
    for h in sorted(horizons) + [END_MS]:
        out = pool_state.tick(state, VIEW, h, PARAMS)
        state = out.state
        spread += out.updates
    once = pool_state.tick(fold(EVENTS), VIEW, END_MS, PARAMS)
    assert spread == once.updates and state == once.state


def test_interleaved_events_and_ticks_equal_events_first():
    """The live order (events, a tick at each deadline, more events) gives what events-then-one-tick gives."""
    state = pool_state.new(scripted.POOL, 1000)
    live = []
    next_deadline = BASE_MS + PARAMS.width_ms + PARAMS.grace_ms
    for i, (record, ts) in enumerate(EVENTS):
        while ts >= next_deadline:
            out = pool_state.tick(state, VIEW, next_deadline, PARAMS)
            state, live = out.state, live + out.updates
            next_deadline += PARAMS.width_ms
        position = pool_state.Position("requests/0", i, ts)
        state, outcome = pool_state.apply_event(state, record, PARAMS, position)
        assert outcome is pool_state.Outcome.APPLIED
        state = pool_state.track_in_flight(state, [(record, position)], [outcome])  # in-flight levels are event time too
    out = pool_state.tick(state, VIEW, END_MS, PARAMS)
    assert live + out.updates == pool_state.tick(fold(EVENTS), VIEW, END_MS, PARAMS).updates


def test_out_of_order_within_grace_counts_in_its_window_later_is_late():
    w, g = PARAMS.width_ms, PARAMS.grace_ms
    state, outcome = pool_state.apply_event(pool_state.new(scripted.POOL, w), decided(BASE_MS + 1500), PARAMS, pool_state.Position("r/0", 1, BASE_MS + 1501))
    # an event of the previous window, arriving inside its grace: counted there
    state, outcome = pool_state.apply_event(state, decided(BASE_MS + 900), PARAMS, pool_state.Position("r/0", 2, BASE_MS + w + g - 1))
    assert outcome is pool_state.Outcome.APPLIED
    assert state.windows["copilot"].buckets[(BASE_MS + 900) // w].admitted == 1
    # stamped by Kafka at the deadline: late even though no tick closed its window yet
    state, outcome = pool_state.apply_event(state, decided(BASE_MS + 950), PARAMS, pool_state.Position("r/0", 3, BASE_MS + w + g))
    assert outcome is pool_state.Outcome.LATE
    # after the tick closed the window, an event for it is late whatever its timestamp
    state = pool_state.tick(state, VIEW, BASE_MS + w + g, PARAMS).state
    assert state.closed_through == BASE_MS // w
    late, outcome = pool_state.apply_event(state, decided(BASE_MS + 999), PARAMS, pool_state.Position("r/0", 4, None))
    assert outcome is pool_state.Outcome.LATE and late.windows == state.windows


def test_redelivered_offsets_are_skipped():
    state = fold(EVENTS[:50])
    again, outcomes = pool_state.apply_events(state, positioned(EVENTS)[:50], PARAMS)
    assert set(outcomes) == {pool_state.Outcome.DUPLICATE} and again == state
    other_partition, outcome = pool_state.apply_event(state, EVENTS[10][0], PARAMS, pool_state.Position("requests/1", 3, EVENTS[10][1]))
    assert outcome is pool_state.Outcome.APPLIED


def test_unknown_key_and_other_pools_are_ignored():
    state = pool_state.new(scripted.POOL, 1000)
    state, a = pool_state.apply_event(state, decided(BASE_MS, entitlement=None), PARAMS)
    state, b = pool_state.apply_event(state, decided(BASE_MS).model_copy(update={"pool": "other"}), PARAMS)
    assert a is b is pool_state.Outcome.IGNORED and state == pool_state.new(scripted.POOL, 1000)


def test_first_tick_starts_at_the_first_event_not_at_the_wall_clock():
    state = fold([(decided(BASE_MS + 5_500), BASE_MS + 5_500)])
    assert pool_state.tick(state, VIEW, BASE_MS + 5_000, PARAMS).updates == []
    out = pool_state.tick(state, VIEW, BASE_MS + 60_000, PARAMS)
    assert out.updates[0].version == BASE_MS + 6_000  # the window of the first event, however late the tick
    assert out.windows == 59 - 5


def test_an_entitlement_unseen_so_far_is_unknown_demand_not_zero():
    """Before its first event an entitlement's sample is None: the core assumes it wants its baseline."""
    state = fold([(decided(BASE_MS + 100, "batch"), BASE_MS + 100), (decided(BASE_MS + 3_100), BASE_MS + 3_100)])
    out = pool_state.tick(state, VIEW, BASE_MS + 5_000, PARAMS)
    copilot_before = [next(e for e in u.entitlements if e.name == "copilot") for u in out.updates[:3]]
    static = pool_state.tick(fold([(decided(BASE_MS + 100, "batch"), BASE_MS + 100)]), VIEW, BASE_MS + 4_000, PARAMS)
    assert copilot_before == [next(e for e in u.entitlements if e.name == "copilot") for u in static.updates]
    assert all(e.concurrency >= 6 for e in copilot_before)  # its baseline is kept for it


def test_catch_up_returns_only_the_newest_updates_but_computes_all():
    few = dataclasses.replace(PARAMS, max_updates_per_tick=3)
    full = pool_state.tick(fold(EVENTS), VIEW, END_MS, PARAMS)
    capped = pool_state.tick(fold(EVENTS, few), VIEW, END_MS, few)
    assert capped.updates == full.updates[-3:] and capped.skipped == len(full.updates) - 3
    assert capped.state == full.state
    assert capped.scale == full.scale and capped.scale.version == full.updates[-1].version


def test_scale_command_uses_the_same_model():
    out = pool_state.tick(fold(EVENTS), VIEW, END_MS, PARAMS)
    assert out.scale is not None
    assert out.scale.floor_replicas == 1 and 1 <= out.scale.desired_replicas <= 4
    assert out.scale.current_replicas == 1  # replicas_ready from the fresh metrics samples


def test_per_proxy_shares_follow_attempts_and_heartbeats():
    # the split alone (no in-flight levels: 40 admissions still running would rightly hold every share back)
    state = fold([(decided(BASE_MS + i * 10, proxy="proxy-1" if i % 4 else "proxy-2"), BASE_MS + i * 10)
                  for i in range(40)], track_in_flight=False)
    beats = {
        "proxy-3": ProxyHeartbeat(proxy_id="proxy-3", t_ms=BASE_MS + 500, pools=(scripted.POOL,), started_ms=BASE_MS),
        "gone": ProxyHeartbeat(proxy_id="gone", t_ms=BASE_MS - 60_000, pools=(scripted.POOL,), started_ms=0),
        "elsewhere": ProxyHeartbeat(proxy_id="elsewhere", t_ms=BASE_MS, pools=("other",), started_ms=0),
    }
    update = pool_state.tick(state, VIEW, BASE_MS + 1_300, PARAMS, beats).updates[0]
    shares = {p.proxy_id: p.entitlements["copilot"] for p in update.proxies}
    assert set(shares) == {"proxy-1", "proxy-2", "proxy-3"}
    copilot = next(e for e in update.entitlements if e.name == "copilot")
    assert sum(s[0] for s in shares.values()) == copilot.concurrency
    assert shares["proxy-1"][1] > shares["proxy-2"][1] > shares["proxy-3"][1] > 0


def test_under_counts_an_update_carries_the_fleet_limits_alone_whatever_the_proxies():
    """policy.fleet_enforcement = counts (the default): the proxies divide the limits themselves, so the update
    has no per-proxy shares (its size does not grow with the proxies) and the state keeps no grants."""
    state = fold([(decided(BASE_MS + i * 10, proxy=f"proxy-{i % 7}"), BASE_MS + i * 10) for i in range(40)])
    counts = dataclasses.replace(PARAMS, proxy_shares=False)
    out = pool_state.tick(state, VIEW, BASE_MS + 1_300, counts)
    shared = pool_state.tick(state, VIEW, BASE_MS + 1_300, PARAMS)
    assert out.updates[0].proxies == () and out.state.granted == {} and out.state.pool_granted == {}
    assert out.updates[0].entitlements == shared.updates[0].entitlements  # the same fleet-wide limits
    assert len(shared.updates[0].proxies) == 7


def test_not_bound_entitlements_get_no_limits_and_mean_slo_is_frozen():
    degraded = dataclasses.replace(VIEW, entitlements=tuple(
        dataclasses.replace(e, state=e.state.__class__("Degraded")) if e.name == "batch" else e
        for e in VIEW.entitlements))
    state = fold(EVENTS)
    out = pool_state.tick(state, VIEW, BASE_MS + 3_000, PARAMS)
    assert out.updates[-1].mean_slo_ms == (500 + 30_000) / 2
    later = pool_state.tick(out.state, degraded, END_MS, PARAMS)
    assert {e.name for e in later.updates[-1].entitlements} == {"copilot"}
    assert later.updates[-1].mean_slo_ms == (500 + 30_000) / 2  # frozen: the first value stays
    recompute = dataclasses.replace(PARAMS, mean_slo_frozen=False)
    assert pool_state.tick(out.state, degraded, END_MS, recompute).updates[-1].mean_slo_ms == 500


def test_unknown_pool_keeps_counting_and_decides_nothing():
    out = pool_state.tick(fold(EVENTS), None, END_MS, PARAMS)
    assert out.updates == [] and out.scale is None and out.state.closed_through is not None
    assert out.effective == out.departed == []


def test_each_update_comes_with_its_entitlements_effective_limits():
    out = pool_state.tick(fold(EVENTS), VIEW, END_MS, PARAMS)
    assert len(out.effective) == sum(len(u.entitlements) for u in out.updates) and out.departed == []
    by_version = {}
    for record in out.effective:
        by_version.setdefault(record.version, []).append(record)
    assert sorted(by_version) == [u.version for u in out.updates]
    for update in out.updates:
        records = by_version[update.version]
        assert [(r.entitlement, r.limit.concurrency, r.limit.tokens_per_s, r.limit.kv_bytes, r.priority, r.debt,
                 r.burst, r.contended) for r in records] == [
            (e.name, e.concurrency, e.tokens_per_s, e.kv_bytes, e.priority, e.debt, e.burst, update.contended)
            for e in update.entitlements]
        assert all(r.window_end_ms - r.window_start_ms == PARAMS.width_ms for r in records)
    last = {r.entitlement: r for r in out.effective if r.version == out.updates[-1].version}
    specs = {e.name: e for e in VIEW.entitlements}
    assert {n: (r.service_class, r.baseline.tokens_per_s) for n, r in last.items()} == {
        n: (specs[n].service_class, specs[n].baseline.tokens_per_s) for n in last}
    measured = [r.measured for r in out.effective if r.measured is not None]
    assert measured and sum(m.admitted for m in measured) > 0  # the scripted traffic, as the windows counted it


def test_catch_up_keeps_the_effective_limits_of_the_updates_it_returns():
    few = dataclasses.replace(PARAMS, max_updates_per_tick=3)
    full = pool_state.tick(fold(EVENTS), VIEW, END_MS, PARAMS)
    capped = pool_state.tick(fold(EVENTS, few), VIEW, END_MS, few)
    versions = {u.version for u in capped.updates}
    assert capped.effective == [r for r in full.effective if r.version in versions]


def test_an_entitlement_that_leaves_the_pools_ticks_is_departed_once():
    degraded = dataclasses.replace(VIEW, entitlements=tuple(
        dataclasses.replace(e, state=e.state.__class__("Degraded")) if e.name == "batch" else e
        for e in VIEW.entitlements))
    out = pool_state.tick(fold(EVENTS), VIEW, BASE_MS + 3_000, PARAMS)
    assert {r.entitlement for r in out.effective} == {"copilot", "batch"} and out.departed == []
    later = pool_state.tick(out.state, degraded, BASE_MS + 6_000, PARAMS)
    assert later.departed == ["batch"] and {r.entitlement for r in later.effective} == {"copilot"}
    again = pool_state.tick(later.state, degraded, END_MS, PARAMS)
    assert again.departed == [] and again.effective
    back = pool_state.tick(again.state, VIEW, END_MS + 2_000, PARAMS)
    assert back.departed == [] and "batch" in {r.entitlement for r in back.effective}


def test_stale_metrics_mean_spec_replicas_never_zero():
    stale = [(BackendMetricsSample(pool=scripted.POOL, t_ms=BASE_MS, replicas_ready=0, waiting=9.0), BASE_MS),
             (decided(BASE_MS + 30_100), BASE_MS + 30_100)]
    out = pool_state.tick(fold(stale), VIEW, BASE_MS + 31_300, PARAMS)
    fresh_zero, stale_spec = out.updates[0], out.updates[-1]
    assert fresh_zero.capacity_concurrency == 0 and fresh_zero.contended and fresh_zero.backend_waiting == 9.0
    assert stale_spec.capacity_concurrency == 16 and stale_spec.backend_waiting == 0  # unknown, not zero
    assert out.scale.reason.startswith("backend metrics stale")


@pytest.mark.parametrize("width", [0, -5])
def test_width_must_be_positive(width):
    with pytest.raises(ValueError, match="width_ms"):
        pool_state.new(scripted.POOL, width)


@st.composite
def event_items(draw):
    """Random decisions, completions and metrics around a few windows, with repeats, late and foreign records."""
    items, offset = [], 0
    for _ in range(draw(st.integers(0, 60))):
        t = BASE_MS + draw(st.integers(0, 6_000))
        kind = draw(st.sampled_from(["admitted", "refused", "completed", "metrics", "foreign", "unknown_key"]))
        entitlement = draw(st.sampled_from(["copilot", "batch"]))
        if kind == "completed":
            record = next(r for r, _ in EVENTS if r.record_type == "request_completed").model_copy(
                update={"t_ms": t, "entitlement": entitlement, "kv_bytes": draw(st.integers(0, 10**7)),
                        "completion_tokens": draw(st.integers(0, 64))})
        elif kind == "metrics":
            record = BackendMetricsSample(pool=scripted.POOL, t_ms=t, replicas_ready=draw(st.integers(0, 3)))
        else:
            outcome = (draw(st.sampled_from([AdmissionOutcome.REFUSED_KV, AdmissionOutcome.REFUSED_BUDGET,
                                             AdmissionOutcome.BUDGET_UNAVAILABLE]))
                       if kind == "refused" else AdmissionOutcome.ADMITTED)
            record = decided(t, entitlement if kind != "unknown_key" else None, draw(st.sampled_from(["p1", "p2"])),
                             outcome, draw(st.integers(0, 500)))
            if kind == "foreign":
                record = record.model_copy(update={"pool": "other"})
        if kind in ("admitted", "refused", "completed", "foreign") and draw(st.booleans()):
            # an identity (core.resends) from a small range: repeats (re-sends), gaps and out-of-order numbers
            record = record.model_copy(update={"proxy_id": draw(st.sampled_from(["p1", "p2"])),
                                               "proxy_start_ms": draw(st.sampled_from([1, 2])),
                                               "sequence": draw(st.integers(1, 6))})
        offset += draw(st.sampled_from([1, 1, 1, 0, -2]))  # some re-deliveries
        timestamp = draw(st.one_of(st.none(), st.integers(t, t + 3_000)))
        items.append((record, pool_state.Position(draw(st.sampled_from(["r/0", "c/0"])), max(0, offset), timestamp)))
    return items


@settings(max_examples=80, deadline=None)
@given(event_items(), event_items(), st.integers(BASE_MS, BASE_MS + 5_000))
def test_the_batch_fold_equals_the_reference_fold(first, second, horizon_ms):
    """streams.batch.fold (the agent's fast path) == apply_event one by one (through core.windows.add), bit for bit,
    including duplicates (by offset and by identity), late events, foreign pools and unknown keys; before and after
    a tick."""
    from tokenpools.streams.table.batch import fold as fast_fold

    reference, expected = pool_state.apply_events(pool_state.new(scripted.POOL, 1000), first, PARAMS)
    fast, outcomes = fast_fold(pool_state.new(scripted.POOL, 1000), first, PARAMS)
    assert (fast, outcomes) == (reference, expected)
    ticked = pool_state.tick(reference, VIEW, horizon_ms, PARAMS).state
    assert fast_fold(ticked, second, PARAMS) == pool_state.apply_events(ticked, second, PARAMS)
