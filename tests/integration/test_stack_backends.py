"""``tokenpools up --backend vllm`` and ``--backend URL`` as a user runs them, on real services (docs/vllm.md).

What it proves:
- ``--backend vllm`` starts a real vLLM per pool replica, serving the pool's ``spec.model`` name: a chat request
  through the stack's proxy is answered by it (the model name, the usage, and vLLM's own token counter agree),
  ``stack.json`` lists it under ``urls.backends``, Prometheus scrapes it with a long timeout, and ``tokenpools down``
  leaves no vLLM process (its engine core included);
- ``--backend URL`` starts no backend and puts the proxies in front of a running server (the session's vLLM): the
  request reaches it, ``down`` leaves it running; a URL that does not serve the pool's model, or does not answer, or
  a value that is not a backend at all, fails in one line before anything starts.

One extra vLLM start (~45 s on 2 shared cores) beside the session's ``vllm_server``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletion

from tokenpools.config import hash_api_key
from tokenpools_dev.devstack.process import free_port
from tokenpools_dev.devstack.stack.state import StackState, pid_runs, read_state
from tokenpools_dev.devstack.vllm import MODEL_NAME, VLLMError, VLLMInstall, VLLMServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POOL = "tiny"
KEY = "sk-backend-test"
SERVED = "acme/tiny-chat"  # what `--backend vllm` must serve: the pool's model, not the install's directory name
CONFIG = """
apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {{name: {pool}}}
spec:
  model: {model}
  backendRef: {{apiVersion: apps/v1, kind: Deployment, name: tiny-vllm}}
  scaling: {{minReplicas: 1, maxReplicas: 1}}
  perReplica: {{tokensPerSecond: 5000, kvCacheGiB: 1, concurrency: 4}}
  kvGeometry: {{layers: 2, kvHeads: 2, headDim: 32, bytesPerElement: 2}}
  defaults: {{maxTokens: 16}}
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: team}}
spec:
  tenantId: tenant-team
  poolRef: {{name: {pool}}}
  qos: {{serviceClass: guaranteed, sloTargetMs: 30000}}
  resources: {{tokensPerSecond: 2000, kvCacheGiB: 0.5, concurrency: 4}}
  apiKeys: [{{sha256: {key}}}]
"""
MAX_TOKENS = 12


def tokenpools(*args: str, timeout_s: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tokenpools", *args], capture_output=True, text=True,
                          timeout=timeout_s, check=False, env={**os.environ, "COLUMNS": "200", **(env or {})})


def write_config(directory: Path, model: str) -> Path:
    path = directory / "backend.yaml"
    path.write_text(CONFIG.format(pool=POOL, model=model, key=hash_api_key(KEY)))
    return path


def chat(proxy_url: str, model: str) -> ChatCompletion:
    with OpenAI(base_url=proxy_url + "/v1", api_key=KEY, max_retries=0, timeout=120) as client:
        return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello, backend"}],
                                              max_tokens=MAX_TOKENS, extra_body={"ignore_eos": True})


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def vllm_counter(base_url: str, name: str) -> float:
    """A ``vllm:*`` counter of vLLM's own ``/metrics``, summed over its labels."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}}\s+(\S+)$", text, re.M))


def scrape_targets(prometheus_url: str) -> list[dict]:
    return list(get_json(prometheus_url + "/api/v1/targets?state=active")["data"]["activeTargets"])


