"""``tokenpools proxy --config FILE --no-kafka`` follows edits of FILE (docs/tenancy.md): a real process, a real
backend (llm-d-inference-sim). An entitlement added to the file is admitted within 2 s; an invalid edit logs one
clear line and the last good version keeps serving; the entitlement removed again is refused (401)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from backend_fixtures import inference_sim_binary  # noqa: F401  (fixture import)
from proxy_fixtures import config_text, start_sim  # noqa: F401

from tokenpools.config import hash_api_key
from tokenpools_dev.devstack.inference_sim import InferenceSim, free_port

pytestmark = pytest.mark.integration

ADDED = """---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: added}}
spec:
  tenantId: added
  poolRef: {{name: {pool}}}
  qos: {{serviceClass: spot, sloTargetMs: 30000}}
  apiKeys: [{{sha256: {digest}}}]
"""


def status(port: int, key: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", method="POST",
        data=b'{"model": "fake-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}',
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:  # not listening yet
        return 0


async def until(check: Callable[[], bool], timeout_s: float, what: str, log: Path) -> float:
    t0 = time.monotonic()
    while not await asyncio.to_thread(check):
        assert time.monotonic() - t0 < timeout_s, f"not within {timeout_s} s: {what}\n{log.read_text()}"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


async def test_the_proxy_follows_edits_of_its_config_file(
        start_sim: Callable[..., InferenceSim], tmp_path: Path) -> None:
    sim = start_sim()
    good = config_text([sim.base_url])
    pool = next(line.split("name:")[1].strip(" }") for line in good.splitlines() if "poolRef" in line)
    config = tmp_path / "pools.yaml"
    config.write_text(good)
    port = free_port()
    exe = Path(sys.executable).with_name("tokenpools")
    cmd = [str(exe), "proxy", "--config", str(config), "--port", str(port), "--no-kafka",
           "--set", f"proxy.spool_dir={tmp_path / 'spool'}", "--set", "proxy.config_poll_interval_s=0.2"]
    log = tmp_path / "proxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        await until(lambda: status(port, "sk-added") == 401, 30, "the proxy up, the key unknown", log)
        config.write_text(good + ADDED.format(pool=pool, digest=hash_api_key("sk-added")))
        added_s = await until(lambda: status(port, "sk-added") == 200, 10, "the added key admitted", log)
        print(f"file edit → admitted: {added_s:.2f} s")
        assert added_s < 2.0

        config.write_text(good + ADDED.format(pool="no-such-pool", digest=hash_api_key("sk-added")))
        await until(lambda: "edit refused" in log.read_text(), 10, "the invalid edit logged", log)
        refused = [line for line in log.read_text().splitlines() if "edit refused" in line]
        assert len(refused) == 1 and "no TokenPool named 'no-such-pool'" in refused[0]
        assert status(port, "sk-added") == 200  # the last good version serves

        config.write_text(good)
        removed_s = await until(lambda: status(port, "sk-added") == 401, 10, "the removed key refused", log)
        assert removed_s < 2.0
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)
