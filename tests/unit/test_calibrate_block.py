"""The KV cache from vLLM's metrics, the ``perReplica`` block, its YAML snippet and the JSON document (pure)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.calibrate.block import floor_significant
from tokenpools.calibrate.exposition import counter_increase, model_total, series
from tokenpools.calibrate.kv import GIB, KvCache, kv_cache_gib, parse_cache_config
from tokenpools.calibrate.plan import make_plan
from tokenpools.calibrate.result import Calibration, engine_full
from tokenpools.calibrate.stats import RequestOutcome, StepStats
from tokenpools.config import load_config_text
from tokenpools.errors import ConfigError

# vLLM 0.32.0's CPU build serving the tiny model (VLLM_CPU_KVCACHE_SPACE=1), as /metrics printed it (labels cut)
VLLM_032 = (
    '# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
    '# TYPE vllm:cache_config_info gauge\n'
    'vllm:cache_config_info{_block_size_resolved="True",block_size="128",cache_dtype="auto",engine="0",'
    'gpu_memory_utilization="0.92",kv_cache_max_concurrency="1024.0",kv_cache_memory_bytes="1073741824",'
    'kv_cache_size_tokens="2097152",num_cpu_blocks="None",num_gpu_blocks="16384",'
    'num_gpu_blocks_override="None",sliding_window="None"} 1.0\n'
    'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.0\n'
)
SIM = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="1024"} 1\n'  # llm-d-inference-sim's
POOL = """\
apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {name: calibrated}
spec:
  model: tiny-llama
  backendRef: {name: vllm}
  kvBytesPerToken: 512
"""
PROPERTY = settings(max_examples=300, deadline=None)


def paste(text: str) -> str:
    """A TokenPool with ``text`` pasted under its spec, indented, as the snippet's comment says."""
    return POOL + "".join(f"  {line}\n" for line in text.splitlines())


def stats(concurrency: int, ttft_p99_s: float, prompt: int = 6400, completion: int = 3200,
          elapsed_s: float = 4.0) -> StepStats:
    return StepStats(concurrency=concurrency, requests=100, answered=100, elapsed_s=elapsed_s, prompt_tokens=prompt,
                     completion_tokens=completion, ttft_p50_s=ttft_p99_s / 2, ttft_p99_s=ttft_p99_s,
                     e2e_p99_s=ttft_p99_s * 3)


def calibration(kv: KvCache | None, kv_bytes_per_token: int | None = None, *steps: StepStats) -> Calibration:
    plan = make_plan("http://127.0.0.1:8000", "tiny-llama", max_concurrency=4, prompt_tokens=64, output_tokens=32,
                     ttft_p99_target_ms=500, kv_bytes_per_token=kv_bytes_per_token)
    return Calibration(plan, "2026-12-06T20:54:21+00:00", True, 26, kv,
                       steps or (stats(1, 0.05), stats(2, 0.2, elapsed_s=2.5), stats(4, 0.6, elapsed_s=2.2)))


def test_vllm_032_reports_blocks_tokens_and_bytes() -> None:
    kv = parse_cache_config(VLLM_032)
    assert kv == KvCache(engines=1, tokens=16384 * 128, memory_bytes=2**30, blocks=16384, block_size_tokens=128)
    estimate = kv_cache_gib(kv, None)
    assert estimate.gib == 1.0
    assert "kv_cache_memory_bytes" in estimate.how and "512 bytes per token" in estimate.how


def test_the_pools_bytes_per_token_converts_the_tokens_vllm_holds() -> None:
    estimate = kv_cache_gib(parse_cache_config(VLLM_032), 1024)  # the pool says twice vLLM's bytes per token
    assert estimate.gib == 2.0  # so that the pool counts the 2,097,152 tokens vLLM holds, not half
    assert "--kv-bytes-per-token" in estimate.how