def group_members(pgid: int) -> list[int]:
    """Live pids in process group ``pgid`` (``vllm serve`` leads its own: the API server, engine core, worker). A
    zombie (state Z) has exited and holds nothing; it stays listed only until its new parent, process 1, reaps it."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            state, _, pgrp = (proc / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            if int(pgrp) == pgid and state != "Z":
                out.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


# ---------------------------------------------------------------- --backend vllm


@dataclass
class VLLMRun:
    up: subprocess.CompletedProcess[str]
    state: StackState | None
    answer: ChatCompletion | None
    generated: float  # vLLM's own vllm:generation_tokens_total after the request
    targets: list[dict]  # Prometheus' active targets while the stack ran
    down: subprocess.CompletedProcess[str] | None
    after: StackState | None
    vllm_pid: int | None
    left: list[int]  # pids of the vLLM's process group after `down`


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory: pytest.TempPathFactory) -> VLLMRun:
    """One ``up --backend vllm --detach``, one request, one ``down``; each step a CLI command or a client call."""
    try:
        VLLMInstall.find()
    except VLLMError as e:
        pytest.skip(str(e))
    tmp = tmp_path_factory.mktemp("backend-vllm")
    run_dir = tmp / "stack"
    up = tokenpools("up", "--config", str(write_config(tmp, SERVED)), "--no-kubernetes", "--backend", "vllm",
                    "--run-dir", str(run_dir), "--detach")
    state = read_state(run_dir)
    answer, generated, targets, down, vllm_pid = None, 0.0, [], None, None
    try:
        if up.returncode == 0 and state is not None:
            vllm_pid = next((c.pid for c in state.components if c.kind == "vllm"), None)
            answer = chat(state.urls["proxies"][0], SERVED)
            generated = vllm_counter(state.urls["backends"][POOL][0], "vllm:generation_tokens_total")
            targets = scrape_targets(state.urls["prometheus"])
    finally:
        down = tokenpools("down", "--run-dir", str(run_dir), timeout_s=120)
    left = group_members(vllm_pid) if vllm_pid else []
    return VLLMRun(up, state, answer, generated, targets, down, read_state(run_dir), vllm_pid, left)


def test_up_backend_vllm_starts_vllm_in_place_of_the_simulator(vllm_run: VLLMRun) -> None:
    assert vllm_run.up.returncode == 0, vllm_run.up.stderr[-3000:]
    state = vllm_run.state
    assert state is not None and state.status == "ready"
    kinds = {c.name: c.kind for c in state.components}
    assert kinds.get(f"vllm-{POOL}-0") == "vllm" and "sim" not in kinds.values()
    assert re.search(rf"vllm-{POOL}-0: running on 127\.0\.0\.1:\d+", vllm_run.up.stderr)  # the progress lines
    assert state.urls["backend"] == "vllm"
    vllm = next(c for c in state.components if c.kind == "vllm")
    assert state.urls["backends"] == {POOL: [f"http://{vllm.address}"]}


def test_a_chat_through_the_proxy_is_answered_by_vllm(vllm_run: VLLMRun) -> None:
    answer = vllm_run.answer
    assert answer is not None, vllm_run.up.stderr[-3000:]
    assert answer.model == SERVED and answer.choices[0].finish_reason == "length"
    assert answer.usage is not None and answer.usage.completion_tokens == MAX_TOKENS
    assert answer.usage.prompt_tokens > 0
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + MAX_TOKENS
    assert vllm_run.generated == MAX_TOKENS  # counted by that vLLM: the only request it ever served


def test_prometheus_scrapes_vllm_with_a_timeout_of_seconds(vllm_run: VLLMRun) -> None:
    (target,) = [t for t in vllm_run.targets if t["labels"]["job"] == POOL]
    assert target["health"] == "up" and target["scrapeTimeout"] == "10s"
    assert vllm_run.state is not None and target["scrapeUrl"] == vllm_run.state.urls["backends"][POOL][0] + "/metrics"


def test_down_leaves_no_vllm_process(vllm_run: VLLMRun) -> None:
    assert vllm_run.down is not None and vllm_run.down.returncode == 0, vllm_run.down
    assert vllm_run.after is not None and vllm_run.after.status == "stopped"
    assert vllm_run.vllm_pid is not None and not pid_runs(vllm_run.vllm_pid, "vllm serve")
    assert vllm_run.left == [], "vLLM's engine core or worker outlived `tokenpools down`"


# ---------------------------------------------------------------- --backend URL


@pytest.fixture
def url_stack(vllm_server: VLLMServer, tmp_path: Path) -> Iterator[tuple[subprocess.CompletedProcess[str], Path]]:
    run_dir = tmp_path / "stack"
    up = tokenpools("up", "--config", str(write_config(tmp_path, vllm_server.model_name)), "--no-kubernetes",
                    "--no-agents", "--no-controller", "--backend", vllm_server.base_url + "/v1",
                    "--run-dir", str(run_dir), "--detach", timeout_s=300)
    try:
        yield up, run_dir
    finally:
        tokenpools("down", "--run-dir", str(run_dir), timeout_s=120)


def test_up_backend_url_fronts_a_running_server(url_stack: tuple[subprocess.CompletedProcess[str], Path],
                                                vllm_server: VLLMServer) -> None:
    up, run_dir = url_stack
    assert up.returncode == 0, up.stderr[-3000:]
    state = read_state(run_dir)
    assert state is not None and state.status == "ready"
    assert not [c for c in state.components if c.kind in ("sim", "vllm", "service")]  # nothing started for it
    assert state.urls["backends"] == {POOL: [vllm_server.base_url]} and state.urls["backend"] == vllm_server.base_url
    assert f'endpoints:\n  - {vllm_server.base_url}' in Path(state.urls["config"]).read_text()
    before = vllm_counter(vllm_server.base_url, "vllm:generation_tokens_total")
    answer = chat(state.urls["proxies"][0], vllm_server.model_name)
    assert answer.model == vllm_server.model_name and answer.usage is not None
    assert answer.usage.completion_tokens == MAX_TOKENS
    assert vllm_counter(vllm_server.base_url, "vllm:generation_tokens_total") - before == MAX_TOKENS
    (target,) = [t for t in scrape_targets(state.urls["prometheus"]) if t["labels"]["job"] == POOL]
    assert target["scrapeUrl"] == vllm_server.base_url + "/metrics" and target["scrapeTimeout"] == "10s"
    down = tokenpools("down", "--run-dir", str(run_dir), timeout_s=120)
    assert down.returncode == 0 and vllm_server.running  # the operator's server is not ours to stop


def test_a_url_that_does_not_serve_the_pools_model_fails_in_one_line(vllm_server: VLLMServer,
                                                                     tmp_path: Path) -> None:
    done = tokenpools("up", "--config", str(write_config(tmp_path, "acme/absent")), "--no-kubernetes",
                      "--backend", vllm_server.base_url, "--run-dir", str(tmp_path / "stack"), "--detach")
    assert done.returncode == 2
    assert one_line_error(done) == (f"tokenpools up: --backend {vllm_server.base_url} does not serve pool {POOL}'s "
                                    f"model acme/absent (it serves: {MODEL_NAME})")
    assert not (tmp_path / "stack").exists()  # checked before anything started


def test_a_url_that_does_not_answer_fails_in_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = tokenpools("up", "--config", str(write_config(tmp_path, "m")), "--backend", url,
                      "--run-dir", str(tmp_path / "stack"), "--detach")
    assert done.returncode == 2  # the environment: exit 2, as bad input (docs/conventions.md#exit-codes)
    assert one_line_error(done).startswith(f"tokenpools up: --backend {url}: GET /v1/models failed: ")


@pytest.mark.parametrize("value", ["vlm", "ftp://127.0.0.1:8000", "127.0.0.1:8000", "http://host:port"])
def test_a_bad_backend_value_is_a_usage_error(value: str, tmp_path: Path) -> None:
    done = tokenpools("up", "--config", str(write_config(tmp_path, "m")), "--backend", value,
                      "--run-dir", str(tmp_path / "stack"), "--detach")
    assert done.returncode == 2
    assert one_line_error(done).startswith("tokenpools up: --backend")
    assert not (tmp_path / "stack").exists()


def test_a_missing_vllm_install_names_the_install_script(tmp_path: Path) -> None:
    done = tokenpools("up", "--config", str(write_config(tmp_path, "m")), "--backend", "vllm",
                      "--run-dir", str(tmp_path / "stack"), "--detach", env={"TOKENPOOLS_CACHE": str(tmp_path)})
    assert done.returncode == 2
    assert "scripts/install-vllm.sh" in one_line_error(done)
