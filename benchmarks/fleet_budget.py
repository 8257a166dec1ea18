"""A budget enforced by N proxies from the published ledger: the measured overshoot ÷ its bounds (docs/budgets.md).

    .venv/bin/python benchmarks/fleet_budget.py            # N ∈ {1, 2, 4, 8}, 5 seeds each: a few seconds
    .venv/bin/python benchmarks/fleet_budget.py --estimate-tokens 512   # reservations of max_tokens
    .venv/bin/python benchmarks/fleet_budget.py --completions-only      # records without the reservations in flight
    .venv/bin/python benchmarks/fleet_budget.py --json   # {"overshoot_ratio": {N: overshoot ÷ allowance}, ...}

One entitlement with a 2,000,000-token budget (``never``: one period), 20 requests/s for 300 s spread at random
over the proxies (prompts 100-1000 tokens, outputs 1-512, ``max_tokens`` 512, 1-20 s each), the ledger published
every 1 s with a 0.1 s watermark lag and a 0.05 s Kafka hop (``replay.fleet.budget``). Per N, the largest over the
seeds of the overshoot and of overshoot ÷ each bound; deterministic (no figure is timed). The records carry each
proxy's reservations in flight and the proxies add the others' (the product's rule,
docs/budgets.md#the-others-reservations-in-flight); ``--completions-only``: records of completions alone, as before.
"""

from __future__ import annotations

import argparse
import platform

import orjson

from tokenpools.core.budgets import BudgetSpec, Period
from tokenpools.replay.fleet.budget import BOUNDS, BudgetFleetConfig, figures, measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--estimate-tokens", type=int, default=256, help="the output estimate reserved (default 256)")
    parser.add_argument("--publish-interval-s", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--completions-only", action="store_true",
                        help="records without the proxies' reservations in flight (the product before they existed)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object: overshoot_ratio (proxies -> the largest overshoot ÷ allowance over "
                             "the seeds), overshoot_units, the ratios to each bound, and the settings")
    args = parser.parse_args()
    base = BudgetFleetConfig(1, BudgetSpec("run", Period.NEVER, 2_000_000), 20.0, 300.0,
                             publish_interval_s=args.publish_interval_s, estimate_tokens=args.estimate_tokens,
                             publish_in_flight=not args.completions_only)
    if args.json:
        rows = figures(base, seeds=args.seeds)
        print(orjson.dumps({
            "machine": platform.node() or "unknown host", "python": platform.python_version(),
            "estimate_tokens": args.estimate_tokens, "publish_interval_s": args.publish_interval_s,
            "seeds": args.seeds, "reservations_in_flight": not args.completions_only,
            "overshoot_ratio": {str(f.proxies): round(f.allowance_ratio, 6) for f in rows},
            "overshoot_units": {str(f.proxies): round(f.overshoot) for f in rows},
            "bound_ratios": {str(f.proxies): dict(zip(BOUNDS, (round(x, 6) for x in f.bound_ratios))) for f in rows},
        }, option=orjson.OPT_INDENT_2).decode())
        return
    print(f"{platform.node() or 'unknown host'}, Python {platform.python_version()}; estimate {args.estimate_tokens} "
          f"of max_tokens {base.max_tokens}, publish every {args.publish_interval_s} s, {args.seeds} seeds"
          f"{', records of completions only' if args.completions_only else ', records carry the reservations in flight'}")
    print("\n".join(measure(base, seeds=args.seeds)))


if __name__ == "__main__":
    main()
