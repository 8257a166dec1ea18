"""What the proxy adds: the same load straight to the backend and through ``tokenpools proxy``, in one run.

    .venv/bin/python benchmarks/proxy_overhead.py                   # Kafka + llm-d-inference-sim + the proxy
    .venv/bin/python benchmarks/proxy_overhead.py --stream          # streaming chat completions
    .venv/bin/python benchmarks/proxy_overhead.py --no-kafka        # events spooled to disk instead

Everything runs on this machine as separate processes: a Kafka broker (``tokenpools_dev.devstack.kafka``), one
llm-d-inference-sim, the real ``tokenpools proxy`` command, and this load generator (aiohttp on uvloop).

- Latency: open loop at ``--rate`` requests/s (default 500) in alternating blocks (direct, proxied, direct, ...),
  so drift hits both sides alike. Latency is measured from the moment a request is sent to the last byte of its
  response. Added latency = percentile through the proxy − the same percentile direct.
- Throughput: closed loop, ``--concurrency`` workers each sending back to back, alternating blocks again; the
  ratio is proxied requests/s ÷ direct requests/s. Run twice: against the backend as configured (its latency
  dominates, as with a real model) and against a zero-latency backend (the CPU-bound worst case, where the proxy's
  Python competes with the load generator and the backend for the same cores).
- Like with like: both legs send the same body and get the same response bytes (printed: bytes per response). A
  stream asks for ``stream_options.include_usage`` in both legs, as the proxy always does upstream, so the backend
  does the same work; ``--strip-usage`` leaves it out and measures the proxy's strip path instead.
- CPU: each block records the CPU time of the load generator (this process), the backend and the proxy, per
  request, and how much of the machine was idle. A leg where the load generator or the backend uses a whole core,
  or the machine has no idle CPU, is limited by them rather than by the proxy (printed as a warning).

Targets (issue #3): p99 added ≤ 1 ms at 500 req/s; throughput ≥ 0.7× direct.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import aiohttp

from tokenpools.config.keys import hash_api_key
from tokenpools_dev.devstack.inference_sim import InferenceSim, free_port

KEY = "sk-bench"
CONFIG = """\
apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {{name: bench}}
spec:
  model: {model}
  backendRef: {{apiVersion: apps/v1, kind: Deployment, name: sim}}
  scaling: {{minReplicas: 1, maxReplicas: 1}}
  perReplica: {{tokensPerSecond: 10000000, kvCacheGiB: 100000, concurrency: {pool_concurrency}}}
  kvGeometry: {{layers: 36, kvHeads: 8, headDim: 128, bytesPerElement: 2}}
  defaults: {{maxTokens: 16}}
  tokenBucketWindowSeconds: 10
  endpoints: ["{endpoint}"]
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: bench}}
spec:
  tenantId: bench
  poolRef: {{name: bench}}
  qos: {{serviceClass: guaranteed, sloTargetMs: 1000}}
  resources: {{tokensPerSecond: 5000000, kvCacheGiB: 50000, concurrency: {concurrency}}}
  apiKeys: [{{sha256: {digest}}}]
"""


def config_text(endpoint: str, model: str = "fake-model", concurrency: int = 2048, pool_concurrency: int = 4096) -> str:
    """One pool in front of ``endpoint`` and one guaranteed entitlement for ``KEY``, limits far above the load."""
    return CONFIG.format(model=model, endpoint=endpoint, digest=hash_api_key(KEY), concurrency=concurrency,
                         pool_concurrency=pool_concurrency)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by every thread of process ``pid``."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # a thread that just ended
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat(5))
    return total / CLK_TCK


def machine_idle_s() -> float:
    """Idle CPU seconds of the whole machine so far (all cores; /proc/stat idle + iowait)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return (int(fields[4]) + int(fields[5])) / CLK_TCK


