"""tokenpools proxy against LiteLLM's proxy and against the backend direct, in one run on this machine.

    scripts/install-litellm.sh                                   # once: LiteLLM 1.95.0 in its own venv (cache)
    .venv/bin/python benchmarks/peers.py                         # direct, tokenpools, LiteLLM: both tables
    .venv/bin/python benchmarks/peers.py --quick                 # short blocks (a smoke run, not figures)
    .venv/bin/python benchmarks/peers.py --targets direct tokenpools --json out.json

Processes, all on this machine: llm-d-inference-sim (the backend), ``tokenpools proxy`` (``--no-kafka``: events
spooled to disk, static limits) and ``litellm`` (1 worker, no database, a master key, a config routing the model to
the sim), and this load generator (aiohttp, the one of ``benchmarks/proxy_overhead.py``). Each proxy runs standalone,
without the services it can use (Kafka and the agents; LiteLLM's Postgres and Redis).

Table 1, overhead. For each backend (zero latency, and TTFT/ITL as a small model's), streaming and not:
open loop at each ``--rates`` (default 100 and 500 req/s) in alternating blocks (direct, tokenpools, LiteLLM,
direct, ...) so drift hits every target alike, then a closed loop of ``--concurrency`` workers. Added p50/p99 =
the percentile through a proxy − the same percentile direct, measured in the same run; throughput ÷ direct = closed
loop requests/s through the proxy ÷ direct's. A request that fails or times out (``--timeout-s``) is counted as an
error and not as a latency.

Table 2, per-key concurrency with 2 replicas of each proxy: a limit of ``--limit`` requests in flight for one API
key, a backend that takes ``--hold-s`` to answer, and 4 × limit requests sent at once, alternating between the
replicas. At once = answered 200 within 1.5 × hold (they reached the backend together); the rest must be refused (429) or wait for a slot (answered later: "waited"). The backend's
``vllm:num_requests_running``, polled, gives the most the key held in flight. Where a proxy cannot express the limit (LiteLLM keeps per-key limits on keys in its database),
the row says so and measures the nearest thing it can do without one.
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
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import KEY, closed_loop, config_text, open_loop, percentile, start_proxy, stop  # noqa: E402

from tokenpools_dev.devstack import process  # noqa: E402
from tokenpools_dev.devstack.inference_sim import InferenceSim, free_port  # noqa: E402

MODEL = "fake-model"
TARGETS = ("direct", "tokenpools", "litellm")
LITELLM_VERSION = "1.95.0"

# LiteLLM without a database: the master key is the only key; the model routes to the sim (OpenAI-compatible).
LITELLM_CONFIG = """\
model_list:
  - model_name: {model}
    litellm_params:
      model: openai/{model}
      api_base: {endpoint}/v1
      api_key: none
{deployment_limit}
litellm_settings:
  telemetry: false
  drop_params: true
general_settings:
  master_key: {key}
"""


def litellm_binary() -> Path:
    """The ``litellm`` of ``scripts/install-litellm.sh`` (``$TOKENPOOLS_LITELLM`` overrides it)."""
    if env := os.environ.get("TOKENPOOLS_LITELLM"):
        return Path(env)
    return process.cache_dir() / "litellm-venv" / "bin" / "litellm"


def machine() -> dict[str, object]:
    """What ran this: every figure depends on it (2 shared cores are not a server)."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown")
    return {"date_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"), "host": platform.node(),
            "platform": platform.platform(), "cpu": model, "cores": os.cpu_count(),
            "python": platform.python_version(), "load_average": [round(x, 2) for x in os.getloadavg()]}


