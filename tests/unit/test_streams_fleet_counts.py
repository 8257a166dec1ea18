"""The agents' fleet counts (streams/counts/fleet_counts.py): event-time counts at an instant, whatever the batches.

Invariants:
- **order-free**: the record at an instant depends on the events before it, not on the order or batches they came in;
- **exact at one proxy**: in flight = admissions − completions before t; the bucket is the one bucket that saw
  every request (refill at the rate up to the depth, charged by reservations, refunded reserved − used);
- **activity**: a proxy is active for an entitlement while it holds a request or attempted one in the demand window;
  a proxy no longer live takes its requests with it.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.streams.counts.fleet_counts import FleetCounts, Rate
from tokenpools.topics.records import RequestCompleted, RequestDecided
from tokenpools_dev import builders

PROPERTY = settings(max_examples=150, deadline=None)
RATES = {"a": Rate(100.0, 1000.0), "b": Rate(50.0, 200.0)}


def decided(rid: str, name: str, proxy: str, t_ms: int, cost: int, admitted: bool = True) -> RequestDecided:
    return builders.decided(rid, t_ms, pool="p", entitlement=name, proxy_id=proxy,
                            outcome=AdmissionOutcome.ADMITTED if admitted else AdmissionOutcome.REFUSED_CONCURRENCY,
                            reason="", prompt_tokens_est=cost // 2, max_tokens=cost - cost // 2, cost_tokens=cost,
                            kv_bytes=0)


def completed(rid: str, name: str, proxy: str, t_ms: int, reserved: int, used: int) -> RequestCompleted:
    return builders.completed(rid, t_ms, pool="p", entitlement=name, proxy_id=proxy, admitted_t_ms=0,
                              prompt_tokens=used // 2, completion_tokens=used - used // 2, reserved_tokens=reserved,
                              kv_bytes=0, e2e_s=0.1)


requests = st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["x", "y", "z"]),
                              st.integers(0, 2_000), st.integers(1, 300), st.integers(1, 2_000),
                              st.integers(0, 400), st.booleans()), max_size=40)


def events_of(rows: list[tuple[str, str, int, int, int, int, bool]]) -> list[RequestDecided | RequestCompleted]:
    out: list[RequestDecided | RequestCompleted] = []
    for i, (name, proxy, t, cost, duration, used, admitted) in enumerate(rows):
        out.append(decided(f"r{i}", name, proxy, t, cost, admitted))
        if admitted:
            out.append(completed(f"r{i}", name, proxy, t + duration, cost, used))
    return out


@given(requests, st.integers(0, 4_000), st.randoms(use_true_random=False), st.integers(1, 5))
@PROPERTY
def test_the_record_at_an_instant_does_not_depend_on_how_the_events_arrived(rows, t_ms, rng, batches) -> None:
    events = events_of(rows)
    straight = FleetCounts("p", 1_000)
    straight.note(sorted(events, key=lambda e: e.t_ms))
    straight.advance(t_ms, RATES)
    shuffled = list(events)
    rng.shuffle(shuffled)
    cut = FleetCounts("p", 1_000)
    size = max(1, len(shuffled) // batches)
    for start in range(0, len(shuffled), size):
        cut.note(shuffled[start:start + size])
    cut.advance(t_ms, RATES)
    live = {"x", "y", "z"}
    assert cut.record(7, ["a", "b"], RATES, live, 3) == straight.record(7, ["a", "b"], RATES, live, 3)


@given(requests, st.integers(0, 4_000))
@PROPERTY
def test_at_one_proxy_the_counts_are_the_exact_enforcers(rows, t_ms) -> None:
    rows = [(name, "x", *rest) for name, _, *rest in rows]
    counts = FleetCounts("p", 1_000)
    events = events_of(rows)
    counts.note(events)
    counts.advance(t_ms, RATES)
    record = counts.record(1, ["a", "b"], RATES, {"x"}, 1)
    for i, name in enumerate(["a", "b"]):
        mine = sorted((e for e in events if e.entitlement == name and e.t_ms < t_ms), key=lambda e: e.t_ms)
        admitted = sum(isinstance(e, RequestDecided) and e.outcome is AdmissionOutcome.ADMITTED for e in mine)
        ended = sum(isinstance(e, RequestCompleted) for e in mine)
        assert record.in_flight[i] == admitted - ended  # every completion here follows its admission
        rate, level, at = RATES[name], RATES[name].depth_tokens, 0
        for e in mine:  # one bucket that saw every request, in event-time order
            level = min(rate.depth_tokens, level + (e.t_ms - at) / 1000 * rate.tokens_per_s)
            at = e.t_ms
            if isinstance(e, RequestDecided) and e.outcome is AdmissionOutcome.ADMITTED:
                level = min(rate.depth_tokens, level - e.cost_tokens)
            elif isinstance(e, RequestCompleted):
                level = min(rate.depth_tokens, level + e.reserved_tokens - e.prompt_tokens - e.completion_tokens)
        level = min(rate.depth_tokens, level + (t_ms - at) / 1000 * rate.tokens_per_s)
        assert abs(record.bucket_tokens[i] - level) <= 1.0 + 1e-6 * abs(level)


def test_a_proxy_is_active_while_it_holds_a_request_or_asked_recently_and_a_gone_one_is_forgotten() -> None:
    counts = FleetCounts("p", 1_000)
    counts.note([decided("1", "a", "x", 100, 10), decided("2", "a", "y", 200, 10, admitted=False),
                 decided("3", "b", "z", 300, 10)])
    counts.advance(1_000, RATES)
    record = counts.record(1, ["a", "b"], RATES, {"x", "y", "z"}, 3)
    assert (record.in_flight, record.active, record.pool_in_flight, record.pool_active) == ((1, 1), (2, 1), 2, 3)
    counts.advance(1_250, RATES)  # y's refusal is out of the demand window; x and z still hold theirs
    record = counts.record(1, ["a", "b"], RATES, {"x", "y", "z"}, 3)
    assert record.active == (1, 1) and record.pool_active == 2
    counts.advance(1_300, RATES)
    record = counts.record(1, ["a", "b"], RATES, {"x"}, 1)  # z is gone: its request went with it
    assert record.in_flight == (1, 0) and record.proxies == 1


def test_an_event_for_an_instant_already_counted_is_applied_at_once() -> None:
    counts = FleetCounts("p", 1_000)
    counts.advance(500, RATES)
    counts.note([decided("1", "a", "x", 100, 10)])  # late: before the cursor
    counts.advance(400, RATES)  # not a step back
    assert counts.cursor_ms == 500
    assert counts.record(1, ["a"], RATES, {"x"}, 1).in_flight == (1,)


@given(requests, st.integers(0, 4_000), st.randoms(use_true_random=False), st.integers(1, 5))
@PROPERTY
def test_the_reserved_levels_are_the_tokens_of_each_proxys_requests_in_flight_whatever_the_batches(rows, t_ms, rng,
                                                                                                   batches) -> None:
    """Invariant *levels are in flight* (docs/budgets.md#the-others-reservations-in-flight): per entitlement and
    proxy, the cost_tokens of the requests admitted before t and not completed before t, in any arrival order."""
    events = events_of(rows)
    rng.shuffle(events)
    counts = FleetCounts("p", 1_000)
    size = max(1, len(events) // batches)
    for start in range(0, len(events), size):
        counts.note(events[start:start + size])
    counts.advance(t_ms, RATES)
    for name in ("a", "b"):
        expected: dict[str, int] = {}
        for n, proxy, t, cost, duration, _, admitted in rows:
            if n == name and admitted and t < t_ms <= t + duration:
                expected[proxy] = expected.get(proxy, 0) + cost
        assert counts.reserved(name) == {p: c for p, c in expected.items() if c > 0}


def test_a_proxy_with_nothing_in_flight_has_nothing_reserved_and_a_gone_one_takes_its_reservations() -> None:
    """After a takeover the levels start empty: a completion of a request admitted before it takes its tokens off
    the proxy's level (never below 0), an under-count until the proxy's requests in flight have all completed."""
    counts = FleetCounts("p", 1_000)
    counts.seed({"a": {"x": 1}})  # a takeover: one request in flight, its tokens unknown
    counts.note([decided("r1", "a", "x", 10, 300), decided("r2", "a", "y", 10, 200),
                 completed("r0", "a", "x", 20, 100, 5)])  # r0: admitted before the takeover
    counts.advance(30, RATES)
    assert counts.reserved("a") == {"x": 200, "y": 200}
    counts.note([completed("r1", "a", "x", 40, 300, 5)])  # x has nothing in flight: nothing reserved (not 0 - 100)
    counts.advance(50, RATES)
    assert counts.reserved("a") == {"y": 200}
    counts.record(1, ["a"], RATES, {"x"}, 1)  # y is no longer live
    assert counts.reserved("a") == {} and counts.reserved("nobody") == {}
