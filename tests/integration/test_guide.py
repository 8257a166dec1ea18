"""docs/guide.md works as written: its ```sh blocks, run as they stand.

Steps 1 and 2 run in one ``bash`` (one shell, as the guide asks of its reader), in an empty directory, against a
real llm-d-inference-sim and the session's real Kafka broker; the only inputs are the variables the guide itself
defines at the top of each step (``BACKEND_URL``, ``PROXY_PORT``, ``KAFKA_BOOTSTRAP``, ...), pointed at the fixtures,
and a topic prefix of this test's own. The proxy and the agents are the guide's own background processes; the
test checks what its ``curl`` commands printed: an admitted request, a 429 over the token bucket and, in file mode,
the spot team refused; with the agents, the spot team admitted once they lend it capacity, and the 429 still there.

Step 3's blocks run in the same directory (they read step 1's ``config.yaml``) with ``kubectl`` recording its
arguments; each recorded command is then checked against the real kube-apiserver as
test_deploy_dry_run.py checks ``kubectl apply -k``: rendered by the real kustomize, the CRDs and the Namespace
applied, everything else server-side applied with ``dryRun=All``. A kubectl command the test cannot check fails it,
so the guide cannot grow a command nobody ran.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from backend_fixtures import inference_sim_binary  # noqa: F401  (fixture import)
from controllers_fixtures import DEPLOY, admin_client, wait_established
from test_deploy_dry_run import name_of, object_path, render, resource_paths, server_side_apply

from tokenpools_dev.devstack.inference_sim import InferenceSim, free_port
from tokenpools_dev.devstack.kube import KubeAPIServer

pytestmark = [pytest.mark.integration]

REPO = DEPLOY.parent
GUIDE = REPO / "docs" / "guide.md"
MODEL = "qwen3-8b"  # the guide's default, served by the simulator under that name
STEP_MARK = "::guide step {}::"
STEPS_TIMEOUT_S = 900.0  # calibration ~30 s, the agents' first start up to a few minutes on 2 busy cores


def sh_blocks(markdown: str) -> dict[int, list[str]]:
    """The ```sh blocks of each '## Step N' section, in order."""
    steps: dict[int, list[str]] = {}
    step = 0
    for part in re.split(r"^(## Step \d+\b.*)$", markdown, flags=re.MULTILINE):
        if m := re.match(r"## Step (\d+)", part):
            step = int(m[1])
        elif step:
            steps[step] = re.findall(r"^```sh\n(.*?)^```$", part, flags=re.MULTILINE | re.DOTALL)
    return steps


def curl_answers(output: str) -> list[tuple[int, str]]:
    """(status, body) of each `curl -w '\\nHTTP %{http_code}\\n'` the guide ran, in order."""
    return [(int(code), body.strip().splitlines()[-1] if body.strip() else "")
            for body, code in re.findall(r"(.*?)\nHTTP (\d{3})\n", output, flags=re.DOTALL)]


def error_code(body: str) -> str:
    return str(json.loads(body)["error"]["code"])


@dataclass
class GuideRun:
    workdir: Path
    env: dict[str, str]
    outputs: dict[int, str]  # stdout of each step
    stderr: str


def stop_background(workdir: Path) -> None:
    """The guide's own background processes, when a failed step may have left them running (a step that ended
    stopped them itself, and their ids may be another process's by now)."""
    for pid_file in workdir.glob("*.pid"):
        try:
            os.kill(int(pid_file.read_text().strip()), signal.SIGTERM)
        except (ValueError, ProcessLookupError):
            pass


@pytest.fixture(scope="module")
def guide_run(inference_sim_binary: Path, kafka_bootstrap: str,  # noqa: F811
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuideRun]:
    """Steps 1 and 2 of the guide, run once for the module's tests."""
    steps = sh_blocks(GUIDE.read_text())
    assert sorted(steps) == [1, 2, 3] and all(steps.values()), "the guide has three steps with ```sh blocks"
    workdir = tmp_path_factory.mktemp("guide")
    exe_dir = Path(sys.executable).parent  # the venv's bin: `tokenpools` as an operator installs it
    with InferenceSim(model=MODEL, max_num_seqs=8, time_to_first_token=0.05, inter_token_latency=0.01,
                      binary=inference_sim_binary) as sim:
        env = {**os.environ, "PATH": f"{exe_dir}{os.pathsep}{os.environ['PATH']}",
               "BACKEND_URL": sim.base_url, "PROXY_PORT": str(free_port()), "KAFKA_BOOTSTRAP": kafka_bootstrap,
               "AGENTS_HTTP_PORT": str(free_port()),
               "TOKENPOOLS_KAFKA__TOPIC_PREFIX": f"guide-{uuid.uuid4().hex[:8]}."}
        for name in ("MODEL", "KV_BYTES_PER_TOKEN", "SUPPORT_KEY", "SEARCH_KEY", "RESEARCH_KEY",
                     "TOKENPOOLS_KAFKA__BOOTSTRAP_SERVERS", "TOKENPOOLS_REPO", "CLUSTER_BACKEND_URL"):
            env.pop(name, None)  # the guide's defaults, not the caller's
        script = "set -eu\n" + "".join(
            f"echo '{STEP_MARK.format(n)}'\n" + "\n".join(steps[n]) for n in (1, 2))
        try:
            done = subprocess.run(["bash", "-c", script], cwd=workdir, env=env, capture_output=True, text=True,
                                  timeout=STEPS_TIMEOUT_S, check=False)
        except BaseException:
            stop_background(workdir)
            raise
        if done.returncode != 0:
            stop_background(workdir)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(workdir.glob("*.log")))
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}\n{logs}"
    parts = done.stdout.split(STEP_MARK.format(2))
    yield GuideRun(workdir, env, {1: parts[0], 2: parts[1]}, done.stderr)


