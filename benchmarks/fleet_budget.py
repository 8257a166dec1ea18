"""A budget enforced by N proxies from the published ledger: the measured overshoot ÷ its bounds (docs/budgets.md).

    .venv/bin/python benchmarks/fleet_budget.py            # N ∈ {1, 2, 4, 8}, 5 seeds each: a few seconds
    .venv/bin/python benchmarks/fleet_budget.py --estimate-tokens 512   # reservations of max_tokens
    .venv/bin/python benchmarks/fleet_budget.py --publish-in-flight     # a design: records carry reservations

One entitlement with a 2,000,000-token budget (``never``: one period), 20 requests/s for 300 s spread at random
over the proxies (prompts 100-1000 tokens, outputs 1-512, ``max_tokens`` 512, 1-20 s each), the ledger published
every 1 s with a 0.1 s watermark lag and a 0.05 s Kafka hop (``replay.fleet.budget``). Per N, the largest over the
seeds of the overshoot and of overshoot ÷ each bound; deterministic (no figure is timed). ``--publish-in-flight``
models records that also carry each proxy's reservations in flight (docs/budgets.md#tightening-the-bound).
"""

from __future__ import annotations

import argparse
import platform

from tokenpools.core.budgets import BudgetSpec, Period
from tokenpools.replay.fleet.budget import BudgetFleetConfig, measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--estimate-tokens", type=int, default=256, help="the output estimate reserved (default 256)")
    parser.add_argument("--publish-interval-s", type=float, default=1.0)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--publish-in-flight", action="store_true",
                        help="records also carry each proxy's reservations in flight (a design, not the product)")
    args = parser.parse_args()
    base = BudgetFleetConfig(1, BudgetSpec("run", Period.NEVER, 2_000_000), 20.0, 300.0,
                             publish_interval_s=args.publish_interval_s, estimate_tokens=args.estimate_tokens,
                             publish_in_flight=args.publish_in_flight)
    print(f"{platform.node() or 'unknown host'}, Python {platform.python_version()}; estimate {args.estimate_tokens} "
          f"of max_tokens {base.max_tokens}, publish every {args.publish_interval_s} s, {args.seeds} seeds"
          f"{', records carry the reservations in flight' if args.publish_in_flight else ''}")
    print("\n".join(measure(base, seeds=args.seeds)))


if __name__ == "__main__":
    main()
