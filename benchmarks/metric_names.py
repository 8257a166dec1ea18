"""What ``proxy.metric_names`` costs on the request path: the metrics a completed request records, per mode.

    .venv/bin/python benchmarks/metric_names.py                 # 200,000 requests per mode, 5 rounds
    .venv/bin/python benchmarks/metric_names.py --requests 50000 --rounds 3

Each request records exactly what the proxy's settlement records (``handlers.Handlers._settle``): the tokenpools
counters and histograms, and with ``gen_ai`` or ``both`` the GenAI conventions' series (``GenAiSeries.completed``),
over 4 pools × 8 entitlements, streams with a time to first token, 1 in 50 a backend error. It prints the median
µs of CPU per request of each mode, the extra of ``both`` over ``tokenpools``, and one scrape's render CPU time and
size per mode with every series present. For scale: the proxy spends ~1 ms of CPU per request in all (proxy/README.md, Overhead).
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import time

from tokenpools.proxy.admission.body import Kind
from tokenpools.proxy.observability.genai_metrics import MetricNames
from tokenpools.proxy.observability.metrics import ProxyMetrics
from tokenpools.topics.records import CompletionStatus

Request = tuple[str, str, Kind, CompletionStatus, int, int, float, float, float | None]


def requests(n: int, seed: int = 7) -> list[Request]:
    rng = random.Random(seed)
    out: list[Request] = []
    for _ in range(n):
        pool = f"pool-{rng.randrange(4)}"
        status = CompletionStatus.BACKEND_ERROR if rng.random() < 0.02 else CompletionStatus.OK
        e2e = rng.uniform(0.05, 5.0)
        stream = rng.random() < 0.7
        out.append((pool, f"{pool}-ent-{rng.randrange(8)}", Kind.CHAT if rng.random() < 0.9 else Kind.COMPLETION,
                    status, rng.randrange(10, 4000), rng.randrange(1, 1000), e2e, e2e * rng.uniform(0.5, 1.0),
                    e2e * rng.uniform(0.01, 0.3) if stream else None))
    return out


def record(metrics: ProxyMetrics, batch: list[Request]) -> None:
    """The settlement's metric lines, as handlers.py has them."""
    gen_ai = metrics.gen_ai
    for pool, name, kind, status, prompt, completion, e2e_s, client_s, ttft_s in batch:
        metrics.completions[(pool, name, status.value)] += 1
        metrics.tokens[(pool, name, "prompt")] += prompt
        metrics.tokens[(pool, name, "completion")] += completion
        metrics.latency[(pool, name)].observe(e2e_s)
        if ttft_s is not None:
            metrics.ttft[(pool, name)].observe(ttft_s)
        if gen_ai is not None:
            gen_ai.completed(pool, name, kind.operation, "model-" + pool, status=status, prompt=prompt, completion=completion,
                             server_s=e2e_s, client_s=client_s, ttft_s=ttft_s)


def per_request_us(names: MetricNames, batch: list[Request]) -> float:
    metrics = ProxyMetrics(names)
    record(metrics, batch[:1000])  # every series exists: the steady state, not the first request of each
    t0 = time.process_time()  # CPU time: what the proxy pays, and steady while other processes share the cores
    record(metrics, batch)
    return (time.process_time() - t0) / len(batch) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    batch = requests(args.requests)
    runs: dict[MetricNames, list[float]] = {names: [] for names in MetricNames}
    for _ in range(args.rounds):  # modes interleaved, so drift on a shared machine hits them alike
        for names in MetricNames:
            runs[names].append(per_request_us(names, batch))
    print(f"python {platform.python_version()}, {args.requests} requests × {args.rounds} rounds")
    median = {names: statistics.median(values) for names, values in runs.items()}
    for names in MetricNames:
        print(f"  {names.value:<10} {median[names]:6.2f} µs/request  (runs: "
              + ", ".join(f"{v:.2f}" for v in runs[names]) + ")")
    print(f"  both − tokenpools: {median[MetricNames.BOTH] - median[MetricNames.TOKENPOOLS]:.2f} µs/request")
    for names in MetricNames:
        metrics = ProxyMetrics(names)
        record(metrics, batch)
        t0 = time.process_time()
        size = len(metrics.render())
        print(f"  one scrape, {names.value}, 32 entitlements: {(time.process_time() - t0) * 1e3:.1f} ms CPU, "
              f"{size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