# ---- the targets -------------------------------------------------------------------------------------------
class Target:
    """One URL under load; counts responses, errors by kind, and bytes (like with like across targets)."""

    def __init__(self, name: str, base: str, body: bytes, stream: bool, timeout_s: float) -> None:
        self.name, self.url, self.body, self.stream = name, base + "/v1/chat/completions", body, stream
        self.headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.errors: Counter[str] = Counter()
        self.responses = 0
        self.bytes = 0

    async def call(self, session: aiohttp.ClientSession) -> float:
        """Seconds from sending to the last byte; NaN for a failed request (counted in ``errors``)."""
        t0 = time.perf_counter()
        try:
            async with session.post(self.url, data=self.body, headers=self.headers, timeout=self.timeout) as r:
                n = 0
                if self.stream:
                    async for data in r.content.iter_any():
                        n += len(data)
                else:
                    n = len(await r.read())
                if r.status != 200:
                    self.errors[str(r.status)] += 1
                    return float("nan")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.errors[type(exc).__name__] += 1
            return float("nan")
        self.responses += 1
        self.bytes += n
        return time.perf_counter() - t0


@dataclass
class Leg:
    """One backend latency and stream setting: latencies per (target, rate) and closed-loop req/s per target."""

    latencies: dict[tuple[str, float], list[float]] = field(default_factory=dict)
    rps: dict[str, list[float]] = field(default_factory=dict)


def ok(values: list[float]) -> list[float]:
    return [v for v in values if v == v]  # NaN != NaN: the failed requests


async def measure(targets: Sequence[Target], args: argparse.Namespace) -> Leg:
    leg = Leg()
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(connector=connector) as session:
        for target in targets:  # warm-up: connections, caches, the proxies' first paths
            await open_loop(session, target, min(args.rates), args.warmup_s)  # type: ignore[arg-type]
        for rate in args.rates:
            for _ in range(args.rounds):
                for target in targets:
                    got = await open_loop(session, target, rate, args.block_s)  # type: ignore[arg-type]
                    leg.latencies.setdefault((target.name, rate), []).extend(got)
        for _ in range(args.rounds):
            for target in targets:
                rps = await closed_loop(session, target, args.concurrency, args.block_s)  # type: ignore[arg-type]
                leg.rps.setdefault(target.name, []).append(rps)
    return leg


def summarise(leg: Leg, targets: Sequence[Target], rates: Sequence[float]) -> dict[str, object]:
    """Per target: p50/p99 per rate, added over direct, closed-loop req/s and ÷ direct, errors."""
    out: dict[str, object] = {}
    direct_rps = statistics.mean(leg.rps["direct"])
    for t in targets:
        row: dict[str, object] = {"errors": dict(t.errors),
                                  "bytes_per_response": round(t.bytes / max(1, t.responses), 1),
                                  "closed_loop_rps": round(statistics.mean(leg.rps[t.name]), 1),
                                  "throughput_ratio": round(statistics.mean(leg.rps[t.name]) / direct_rps, 3)}
        for rate in rates:
            got, base = ok(leg.latencies[(t.name, rate)]), ok(leg.latencies[("direct", rate)])
            cell: dict[str, object] = {"samples": len(got),
                                       "failed": len(leg.latencies[(t.name, rate)]) - len(got)}
            if got and base:
                for q in (50, 99):
                    ms, direct_ms = percentile(got, q) * 1000, percentile(base, q) * 1000
                    cell[f"p{q}_ms"] = round(ms, 3)
                    cell[f"added_p{q}_ms"] = round(ms - direct_ms, 3)
            row[f"open_{rate:g}"] = cell
        out[t.name] = row
    return out


def start_litellm(config: Path, port: int, log: Path, timeout_s: float = 240.0) -> subprocess.Popen[bytes]:
    """``litellm`` with 1 worker, no database (no ``DATABASE_URL``), ready when ``/health/liveliness`` answers."""
    binary = litellm_binary()
    if not binary.is_file():
        raise SystemExit(f"{binary} not found: run scripts/install-litellm.sh (or leave litellm out of --targets)")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_HOST", "REDIS_URL")}
    env.update({"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False", "NO_DOCS": "True",
                "LITELLM_MODE": "PRODUCTION", "DISABLE_ADMIN_UI": "True",
                "LITELLM_LOCAL_MODEL_COST_MAP": "True"})  # its cost map from the package, not from GitHub
    cmd = [str(binary), "--config", str(config), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"litellm exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/liveliness", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.2)
    stop(proc)
    raise SystemExit(f"litellm did not become healthy in {timeout_s:.0f} s:\n{log.read_text()[-3000:]}")