def test_the_simulator_has_blocks_without_bytes() -> None:
    kv = parse_cache_config(SIM)
    assert kv is not None and (kv.tokens, kv.memory_bytes) == (16384, None)
    missing = kv_cache_gib(kv, None)
    assert missing.gib is None and "16,384 tokens" in missing.how and "--kv-bytes-per-token" in missing.how
    assert kv_cache_gib(kv, 512).gib == 16384 * 512 / GIB


def test_engines_add_up_and_no_series_is_none() -> None:
    two = parse_cache_config(SIM + SIM.replace('block_size="16"', 'block_size="16",engine="1"'))
    assert two is not None and (two.engines, two.tokens, two.blocks) == (2, 32768, 2048)
    assert parse_cache_config("vllm:num_requests_running 0\n") is None
    assert kv_cache_gib(None, 512).gib is None


@PROPERTY
@given(st.floats(1e-6, 1e9, allow_nan=False, allow_infinity=False))
def test_floor_significant_never_exceeds_the_value_and_keeps_four_digits(value: float) -> None:
    floored = floor_significant(value)
    assert floored <= value * (1 + 1e-9)
    assert floored >= value * (1 - 1e-3)


@pytest.mark.parametrize(("value", "expected"), [(1701.53, 1701), (480.33, 480.3), (1.0, 1.0),
                                                 (0.0078125, 0.007812), (123456.7, 123400)])
def test_floor_significant_examples(value: float, expected: float) -> None:
    assert floor_significant(value) == expected


def test_the_block_is_the_chosen_steps_total_tokens_per_s_and_concurrency() -> None:
    c = calibration(parse_cache_config(VLLM_032))
    chosen = c.chosen()
    assert chosen is not None and chosen.concurrency == 2  # 4's P99 TTFT 600 ms is over 500
    assert c.block() == {"tokensPerSecond": 3840, "kvCacheGiB": 1.0, "concurrency": 2}  # 9600 tokens / 2.5 s


def test_the_snippet_pasted_into_a_pool_validates_with_the_same_values() -> None:
    c = calibration(parse_cache_config(VLLM_032))
    text = c.snippet()
    assert text is not None and yaml.safe_load(text) == {"perReplica": c.block()}
    assert all(len(line) <= 100 for line in text.splitlines())
    pool = load_config_text(paste(text)).pools["calibrated"]
    assert (pool.per_replica.tokens_per_s, pool.per_replica.kv_bytes, pool.per_replica.concurrency) == (
        3840, 2**30, 2)


def test_without_kv_figures_the_snippet_says_so_and_does_not_validate_until_filled_in() -> None:
    c = calibration(None)
    text = c.snippet()
    assert text is not None and "kvCacheGiB: FILL IN" in text
    assert yaml.safe_load(text) == {"perReplica": {"tokensPerSecond": 3840, "concurrency": 2}}
    with pytest.raises(ConfigError, match="kvCacheGiB"):
        load_config_text(paste(text))
    filled = text.replace("perReplica:\n", "perReplica:\n  kvCacheGiB: 8\n")
    assert load_config_text(paste(filled)).pools["calibrated"].per_replica.kv_bytes == 8 * 2**30


def test_no_step_under_target_proposes_nothing_and_says_why() -> None:
    c = calibration(None, None, stats(1, 0.7), stats(2, 0.9))
    assert (c.chosen(), c.block(), c.snippet()) == (None, None, None)
    assert any("lowest P99 TTFT was 700 ms" in note for note in c.notes())


def test_the_document_agrees_with_the_steps_and_the_block() -> None:
    failed = StepStats(8, 10, 9, 3.0, 100, 50, 0.1, 0.2, 0.3, {RequestOutcome.TIMED_OUT: 1}, "no end within 5 s")
    c = calibration(parse_cache_config(SIM), 512, stats(1, 0.05), stats(4, 0.3), failed)
    doc = c.document()
    assert [s["verdict"] for s in doc["steps"]] == ["under target", "under target", "failed"]
    assert doc["steps"][2]["failures"] == {"timed out": 1}
    assert doc["chosen_concurrency"] == 4 == doc["per_replica"]["concurrency"]
    assert doc["per_replica"]["tokensPerSecond"] == math.floor(doc["steps"][1]["total_tokens_per_s"])
    assert doc["kv_cache_gib"]["value"] == pytest.approx(16384 * 512 / GIB)
    assert any("concurrency 8: 1 timed out (no end within 5 s)" in note for note in doc["notes"])


