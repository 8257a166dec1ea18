"""Refusals of a live proxy fleet against one proxy, same seeded schedule, on real processes.

    .venv/bin/python benchmarks/fleet_live.py             # uncompressed: 150 s measured per run, ~7 minutes
    .venv/bin/python benchmarks/fleet_live.py --quick     # compressed 2× (the live test's): ~3 minutes on 2 cores
    .venv/bin/python benchmarks/fleet_live.py --json      # the same figures as JSON
    .venv/bin/python benchmarks/fleet_live.py --quick --proxies 1 2 4 --load 0.3

For each proxy count (default 1 and 4) a local stack starts as ``tokenpools up --no-kubernetes --proxies N`` would
(Kafka, one llm-d-inference-sim of 64 slots behind the pool's Service, Prometheus, the agents, the controller, N
proxies), the schedule of ``tokenpools_dev.fleet_live.scenario`` is sent through it and the stack stops: 20
guaranteed entitlements of 2 slots (40 of 64 promised), each sending Poisson arrivals at 60 % of its slots (1.2
erlangs; ``--load``), 32 + 32 tokens a request, every request to a proxy drawn uniformly by a seeded random
balancer, as a Kubernetes Service spreads connections, no retries. Requests in the warm-up are sent, not counted.

Per proxy count: requests, refused % and by reason, the ratio to the single proxy's rate, requests per proxy, the
admitted requests in flight per entitlement, the overshoot (the most slots any entitlement held above its limit
across the fleet, and the slot-seconds above the limits as a % of the limits', both seen from the client), and
whether the run stays within the target: refused ≤ 1.5 × the
single proxy's rate × its requests + 5 requests (``fleet_live.figures``: the allowance keeps a single-proxy rate of 0
meaningful). The first lines say which machine ran it. Exits 0 whatever the verdict: it measures, the live test
(``tests/integration/test_live_fleet.py``) asserts.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from tokenpools import accel
from tokenpools_dev.fleet_live import figures as fig
from tokenpools_dev.fleet_live import runner
from tokenpools_dev.fleet_live import scenario as sc
from tokenpools_dev.loadgen.cli import quiet_http_logs


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "machine": platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "build": accel.describe(),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def rows(runs: list[runner.FleetRun]) -> list[dict[str, Any]]:
    """Each run's figures with its ratio and verdict against the first run with one proxy (None without one)."""
    one = next((r.figures for r in runs if r.figures.proxies == 1), None)
    out = []
    for r in runs:
        f = r.figures
        out.append({**f.summary(),
                    "ratio_to_one_proxy": None if one is None else fig.ratio(one, f),
                    "allowed_refused": None if one is None else round(fig.allowed_refusals(one, f), 1),
                    "within_target": None if one is None else fig.holds(one, f),
                    "stack_ready_s": round(r.stack_ready_s, 1), "load_wall_s": round(r.load_wall_s, 1),
                    "client_failures": r.client_failures, "client_loop_lag_p99_ms": r.loop_lag_p99_ms,
                    "counts_age_p50_s": r.counts_age_s[0], "counts_age_p99_s": r.counts_age_s[1],
                    "run_dir": str(r.run_dir)})
    return out