def test_step_1_file_mode_admits_and_refuses_as_the_guide_says(guide_run: GuideRun) -> None:
    answers = curl_answers(guide_run.outputs[1])
    assert [status for status, _ in answers] == [200, 429, 429], guide_run.outputs[1]
    ok, over, spot = (body for _, body in answers)
    assert json.loads(ok)["choices"][0]["message"]["content"]
    assert error_code(over) == "token_budget" and "bucket holds at most 4000" in json.loads(over)["error"]["message"]
    assert error_code(spot) == "concurrency" and "its limit is 0" in json.loads(spot)["error"]["message"]
    # the pool is the calibration's: the block in config.yaml is the one calibrate wrote
    block = yaml.safe_load((guide_run.workdir / "calibrate" / "calibration.yaml").read_text())["perReplica"]
    pool = next(d for d in yaml.safe_load_all((guide_run.workdir / "config.yaml").read_text())
                if d["kind"] == "TokenPool")
    assert pool["spec"]["perReplica"] == block and block["concurrency"] >= 4
    assert "config.yaml: valid (1 pool, 3 entitlements)" in guide_run.outputs[1]


def test_step_2_the_agents_lend_the_spot_team_capacity(guide_run: GuideRun) -> None:
    out = guide_run.outputs[2]
    tries = re.findall(r"^research: HTTP (\d{3})$", out, flags=re.MULTILINE)
    assert tries and tries[-1] == "200" and set(tries[:-1]) <= {"429"}, out
    health = json.loads(next(line for line in out.splitlines() if line.startswith('{"status"')))
    assert health["pools"]["shared"]["limits"] == "update" and health["events"]["send_errors"] == 0
    (status, body), = curl_answers(out)
    assert status == 429 and error_code(body) == "token_budget"
    for name in ("proxy", "agents"):  # the guide stopped what it started
        pid = int((guide_run.workdir / f"{name}.pid").read_text())
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


KUBECTL_SHIM = """#!{python}
import json, os, sys
with open(os.environ["KUBECTL_LOG"], "a") as f:
    f.write(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd()}}) + "\\n")
"""


def namespace_and_rest(argv: list[str]) -> tuple[str | None, list[str]]:
    if argv[:1] == ["-n"]:
        return argv[1], argv[2:]
    return None, argv