def test_a_refused_ignore_eos_and_short_answers_are_noted() -> None:
    c = calibration(None, None, stats(1, 0.05, completion=1000))  # 10 tokens a request of 32 asked
    c = Calibration(c.plan, c.measured_at, False, c.prompt_words, c.kv, c.steps)
    notes = c.notes()
    assert any("refused vLLM's ignore_eos" in n for n in notes)
    assert any("10.0 completion tokens on average, below --output-tokens 32" in n for n in notes)


def test_exposition_series_keep_vllms_names_and_skip_the_rest() -> None:
    page = (VLLM_032 + '# TYPE vllm:request_queue_time_seconds histogram\n'
            'vllm:request_queue_time_seconds_sum{engine="0",model_name="tiny-llama"} 19.8\n'
            'vllm:request_queue_time_seconds_sum{engine="1",model_name="tiny-llama"} 0.2\n'
            'vllm:request_queue_time_seconds_sum{engine="0",model_name="other"} 7.0\n'
            'vllm:request_queue_time_seconds_count{engine="0",model_name="tiny-llama"} 158.0\n'
            'vllm:request_queue_time_seconds_sum_broken{model_name="tiny-llama"} 1\n'
            'vllm:request_queue_time_seconds_sum{model_name="tiny-llama"} not-a-number\n')
    assert series(page, "vllm:kv_cache_usage_perc") == [({"engine": "0", "model_name": "tiny-llama"}, 0.0)]
    assert model_total(page, "vllm:request_queue_time_seconds_sum", "tiny-llama") == pytest.approx(20.0)
    assert model_total(page, "vllm:request_queue_time_seconds_sum", "absent") is None
    assert model_total("plain_counter 3\n", "plain_counter", "any") == 3.0  # no model_name: every series


def test_a_chosen_step_whose_requests_wait_in_the_engine_is_noted() -> None:
    full = dataclasses.replace(stats(2, 0.2), ttft_p50_s=0.1, backend_queue_mean_s=0.06)
    busy = dataclasses.replace(stats(2, 0.2), ttft_p50_s=0.1, backend_queue_mean_s=0.01)
    assert (engine_full(full), engine_full(busy), engine_full(stats(2, 0.2))) == (True, False, False)
    notes = calibration(None, None, stats(1, 0.05), full).notes()
    assert any(n.startswith("at concurrency 2 requests waited 60 ms on average in the backend's own queue")
               for n in notes)
    assert not any("own queue" in n for n in calibration(None, None, stats(1, 0.05), busy).notes())


def test_a_counter_that_appears_during_a_step_counts_from_zero() -> None:
    name, line = "vllm:request_queue_time_seconds_sum", 'vllm:request_queue_time_seconds_sum{model_name="m"} '
    assert counter_increase(line + "1.5\n", line + "4.0\n", name, "m") == 2.5
    assert counter_increase("other 1\n", line + "4.0\n", name, "m") == 4.0  # no request had queued before
    assert counter_increase(line + "1.5\n", "other 1\n", name, "m") is None
    assert counter_increase(None, line + "4.0\n", name, "m") is None  # no /metrics: unknown, not 0
    running = 'vllm:num_requests_running{model_name="m"} 0\n'
    assert counter_increase(running, running, name, "m") is None  # without a witness: the backend lacks it
    assert counter_increase(running, running, name, "m", witness="vllm:num_requests_running") == 0.0
    assert counter_increase(running, running + line + "0.5\n", name, "m", witness="vllm:num_requests_running") == 0.5
