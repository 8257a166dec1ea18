"""What serves the local stack's pools (``tokenpools up --backend``): the option, the checks of a server's answers,
how Prometheus scrapes each backend, and the progress ``up --detach`` prints. Pure: no processes, no network."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tokenpools.config import load_config_text
from tokenpools.replay.experiments import examples_dir
from tokenpools_dev.devstack.prometheus import ScrapeJob, render_config
from tokenpools_dev.devstack.stack.backend import (
    REAL_SCRAPE_TIMEOUT_S,
    Backend,
    BackendKind,
    parse_backend,
    scrape_timing,
    served_models,
    unserved,
    unserved_message,
    url_scrape,
)
from tokenpools_dev.devstack.stack.components import VLLM_ENGINE_NICE, vllm_replica, worker_cpu
from tokenpools_dev.devstack.stack.config import StackOptions, pool_layouts
from tokenpools_dev.devstack.stack.state import ComponentState, Progress, StackState
from tokenpools_dev.devstack.vllm import SchedulingPolicy, VLLMInstall

EXP1 = examples_dir() / "exp1.yaml"


@pytest.mark.parametrize(("text", "kind", "url"), [
    ("sim", BackendKind.SIM, ""),
    ("vllm", BackendKind.VLLM, ""),
    (" vllm ", BackendKind.VLLM, ""),
    ("http://127.0.0.1:8000", BackendKind.URL, "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/", BackendKind.URL, "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/v1", BackendKind.URL, "http://127.0.0.1:8000"),  # an OpenAI client's base URL
    ("https://llm.example.com/team/v1/", BackendKind.URL, "https://llm.example.com/team"),
])
def test_a_backend_is_sim_vllm_or_a_servers_base_url(text: str, kind: BackendKind, url: str) -> None:
    backend = parse_backend(text)
    assert (backend.kind, backend.url) == (kind, url)
    assert backend.runs_replicas is (kind is not BackendKind.URL)
    assert str(backend) == (url or kind.value)


@pytest.mark.parametrize(("text", "says"), [
    ("vlm", "takes sim, vllm or the http"),
    ("ftp://host:21", "takes sim, vllm or the http"),
    ("127.0.0.1:8000", "takes sim, vllm or the http"),  # no scheme
    ("http://", "takes sim, vllm or the http"),
    ("http://host:port", "port must be a number"),
    ("http://host:99999", "port must be a number"),
    ("http://host:8000/v1?model=x", "query or a fragment"),
    ("", "takes sim, vllm or the http"),
])
def test_a_bad_backend_is_refused_in_one_line(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as refused:
        parse_backend(text)
    assert "\n" not in str(refused.value)


def test_only_a_url_backend_has_a_url() -> None:
    with pytest.raises(ValueError, match="kind `url` only"):
        Backend(BackendKind.VLLM, "http://h:1")
    with pytest.raises(ValueError, match="kind `url` only"):
        Backend(BackendKind.URL)


def test_a_real_backend_runs_at_its_own_speed_and_whole(tmp_path: Path) -> None:
    vllm = Backend(BackendKind.VLLM)
    with pytest.raises(ValueError, match="time scale must be 1, got 0.25"):
        StackOptions(config=EXP1, run_dir=tmp_path, time_scale=0.25, backend=vllm)
    with pytest.raises(ValueError, match="--split divides a simulated replica"):
        StackOptions(config=EXP1, run_dir=tmp_path, split={"qwen3-8b": 2}, backend=parse_backend("http://h:1"))
    assert StackOptions(config=EXP1, run_dir=tmp_path, time_scale=0.25, split={"qwen3-8b": 2}).backend == Backend()


def test_a_vllm_replica_gets_long_enough_to_start(tmp_path: Path) -> None:
    assert StackOptions(config=EXP1, run_dir=tmp_path, ready_timeout_s=30).replica_ready_timeout_s == 30
    vllm = StackOptions(config=EXP1, run_dir=tmp_path, ready_timeout_s=30, backend=Backend(BackendKind.VLLM))
    assert vllm.replica_ready_timeout_s == 600
    longer = StackOptions(config=EXP1, run_dir=tmp_path, ready_timeout_s=900, backend=Backend(BackendKind.VLLM))
    assert longer.replica_ready_timeout_s == 900


@pytest.mark.parametrize("engine_priority", [True, False])
def test_a_vllm_replica_serves_the_pools_model_with_its_slots_and_scheduling(tmp_path: Path,
                                                                             engine_priority: bool) -> None:
    text = EXP1.read_text().replace("  defaults: {maxTokens: 64}",
                                    f"  defaults: {{maxTokens: 64}}\n  enginePriority: {str(engine_priority).lower()}")
    layout = pool_layouts(load_config_text(text, "exp1.yaml"))["qwen3-8b"]
    assert layout.engine_priority is engine_priority
    install = VLLMInstall(vllm=tmp_path / "vllm", model=tmp_path / "model-1", cache=tmp_path / "cache")
    server = vllm_replica(layout, 3, tmp_path / "logs", install, ready_timeout_s=600)
    assert server.model_name == "nvidia/Qwen3-8B-NVFP4" and server.max_num_seqs == 16
    assert server.scheduling_policy is (SchedulingPolicy.PRIORITY if engine_priority else SchedulingPolicy.FCFS)
    assert server.log_path == tmp_path / "logs" / "vllm-qwen3-8b-3.log" and server.startup_timeout == 600
    assert server.KIND == "vllm" and server.CMD_MARKER == "vllm serve"
    assert server.engine_nice == VLLM_ENGINE_NICE > 0  # as every test vLLM: the API server must get the CPU
    env = server.environment()
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == worker_cpu(3, sorted(os.sched_getaffinity(0)))
    assert env["VLLM_USE_AOT_COMPILE"] == "0"  # vLLM 0.32's AOT artifact does not load on CPU: a start would compile


def test_vllm_replicas_bind_their_workers_to_the_cores_in_turn() -> None:
    assert [worker_cpu(serial, [1, 0]) for serial in range(4)] == ["0", "1", "0", "1"]
    assert [worker_cpu(serial, [5]) for serial in range(3)] == ["5", "5", "5"]  # one core: all share it
    with pytest.raises(ValueError, match="no CPU"):
        worker_cpu(0, [])


def test_real_backends_are_scraped_with_a_long_timeout() -> None:
    assert scrape_timing(BackendKind.SIM, 0.25) == (0.25, 0.25)
    assert scrape_timing(BackendKind.VLLM, 1.0) == (REAL_SCRAPE_TIMEOUT_S, REAL_SCRAPE_TIMEOUT_S)
    assert scrape_timing(BackendKind.URL, 30.0) == (30.0, REAL_SCRAPE_TIMEOUT_S)
    assert REAL_SCRAPE_TIMEOUT_S >= 5  # docs/vllm.md: /metrics took 1.4–2.4 s, once 9.8 s, while generating


def test_a_url_backends_metrics_are_beside_its_openai_paths() -> None:
    s = url_scrape("https://llm.example.com/team", 1.0)
    assert (s.host_port, s.scheme, s.metrics_path) == ("llm.example.com:443", "https", "/team/metrics")
    s = url_scrape("http://127.0.0.1:8000", 1.0)
    assert (s.host_port, s.scheme, s.metrics_path) == ("127.0.0.1:8000", "http", "/metrics")
    assert (s.interval_s, s.timeout_s) == scrape_timing(BackendKind.URL, 1.0)


def test_prometheus_jobs_keep_their_own_timing_scheme_and_path() -> None:
    doc = render_config({"sim-pool": ["127.0.0.1:1"],
                         "vllm-pool": ScrapeJob(("127.0.0.1:2",), interval_s=10, timeout_s=10),
                         "remote": ScrapeJob(("llm:443",), "https", "/team/metrics", 10, 8)}, scrape_interval=0.5)
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert doc["global"]["scrape_interval"] == "500ms"
    assert (jobs["sim-pool"]["scrape_interval"], jobs["sim-pool"]["scrape_timeout"]) == ("500ms", "500ms")
    assert "scheme" not in jobs["sim-pool"] and "metrics_path" not in jobs["sim-pool"]
    assert (jobs["vllm-pool"]["scrape_interval"], jobs["vllm-pool"]["scrape_timeout"]) == ("10000ms", "10000ms")
    assert jobs["remote"]["scheme"] == "https" and jobs["remote"]["metrics_path"] == "/team/metrics"
    assert jobs["remote"]["scrape_timeout"] == "8000ms"
    with pytest.raises(ValueError, match="above its interval"):
        render_config({"slow": ScrapeJob(("h:1",), timeout_s=5)}, scrape_interval=1)
    with pytest.raises(ValueError, match="timeout_s"):
        ScrapeJob(("h:1",), interval_s=1, timeout_s=2)


def test_the_models_a_server_lists_and_the_pools_it_does_not_serve() -> None:
    answer = {"object": "list", "data": [{"id": "tiny-llama", "object": "model"}, {"id": "other"}]}
    assert served_models(answer) == ["tiny-llama", "other"]
    models = {"a": "tiny-llama", "b": "nvidia/Qwen3-8B-NVFP4"}
    missing = unserved(models, served_models(answer))
    assert missing == {"b": "nvidia/Qwen3-8B-NVFP4"}
    message = unserved_message("http://h:1", missing, ["tiny-llama", "other"])
    assert message == "--backend http://h:1 does not serve pool b's model nvidia/Qwen3-8B-NVFP4 (it serves: tiny-llama, other)"
    assert unserved(models, ["tiny-llama", "nvidia/Qwen3-8B-NVFP4"]) == {}
    for not_a_list in ({"data": "x"}, {"models": []}, [], {"data": [{"name": "x"}]}):
        with pytest.raises(ValueError, match="not an OpenAI model list"):
            served_models(not_a_list)


def _state(*statuses: tuple[str, str, str]) -> StackState:
    return StackState("/run", 1, "starting", 0.0, "c.yaml", tuple(
        ComponentState(name, kind, 10, "127.0.0.1:5" if status == "running" else "", f"/run/logs/{name}.log", status)
        for name, kind, status in statuses))


def test_detached_up_reports_each_vllm_replicas_start_and_who_is_still_starting() -> None:
    progress, lines = Progress().after(_state(("kafka", "kafka", "stopped"), ("vllm-p-0", "vllm", "starting"),
                                              ("sim-q-0", "sim", "running")), 1.0)
    assert lines == ["   1 s  vllm-p-0: starting (log /run/logs/vllm-p-0.log)"]  # slow components only
    state = _state(("vllm-p-0", "vllm", "starting"))
    progress, lines = progress.after(state, 10.0)
    assert lines == []  # nothing changed, and not 15 s since the last line
    progress, lines = progress.after(state, 16.0)
    assert lines == ["  16 s  still starting: vllm-p-0"]
    progress, lines = progress.after(state, 20.0)
    assert lines == []
    progress, lines = progress.after(_state(("vllm-p-0", "vllm", "running")), 43.0)
    assert lines == ["  43 s  vllm-p-0: running on 127.0.0.1:5"]
    assert progress.after(_state(("vllm-p-0", "vllm", "running")), 90.0)[1] == []  # nothing is starting
