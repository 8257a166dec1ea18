"""A decision or completion the broker holds twice counts once in the agents' pool state (streams.pool_state).

The named invariant: folding a stream of decisions and completions that carry their identity (``proxy_start_ms``,
``sequence``) with re-sent copies inserted anywhere after their originals, at new offsets and later Kafka
timestamps, gives the pool state (usage windows, attempts, in-flight levels and deltas, the streams seen) that
folding it without them gives, with a tick anywhere between, through the reference fold and the agent's batch fold.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resend_support import PROXY_START_MS, numbered, resent
from tokenpools.core import resends
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.runtime.specs import Catalogue
from tokenpools.streams.table import pool_state
from tokenpools.streams.sharding import shard_windows
from tokenpools.streams.table.batch import fold as batch_fold
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.views import pool_view
from tokenpools.config import load_config_text
from tokenpools.topics.records import RequestCompleted, RequestDecided
from tokenpools_dev import builders
from tokenpools_dev.streams import scripted

BASE_MS = 1_700_000_000_000
PARAMS = StreamParams(width_ms=1000, grace_ms=300, max_updates_per_tick=1000, proxy_shares=True)
VIEW = pool_view(Catalogue.from_loaded(load_config_text(scripted.CONFIG_YAML)), scripted.POOL)
OUTCOMES = [AdmissionOutcome.ADMITTED, AdmissionOutcome.ADMITTED, AdmissionOutcome.REFUSED_KV,
            AdmissionOutcome.REFUSED_BUDGET]


def decided(t_ms: int, entitlement: str, proxy: str, outcome: AdmissionOutcome, cost: int) -> RequestDecided:
    return builders.decided(f"r{t_ms}-{proxy}", t_ms, pool=scripted.POOL, entitlement=entitlement, proxy_id=proxy,
                            outcome=outcome, cost_tokens=cost,
                            kv_bytes=cost * 10 if outcome is AdmissionOutcome.ADMITTED else 0)


def completed(t_ms: int, entitlement: str, proxy: str, tokens: int) -> RequestCompleted:
    return builders.completed(f"c{t_ms}-{proxy}", t_ms, pool=scripted.POOL, entitlement=entitlement, proxy_id=proxy,
                              completion_tokens=tokens)


@st.composite
def streams(draw):
    """Decisions and completions of two entitlements through two proxies around a few windows, numbered as a proxy
    numbers them, with Kafka timestamps at or after their event times (some late)."""
    events = []
    for _ in range(draw(st.integers(0, 40))):
        t = BASE_MS + draw(st.integers(0, 5_000))
        entitlement, proxy = draw(st.sampled_from(["copilot", "batch"])), draw(st.sampled_from(["p1", "p2"]))
        if draw(st.booleans()):
            record = decided(t, entitlement, proxy, draw(st.sampled_from(OUTCOMES)), draw(st.integers(0, 500)))
        else:
            record = completed(t, entitlement, proxy, draw(st.integers(0, 64)))
        events.append((record, draw(st.one_of(st.none(), st.integers(t, t + 2_000)))))
    return numbered(events)


def positioned(events):
    return [(record, pool_state.Position("requests/0", offset, ts)) for offset, (record, ts) in enumerate(events)]


def run(fold, events, cut: int, horizon_ms: int):
    """``events`` folded in two batches around a tick at ``horizon_ms`` after the first ``cut``, with the in-flight
    tracking the agent runs after each fold; the state (offsets aside: the copies moved them) and the outcomes."""
    items = positioned(events)
    state, outcomes = pool_state.new(scripted.POOL, PARAMS.width_ms), []
    for k, batch in enumerate((items[:cut], items[cut:])):
        state, more = fold(state, batch, PARAMS)
        state = pool_state.track_in_flight(state, batch, more)
        outcomes += more
        if k == 0:
            state = pool_state.tick(state, VIEW, horizon_ms, PARAMS).state
    return dataclasses.replace(state, offsets={}), outcomes


@pytest.mark.parametrize("fold", [pool_state.apply_events, batch_fold], ids=["reference", "batch"])
@settings(max_examples=60, deadline=None)
@given(events=streams(), copies=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12), st.integers(0, 3_000)),
                                         max_size=15),
       tick_at=st.integers(0, 40), horizon_ms=st.integers(BASE_MS, BASE_MS + 5_000))
def test_re_sent_decisions_and_completions_count_once(fold, events, copies, tick_at, horizon_ms):
    with_copies, is_copy = resent(events, copies)
    tick_at = min(tick_at, len(events))
    originals = [k for k, c in enumerate(is_copy) if not c]
    cut = originals[tick_at] if tick_at < len(originals) else len(with_copies)
    expected, expected_outcomes = run(fold, events, tick_at, horizon_ms)
    state, outcomes = run(fold, with_copies, cut, horizon_ms)
    assert state == expected
    assert [o for o, c in zip(outcomes, is_copy) if not c] == expected_outcomes
    assert all(o is pool_state.Outcome.DUPLICATE for o, c in zip(outcomes, is_copy) if c)


def test_without_an_identity_a_copy_at_a_new_offset_counts_again():
    """Records written before the fields existed are de-duplicated by their offset alone, as before."""
    record = decided(BASE_MS + 10, "copilot", "p1", AdmissionOutcome.ADMITTED, 100)
    state, outcomes = pool_state.apply_events(pool_state.new(scripted.POOL, 1000), positioned([(record, None), (record, None)]), PARAMS)
    assert outcomes == [pool_state.Outcome.APPLIED, pool_state.Outcome.APPLIED] and state.seen == {}
    assert state.attempts == {BASE_MS // 1000: {"copilot": {"p1": 2}}}


def test_a_late_re_send_is_a_duplicate_not_a_late_admission():
    """A late event still moves the in-flight level, so the copy of an admission whose window closed must not."""
    [(record, _)] = numbered([(decided(BASE_MS + 10, "copilot", "p1", AdmissionOutcome.ADMITTED, 100), None)])
    state, outcome = pool_state.apply_event(pool_state.new(scripted.POOL, 1000), record, PARAMS, pool_state.Position("requests/0", 0, BASE_MS + 20))
    state = pool_state.track_in_flight(state, [(record, None)], [outcome])
    state = pool_state.tick(state, VIEW, BASE_MS + 5_000, PARAMS).state
    level = pool_state.in_flight_through(state)
    again = pool_state.Position("requests/0", 1, BASE_MS + 4_000)
    for fold in (pool_state.apply_events, batch_fold):
        after, outcomes = fold(state, [(record, again)], PARAMS)
        assert outcomes == [pool_state.Outcome.DUPLICATE]
        assert pool_state.in_flight_through(pool_state.track_in_flight(after, [(record, again)], outcomes)) == level


def test_the_two_kinds_are_numbered_apart():
    """A decision and a completion of one request at one proxy carry the same numbers in separate streams."""
    first = decided(BASE_MS + 10, "copilot", "p1", AdmissionOutcome.ADMITTED, 100)
    done = completed(BASE_MS + 50, "copilot", "p1", 8)
    events = numbered([(first, None), (done, None)])
    assert [r.sequence for r, _ in events] == [1, 1]
    state, outcomes = pool_state.apply_events(pool_state.new(scripted.POOL, 1000), positioned(events), PARAMS)
    assert outcomes == [pool_state.Outcome.APPLIED, pool_state.Outcome.APPLIED]
    assert sorted(state.seen) == [f"copilot\x1fcompleted\x1fp1@{PROXY_START_MS}",
                                  f"copilot\x1fdecided\x1fp1@{PROXY_START_MS}"]


def test_a_stream_is_forgotten_resend_memory_after_its_newest_event():
    [(record, _)] = numbered([(decided(BASE_MS + 10, "copilot", "p1", AdmissionOutcome.ADMITTED, 100), None)])
    state, _ = pool_state.apply_event(pool_state.new(scripted.POOL, 1000), record, PARAMS, pool_state.Position("requests/0", 0, None))
    stream = pool_state.resend_stream(record)
    assert state.seen == {stream: resends.Seen(1, frozenset(), BASE_MS + 10)}
    # kept while the newest closed window ends less than RESEND_MEMORY_MS after the event
    kept = pool_state.tick(state, None, BASE_MS + pool_state.RESEND_MEMORY_MS + PARAMS.grace_ms, PARAMS).state
    assert stream in kept.seen
    gone = pool_state.tick(kept, None, BASE_MS + pool_state.RESEND_MEMORY_MS + 1000 + PARAMS.grace_ms, PARAMS).state
    assert gone.seen == {}
    # a shard's close forgets by the same rule
    shard = dataclasses.replace(state, pool=f"{scripted.POOL}#0")
    closed, _ = shard_windows.close(shard, BASE_MS + pool_state.RESEND_MEMORY_MS + 1000 + PARAMS.grace_ms, PARAMS, 2)
    assert closed.seen == {}


def test_a_stream_resumed_after_it_was_forgotten_holds_a_bounded_gap():
    """A stream forgotten after an hour of quiet resumes at its next number: the gap below it never fills, so it is
    given up after RESEND_MAX_AHEAD_UNSTARTED numbers, and the stream is compact again; each number counted once."""
    start = 5_000
    events = [decided(BASE_MS + n, "copilot", "p1", AdmissionOutcome.REFUSED_KV, 10) for n in range(200)]
    events = [r.model_copy(update={"proxy_start_ms": PROXY_START_MS, "sequence": start + n})
              for n, r in enumerate(events)]
    stream = pool_state.resend_stream(events[0])
    for fold in (pool_state.apply_events, batch_fold):
        state, widest = pool_state.new(scripted.POOL, 1000), 0
        for n, record in enumerate(events):
            state, outcomes = fold(state, [(record, pool_state.Position("requests/0", n, None))], PARAMS)
            assert outcomes == [pool_state.Outcome.APPLIED]
            widest = max(widest, len(state.seen[stream].ahead))
        assert widest == pool_state.RESEND_MAX_AHEAD_UNSTARTED
        assert state.seen[stream] == resends.Seen(start + 199, frozenset(), BASE_MS + 199)
        again = [(events[3], pool_state.Position("requests/0", 500, None))]
        assert fold(state, again, PARAMS)[1] == [pool_state.Outcome.DUPLICATE]
