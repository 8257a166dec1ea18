"""``tokenpools calibrate`` against real vLLM (the CPU build serving the tiny model, docs/vllm.md): vLLM accepts
``ignore_eos``, so every request makes exactly its ``max_tokens``; the tokens counted from its usage are those its
own counters show; the KV cache is what its ``vllm:cache_config_info`` says (``VLLMServer``'s 1 GiB, at the bytes
per token the model's geometry gives); the block validates. Short on purpose (concurrency up to 4, 32 tokens out):
vLLM shares 2 cores with everything else here, so the target is generous and the figures are not asserted, only
their coherence.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from backend_fixtures import scrape
from calibrate_support import calibrate, check_consistent, check_validates

from tokenpools.calibrate.kv import GIB
from tokenpools_dev.devstack.vllm import MODEL_NAME, VLLMServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OUTPUT_TOKENS, PROMPT_TOKENS = 32, 64


def kv_bytes_per_token(model: Path) -> int:
    """c of the model vLLM serves, from its config.json: layers × (K and V) × KV heads × head dim × 2 bytes (bf16,
    as ``VLLMServer`` runs it); the tiny model's is 512."""
    config = json.loads((model / "config.json").read_text())
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * 2


def counter(samples: dict[str, float], name: str) -> float:
    return samples.get(f'{name}{{engine="0",model_name="{MODEL_NAME}"}}', 0.0)


def test_calibrating_vllm(vllm_server: VLLMServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = scrape(vllm_server.base_url)
    document = calibrate(capsys, tmp_path, vllm_server.base_url, "--model", MODEL_NAME, "--max-concurrency", "4",
                         "--prompt-tokens", str(PROMPT_TOKENS), "--output-tokens", str(OUTPUT_TOKENS),
                         "--rounds", "4", "--ttft-p99-target-ms", "20000")
    after = scrape(vllm_server.base_url)
    steps = document["steps"]
    assert [s["concurrency"] for s in steps] == [1, 2, 4]
    assert all(s["answered"] == s["requests"] for s in steps)
    check_consistent(document)
    requests = sum(s["requests"] for s in steps)
    completion = sum(s["completion_tokens"] for s in steps)
    assert document["backend"]["ignore_eos"] and completion == OUTPUT_TOKENS * requests
    assert sum(s["prompt_tokens"] for s in steps) / requests == pytest.approx(PROMPT_TOKENS, rel=0.25)
    made = counter(after, "vllm:generation_tokens_total") - counter(before, "vllm:generation_tokens_total")
    assert made == completion + 2 * OUTPUT_TOKENS  # and the two warm-ups
    prompted = counter(after, "vllm:prompt_tokens_total") - counter(before, "vllm:prompt_tokens_total")
    assert prompted == sum(s["prompt_tokens"] for s in steps) + document["backend"]["warm_up_tokens"]["prompt"]
    assert all(s["backend_queue_mean_s"] is not None and s["backend_queue_mean_s"] >= 0 for s in steps)
    kv, c = document["backend"]["kv_cache"], kv_bytes_per_token(vllm_server.install.model)
    assert kv["memory_bytes"] == vllm_server.kv_cache_gib * GIB
    assert kv["memory_bytes"] == kv["tokens"] * c  # vLLM's blocks × block size × the model's bytes per token
    assert document["per_replica"]["kvCacheGiB"] == vllm_server.kv_cache_gib
    check_validates(capsys, tmp_path, MODEL_NAME, c)
