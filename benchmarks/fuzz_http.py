"""Fuzz the proxy's HTTP framing for a while and print what happened.

    .venv/bin/python benchmarks/fuzz_http.py --minutes 10            # grammar + mutations, seed 0
    .venv/bin/python benchmarks/fuzz_http.py --minutes 1 --seed 7
    .venv/bin/python benchmarks/fuzz_http.py --minutes 10 --engine atheris   # coverage-guided (pip install atheris)

Each exec sends one generated input (1-3 requests of an HTTP/1.1 grammar, then byte mutations, in random pieces;
``tokenpools_dev.proxy.httpfuzz``) to a real proxy on a real socket (fake backend, Kafka off, 0.5 s deadlines) and
judges the answer: valid responses or a close are fine; a 5xx, a hang (no close within 3 s), bytes that are not
HTTP, or an exception out of the protocol (the loop's exception handler, or an error logged by the server) are
findings. Prints exec count, execs/s, outcomes, findings (with the seed and index that reproduce each), and the
slowest exec. Exit status 1 on any finding.

``--engine atheris`` (when atheris is installed; it is not a dependency of the project) lets libFuzzer mutate the
bytes instead, guided by the coverage of the proxy's own modules, from a corpus of grammar-generated inputs; it
stops at the first finding and prints libFuzzer's own statistics.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import time

import tempfile
from pathlib import Path
from typing import Any


def run_atheris(minutes: float, seed: int) -> int:
    """Coverage-guided: the proxy's modules instrumented, libFuzzer's mutations on grammar-generated seeds."""
    import atheris

    with atheris.instrument_imports(include=["tokenpools.proxy"]):
        from tokenpools_dev.proxy import httpfuzz
    corpus = Path(tempfile.mkdtemp(prefix="fuzz-http-corpus-"))
    rng = random.Random(seed)
    for i in range(300):
        corpus.joinpath(f"seed-{i}").write_bytes(httpfuzz.generate(rng)[0])
    execs = [0]
    with httpfuzz.ProxyThread() as proxy:
        address: Any = proxy.address

        def one(data: bytes) -> None:
            execs[0] += 1
            result = httpfuzz.exchange(address, data, [], True)
            if result.outcome not in (httpfuzz.Outcome.ANSWERED, httpfuzz.Outcome.CLOSED) or proxy.faults.errors:
                raise RuntimeError(f"finding: {result} {proxy.faults.errors[:3]} for {data[:200]!r}")

        atheris.Setup([sys.argv[0], str(corpus), f"-max_total_time={int(minutes * 60)}", "-timeout=20",
                       f"-seed={seed + 1}", "-print_final_stats=1"], one)
        try:
            atheris.Fuzz()
        except SystemExit as exc:
            print(f"fuzz_http (atheris): {execs[0]} execs, exit {exc.code}")
            return int(exc.code or 0)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--report-s", type=float, default=60.0, help="progress line every this many seconds")
    parser.add_argument("--engine", choices=("grammar", "atheris"), default="grammar")
    args = parser.parse_args()
    if args.engine == "atheris":
        return run_atheris(args.minutes, args.seed)
    from tokenpools_dev.proxy.httpfuzz import Outcome, ProxyThread, exchange, generate

    findings_kinds = (Outcome.SERVER_ERROR, Outcome.HUNG, Outcome.INVALID)
    outcomes: collections.Counter[str] = collections.Counter()
    findings: list[tuple[int, str, bytes]] = []
    slowest = (0.0, -1)
    with ProxyThread() as proxy:
        assert proxy.address is not None
        rng = random.Random(args.seed)
        t0 = time.monotonic()
        end, next_report = t0 + args.minutes * 60, t0 + args.report_s
        n = 0
        while time.monotonic() < end:
            data, splits, half_close = generate(rng)
            result = exchange(proxy.address, data, splits, half_close)
            outcomes[result.outcome.value] += 1
            if result.outcome in findings_kinds:
                findings.append((n, f"{result.outcome.value} {result.statuses}", data[:200]))
            slowest = max(slowest, (result.seconds, n))
            n += 1
            if time.monotonic() > next_report:
                next_report += args.report_s
                print(f"  {time.monotonic() - t0:6.0f} s  {n} execs  {dict(outcomes)}  "
                      f"exceptions {len(proxy.faults.errors)}", flush=True)
        elapsed = time.monotonic() - t0
        errors = list(proxy.faults.errors)
    print(f"fuzz_http: seed {args.seed}, {elapsed:.0f} s, {n} execs ({n / elapsed:.0f}/s)")
    print(f"  outcomes: {dict(outcomes)}")
    print(f"  crashes (exceptions out of the protocol or logged by the server): {len(errors)}")
    print(f"  5xx: {outcomes[Outcome.SERVER_ERROR.value]}, hangs: {outcomes[Outcome.HUNG.value]}, "
          f"invalid responses: {outcomes[Outcome.INVALID.value]}")
    print(f"  slowest exec: {slowest[0] * 1000:.1f} ms (index {slowest[1]})")
    for index, what, data in findings[:20]:
        print(f"  finding at index {index} (seed {args.seed}): {what}: {data!r}")
    for error in errors[:20]:
        print(f"  exception: {error}")
    return 1 if findings or errors else 0


if __name__ == "__main__":
    sys.exit(main())