class Cpu:
    """CPU seconds per process over the measurement blocks of each leg, and the machine's idle share."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.used: dict[str, dict[str, float]] = {}  # leg -> process -> CPU s
        self.wall_s: dict[str, float] = {}
        self.idle_s: dict[str, float] = {}
        self.requests: dict[str, int] = {}

    def snapshot(self) -> tuple[float, float, dict[str, float]]:
        used = {"loadgen": time.process_time(), **{name: cpu_s(pid) for name, pid in self.pids.items()}}
        return time.perf_counter(), machine_idle_s(), used

    def add(self, leg: str, before: tuple[float, float, dict[str, float]], requests: int) -> None:
        t1, idle1, after = self.snapshot()
        t0, idle0, used0 = before
        used = self.used.setdefault(leg, {})
        for name, value in after.items():
            used[name] = used.get(name, 0.0) + value - used0[name]
        self.wall_s[leg] = self.wall_s.get(leg, 0.0) + t1 - t0
        self.idle_s[leg] = self.idle_s.get(leg, 0.0) + idle1 - idle0
        self.requests[leg] = self.requests.get(leg, 0) + requests

    def summary(self) -> dict[str, dict[str, float]]:
        cores = os.cpu_count() or 1
        out: dict[str, dict[str, float]] = {}
        for leg, used in self.used.items():
            n, wall = max(1, self.requests[leg]), max(1e-9, self.wall_s[leg])
            row = {f"{name}_us": round(value / n * 1e6, 1) for name, value in used.items()}
            row.update({f"{name}_cores": round(value / wall, 2) for name, value in used.items()})
            row["idle_pct"] = round(min(100.0, max(0.0, 100 * self.idle_s[leg] / (wall * cores))), 1)
            out[leg] = row
        return out


class Target:
    def __init__(self, name: str, base: str, body: bytes, stream: bool) -> None:
        self.name, self.url, self.body, self.stream = name, base + "/v1/chat/completions", body, stream
        self.headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
        self.errors = 0
        self.responses = 0
        self.bytes = 0

    async def call(self, session: aiohttp.ClientSession) -> float:
        t0 = time.perf_counter()
        async with session.post(self.url, data=self.body, headers=self.headers) as r:
            n = 0
            if self.stream:
                async for data in r.content.iter_any():
                    n += len(data)
            else:
                n = len(await r.read())
            if r.status != 200:
                self.errors += 1
        self.responses += 1
        self.bytes += n
        return time.perf_counter() - t0


async def open_loop(session: aiohttp.ClientSession, target: Target, rate: float, seconds: float) -> list[float]:
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        latencies.append(await target.call(session))

    period, n = 1.0 / rate, int(rate * seconds)
    start = loop.time()
    for i in range(n):
        delay = start + i * period - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    return latencies


async def closed_loop(session: aiohttp.ClientSession, target: Target, workers: int, seconds: float) -> float:
    done = 0
    end = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < end:
            await target.call(session)
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return done / (time.perf_counter() - t0)


async def measure(direct: Target, proxied: Target, args: argparse.Namespace, cpu: Cpu) -> dict[str, object]:
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(connector=connector) as session:
        for target in (direct, proxied):  # warm-up: connections, JIT-free but caches and the proxy's first paths
            await open_loop(session, target, args.rate, args.warmup_s)
        lat: dict[str, list[float]] = {direct.name: [], proxied.name: []}
        for _ in range(args.rounds):
            for target in (direct, proxied):
                before = cpu.snapshot()
                got = await open_loop(session, target, args.rate, args.block_s)
                cpu.add(f"{target.name} open loop", before, len(got))
                lat[target.name] += got
        rps: dict[str, list[float]] = {direct.name: [], proxied.name: []}
        for _ in range(args.rounds):
            for target in (direct, proxied):
                before, n0 = cpu.snapshot(), target.responses
                rps[target.name].append(await closed_loop(session, target, args.concurrency, args.block_s))
                cpu.add(f"{target.name} closed loop", before, target.responses - n0)
    result: dict[str, object] = {"errors": {direct.name: direct.errors, proxied.name: proxied.errors}}
    for name, values in lat.items():
        result[f"{name}_ms"] = {q: round(percentile(values, q) * 1000, 3) for q in (50, 90, 99, 99.9)}
        result[f"{name}_samples"] = len(values)
    d, p = result[f"{direct.name}_ms"], result[f"{proxied.name}_ms"]
    result["added_ms"] = {q: round(p[q] - d[q], 3) for q in d}  # type: ignore[index]
    result["rps"] = {name: round(statistics.mean(v), 1) for name, v in rps.items()}
    result["throughput_ratio"] = round(statistics.mean(rps[proxied.name]) / statistics.mean(rps[direct.name]), 3)
    result["bytes_per_response"] = {t.name: round(t.bytes / max(1, t.responses), 1) for t in (direct, proxied)}
    result["cpu"] = cpu.summary()
    return result


def start_proxy(config: Path, spool: Path, port: int, bootstrap: str | None, log: Path,
                settings: list[str]) -> subprocess.Popen[bytes]:
    exe = Path(sys.executable).with_name("tokenpools")
    cmd = [str(exe), "proxy", "--config", str(config), "--port", str(port), "--proxy-id", "bench",
           "--set", f"proxy.spool_dir={spool}", "--log-level", "WARNING"]
    for setting in settings:
        cmd += ["--set", setting]
    cmd += ["--set", f"kafka.bootstrap_servers={bootstrap}"] if bootstrap else ["--no-kafka"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"proxy exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("proxy did not become healthy in 30 s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def healthz(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def run_case(label: str, sim_kw: dict[str, float], args: argparse.Namespace, bootstrap: str | None,
             work: Path) -> dict[str, object]:
    with ExitStack() as stack:
        sim = stack.enter_context(InferenceSim(max_num_seqs=4096, **sim_kw))  # type: ignore[arg-type]
        config = work / f"{label}.yaml"
        config.write_text(config_text(sim.base_url))
        port = free_port()
        proxy = start_proxy(config, work / f"spool-{label}", port, bootstrap, work / f"proxy-{label}.log",
                            args.proxy_set)
        stack.callback(stop, proxy)
        body: dict[str, object] = {
            "model": "fake-model", "messages": [{"role": "user", "content": "Hello there, how are you today?"}],
            "max_tokens": args.max_tokens}
        if args.stream:
            body["stream"] = True
            if not args.strip_usage:  # the proxy always asks upstream for usage: ask the direct backend too
                body["stream_options"] = {"include_usage": True}
        raw = json.dumps(body).encode()
        direct = Target("direct", sim.base_url, raw, args.stream)
        proxied = Target("proxied", f"http://127.0.0.1:{port}", raw, args.stream)
        sim_proc = sim._proc  # the simulator's process, for its CPU time
        assert sim_proc is not None
        cpu = Cpu({"backend": sim_proc.pid, "proxy": proxy.pid})
        try:
            import uvloop

            result = uvloop.run(measure(direct, proxied, args, cpu))
        except ImportError:
            result = asyncio.run(measure(direct, proxied, args, cpu))
        result["proxy_events"] = healthz(port)["events"]
        return result


def report(label: str, r: dict[str, object]) -> None:
    d, p, a = r["direct_ms"], r["proxied_ms"], r["added_ms"]
    print(f"\n== {label} ==")
    print(f"  latency ms   {'p50':>8} {'p90':>8} {'p99':>8} {'p99.9':>8}   samples")
    for name, row in (("direct", d), ("proxied", p), ("added", a)):
        n = r.get(f"{name}_samples", "")
        print(f"  {name:<11} " + " ".join(f"{row[q]:8.3f}" for q in (50, 90, 99, 99.9)) + f"   {n}")  # type: ignore[index]
    rps = r["rps"]
    print(f"  throughput   direct {rps['direct']:.0f} req/s, proxied {rps['proxied']:.0f} req/s, "  # type: ignore[index]
          f"ratio {r['throughput_ratio']:.2f}")
    print(f"  bytes per response {r['bytes_per_response']}  errors {r['errors']}")
    print(f"  proxy events {r['proxy_events']}")
    print(f"  CPU µs per request and cores used   {'loadgen':>16} {'backend':>16} {'proxy':>16}   machine idle")
    for leg, row in r["cpu"].items():  # type: ignore[attr-defined]
        cells = " ".join(f"{row[f'{n}_us']:7.0f} ({row[f'{n}_cores']:4.2f})" for n in ("loadgen", "backend", "proxy"))
        print(f"  {leg:<34} {cells}   {row['idle_pct']:5.1f}%")
        limiting = [n for n in ("loadgen", "backend") if row[f"{n}_cores"] > 0.8]
        if limiting or row["idle_pct"] < 5:
            print(f"    ! {leg}: limited by {', '.join(limiting) or 'the machine (no idle CPU)'}, not only the proxy")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=500.0, help="open-loop requests/s (default 500)")
    parser.add_argument("--block-s", type=float, default=5.0, help="seconds per measurement block (default 5)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating direct/proxied rounds (default 3)")
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=32, help="closed-loop workers (default 32)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--ttft-ms", type=float, default=20.0, help="backend time to first token (default 20)")
    parser.add_argument("--itl-ms", type=float, default=2.0, help="backend inter-token latency (default 2)")
    parser.add_argument("--stream", action="store_true", help="streaming chat completions")
    parser.add_argument("--strip-usage", action="store_true",
                        help="streams without include_usage: the proxy requests it and strips it (the legs then differ)")
    parser.add_argument("--no-kafka", action="store_true", help="no broker: the proxy spools its events")
    parser.add_argument("--bootstrap", help="use this running broker instead of starting one")
    parser.add_argument("--proxy-set", action="append", default=[], metavar="GROUP.FIELD=VALUE",
                        help="a setting for the proxy (its --set), e.g. proxy.producer_linger_ms=50; repeatable")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    print(f"proxy_overhead: {platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"rate {args.rate:.0f}/s, {args.rounds}×{args.block_s:.0f} s blocks, stream={args.stream}, "
          f"proxy settings {args.proxy_set or 'default'}, "
          f"load average at start {os.getloadavg()[0]:.1f} (other work on the machine skews every figure)")
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="tokenpools-bench-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        bootstrap = args.bootstrap
        if not bootstrap and not args.no_kafka:
            from tokenpools_dev.devstack.kafka import KafkaBroker

            broker = stack.enter_context(KafkaBroker(workdir=work / "kafka", write_cds_archive=False))
            bootstrap = broker.bootstrap
            print(f"kafka broker on {bootstrap} (ready in {broker.startup_seconds:.1f} s)")
        cases = {
            "backend latency": {"time_to_first_token": args.ttft_ms / 1000, "inter_token_latency": args.itl_ms / 1000},
            "zero-latency backend": {"time_to_first_token": 0.0, "inter_token_latency": 0.0},
        }
        for label, sim_kw in cases.items():
            results[label] = run_case(label.split()[0], sim_kw, args, bootstrap, work)
            report(f"{label} (TTFT {sim_kw['time_to_first_token'] * 1000:.0f} ms, "
                   f"ITL {sim_kw['inter_token_latency'] * 1000:.0f} ms)", results[label])
    print(f"\nload average at end {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
