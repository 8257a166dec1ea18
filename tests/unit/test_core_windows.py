"""Event-time usage windows (tokenpools.core.windows): worked examples and invariant 7.

A request is admitted at ``a`` and completes at ``c`` (or never, or is refused at ``a``); the property tests check the
window algebra against a brute-force integration of those intervals.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.accumulator import add
from tokenpools.core.windows import UsageEvent, UsageKind, WindowState, close, empty

PROPERTY = settings(max_examples=100, deadline=None)
A, C, R = UsageKind.ADMITTED, UsageKind.COMPLETED, UsageKind.REFUSED


def feed(state: WindowState, events: list[UsageEvent]) -> WindowState:
    for e in events:
        state, accepted = add(state, e)
        assert accepted
    return state


# ---- worked examples -----------------------------------------------------------------------------------------

def test_width_must_be_positive() -> None:
    with pytest.raises(ValueError, match="width_ms"):
        empty(0)


def test_time_weighted_concurrency_and_kv_across_two_windows() -> None:
    """Admitted at 2.5 s, completed at 7.5 s, 5 s windows: half a slot in each window, and its KV likewise."""
    state = feed(empty(5000), [UsageEvent(A, 2500, cost_tokens=300, kv_bytes=1000),
                               UsageEvent(C, 7500, served_tokens=200, kv_bytes=1000)])
    state, samples = close(state, 10_000, 0)
    assert [s.start_ms for s in samples] == [0, 5000]
    first, second = samples
    assert first.used.concurrency == pytest.approx(0.5) and first.used.kv_bytes == pytest.approx(500.0)
    assert second.used.concurrency == pytest.approx(0.5) and second.used.kv_bytes == pytest.approx(500.0)
    assert first.used.tokens_per_s == 0.0  # λ̂ counts tokens of requests *completed* in the window
    assert second.used.tokens_per_s == pytest.approx(200 / 5.0)
    assert (first.in_flight_at_end, second.in_flight_at_end) == (1, 0)
    assert (first.admitted, second.completed) == (1, 1)


def test_demand_counts_refused_cost_and_scales_slots_by_attempts() -> None:
    events = [UsageEvent(A, 0, cost_tokens=100, kv_bytes=10), UsageEvent(R, 1000, cost_tokens=400),
              UsageEvent(C, 5000, served_tokens=80, kv_bytes=10)]
    state, samples = close(feed(empty(10_000), events), 10_000, 0)
    (sample,) = samples
    assert sample.used.concurrency == pytest.approx(0.5)
    assert sample.demand.tokens_per_s == pytest.approx((80 + 400) / 10.0)  # served + refused cost
    assert sample.demand.concurrency == pytest.approx(1.5)  # max(0.5 × 2 attempts/1 admission, 0.5 + 1)
    assert sample.demand.kv_bytes == pytest.approx(10.0)  # 5 KV-bytes average × 2
    assert sample.refused == 1


def test_only_refusals_still_demand_a_slot() -> None:
    _, samples = close(feed(empty(5000), [UsageEvent(R, 100, cost_tokens=50)]), 5000, 0)
    assert samples[0].demand.concurrency == 1.0 and samples[0].used.concurrency == 0.0
    assert samples[0].demand.tokens_per_s == pytest.approx(10.0)


def test_a_window_closes_only_after_its_grace() -> None:
    state = feed(empty(5000), [UsageEvent(A, 100, kv_bytes=1)])
    state, samples = close(state, 5000 + 999, 1000)
    assert samples == []
    state, samples = close(state, 5000 + 1000, 1000)
    assert [s.start_ms for s in samples] == [0]


def test_idle_windows_after_the_first_event_are_emitted_empty() -> None:
    state = feed(empty(1000), [UsageEvent(R, 500, cost_tokens=10)])
    _, samples = close(state, 4000, 0)
    assert [s.start_ms for s in samples] == [0, 1000, 2000, 3000]
    assert all(s.demand.tokens_per_s == 0 and s.admitted == s.refused == 0 for s in samples[1:])


def test_no_window_is_emitted_before_the_first_event() -> None:
    """A tick that closes windows of an entitlement that has not had an event yet emits nothing, now or later."""
    state, samples = close(empty(1000), 3000, 0)
    assert samples == []
    state = feed(state, [UsageEvent(R, 5500, cost_tokens=10)])
    _, samples = close(state, 7000, 0)
    assert [s.start_ms for s in samples] == [5000, 6000]


def test_an_event_in_a_closed_window_is_late() -> None:
    state = feed(empty(1000), [UsageEvent(A, 10, kv_bytes=1)])
    state, _ = close(state, 2000, 0)
    late, accepted = add(state, UsageEvent(C, 1999, kv_bytes=1))
    assert not accepted and late == state
    state, accepted = add(state, UsageEvent(C, 2000, kv_bytes=1))
    assert accepted


# ---- invariant 7: generators ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    at_ms: int
    duration_ms: int | None  # None: still in flight at the end
    cost_tokens: int
    served_tokens: int
    kv_bytes: int
    refused: bool

    def events(self) -> list[UsageEvent]:
        if self.refused:
            return [UsageEvent(R, self.at_ms, cost_tokens=self.cost_tokens)]
        out = [UsageEvent(A, self.at_ms, cost_tokens=self.cost_tokens, kv_bytes=self.kv_bytes)]
        if self.duration_ms is not None:
            out.append(UsageEvent(C, self.at_ms + self.duration_ms, served_tokens=self.served_tokens,
                                  kv_bytes=self.kv_bytes))
        return out


REQUESTS = st.lists(
    st.builds(Request, at_ms=st.integers(0, 30_000), duration_ms=st.none() | st.integers(0, 12_000),
              cost_tokens=st.integers(0, 500), served_tokens=st.integers(0, 500), kv_bytes=st.integers(0, 10**9),
              refused=st.booleans()),
    max_size=25,
)
WIDTH_MS = st.sampled_from([1000, 5000, 3000])
GRACE_MS = st.sampled_from([0, 500, 2000])
END_MS = 60_000  # after every event and its grace


def all_events(requests: list[Request]) -> list[UsageEvent]:
    return sorted((e for r in requests for e in r.events()), key=lambda e: e.t_ms)


def one_shot(width: int, grace: int, events: list[UsageEvent], end_ms: int = END_MS):
    state, samples = close(feed(empty(width), events), end_ms, grace)
    return state, samples


# ---- invariant 7 ---------------------------------------------------------------------------------------------

@PROPERTY
@given(requests=REQUESTS, width=WIDTH_MS, grace=GRACE_MS, data=st.data())
def test_adding_events_in_any_order_gives_the_same_samples(requests: list[Request], width: int, grace: int,
                                                           data: st.DataObject) -> None:
    """Invariant 7a — window state holds sums only: any permutation of the same (non-late) events gives identical
    state and identical samples."""
    events = all_events(requests)
    shuffled = data.draw(st.permutations(events))
    assert feed(empty(width), shuffled) == feed(empty(width), events)
    assert one_shot(width, grace, shuffled) == one_shot(width, grace, events)


@PROPERTY
@given(requests=REQUESTS, width=WIDTH_MS, grace=GRACE_MS,
       closes=st.lists(st.integers(0, END_MS), max_size=12))
def test_closing_in_one_call_or_many_gives_the_same_samples(requests: list[Request], width: int, grace: int,
                                                            closes: list[int]) -> None:
    """Invariant 7b — one step or many: events added in time order with closes interleaved at any times that make no
    event late (a close at c precedes only events at t ≥ c − grace) give the same samples, concatenated, and the
    same final state as adding everything and closing once."""
    events = all_events(requests)
    pending = sorted(closes)
    state, samples = empty(width), []
    for e in events:
        while pending and pending[0] <= e.t_ms + grace:
            state, out = close(state, pending.pop(0), grace)
            samples += out
        state, accepted = add(state, e)
        assert accepted, e
    for c in [*pending, END_MS]:
        state, out = close(state, c, grace)
        samples += out
    assert (state, samples) == one_shot(width, grace, events)


@PROPERTY
@given(requests=REQUESTS, width=WIDTH_MS, grace=GRACE_MS)
def test_windows_conserve_requests(requests: list[Request], width: int, grace: int) -> None:
    """Invariant 7c — conservation: after the last window, in flight = admitted − completed; every admission,
    completion, refusal and served token is counted in exactly one sample; windows are contiguous."""
    events = all_events(requests)
    _, samples = one_shot(width, grace, events)
    if not events:
        assert samples == []
        return
    admitted = sum(e.kind is A for e in events)
    completed = sum(e.kind is C for e in events)
    assert samples[-1].in_flight_at_end == admitted - completed
    assert sum(s.admitted for s in samples) == admitted
    assert sum(s.completed for s in samples) == completed
    assert sum(s.refused for s in samples) == sum(e.kind is R for e in events)
    assert sum(s.used.tokens_per_s * s.width_ms / 1000 for s in samples) == pytest.approx(
        sum(e.served_tokens for e in events))
    assert samples[0].start_ms == events[0].t_ms // width * width
    assert [s.start_ms for s in samples] == list(range(samples[0].start_ms, samples[-1].start_ms + 1, width))
    assert all(s.in_flight_at_end >= 0 for s in samples)


def _overlap(lo: int, hi: int, start: int, end: int) -> int:
    return max(0, min(hi, end) - max(lo, start))


@PROPERTY
@given(requests=REQUESTS, width=WIDTH_MS)
def test_time_weighted_usage_matches_the_intervals(requests: list[Request], width: int) -> None:
    """r̂ and χ̂ of each window are the time-weighted in-flight count and KV of the requests' [admit, complete)
    intervals, integrated by brute force."""
    _, samples = one_shot(width, 0, all_events(requests))
    served = [r for r in requests if not r.refused]
    for s in samples:
        end = s.start_ms + width
        intervals = [(r, _overlap(r.at_ms, r.at_ms + r.duration_ms if r.duration_ms is not None else 10**12,
                                  s.start_ms, end)) for r in served]
        assert s.used.concurrency == pytest.approx(sum(o for _, o in intervals) / width, abs=1e-9)
        assert s.used.kv_bytes == pytest.approx(sum(o * r.kv_bytes for r, o in intervals) / width, rel=1e-9, abs=1e-6)


@PROPERTY
@given(requests=REQUESTS.filter(bool), width=WIDTH_MS, grace=GRACE_MS, now=st.integers(0, END_MS),
       window=st.integers(-3, 2), at=st.integers(0, 10**6), kind=st.sampled_from(list(UsageKind)))
def test_late_events_are_rejected(requests: list[Request], width: int, grace: int, now: int, window: int, at: int,
                                  kind: UsageKind) -> None:
    """Invariant 7d — an event in a window that has been closed (at or before the last closed window) is reported
    late and leaves the state unchanged; an event in a later window is accepted; a window whose sample is out is
    never changed afterwards."""
    state = feed(empty(width), all_events(requests))
    state, samples = close(state, now, grace)
    index = state.closed_through + window  # around the lateness boundary
    if index < 0:
        return
    t = index * width + at % width
    after, accepted = add(state, UsageEvent(kind, t, cost_tokens=1, served_tokens=1, kv_bytes=1))
    assert accepted is (window > 0)
    if not accepted:
        assert after == state
    if any(s.start_ms <= t < s.start_ms + width for s in samples):
        assert not accepted
