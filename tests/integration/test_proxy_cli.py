"""``tokenpools proxy --config FILE`` as an operator runs it: real process, real Kafka, real simulator; it serves
the openai client, exposes /healthz and /metrics, and on SIGTERM flushes its events and exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from backend_fixtures import inference_sim_binary  # noqa: F401  (fixture import)
from openai import AsyncOpenAI
from proxy_fixtures import KEYS, config_text, read_topic, start_sim, topics  # noqa: F401

from tokenpools.topics.declarations import Topics
from tokenpools_dev.devstack.inference_sim import InferenceSim, free_port

pytestmark = pytest.mark.integration


def get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read()


async def test_the_proxy_command_serves_and_shuts_down_cleanly(
        start_sim: Callable[..., InferenceSim], kafka_bootstrap: str, topics: Topics, tmp_path: Path) -> None:
    sim = start_sim()
    config = tmp_path / "pools.yaml"
    config.write_text(config_text([sim.base_url]))
    port = free_port()
    prefix = topics.requests.name[: -len("requests")]
    exe = Path(sys.executable).with_name("tokenpools")
    cmd = [str(exe), "proxy", "--config", str(config), "--port", str(port), "--proxy-id", "cli-proxy",
           "--set", f"kafka.bootstrap_servers={kafka_bootstrap}", "--set", f"kafka.topic_prefix={prefix}",
           "--set", f"proxy.spool_dir={tmp_path / 'spool'}"]
    log = tmp_path / "proxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if get(f"http://127.0.0.1:{port}/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            await asyncio.sleep(0.1)
        async with AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEYS["gold"], max_retries=0) as oai:
            r = await oai.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}])
            assert r.choices[0].message.content
            chunks = [c async for c in await oai.completions.create(model="fake-model", prompt="hi", max_tokens=4,
                                                                     stream=True)]
            assert chunks
        status, body = get(f"http://127.0.0.1:{port}/healthz")
        health = json.loads(body)
        assert health["proxy_id"] == "cli-proxy" and health["pools"]["sim-pool"]["limits"] == "static"
        status, metrics = get(f"http://127.0.0.1:{port}/metrics")
        assert b'tokenpools_proxy_decisions_total{entitlement="gold",outcome="admitted",pool="sim-pool"} 2.0' in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    output = log.read_text()
    assert code == 0, output
    assert "listening on http://127.0.0.1:" in output and "is Degraded" in output
    decided = await read_topic(kafka_bootstrap, topics.requests.name, expect=2)
    completed = await read_topic(kafka_bootstrap, topics.completions.name, expect=2)
    assert [d["proxy_id"] for d in decided] == ["cli-proxy"] * 2 and len(completed) == 2
    assert not list((tmp_path / "spool").glob("*.spool")) or (tmp_path / "spool" / "cli-proxy.spool").stat().st_size == 0
