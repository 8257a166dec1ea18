"""PromQL for a pool's backends and proxies, and Prometheus answers parsed (tokenpools.controllers.promql); what the
answers mean is tests/unit/test_controllers_reading.py."""

from __future__ import annotations

from typing import Any

import pytest

from tokenpools.controllers.promql import (
    PROXY_FINISHED,
    PROXY_IN_FLIGHT,
    PROXY_SERVED,
    SAMPLE_FIELDS,
    SCRAPE_AGE,
    VLLM_FINISHED,
    QueryConfig,
    field_query,
    parse_values,
    pool_query,
)


def test_one_query_asks_for_every_field_of_the_sample_and_every_check() -> None:
    q = pool_query(QueryConfig(), "qwen3-8b")
    for field in SAMPLE_FIELDS:
        assert f'"tp_field", "{field}"' in q
    assert q.count(" or label_replace(") == len(SAMPLE_FIELDS) + 7  # 8 checks: one more part than ors
    assert 'job="qwen3-8b"' in q and 'tokenpools_proxy_in_flight{pool="qwen3-8b"}' in q


def test_scrape_age_is_the_oldest_targets_and_the_frozen_windows_overlap_as_reading_needs() -> None:
    config = QueryConfig(rate_window_s=30, stale_after_s=15)
    assert field_query(config, SCRAPE_AGE, "p") == 'time() - min(timestamp(up{job="p"}))'
    # vLLM over the rate window + 2 × the limit, up to now; the proxies over the rate window ending one limit ago
    assert 'vllm:request_success_total{job="p"}[60000ms]' in field_query(config, VLLM_FINISHED, "p")
    proxies = field_query(config, PROXY_FINISHED, "p")
    assert 'tokenpools_proxy_completions_total{pool="p",status="ok"}[30000ms] offset 15000ms' in proxies
    assert '{pool="p",status="ok"}[30000ms])' in field_query(config, PROXY_SERVED, "p")
    # the proxies' in flight as last scraped within the limit: one failed scrape of a proxy does not drop it
    assert field_query(config, PROXY_IN_FLIGHT, "p") == (
        'sum(last_over_time(tokenpools_proxy_in_flight{pool="p"}[15000ms]))')


def test_the_proxy_selector_is_its_own_and_a_trailing_comma_still_composes() -> None:
    config = QueryConfig(proxy_selector='pool="{pool}", namespace="{namespace}",')
    q = field_query(config, PROXY_SERVED, "p", namespace="ns")
    assert 'tokenpools_proxy_completions_total{pool="p", namespace="ns",status="ok"}' in q
    with pytest.raises(ValueError, match="proxy_selector"):
        QueryConfig(proxy_selector="{pool}")


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


@pytest.mark.parametrize("field", ["rate_window_s", "stale_after_s"])
def test_windows_must_be_positive(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        QueryConfig(**{field: 0})


def test_garbage_in_the_answer_is_ignored() -> None:
    result: list[dict[str, Any]] = [
        {"metric": {}, "value": [0, "1"]},
        {"metric": {"tp_field": "unknown"}, "value": [0, "1"]},
        {"metric": {"tp_field": "running"}, "value": [0, "not a number"]},
        {"metric": {"tp_field": "waiting"}},
    ]
    values, present = parse_values(result)
    assert values == {"running": None, "waiting": None} and present == {"running", "waiting"}
