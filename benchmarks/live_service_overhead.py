"""What the local stack's pool Service (``tokenpools_dev.devstack.service``) adds to a streamed request.

One llm-d-inference-sim (16 slots, 64 output tokens, the Exp-1 latencies × ``--time-scale``), the same streamed
completions sent ``--concurrency`` at a time straight to the simulator and through the Service; prints TTFT and
end-to-end percentiles per path and the Service's CPU time per request.

    .venv/bin/python benchmarks/live_service_overhead.py --requests 200 --concurrency 16 --time-scale 0.25
"""

from __future__ import annotations

import argparse
import asyncio
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from tokenpools_dev.devstack.inference_sim import free_port
from tokenpools_dev.devstack.kafka import tcp_open
from tokenpools_dev.devstack.service import write_members
from tokenpools_dev.devstack.stack.components import LoggedSim
from tokenpools_dev.devstack.stack.config import SimProfile
from tokenpools_dev.loadgen.plan import prompt_text


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


async def send(url: str, requests: int, concurrency: int) -> tuple[list[float], list[float]]:
    ttfts: list[float] = []
    e2es: list[float] = []
    gate = asyncio.Semaphore(concurrency)
    body = {"model": "fake-model", "prompt": prompt_text(64), "max_tokens": 64, "stream": True, "ignore_eos": True}
    async with aiohttp.ClientSession() as session:
        async def one() -> None:
            async with gate:
                t0 = time.monotonic()
                first = None
                async with session.post(url + "/v1/completions", json=body) as r:
                    async for line in r.content:
                        if first is None and line.startswith(b"data: {"):
                            first = time.monotonic() - t0
                ttfts.append(first or 0.0)
                e2es.append(time.monotonic() - t0)
        await asyncio.gather(*(one() for _ in range(requests)))
    return ttfts, e2es


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, clock ticks of 10 ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--time-scale", type=float, default=0.25)
    args = parser.parse_args()
    p = SimProfile().scaled(args.time_scale)
    with tempfile.TemporaryDirectory() as tmp:
        sim = LoggedSim(log=Path(tmp) / "sim.log", model="fake-model", max_num_seqs=16, time_to_first_token=p.ttft_s,
                        inter_token_latency=p.itl_s, time_factor_under_load=p.factor_under_load).start()
        members, port = Path(tmp) / "members.json", free_port()
        write_members(members, [sim.host_port])
        service = subprocess.Popen([sys.executable, "-m", "tokenpools_dev.devstack.service", f"--listen=127.0.0.1:{port}",
                                    f"--members={members}"], stderr=subprocess.DEVNULL)
        try:
            while not tcp_open(port):
                time.sleep(0.05)
            for name, url in (("direct", sim.base_url), ("service", f"http://127.0.0.1:{port}")):
                before = cpu_s(service.pid)
                ttfts, e2es = asyncio.run(send(url, args.requests, args.concurrency))
                used = cpu_s(service.pid) - before
                print(f"{name:8s} TTFT p50 {pct(ttfts, .5) * 1000:7.1f} ms  p99 {pct(ttfts, .99) * 1000:7.1f} ms   "
                      f"e2e p50 {pct(e2es, .5):6.3f} s  p99 {pct(e2es, .99):6.3f} s   "
                      f"service CPU {used / args.requests * 1000:5.2f} ms/request")
        finally:
            service.terminate()
            service.wait()
            sim.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
