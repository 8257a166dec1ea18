"""A pool's reading from one Prometheus answer (tokenpools.controllers.reading): vLLM's series when fresh, else the
proxies' view, and the named invariants over random answers."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.controllers.promql import (
    PROXY_FINISHED,
    PROXY_GENERATION_TOKENS_PER_S,
    PROXY_IN_FLIGHT,
    PROXY_PROMPT_TOKENS_PER_S,
    PROXY_SERVED,
    SAMPLE_FIELDS,
    SCRAPE_AGE,
    TARGETS,
    VLLM_FINISHED,
    parse_values,
)
from tokenpools.controllers.reading import Cause, PoolReading, Ready, classify, read_pool
from tokenpools.core.capacity import Capacity
from tokenpools.core.spec import PoolSpec
from tokenpools.topics.records import MetricsSource, MetricsState

LIMIT_S = 15.0
SLOTS = 8  # per replica
POOL = PoolSpec(name="p", model="m", per_replica=Capacity(480, 8 * 2**30, SLOTS), max_replicas=4, replicas=2)
LOAD = ("running", "waiting", "prompt_tokens_per_s", "generation_tokens_per_s")

FULL = dict(replicas_ready=2, running=3, waiting=1, kv_cache_usage=0.25, prompt_tokens_per_s=120.5,
            generation_tokens_per_s=60.0, ttft_p99_s=0.4, inter_token_latency_p50_s=0.02, e2e_p99_s=2.5,
            scrape_age_s=0.8, targets=2, vllm_finished=40)
PROXIES = {PROXY_IN_FLIGHT: 5, PROXY_PROMPT_TOKENS_PER_S: 110.0,
           PROXY_GENERATION_TOKENS_PER_S: 58.0, PROXY_SERVED: 12, PROXY_FINISHED: 30}


def answer(**values: Any) -> list[dict[str, Any]]:
    """What custom_query returns for pool_query: one element per value present, as a string."""
    return [{"metric": {"tp_field": k}, "value": [1_700_000_000.0, str(v)]} for k, v in values.items()]


def read(values: dict[str, Any], t_ms: int = 0) -> PoolReading:
    return read_pool(POOL, t_ms, *parse_values(answer(**values)), LIMIT_S)


# ---- examples ----------------------------------------------------------------------------------------------------

def test_a_full_fresh_answer_is_used_as_it_is() -> None:
    r = read({**FULL, **PROXIES}, t_ms=123)
    s = r.sample
    assert (r.state, r.source, r.cause) == (MetricsState.FRESH, MetricsSource.VLLM, Cause.SERIES_CURRENT)
    assert s.stale == () and (s.pool, s.t_ms, s.replicas_ready, s.running, s.waiting) == ("p", 123, 2, 3.0, 1.0)
    assert s.kv_cache_usage == 0.25 and s.prompt_tokens_per_s == 120.5 and s.generation_tokens_per_s == 60.0
    assert s.ttft_p99_s == 0.4 and s.inter_token_latency_p50_s == 0.02 and s.e2e_p99_s == 2.5
    assert "metrics_state" not in s.model_dump(mode="json") and "source" not in s.model_dump(mode="json")


def test_a_fresh_answer_missing_a_field_names_it_stale_never_zero() -> None:
    s = read({k: v for k, v in FULL.items() if k != "kv_cache_usage"}).sample
    assert s.kv_cache_usage is None and s.stale == ("kv_cache_usage",) and s.running == 3.0


def test_a_nan_quantile_is_unknown_but_not_stale() -> None:
    """No request in the window: histogram_quantile is NaN. The series exist; nothing happened."""
    s = read({**FULL, "ttft_p99_s": "NaN", "e2e_p99_s": "+Inf"}).sample
    assert s.ttft_p99_s is None and s.e2e_p99_s is None and s.stale == ()


def test_out_of_range_values_are_clamped_not_rejected() -> None:
    s = read({**FULL, "kv_cache_usage": 1.0000001, "running": -0.0, "replicas_ready": 2.4}).sample
    assert s.kv_cache_usage == 1.0 and s.running == 0.0 and s.replicas_ready == 2


def test_a_failed_scrape_while_the_proxies_see_requests_end_reads_their_view() -> None:
    """The issue: vLLM busy on 2 cores answers /metrics after the scrape timeout, up = 0, its series vanish."""
    r = read({"replicas_ready": 0, "targets": 1, SCRAPE_AGE: 2.0, **PROXIES})
    s = r.sample
    assert (r.state, r.source, r.cause) == (MetricsState.STALE, MetricsSource.PROXIES, Cause.SCRAPE_FAILED)
    assert (s.running, s.waiting) == (5.0, 0.0)  # 5 in flight at the proxies, 16 slots at the spec's 2 replicas
    assert (s.prompt_tokens_per_s, s.generation_tokens_per_s) == (110.0, 58.0)
    assert s.replicas_ready is None  # the pool answers: not 0, unknown (the agents assume the spec's replicas)
    assert set(s.stale) == {"replicas_ready", "kv_cache_usage", "ttft_p99_s", "inter_token_latency_p50_s",
                            "e2e_p99_s"}
    wire = s.model_dump(mode="json")
    assert (wire["metrics_state"], wire["source"]) == ("stale", "proxies")
    assert "proxies' view" in r.describe() and "ready replicas unknown" in r.describe()


def test_a_stopped_backend_nobody_is_served_by_reads_zero_ready_replicas() -> None:
    r = read({"replicas_ready": 0, "targets": 1, SCRAPE_AGE: 0.5, PROXY_IN_FLIGHT: 0, PROXY_SERVED: 0})
    assert (r.cause, r.source, r.ready, r.sample.replicas_ready) == (
        Cause.SCRAPE_FAILED, MetricsSource.PROXIES, Ready.DOWN, 0)
    assert (r.sample.running, r.sample.waiting) == (0.0, 0.0)  # the proxies hold nothing: their zero, not a stale one
    assert "ready replicas unknown" not in r.describe()


def test_a_starved_backend_that_finished_nothing_in_the_window_is_busy_not_dead() -> None:
    """The flaky run: the tiny CPU vLLM, starved, answered /metrics too late (up 0) and completed nothing over the
    20-s rate window, while the proxies held 6 requests in flight. It works: its ready replicas are unknown."""
    r = read({"replicas_ready": 0, "targets": 1, SCRAPE_AGE: 4.0, PROXY_IN_FLIGHT: 6, PROXY_SERVED: 0,
              PROXY_GENERATION_TOKENS_PER_S: 0.0})
    assert (r.cause, r.source, r.ready, r.sample.replicas_ready) == (
        Cause.SCRAPE_FAILED, MetricsSource.PROXIES, Ready.BUSY, None)
    assert (r.sample.running, r.sample.waiting) == (6.0, 0.0) and "replicas_ready" in r.sample.stale
    assert "ready replicas unknown, the proxies see the pool working" in r.describe()
    no_counter = read({"replicas_ready": 0, "targets": 1, SCRAPE_AGE: 4.0, PROXY_IN_FLIGHT: 6})  # none ended ok yet
    assert (no_counter.ready, no_counter.sample.replicas_ready) == (Ready.BUSY, None)


def test_a_failed_scrape_without_the_proxies_view_reads_ready_unknown_and_every_load_unknown() -> None:
    """Nothing but up 0: a busy vLLM answering late looks the same as a stopped one, so the count is not 0."""
    r = read({"replicas_ready": 0, "targets": 1, SCRAPE_AGE: 0.5})
    assert (r.state, r.source, r.ready, r.sample.replicas_ready) == (
        MetricsState.STALE, MetricsSource.NONE, Ready.UNSEEN, None)
    assert r.sample.stale == SAMPLE_FIELDS and all(getattr(r.sample, f) is None for f in SAMPLE_FIELDS)
    assert "the proxies' view is missing too" in r.describe()


def test_what_is_news_includes_how_the_ready_count_was_read() -> None:
    busy = read({"replicas_ready": 0, "targets": 1, SCRAPE_AGE: 1.0, PROXY_IN_FLIGHT: 3, PROXY_SERVED: 0})
    down = read({"replicas_ready": 0, "targets": 1, SCRAPE_AGE: 1.0, PROXY_IN_FLIGHT: 0, PROXY_SERVED: 0})
    assert (busy.cause, busy.source) == (down.cause, down.source) and busy.key != down.key
    assert busy.describe() != down.describe()


def test_no_target_at_all_is_stale_everywhere() -> None:
    r = read({})
    assert (r.cause, r.source) == (Cause.NO_TARGETS, MetricsSource.NONE)
    assert r.sample.stale == SAMPLE_FIELDS and all(getattr(r.sample, f) is None for f in SAMPLE_FIELDS)


def test_scrapes_older_than_the_limit_are_stale_whatever_they_say() -> None:
    r = read({**FULL, SCRAPE_AGE: LIMIT_S + 1, **PROXIES})
    assert (r.cause, r.source, r.sample.replicas_ready, r.sample.running) == (
        Cause.SCRAPES_OLD, MetricsSource.PROXIES, None, 5.0)


def test_targets_up_without_vllms_load_series_read_the_proxies_and_keep_the_ready_count() -> None:
    r = read({"replicas_ready": 2, "targets": 2, SCRAPE_AGE: 1.0, **PROXIES})  # e.g. --disable-log-stats
    assert (r.cause, r.source, r.sample.replicas_ready, r.sample.running) == (
        Cause.SERIES_MISSING, MetricsSource.PROXIES, 2, 5.0)


def test_counters_still_while_the_proxies_saw_requests_end_is_frozen() -> None:
    r = read({**FULL, VLLM_FINISHED: 0, **PROXIES})
    assert (r.state, r.cause, r.source) == (MetricsState.FROZEN, Cause.COUNTERS_STILL, MetricsSource.PROXIES)
    assert r.sample.running == 5.0 and r.sample.replicas_ready == 2 and r.sample.kv_cache_usage is None


def test_frozen_needs_both_sides_measured() -> None:
    assert read({**FULL, VLLM_FINISHED: 0, **PROXIES, PROXY_FINISHED: 0}).state is MetricsState.FRESH  # idle
    no_counter = {k: v for k, v in FULL.items() if k != VLLM_FINISHED}
    assert read({**no_counter, **PROXIES}).state is MetricsState.FRESH  # no counter yet: not evidence of anything
    assert read({**FULL, VLLM_FINISHED: 0}).state is MetricsState.FRESH  # no proxies' series


def test_in_flight_beyond_the_slots_is_waiting_at_the_backend() -> None:
    r = read({"replicas_ready": 1, "targets": 1, SCRAPE_AGE: 1.0, **PROXIES, PROXY_IN_FLIGHT: 11})  # series missing
    assert r.sample.replicas_ready == 1 and (r.sample.running, r.sample.waiting) == (8.0, 3.0)  # 1 × 8 slots
    # one of two targets failed while requests are in flight: either may hold them, so the spec's 2 × 8 slots
    r = read({"replicas_ready": 1, "targets": 2, SCRAPE_AGE: 1.0, **PROXIES, PROXY_IN_FLIGHT: 11, PROXY_SERVED: 0})
    assert r.sample.replicas_ready is None and (r.sample.running, r.sample.waiting) == (11.0, 0.0)


def test_without_the_proxies_in_flight_there_is_no_view_at_all() -> None:
    """Rates and completions are ranges that outlive the proxies; what they hold in flight within the limit is
    what says they are there."""
    r = read({"replicas_ready": 0, "targets": 1, SCRAPE_AGE: 1.0,
              **{k: v for k, v in PROXIES.items() if k != PROXY_IN_FLIGHT}})
    assert r.source is MetricsSource.NONE and r.sample.running is None and r.sample.generation_tokens_per_s is None


def test_the_description_has_no_numbers_so_a_status_changes_only_with_the_key() -> None:
    a = read({"replicas_ready": 0, "targets": 1, SCRAPE_AGE: 2.0, **PROXIES})
    b = read({"replicas_ready": 0, "targets": 1, SCRAPE_AGE: 3.0, **PROXIES, PROXY_IN_FLIGHT: 7})
    assert a.key == b.key and a.describe() == b.describe() and a.sample != b.sample


# ---- invariants over random answers ------------------------------------------------------------------------------

_NUMBER = st.one_of(st.just("NaN"), st.floats(0, 50, allow_nan=False), st.integers(0, 40))
_AGE = st.one_of(st.floats(0, 2 * LIMIT_S, allow_nan=False), st.just("NaN"))
_NAMES = {**{f: _NUMBER for f in SAMPLE_FIELDS}, "replicas_ready": st.integers(0, 4), TARGETS: st.integers(0, 4),
          SCRAPE_AGE: _AGE, VLLM_FINISHED: _NUMBER, PROXY_IN_FLIGHT: _NUMBER,
          PROXY_PROMPT_TOKENS_PER_S: _NUMBER, PROXY_GENERATION_TOKENS_PER_S: _NUMBER, PROXY_SERVED: _NUMBER,
          PROXY_FINISHED: _NUMBER}


@st.composite
def answers(draw: st.DrawFn) -> dict[str, Any]:
    """Any subset of the values, each a number or NaN; half the time a consistent fresh base under it."""
    base = dict(FULL) if draw(st.booleans()) else {}
    for name, strategy in _NAMES.items():
        choice = draw(st.sampled_from(("keep", "drop", "draw")))
        if choice == "drop":
            base.pop(name, None)
        elif choice == "draw":
            base[name] = draw(strategy)
    return base


def _number(raw: Any) -> float | None:
    return None if raw in (None, "NaN") else float(raw)


EXAMPLES = settings(max_examples=400, deadline=None)


@EXAMPLES
@given(answers())
def test_fresh_series_are_used_as_they_are(values: dict[str, Any]) -> None:
    r = read(values)
    if r.state is not MetricsState.FRESH:
        return
    assert r.source is MetricsSource.VLLM
    for field in LOAD:
        raw = _number(values.get(field))
        assert getattr(r.sample, field) == (None if raw is None else max(0.0, raw)), field


@EXAMPLES
@given(answers(), st.floats(0, 100, allow_nan=False))
def test_a_stale_series_never_reads_as_zero_load(values: dict[str, Any], other: float) -> None:
    """Not fresh: the load is the proxies' (running + waiting = their in flight) or unknown, and vLLM's own load
    values do not matter at all (replacing them changes nothing)."""
    r = read(values)
    if r.state is MetricsState.FRESH:
        return
    s = r.sample
    if r.source is MetricsSource.NONE:
        assert all(getattr(s, f) is None for f in LOAD)
    else:
        assert r.source is MetricsSource.PROXIES
        in_flight = _number(values[PROXY_IN_FLIGHT])
        assert s.running is not None and s.waiting is not None
        assert abs(s.running + s.waiting - max(0.0, in_flight or 0.0)) < 1e-9
        assert s.generation_tokens_per_s == _number(values.get(PROXY_GENERATION_TOKENS_PER_S))
    if "running" in values:  # its presence is part of the rule, its value is not
        replaced = {**values, **{f: other for f in LOAD}, "kv_cache_usage": min(1.0, other)}
        assert read(replaced).sample == s


@EXAMPLES
@given(answers())
def test_the_source_says_where_the_load_came_from(values: dict[str, Any]) -> None:
    r = read(values)
    assert (r.source is MetricsSource.VLLM) == (r.state is MetricsState.FRESH)
    assert r.sample.metrics_state is r.state and r.sample.source is r.source


@EXAMPLES
@given(answers())
def test_a_pool_the_proxies_see_answering_never_reads_zero_ready_replicas(values: dict[str, Any]) -> None:
    served, in_flight = _number(values.get(PROXY_SERVED)), _number(values.get(PROXY_IN_FLIGHT))
    if (served is not None and served > 0) or (in_flight is not None and in_flight > 0):
        assert read(values).sample.replicas_ready != 0


@EXAMPLES
@given(answers())
def test_zero_ready_replicas_needs_the_proxies_word_that_the_pool_is_idle(values: dict[str, Any]) -> None:
    """A failed scrape alone (up 0) never makes 0: the proxies' in flight must be there and 0, and none ended well."""
    r = read(values)
    if r.sample.replicas_ready == 0:
        assert r.ready is Ready.DOWN and r.source is MetricsSource.PROXIES
        assert _number(values.get(PROXY_IN_FLIGHT)) == 0 and (_number(values.get(PROXY_SERVED)) or 0) == 0