def write_configs(work: Path, label: str, endpoint: str, concurrency: int, pool_concurrency: int,
                  deployment_limit: int | None) -> tuple[Path, Path]:
    tp, ll = work / f"tokenpools-{label}.yaml", work / f"litellm-{label}.yaml"
    tp.write_text(config_text(endpoint, MODEL, concurrency, pool_concurrency))
    limit = "" if deployment_limit is None else f"      max_parallel_requests: {deployment_limit}"
    ll.write_text(LITELLM_CONFIG.format(model=MODEL, endpoint=endpoint, key=KEY, deployment_limit=limit))
    return tp, ll


def run_uv(coro_fn: Callable[[], object]) -> object:
    try:
        import uvloop

        return uvloop.run(coro_fn())  # type: ignore[arg-type]
    except ImportError:
        return asyncio.run(coro_fn())  # type: ignore[arg-type]


def overhead_case(label: str, sim_kw: dict[str, float], stream: bool, args: argparse.Namespace,
                  work: Path) -> dict[str, object]:
    with ExitStack() as stack:
        sim = stack.enter_context(InferenceSim(model=MODEL, max_num_seqs=4096, **sim_kw))  # type: ignore[arg-type]
        tp_config, ll_config = write_configs(work, label, sim.base_url, 2048, 4096, None)
        bases = {"direct": sim.base_url}
        if "tokenpools" in args.targets:
            port = free_port()
            stack.callback(stop, start_proxy(tp_config, work / f"spool-{label}", port, None,
                                             work / f"tokenpools-{label}.log", []))
            bases["tokenpools"] = f"http://127.0.0.1:{port}"
        if "litellm" in args.targets:
            port = free_port()
            stack.callback(stop, start_litellm(ll_config, port, work / f"litellm-{label}.log"))
            bases["litellm"] = f"http://127.0.0.1:{port}"
        body: dict[str, object] = {"model": MODEL, "max_tokens": args.max_tokens,
                                   "messages": [{"role": "user", "content": "Hello there, how are you today?"}]}
        if stream:  # tokenpools always asks upstream for usage: every target asks, so the backend does the same work
            body.update(stream=True, stream_options={"include_usage": True})
        raw = json.dumps(body).encode()
        targets = [Target(name, bases[name], raw, stream, args.timeout_s) for name in TARGETS if name in bases]
        leg = run_uv(lambda: measure(targets, args))
        return summarise(leg, targets, args.rates)  # type: ignore[arg-type]


# ---- table 2: per-key concurrency across 2 replicas ------------------------------------------------------------
def running(metrics: str) -> int:
    """``vllm:num_requests_running`` from the sim's Prometheus text (summed over its label sets)."""
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("vllm:num_requests_running")))


