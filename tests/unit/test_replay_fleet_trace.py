"""The fleet model's trace: drawn from the seed alone, at the offered load asked for, limits consistent."""

from __future__ import annotations

import random

import pytest

from tokenpools.replay.fleet.trace import TraceConfig, generate

CONFIG = TraceConfig(entitlements=30, duration_s=120.0)


def test_the_same_seed_gives_the_same_trace_and_another_seed_another() -> None:
    assert generate(CONFIG, random.Random(5)) == generate(CONFIG, random.Random(5))
    assert generate(CONFIG, random.Random(5)).requests != generate(CONFIG, random.Random(6)).requests


def test_an_entitlements_requests_do_not_depend_on_the_entitlements_after_it() -> None:
    fewer = generate(TraceConfig(entitlements=11, duration_s=60.0), random.Random(3))
    more = generate(TraceConfig(entitlements=12, duration_s=60.0), random.Random(3))
    assert more.entitlements[:11] == fewer.entitlements
    assert [r._replace(request_id="") for r in more.requests if r.entitlement != "e11"] == [
        r._replace(request_id="") for r in fewer.requests]


def test_arrivals_come_at_the_offered_load() -> None:
    """λ_e · mean service = load · L_e; the count over the run is Poisson, so within 5 standard deviations."""
    trace = generate(CONFIG, random.Random(1))
    expected = sum(e.rate_per_s for e in trace.entitlements) * CONFIG.duration_s
    assert abs(len(trace.requests) - expected) < 5 * expected**0.5
    for e in trace.entitlements:
        assert e.rate_per_s * CONFIG.mean_service_s == pytest.approx(CONFIG.load * e.concurrency)
    offered = sum(r.service_s for r in trace.requests) / CONFIG.duration_s
    assert offered == pytest.approx(CONFIG.load * sum(e.concurrency for e in trace.entitlements), rel=0.05)


def test_limits_and_requests_are_consistent() -> None:
    trace = generate(CONFIG, random.Random(2))
    per_slot = (CONFIG.mean_prompt_tokens + CONFIG.mean_output_tokens) / CONFIG.mean_service_s
    for e in trace.entitlements:
        assert e.concurrency in CONFIG.concurrency_choices
        assert e.tokens_per_s == pytest.approx(e.concurrency * per_slot)
    times = [r.t_s for r in trace.requests]
    assert times == sorted(times) and 0 <= times[0] and times[-1] < CONFIG.duration_s
    assert len({r.request_id for r in trace.requests}) == len(trace.requests)
    for r in trace.requests[:200]:
        assert CONFIG.prompt_tokens_range[0] <= r.prompt_tokens <= CONFIG.prompt_tokens_range[1]
        assert r.output_tokens <= r.max_tokens == CONFIG.max_tokens
        assert r.service_s == pytest.approx(CONFIG.service_s(r.prompt_tokens, r.output_tokens))
        assert r.cost_tokens == r.prompt_tokens + r.max_tokens and r.used_tokens <= r.cost_tokens


@pytest.mark.parametrize("bad, field", [
    ({"entitlements": 0}, "entitlements"),
    ({"duration_s": 0.0}, "duration_s"),
    ({"load": 0.0}, "load"),
    ({"concurrency_choices": (0, 4)}, "concurrency_choices"),
    ({"prompt_tokens_range": (10, 5)}, "prompt_tokens_range"),
    ({"output_tokens_range": (1, 600)}, "output_tokens_range"),
    ({"decode_tokens_per_s": 0.0}, "decode_tokens_per_s"),
])
def test_a_bad_config_is_refused_with_its_field(bad: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TraceConfig(**bad)