@EXAMPLES
@given(answers())
def test_the_ready_count_is_unknown_exactly_when_its_reading_says_so(values: dict[str, Any]) -> None:
    r = read(values)
    assert (r.sample.replicas_ready is not None) == r.ready.known
    assert ("replicas_ready" in r.sample.stale) == (not r.ready.known)


@EXAMPLES
@given(answers())
def test_unknown_is_named_stale_and_stale_is_never_a_value(values: dict[str, Any]) -> None:
    r = read(values)
    s = r.sample
    assert all(getattr(s, f) is None for f in s.stale)
    if r.state is not MetricsState.FRESH:
        assert all(f in s.stale for f in SAMPLE_FIELDS if getattr(s, f) is None)


@EXAMPLES
@given(answers())
def test_old_or_absent_scrapes_are_never_fresh_and_frozen_needs_the_proxies_evidence(values: dict[str, Any]) -> None:
    cause = classify(*parse_values(answer(**values)), LIMIT_S)
    age = _number(values.get(SCRAPE_AGE))
    if age is None or age > LIMIT_S:
        assert cause.state is MetricsState.STALE
    if cause is Cause.COUNTERS_STILL:
        assert _number(values[VLLM_FINISHED]) == 0 and (_number(values[PROXY_FINISHED]) or 0) > 0