def print_table(table: list[dict[str, Any]]) -> None:
    header = (f"{'proxies':>7}{'requests':>9}{'refused%':>9}{'ratio':>7}{'allowed':>8}{'target':>8}  "
              f"{'refused by reason':<40}{'per proxy':<24}{'in flight':>9}{'over max':>9}{'over %':>8}"
              f"{'lag p99 ms':>11}")
    print(header)
    print("-" * len(header))
    for row in table:
        by = ", ".join(f"{k} {v}" for k, v in row["refused_by"].items()) or "none"
        ratio = "-" if row["ratio_to_one_proxy"] is None else f"{row['ratio_to_one_proxy']:.2f}"
        verdict = {None: "-", True: "met", False: "MISSED"}[row["within_target"]]
        print(f"{row['proxies']:>7}{row['requests']:>9}{100 * row['refused_fraction']:>9.1f}{ratio:>7}"
              f"{row['allowed_refused'] if row['allowed_refused'] is not None else '-':>8}{verdict:>8}  "
              f"{by:<40}{'/'.join(map(str, row['by_proxy'])):<24}{row['mean_in_flight']:>9.2f}"
              f"{row['overshoot_max_slots']:>9}{100 * row['overshoot_fraction']:>8.3f}"
              f"{row['client_loop_lag_p99_ms'] if row['client_loop_lag_p99_ms'] is not None else '-':>11}")
        if row["counts_age_p50_s"] is not None:
            print(f"{'':>7} counts' age at the proxies (histogram bucket bounds): P50 ≤ {row['counts_age_p50_s']:g} s, "
                  f"P99 ≤ {row['counts_age_p99_s']:g} s")
        if row["errors"] or row["unsent"] or row["client_failures"]:
            print(f"{'':>7} errors {row['errors']}, unsent {row['unsent']}, client failures {row['client_failures']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="compressed 2×: {duration_s:g} s of schedule, {warmup_s:g} s warm-up (else "
                             "{full[duration_s]:g} s and {full[warmup_s]:g} s, uncompressed)".format(
                                 **runner.QUICK, full=runner.FULL))
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--proxies", type=int, nargs="+", default=[1, 4], help="proxy counts, in order (default 1 4)")
    parser.add_argument("--entitlements", type=int, default=20)
    parser.add_argument("--slots", type=int, default=2, help="concurrency of each entitlement")
    parser.add_argument("--pool-slots", type=int, default=64)
    parser.add_argument("--load", type=float, default=0.6, help="offered erlangs as a fraction of each limit")
    parser.add_argument("--duration-s", type=float, help="experiment seconds of schedule (overrides --quick's)")
    parser.add_argument("--warmup-s", type=float, help="experiment seconds not counted (overrides --quick's)")
    parser.add_argument("--time-scale", type=float, help="wall ÷ experiment time (overrides --quick's)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for every component of the stacks (repeatable), as `tokenpools up --set`")
    parser.add_argument("--out", type=Path, default=Path("out/fleet-live"), help="stacks' logs and load records")
    args = parser.parse_args(argv)
    preset = runner.QUICK if args.quick else runner.FULL
    scenario = sc.FleetScenario(entitlements=args.entitlements, slots=args.slots, pool_slots=args.pool_slots,
                                load=args.load, duration_s=args.duration_s or preset["duration_s"],
                                warmup_s=args.warmup_s if args.warmup_s is not None else preset["warmup_s"],
                                seed=args.seed)
    options = runner.RunOptions(out=args.out, proxies=tuple(args.proxies),
                                time_scale=args.time_scale or preset["time_scale"], overrides=tuple(args.overrides))
    quiet_http_logs()
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    where = machine()
    erlangs = scenario.load * scenario.slots
    described = (f"{scenario.entitlements} guaranteed entitlements × {scenario.slots} slots on a "
                 f"{scenario.pool_slots}-slot pool, {erlangs:g} erlangs each ({sc.rate_per_s(scenario):.3f} req/s), "
                 f"{scenario.prompt_tokens}+{scenario.output_tokens} tokens, random balancer, seed {scenario.seed}; "
                 f"{scenario.duration_s:g} s of schedule ({scenario.warmup_s:g} s warm-up) × {options.time_scale:g}"
                 + "".join(f"; --set {o}" for o in options.overrides))
    if not args.json:
        print(where["build"])
        print(f"python {where['python']} on {where['platform']} ({where['machine']}, {where['cores']} cores, "
              f"load average {' '.join(map(str, where['load_average']))})")
        print(f"scenario: {described}\n")
    started = time.monotonic()
    runs = runner.run(scenario, options, progress=(lambda m: print(f"  {m}", file=sys.stderr)))
    table = rows(runs)
    if args.json:
        print(json.dumps({"machine": where, "scenario": described,
                          "target": {"factor": fig.FACTOR, "allowance_requests": fig.ALLOWANCE_REQUESTS},
                          "runs": table, "total_s": round(time.monotonic() - started, 1)}, indent=2))
    else:
        print_table(table)
        print(f"\ntarget: refused ≤ {fig.FACTOR:g} × the single proxy's rate × requests + {fig.ALLOWANCE_REQUESTS} "
              f"requests; total {time.monotonic() - started:.0f} s; records in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
