"""PromQL for a pool's backends and Prometheus answers → BackendMetricsSample (tokenpools.controllers.promql)."""

from __future__ import annotations

from typing import Any

import pytest

from tokenpools.controllers.promql import (
    SAMPLE_FIELDS,
    QueryConfig,
    field_query,
    parse_values,
    pool_query,
    to_sample,
)


def answer(**values: Any) -> list[dict[str, Any]]:
    """What custom_query returns for pool_query: one element per field present, value as a string."""
    return [{"metric": {"tp_field": k}, "value": [1_700_000_000.0, str(v)]} for k, v in values.items()]


FULL = dict(replicas_ready=2, running=3, waiting=1, kv_cache_usage=0.25, prompt_tokens_per_s=120.5,
            generation_tokens_per_s=60.0, ttft_p99_s=0.4, inter_token_latency_p50_s=0.02, e2e_p99_s=2.5,
            scrape_age_s=0.8)


def test_one_query_asks_for_every_field_of_the_sample() -> None:
    q = pool_query(QueryConfig(), "qwen3-8b")
    for field in SAMPLE_FIELDS:
        assert f'"tp_field", "{field}"' in q
    assert q.count(" or label_replace(") == len(SAMPLE_FIELDS)  # + scrape age = one more part than ors
    assert 'job="qwen3-8b"' in q


def test_old_and_new_vllm_names_are_both_accepted() -> None:
    kv = field_query(QueryConfig(), "kv_cache_usage", "p")
    assert "vllm:kv_cache_usage_perc" in kv and "vllm:gpu_cache_usage_perc" in kv and " or " in kv
    itl = field_query(QueryConfig(), "inter_token_latency_p50_s", "p")
    assert "vllm:inter_token_latency_seconds_bucket" in itl and "vllm:time_per_output_token_seconds_bucket" in itl


def test_rates_and_quantiles_count_only_backends_that_are_up_now() -> None:
    for field in ("prompt_tokens_per_s", "generation_tokens_per_s", "ttft_p99_s", "e2e_p99_s"):
        q = field_query(QueryConfig(rate_window_s=20), field, "p")
        assert "[20000ms]" in q and "and on (job, instance) (up{job=\"p\"} == 1)" in q
    assert "up" not in field_query(QueryConfig(), "running", "p")  # gauges: Prometheus staleness markers suffice


def test_selector_template_and_quoting() -> None:
    config = QueryConfig(selector='namespace="{namespace}", model_name="{model}"')
    q = field_query(config, "running", "p", model='we"ird\\model', namespace="ns")
    assert 'vllm:num_requests_running{namespace="ns", model_name="we\\"ird\\\\model"}' in q


@pytest.mark.parametrize("selector", ["{pool}", 'job="{pool}"}) or vector(1', 'job="{nope}"', ""])
def test_a_selector_that_is_not_label_matchers_is_refused(selector: str) -> None:
    with pytest.raises(ValueError):
        QueryConfig(selector=selector)


def test_a_full_answer_becomes_a_full_sample() -> None:
    sample = to_sample("p", 123, answer(**FULL), staleness_s=15)
    assert sample.stale == ()
    assert (sample.pool, sample.t_ms, sample.replicas_ready, sample.running, sample.waiting) == ("p", 123, 2, 3.0, 1.0)
    assert sample.kv_cache_usage == 0.25 and sample.prompt_tokens_per_s == 120.5
    assert sample.ttft_p99_s == 0.4 and sample.inter_token_latency_p50_s == 0.02 and sample.e2e_p99_s == 2.5


def test_a_missing_series_is_stale_never_zero() -> None:
    values = {k: v for k, v in FULL.items() if k not in ("running", "kv_cache_usage")}
    sample = to_sample("p", 0, answer(**values), staleness_s=15)
    assert sample.running is None and sample.kv_cache_usage is None
    assert sample.stale == ("running", "kv_cache_usage")


def test_a_stopped_backend_reports_zero_ready_replicas_and_stale_metrics() -> None:
    sample = to_sample("p", 0, answer(replicas_ready=0, scrape_age_s=0.5), staleness_s=15)
    assert sample.replicas_ready == 0
    assert set(sample.stale) == set(SAMPLE_FIELDS) - {"replicas_ready"}


def test_no_target_at_all_is_stale_everywhere() -> None:
    sample = to_sample("p", 0, [], staleness_s=15)
    assert sample.stale == SAMPLE_FIELDS
    assert all(getattr(sample, f) is None for f in SAMPLE_FIELDS)


def test_scrapes_older_than_the_staleness_limit_make_everything_stale() -> None:
    sample = to_sample("p", 0, answer(**{**FULL, "scrape_age_s": 16}), staleness_s=15)
    assert sample.stale == SAMPLE_FIELDS and sample.running is None and sample.replicas_ready is None


def test_nan_quantile_is_unknown_but_not_stale() -> None:
    """No request in the window: histogram_quantile is NaN. The series exist; nothing happened."""
    sample = to_sample("p", 0, answer(**{**FULL, "ttft_p99_s": "NaN", "e2e_p99_s": "+Inf"}), staleness_s=15)
    assert sample.ttft_p99_s is None and sample.e2e_p99_s is None
    assert sample.stale == ()


def test_out_of_range_values_are_clamped_not_rejected() -> None:
    sample = to_sample("p", 0, answer(**{**FULL, "kv_cache_usage": 1.0000001, "running": -0.0, "replicas_ready": 2.4}),
                       staleness_s=15)
    assert sample.kv_cache_usage == 1.0 and sample.running == 0.0 and sample.replicas_ready == 2


def test_garbage_in_the_answer_is_ignored() -> None:
    result: list[dict[str, Any]] = [
        {"metric": {}, "value": [0, "1"]},
        {"metric": {"tp_field": "unknown"}, "value": [0, "1"]},
        {"metric": {"tp_field": "running"}, "value": [0, "not a number"]},
        {"metric": {"tp_field": "waiting"}},
    ]
    values, present = parse_values(result)
    assert values == {"running": None, "waiting": None} and present == {"running", "waiting"}
