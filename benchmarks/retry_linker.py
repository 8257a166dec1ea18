"""Cost of telling a retry from a new request on the proxy's hot path (``proxy.retries``), per request.

    .venv/bin/python benchmarks/retry_linker.py                 # 5 runs of 100,000 requests per path
    .venv/bin/python benchmarks/retry_linker.py --calls 300000 --body-bytes 8192

Each request is what the handler does for it: the digest of its body (``--body-bytes``, default 1 KiB), the
linker's ``attempt`` on arrival and its ``decided`` after the decision, at a clock that advances 1 ms per request
(so the 60-s window holds 60,000 entries, expiring one per request once full). The linker starts full
(``--entries``, default 100,000: ``proxy.retry_max_entries``' default). Paths:

- unmarked, admitted: a client that marks nothing, admitted (the commonest; nothing is remembered);
- unmarked, refused: the same, refused (a heuristic chain opens);
- sdk: ``x-stainless-retry-count: 0`` (the OpenAI SDKs' first attempt: remembered for its retries);
- idempotency: a fresh ``Idempotency-Key`` per request (remembered).

The baseline is the body digest alone. Each figure is the median of the runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

from tokenpools.proxy.admission.retries import RetryLinker, body_digest

KEY = b"k" * 32


def _run(calls: int, body_bytes: int, entries: int, path: str) -> float:
    """µs per request on ``path``."""
    linker = RetryLinker(60.0, entries)
    bodies = [os.urandom(body_bytes) for _ in range(64)]
    now = 0.0
    for i in range(entries):  # full: every insert evicts or expires one
        linker.decided(linker.attempt({}, KEY, body_digest(i.to_bytes(8, "big")), f"w{i}", now), f"w{i}", True, now)
        now += 0.0005
    headers: Callable[[int], dict[str, str]] = {
        "unmarked, admitted": lambda i: {}, "unmarked, refused": lambda i: {},
        "sdk": lambda i: {"x-stainless-retry-count": "0"},
        "idempotency": lambda i: {"idempotency-key": f"key-{i}"},
        "digest only": lambda i: {}}[path]
    refused = path == "unmarked, refused"
    made = [headers(i) for i in range(calls)]
    rids = [f"proxy-0-1-{i:x}" for i in range(calls)]
    t0 = time.perf_counter()
    if path == "digest only":
        for i in range(calls):
            body_digest(bodies[i & 63] + rids[i].encode())
    else:
        for i in range(calls):
            digest = body_digest(bodies[i & 63] + rids[i].encode())  # distinct bodies: no accidental links
            linked = linker.attempt(made[i], KEY, digest, rids[i], now)
            linker.decided(linked, rids[i], refused, now)
            now += 0.001
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--body-bytes", type=int, default=1024)
    parser.add_argument("--entries", type=int, default=100_000)
    args = parser.parse_args()
    print(f"Python {platform.python_version()} on {platform.machine()}; {args.calls} requests x {args.runs} runs, "
          f"{args.body_bytes}-byte bodies, linker holding {args.entries} entries")
    for path in ("digest only", "unmarked, admitted", "unmarked, refused", "sdk", "idempotency"):
        runs = [_run(args.calls, args.body_bytes, args.entries, path) for _ in range(args.runs)]
        print(f"  {path:<20} {statistics.median(runs):6.2f} us/request  (runs: "
              f"{', '.join(f'{r:.2f}' for r in runs)})")


if __name__ == "__main__":
    sys.exit(main())
