"""A live Exp 1 on real vLLM (``experiment exp1 --mode live --backend vllm``): the option, what it rules out, and Exp
1's pool and load rescaled to a calibration of the backend. Pure: no processes, no network."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenpools.calibrate.stats import StepStats
from tokenpools.cli import main
from tokenpools.config import ConfigError, load_config, load_config_documents
from tokenpools.replay.experiments import (
    LoadOptions,
    build,
    examples_dir,
    exp1_slots,
    replica_model_at,
    replica_model_for,
)
from tokenpools.replay.load import service_time_s
from tokenpools_dev.live.calibrated import demo_keys
from tokenpools_dev.live.rescale import (
    LiveBackend,
    MeasuredReplica,
    check_live_options,
    guaranteed_slo_ms,
    parse_live_backend,
    rescale_documents,
    rescaled_slots,
)
from tokenpools_dev.live.runner import LiveOptions, stack_options
from tokenpools_dev.loadgen.keys import comment_keys, keys_for

EXP1 = examples_dir() / "exp1.yaml"


@pytest.mark.parametrize(("text", "backend"), [("sim", LiveBackend.SIM), ("vllm", LiveBackend.VLLM),
                                               (" vllm ", LiveBackend.VLLM)])
def test_the_live_backend_is_sim_or_vllm(text: str, backend: LiveBackend) -> None:
    assert parse_live_backend(text) is backend


@pytest.mark.parametrize(("text", "says"), [
    ("gpu", "--backend takes sim or vllm, got 'gpu'"),
    ("", "--backend takes sim or vllm, got ''"),
    ("http://127.0.0.1:8000", "use `tokenpools up --backend URL`"),  # a URL: the live runner measures what it starts
])
def test_any_other_backend_is_one_line(text: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_live_backend(text)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_vllm_runs_exp1_at_its_own_pace_only() -> None:
    check_live_options(LiveBackend.SIM, "exp2", 0.25)  # the simulator takes any
    check_live_options(LiveBackend.VLLM, "exp1", 1.0)
    with pytest.raises(ValueError, match="runs exp1 only"):
        check_live_options(LiveBackend.VLLM, "exp2", 1.0)
    with pytest.raises(ValueError, match="leave it at 1 \\(got 0.25\\)"):
        check_live_options(LiveBackend.VLLM, "exp1", 0.25)


def test_max_slots_goes_with_a_calibration_and_leaves_room_for_both_guaranteed_tenants() -> None:
    check_live_options(LiveBackend.VLLM, "exp1", 1.0, 2)
    with pytest.raises(ValueError, match="goes with --backend vllm"):
        check_live_options(LiveBackend.SIM, "exp1", 1.0, 4)
    with pytest.raises(ValueError, match="at least 2 .* got 1"):
        check_live_options(LiveBackend.VLLM, "exp1", 1.0, 1)


@pytest.mark.parametrize(("argv", "says"), [
    (["--backend", "gpu"], "--backend takes sim or vllm, got 'gpu'"),
    (["--backend", "vllm", "--time-scale", "0.5"], "leave it at 1 (got 0.5)"),
    (["--max-slots", "4"], "--max-slots caps what a calibration gives the pool"),
    (["--backend", "vllm", "--max-slots", "0"], "--max-slots must be at least 2"),
])
def test_a_bad_backend_stops_the_command_at_once_in_one_line(argv: list[str], says: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "exp1", "--mode", "live", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_exp2_on_vllm_stops_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "exp2", "--mode", "live", "--backend", "vllm"]) == 2
    assert "runs exp1 only" in capsys.readouterr().err


def step(concurrency: int, answered: int, elapsed_s: float, tokens: int) -> StepStats:
    return StepStats(concurrency=concurrency, requests=answered, answered=answered, elapsed_s=elapsed_s,
                     prompt_tokens=tokens // 2, completion_tokens=tokens - tokens // 2, ttft_p50_s=0.05,
                     ttft_p99_s=0.4, e2e_p99_s=0.8)


def test_a_requests_service_time_is_littles_law_over_the_chosen_step() -> None:
    # 8 clients, 64 requests answered in 4 s: each held its slot 8 × 4 / 64 = 0.5 s; 64 × 128 tokens in 4 s
    measured = MeasuredReplica.from_step(step(8, 64, 4.0, 64 * 128))
    assert measured == MeasuredReplica(8, 2048.0, 0.5)
    assert measured.tokens_per_slot_s == 256.0
    with pytest.raises(ValueError, match="no answered request"):
        MeasuredReplica.from_step(step(8, 0, 4.0, 0))
    with pytest.raises(ValueError, match="service_s"):
        MeasuredReplica(8, 2048.0, 0.0)


def test_the_calibration_target_is_the_tightest_guaranteed_slo() -> None:
    docs = list(load_config(EXP1).raw_documents)
    assert guaranteed_slo_ms(docs) == 1200
    docs[1]["spec"]["qos"]["sloTargetMs"] = 800
    assert guaranteed_slo_ms(docs) == 800
    with pytest.raises(ValueError, match="no guaranteed entitlement"):
        guaranteed_slo_ms([d for d in docs if d["kind"] == "TokenPool"])


def rescaled_exp1(concurrency: int, tokens_per_s: float, service_s: float = 0.5) -> list[dict]:
    return rescale_documents(load_config(EXP1).raw_documents, MeasuredReplica(concurrency, tokens_per_s, service_s))


def test_exp1_rescaled_to_8_slots_keeps_every_tenants_share() -> None:
    docs = rescaled_exp1(8, 4096.0)
    by_name = {d["metadata"]["name"]: d["spec"] for d in docs}
    assert by_name["qwen3-8b"]["perReplica"] == {"tokensPerSecond": 4096, "kvCacheGiB": 8, "concurrency": 8}
    for name in ("guaranteed-a", "guaranteed-c"):  # 6 of 16 slots -> 3 of 8; 3 slots × 512 tokens/s; 3/8 of 8 GiB
        assert by_name[name]["resources"] == {"tokensPerSecond": 1536, "kvCacheGiB": 3, "concurrency": 3}
    assert "resources" not in by_name["spot-b"]  # spot has no baseline
    original = load_config(EXP1).raw_documents
    assert original[0]["spec"]["perReplica"]["concurrency"] == 16  # the file's documents are left as they were
    loaded = load_config_documents(docs, "exp1-vllm.yaml")  # and the rescaled ones are a valid config
    assert loaded.pools["qwen3-8b"].per_replica.concurrency == 8


def test_a_rescaled_exp1_sends_each_tenant_its_slots_at_the_measured_pace(tmp_path) -> None:
    import yaml

    path = tmp_path / "exp1-vllm.yaml"
    path.write_text(demo_keys(EXP1.read_text()) + yaml.safe_dump_all(rescaled_exp1(8, 4096.0), sort_keys=False))
    loaded = load_config(path)
    pool = loaded.pools["qwen3-8b"]
    assert exp1_slots(pool, loaded.entitlements_of("qwen3-8b")) == {"guaranteed-a": 3, "spot-b": 5, "guaranteed-c": 3}
    scenario = build("exp1", ["load.service_s=0.5"], path)
    assert scenario.pool.per_replica.concurrency == 8
    assert service_time_s(scenario.replica_model, 64, 64) == pytest.approx(0.5)
    counts = {name: sum(1 for a in scenario.arrivals if a.entitlement == name) for name in exp1_slots(pool, [
        e for e in loaded.entitlements_of("qwen3-8b")])}
    # 3 slots / 0.5 s = 6 requests/s for 90 s; spot 10/s for 90 s; c 6/s for 30 s (Poisson: within ~10 %)
    assert counts["guaranteed-a"] == pytest.approx(540, rel=0.1)
    assert counts["spot-b"] == pytest.approx(900, rel=0.1)
    assert counts["guaranteed-c"] == pytest.approx(180, rel=0.15)
    assert [p.name for p in scenario.phases] == ["a + b (8 of 8 slots)", "+ c: overload (11 of 8)", "c gone (8 of 8)"]
    # the load generator still finds every tenant's demo key in the rescaled file
    assert keys_for(loaded, path.read_text(), None, list(counts)) == comment_keys(EXP1.read_text())


def test_the_paper_exp1_is_unchanged_without_a_measured_service_time() -> None:
    loaded = load_config(EXP1)
    assert exp1_slots(loaded.pools["qwen3-8b"], loaded.entitlements_of("qwen3-8b")) == {
        "guaranteed-a": 6, "spot-b": 10, "guaranteed-c": 6}
    assert build("exp1").replica_model == replica_model_for(loaded.pools["qwen3-8b"])
    assert [p.name for p in build("exp1").phases] == ["a + b (16 of 16 slots)", "+ c: overload (22 of 16)",
                                                       "c gone (16 of 16)"]


def test_a_pool_of_one_slot_cannot_hold_exp1() -> None:
    with pytest.raises(ValueError, match="at 1 slot only"):
        rescaled_exp1(1, 500.0)


@pytest.mark.parametrize("bad", ["-1", "nan", "inf"])
def test_a_service_time_is_a_number_of_seconds(bad: str) -> None:
    with pytest.raises(ConfigError, match="--set: load.service_s: must be a number of seconds >= 0"):
        LoadOptions.parse([f"load.service_s={bad}"])


@given(st.floats(0.01, 100.0), st.integers(1, 64), st.integers(1, 2048), st.integers(1, 2048))
def test_a_replica_model_at_a_service_time_takes_exactly_that_long(service_s: float, seqs: int, prompt: int,
                                                                   output: int) -> None:
    model = replica_model_at(replica_model_for(load_config(EXP1).pools["qwen3-8b"]).__class__(max_num_seqs=seqs),
                             service_s, prompt, output)
    assert math.isclose(service_time_s(model, prompt, output), service_s, rel_tol=1e-9)
    assert model.max_num_seqs == seqs


@given(st.integers(1, 64), st.integers(2, 64))
def test_rescaled_guaranteed_slots_keep_their_share_within_half_a_slot(slots_of_16: int, concurrency: int) -> None:
    n = rescaled_slots(min(slots_of_16, 16), 16, concurrency)
    assert n >= 1
    assert abs(n - min(slots_of_16, 16) * concurrency / 16) <= 0.5 or n == 1


def test_the_stack_of_a_vllm_run_runs_vllm_unsplit(tmp_path) -> None:
    options = LiveOptions(name="exp1", out=tmp_path, backend=LiveBackend.VLLM)
    built = stack_options(options, build("exp1"))
    assert str(built.backend) == "vllm" and built.split == {} and built.time_scale == 1
    assert str(stack_options(LiveOptions(name="exp1", out=tmp_path), build("exp1")).backend) == "sim"
