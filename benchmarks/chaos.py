"""A seeded schedule of faults against the real local stack under load, then a checker of the books (issue 32).

    .venv/bin/python benchmarks/chaos.py --quick          # 3 minutes of load, 7 faults; ~5 minutes in all
    .venv/bin/python benchmarks/chaos.py --minutes 10     # 10 minutes of load, 20 faults
    .venv/bin/python benchmarks/chaos.py --quick --json   # the figures as one JSON object

A local stack starts as ``tokenpools up --no-kubernetes --proxies 3 --agents-workers 2`` would (Kafka, a simulated
pool of 16 slots, Prometheus, two agents workers, the controller, three proxies), compressed 2× (``--time-scale``).
Three tenants of 4 slots each send closed-loop requests (6 clients each, no retries) through a random balancer; the
first tenant has a daily budget the load exhausts. While they send, the faults of ``tokenpools_dev.chaos.schedule``
(seeded, every kind at least once) are injected: SIGKILL an agents worker and start it again; SIGSTOP the broker
longer than ``proxy.producer_request_timeout_ms`` (1 s here), then SIGCONT; restart the broker; SIGKILL a proxy and
start it again; restart the controller; SIGSTOP a proxy for 3 s. Then the topics are recorded (as ``tokenpools
record``) and ``tokenpools_dev.chaos.checker`` reads the history: requests lost or counted twice, the budget's
overshoot, the concurrency overshoot seen from the clients, slots held after the load, and ``tokenpools usage --log
LOG --reconcile``. What each figure means and what it is checked against: docs/chaos.md.

Exit 0 when every check holds, 1 when one fails (a finding, named on stderr), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from tokenpools.config import load_settings
from tokenpools.errors import PermanentError, TokenPoolsError
from tokenpools_dev.chaos import runner
from tokenpools_dev.loadgen.cli import quiet_http_logs


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "machine": platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version()}


def report(run: runner.ChaosRun, options: runner.RunOptions) -> dict[str, Any]:
    f = run.figures
    kinds = Counter(fault["kind"] for fault in run.faults)
    return {"faults": {"count": len(run.faults), "by_kind": dict(sorted(kinds.items()))},
            "requests": f.requests, "admitted": f.admitted, "refused_by": dict(f.refused_by),
            "completions": f.completions,
            "lost": f.lost, "lost_detail": dict(f.lost_detail), "interrupted": f.interrupted,
            "unanswered_in_faults": f.unanswered_in_faults, "double_counted": f.double_counted,
            "held_twice": f.held_twice, "budget_overshoot_ratio": f.budget_overshoot_ratio,
            "budget_bound_ratio": f.budget_bound_ratio, "concurrency_overshoot": f.concurrency_overshoot,
            "concurrency_bound": f.concurrency_bound, "slots_held_after": f.slots_held_after,
            "reconciled": f.reconciled, "findings": [x.value for x in f.findings],
            "settings": list(options.overrides), "seed": options.seed, "load_s": options.load_s,
            "time_scale": options.time_scale,
            "stack_ready_s": round(run.stack_ready_s, 1), "settle_s": round(run.settle_s, 1),
            "client_failures": run.client_failures, "run_dir": str(run.run_dir), "machine": machine()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 minutes of load, 7 faults (the integration test's)")
    parser.add_argument("--minutes", type=float, default=None, help="minutes of load (default 10; --quick 3)")
    parser.add_argument("--faults", type=int, default=None, help="faults to inject (default 2 per minute, >= 6)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--time-scale", type=float, default=0.5, help="the stack's time scale (default 0.5)")
    parser.add_argument("--out", type=Path, default=None, help="run directory (default: a new temporary one)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a setting for every component (repeatable), e.g. budgets.on_stale=refuse")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    minutes = args.minutes if args.minutes is not None else 3.0 if args.quick else 10.0
    if minutes <= 0 or minutes > 600:
        return _bad(f"--minutes must be in (0, 600], got {minutes:g}")
    faults = args.faults if args.faults is not None else runner.QUICK["faults"] if args.quick \
        else max(6, round(2 * minutes))
    if faults < 6:
        return _bad(f"--faults must be >= 6 (one of each kind), got {faults}")
    if not 0 < args.time_scale <= 1:
        return _bad(f"--time-scale must be in (0, 1], got {args.time_scale:g}")
    try:
        load_settings(None, args.overrides)  # a bad --set fails before anything starts
    except TokenPoolsError as exc:
        return _bad(str(exc).splitlines()[0])
    out = args.out if args.out is not None else Path(tempfile.mkdtemp(prefix="chaos-"))
    try:
        options = runner.RunOptions(out=out, seed=args.seed, load_s=60 * minutes, faults=faults,
                                    time_scale=args.time_scale, overrides=tuple(args.overrides))
    except ValueError as exc:
        return _bad(str(exc))
    logging.basicConfig(level=logging.WARNING)
    quiet_http_logs()
    progress = (lambda line: print(line, file=sys.stderr)) if args.json else print
    try:
        run = runner.run(options, progress)
    except (PermanentError, ValueError) as exc:
        return _bad(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
    figures = report(run, options)
    (out / "figures.json").write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(figures))
    else:
        for key, value in figures.items():
            print(f"{key:24} {value}")
    if run.figures.findings:
        print(f"chaos: findings: {', '.join(x.value for x in run.figures.findings)}", file=sys.stderr)
        return 1
    return 0


def _bad(message: str) -> int:
    print(f"chaos: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