async def burst(urls: Sequence[str], n: int, hold_s: float, timeout_s: float,
                backend: str) -> tuple[Counter[str], int]:
    """``n`` requests at once, the i-th to ``urls[i % len(urls)]``: outcome counts, and the most requests the
    backend ran at once (its ``vllm:num_requests_running``, polled every 50 ms: what the key held in flight).

    ``at once``: answered 200 within 1.5 × ``hold_s``; ``waited``: answered 200 later (queued for a slot, or a
    slow proxy); else the HTTP status or the client error.
    """
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hold"}]}
    headers = {"Authorization": f"Bearer {KEY}"}
    outcomes: Counter[str] = Counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async def one(url: str) -> None:
            t0 = time.perf_counter()
            try:
                async with session.post(url + "/v1/chat/completions", json=body, headers=headers,
                                        timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                    await r.read()
                    if r.status != 200:
                        outcomes[str(r.status)] += 1
                    else:
                        outcomes["at once" if time.perf_counter() - t0 < 1.5 * hold_s else "waited"] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                outcomes[type(exc).__name__] += 1
        most = 0
        done = asyncio.Event()

        async def poll() -> None:
            nonlocal most
            while not done.is_set():
                async with session.get(backend + "/metrics") as r:
                    most = max(most, running(await r.text()))
                await asyncio.sleep(0.05)

        poller = asyncio.create_task(poll())
        await asyncio.gather(*(one(urls[i % len(urls)]) for i in range(n)))
        done.set()
        await poller
    return outcomes, most


def concurrency_case(args: argparse.Namespace, work: Path) -> dict[str, object]:
    limit, sent = args.limit, 4 * args.limit
    out: dict[str, object] = {"limit": limit, "sent": sent, "replicas": 2, "hold_s": args.hold_s}
    with ExitStack() as stack:
        sim = stack.enter_context(InferenceSim(model=MODEL, max_num_seqs=4096, time_to_first_token=args.hold_s))
        tp_config, ll_config = write_configs(work, "limit", sim.base_url, limit, 4096, limit)
        if "tokenpools" in args.targets:
            urls = []
            for i in range(2):
                port = free_port()
                # no waiting at the proxy: a request over the limit is refused at once (docs/queueing.md)
                stack.callback(stop, start_proxy(tp_config, work / f"spool-limit-{i}", port, None,
                                                 work / f"tokenpools-limit-{i}.log",
                                                 ["policy.queue_slo_fraction=0"]))
                urls.append(f"http://127.0.0.1:{port}")
            got, most = run_uv(lambda: burst(urls, sent, args.hold_s, args.hold_s * 4 + 30, sim.base_url))  # type: ignore[misc]
            out["tokenpools"] = {"outcomes": dict(got), "backend_max_running": most,
                "mode": "--no-kafka (standalone, static limits)",
                "how": ("each replica enforces the entitlement's static limit by itself (no Kafka, so it knows no "
                        "other replica): up to 2 × limit fleet-wide. With Kafka and the agents (the default "
                        "deployment) each proxy applies fleet-wide in-flight counts every 0.1 s, see "
                        "benchmarks/fleet_live.py")}
        if "litellm" in args.targets:
            urls = []
            for i in range(2):
                port = free_port()
                stack.callback(stop, start_litellm(ll_config, port, work / f"litellm-limit-{i}.log"))
                urls.append(f"http://127.0.0.1:{port}")
            got, most = run_uv(lambda: burst(urls, sent, args.hold_s, args.hold_s * 4 + 30, sim.base_url))  # type: ignore[misc]
            out["litellm"] = {"outcomes": dict(got), "backend_max_running": most,
                "mode": "no database: model-level max_parallel_requests (per deployment, not per key)",
                "how": ("a per-key max_parallel_requests lives on a virtual key, and keys live in its Postgres "
                        "database; the master key has no limit. Without a database the nearest limit is the "
                        "deployment's max_parallel_requests, held in each replica's memory (shared only through "
                        "Redis), and a request over it waits for a slot (the router's semaphore) instead of being refused")}
    return out


# ---- output -------------------------------------------------------------------------------------------------
def fmt(value: object, spec: str = "+.2f") -> str:
    return "—" if value is None else format(value, spec)  # type: ignore[arg-type]


def print_tables(result: dict[str, object], rates: Sequence[float]) -> None:
    m = result["machine"]
    print(f"\n{m['date_utc']} UTC on {m['host']}: {m['cpu']}, {m['cores']} cores, "  # type: ignore[index]
          f"Python {m['python']}, load average at start {m['load_average'][0]}")  # type: ignore[index]
    rate_cols = " | ".join(f"added p50 / p99 ms at {r:g}/s" for r in rates)
    print(f"\n| backend | stream | proxy | {rate_cols} | closed loop ÷ direct | errors |")
    print("|---|---|---|" + "---|" * len(rates) + "---|---|")
    for case, rows in result["overhead"].items():  # type: ignore[attr-defined]
        backend, stream = case.rsplit(", ", 1)
        direct = rows["direct"]
        cells = " | ".join(f"{fmt(direct[f'open_{r:g}'].get('p50_ms'), '.2f')} / "
                           f"{fmt(direct[f'open_{r:g}'].get('p99_ms'), '.2f')} (absolute)" for r in rates)
        print(f"| {backend} | {stream} | direct | {cells} | 1 ({direct['closed_loop_rps']:.0f} req/s) | "
              f"{direct['errors'] or 0} |")
        for name, row in rows.items():
            if name == "direct":
                continue
            cells = " | ".join(f"{fmt(row[f'open_{r:g}'].get('added_p50_ms'))} / "
                               f"{fmt(row[f'open_{r:g}'].get('added_p99_ms'))}" for r in rates)
            print(f"| | | {name} | {cells} | {row['throughput_ratio']:.3f} | {row['errors'] or 0} |")
    conc = result.get("concurrency")
    if conc:
        print(f"\nper-key limit {conc['limit']} in flight, 2 replicas, {conc['sent']} requests at once "  # type: ignore[index]
              f"(backend holds each {conc['hold_s']} s)")  # type: ignore[index]
        print(f"| proxy | mode | most in flight at the backend (limit {conc['limit']}) | outcomes | how |")  # type: ignore[index]
        print("|---|---|---|---|---|")
        for name in ("tokenpools", "litellm"):
            if name in conc:  # type: ignore[operator]
                row = conc[name]  # type: ignore[index]
                print(f"| {name} | {row['mode']} | {row['backend_max_running']} | {row['outcomes']} | {row['how']} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS),
                        help="what to measure (direct always runs: every ratio is against it)")
    parser.add_argument("--rates", type=float, nargs="+", default=[100.0, 500.0], help="open-loop req/s")
    parser.add_argument("--block-s", type=float, default=5.0, help="seconds per measurement block (default 5)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per rate (default 2)")
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=16, help="closed-loop workers (default 16)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--ttft-ms", type=float, default=20.0, help="realistic backend: time to first token")
    parser.add_argument("--itl-ms", type=float, default=2.0, help="realistic backend: inter-token latency")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="a request slower than this is an error")
    parser.add_argument("--limit", type=int, default=4, help="table 2: the key's concurrency limit")
    parser.add_argument("--hold-s", type=float, default=2.0, help="table 2: how long the backend holds a request")
    parser.add_argument("--no-concurrency", action="store_true", help="skip table 2")
    parser.add_argument("--no-overhead", action="store_true", help="skip table 1")
    parser.add_argument("--quick", action="store_true", help="short blocks, one round: checks the script runs")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if "direct" not in args.targets:
        args.targets.insert(0, "direct")
    if args.quick:
        args.block_s, args.rounds, args.warmup_s, args.hold_s = 1.0, 1, 0.5, 1.0
    result: dict[str, object] = {"machine": machine(), "command": " ".join(["benchmarks/peers.py", *sys.argv[1:]]),
                                 "litellm_version": LITELLM_VERSION if "litellm" in args.targets else None,
                                 "overhead": {}}
    print(f"peers: {result['machine']}; targets {args.targets}, rates {args.rates}, "
          f"{args.rounds}×{args.block_s:g} s blocks, {args.concurrency} closed-loop workers", flush=True)
    backends = {"zero latency": {"time_to_first_token": 0.0, "inter_token_latency": 0.0},
                f"TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms":
                    {"time_to_first_token": args.ttft_ms / 1000, "inter_token_latency": args.itl_ms / 1000}}
    with tempfile.TemporaryDirectory(prefix="tokenpools-peers-") as tmp:
        work = Path(tmp)
        for i, (backend, sim_kw) in enumerate(() if args.no_overhead else backends.items()):
            for stream in (False, True):
                case = f"{backend}, {'stream' if stream else 'no stream'}"
                t0 = time.monotonic()
                result["overhead"][case] = overhead_case(f"{i}{int(stream)}", sim_kw, stream, args, work)  # type: ignore[index]
                print(f"  {case}: {time.monotonic() - t0:.0f} s", flush=True)
        if not args.no_concurrency and len(args.targets) > 1:
            result["concurrency"] = concurrency_case(args, work)
    print_tables(result, args.rates)
    print(f"\nload average at end {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