async def check_kubectl(server: KubeAPIServer, commands: list[dict[str, Any]]) -> None:
    """Each recorded kubectl command, as the real kubectl would send it, against the real apiserver."""
    async with await admin_client(server) as api:
        for command in commands:
            ns, argv = namespace_and_rest(command["argv"])
            cwd = Path(command["cwd"])
            if argv[:2] == ["apply", "-k"] and len(argv) == 3:
                objs = render(cwd / argv[2])
            elif argv[:2] == ["apply", "-f"] and len(argv) == 3:
                objs = [d for d in yaml.safe_load_all((cwd / argv[2]).read_text()) if d]
                assert objs, f"kubectl {' '.join(command['argv'])}: no documents"
                for obj in objs:
                    if ns:
                        obj["metadata"].setdefault("namespace", ns)
            elif argv[:1] == ["get"] and len(argv) == 2 and ns:
                for plural in argv[1].split(","):
                    group = "/apis/tokenpools.io/v1alpha1" if plural.startswith("token") else "/api/v1"
                    await api.call_api(f"{group}/namespaces/{ns}/{plural}", "GET",
                                       response_types_map={200: "object"}, auth_settings=["BearerToken"],
                                       _return_http_data_only=True)
                continue
            else:
                pytest.fail(f"the test does not know how to check: kubectl {' '.join(command['argv'])}")
            await apply_objects(api, objs)


async def apply_objects(api: Any, objs: list[dict[str, Any]]) -> None:
    """CRDs and Namespaces for real (the rest's dry run needs them), the rest as a server-side dry run."""
    first = [o for o in objs if o["kind"] in ("CustomResourceDefinition", "Namespace")]
    rest = [o for o in objs if o not in first]
    if first:
        paths = await resource_paths(api, first)
        for obj in first:
            refused = await server_side_apply(api, obj, object_path(obj, *paths[(obj["apiVersion"], obj["kind"])]),
                                              dry_run=False)
            assert refused is None, refused
        await asyncio.gather(*(wait_established(api, o["metadata"]["name"]) for o in first
                               if o["kind"] == "CustomResourceDefinition"))
    paths = await resource_paths(api, rest)
    missing = sorted({name_of(o) for o in rest if (o["apiVersion"], o["kind"]) not in paths})
    assert not missing, f"kinds the server does not serve: {missing}"
    refusals = [r for o in rest
                if (r := await server_side_apply(api, o, object_path(o, *paths[(o["apiVersion"], o["kind"])]),
                                                 dry_run=True))]
    assert not refusals, "the server refused:\n" + "\n".join(refusals)


def test_step_3_kubernetes_commands_are_accepted_by_the_apiserver(guide_run: GuideRun,
                                                                   kube_apiserver: KubeAPIServer) -> None:
    shim_dir = guide_run.workdir / "kubectl-shim"
    shim_dir.mkdir(exist_ok=True)
    shim = shim_dir / "kubectl"
    shim.write_text(KUBECTL_SHIM.format(python=sys.executable))
    shim.chmod(0o755)
    log = guide_run.workdir / "kubectl.jsonl"
    env = {**guide_run.env, "PATH": f"{shim_dir}{os.pathsep}{guide_run.env['PATH']}", "KUBECTL_LOG": str(log),
           "TOKENPOOLS_REPO": str(REPO), "CLUSTER_BACKEND_URL": "http://vllm.tokenpools.svc:8000"}
    script = "set -eu\n" + "\n".join(sh_blocks(GUIDE.read_text())[3])
    done = subprocess.run(["bash", "-c", script], cwd=guide_run.workdir, env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    commands = [json.loads(line) for line in log.read_text().splitlines()]
    assert [c["argv"][:2] for c in commands] == [["apply", "-k"], ["-n", "tokenpools"], ["-n", "tokenpools"]]
    teams = [d for d in yaml.safe_load_all((guide_run.workdir / "teams.yaml").read_text()) if d]
    assert [d["kind"] for d in teams] == ["TokenPool"] + ["TokenEntitlement"] * 3
    assert teams[0]["spec"]["endpoints"] == ["http://vllm.tokenpools.svc:8000"]
    asyncio.run(check_kubectl(kube_apiserver, commands))
