"""``tokenpools calibrate`` against llm-d-inference-sim, whose capacity is known: 4 slots (``--max-num-seqs 4``),
TTFT 50 ms and 25 ms between tokens. The calibration must find the 4, see the throughput stop growing beyond it,
count exactly the tokens the simulator says it made, and write a block that validates."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from backend_fixtures import inference_sim_binary, scrape  # noqa: F401 -- fixture
from calibrate_support import calibrate, check_consistent, check_validates

from tokenpools.calibrate.kv import GIB
from tokenpools_dev.devstack.inference_sim import InferenceSim

pytestmark = [pytest.mark.integration]

MODEL, SLOTS, OUTPUT_TOKENS, PROMPT_TOKENS = "sim-model", 4, 8, 64


@pytest.fixture(scope="module")
def sim(inference_sim_binary: Path) -> Iterator[InferenceSim]:  # noqa: F811 -- the fixture above
    with InferenceSim(model=MODEL, max_num_seqs=SLOTS, time_to_first_token=0.05, inter_token_latency=0.025,
                      binary=inference_sim_binary) as server:
        yield server


def test_the_calibration_finds_the_simulators_slots(sim: InferenceSim, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    before = scrape(sim.base_url)
    document = calibrate(capsys, tmp_path, sim.base_url, "--model", MODEL, "--max-concurrency", "8",
                         "--prompt-tokens", str(PROMPT_TOKENS), "--output-tokens", str(OUTPUT_TOKENS),
                         "--rounds", "4", "--ttft-p99-target-ms", "150", "--kv-bytes-per-token", "512")
    after = scrape(sim.base_url)
    steps = {s["concurrency"]: s for s in document["steps"]}
    assert list(steps) == [1, 2, 4, 8] and all(s["answered"] == s["requests"] == 4 * c for c, s in steps.items())
    # a queue forms beyond the 4 slots: a request waits for a whole one (~225 ms) before its first token
    assert document["chosen_concurrency"] == SLOTS
    assert steps[8]["verdict"] == "over target" and steps[8]["ttft_p50_s"] > 0.15
    chosen = check_consistent(document)
    assert 0.05 <= chosen["ttft_p50_s"] < 0.15  # the simulator's 50 ms TTFT, measured from the client
    # throughput grows with the slots in use, then stops
    assert steps[4]["output_tokens_per_s"] > 2.5 * steps[1]["output_tokens_per_s"]
    assert steps[8]["output_tokens_per_s"] < 1.3 * steps[4]["output_tokens_per_s"]
    # the tokens counted are those the simulator made (its own counters), the two warm-ups included
    made = {name: counter(after, name) - counter(before, name)
            for name in ("vllm:generation_tokens_total", "vllm:prompt_tokens_total")}
    assert document["backend"]["ignore_eos"]
    completion = sum(s["completion_tokens"] for s in steps.values())
    assert completion == OUTPUT_TOKENS * sum(s["requests"] for s in steps.values())  # ignore_eos: never shorter
    assert made["vllm:generation_tokens_total"] == completion + 2 * OUTPUT_TOKENS
    prompt = sum(s["prompt_tokens"] for s in steps.values())
    assert prompt / sum(s["requests"] for s in steps.values()) == pytest.approx(PROMPT_TOKENS, rel=0.1)
    warm_up = document["backend"]["warm_up_tokens"]
    assert made["vllm:prompt_tokens_total"] == prompt + warm_up["prompt"]
    assert warm_up["completion"] == 2 * OUTPUT_TOKENS
    # the wait is in the simulator's own queue: none within its slots, about a whole request beyond them
    assert all(steps[c]["backend_queue_mean_s"] < 0.03 for c in (1, 2, 4))
    assert steps[8]["backend_queue_mean_s"] > 0.1
    # the simulator reports 1,024 blocks of 16 tokens and no bytes: the pool's 512 bytes per token convert them
    assert document["backend"]["kv_cache"]["tokens"] == 16_384
    assert document["kv_cache_gib"]["value"] == 16_384 * 512 / GIB
    assert document["per_replica"]["kvCacheGiB"] == 0.007812  # floored to 4 significant digits
    check_validates(capsys, tmp_path, MODEL, 512)


def counter(samples: dict[str, float], name: str) -> float:
    """A counter of the model's (0 before its first request: the simulator has no series until then)."""
    return samples.get(f'{name}{{model_name="{MODEL}"}}', 0.0)


def test_bad_input_is_one_line_and_exit_2(sim: InferenceSim) -> None:
    """As an operator sees it: the installed command, a model the simulator does not serve."""
    done = subprocess.run([sys.executable, "-m", "tokenpools", "calibrate", sim.base_url + "/v1", "--model", "gpt-9"],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [
        f"tokenpools calibrate: {sim.base_url} does not serve the model 'gpt-9'; it serves: {MODEL}"]
