"""``tokenpools fleet`` (a row of ``tokenpools.cli.COMMANDS``): one fleet of P proxies behind a load balancer,
each distribution design against one exact enforcer on the same seeded trace (``compare``).

``add_fleet_arguments(parser)`` adds the options, each checked as it is parsed (a bad value exits 2 with a message
naming the option); ``fleet(args)`` runs the comparison and prints it as a table that fits the terminal
(``table.terminal_table``) or, with ``--json``, as JSON, written to ``--out DIR/results.json`` too when asked. The model is imported by these functions only, so
``tokenpools --help`` stays fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from tokenpools.argtypes import number

DEFAULT_DESIGN = "counts"
FORMER_NAMES = {"split": "shares"}  # accepted, read as the settings' name (policy.fleet_enforcement)


def _design_list(known: list[str]) -> Callable[[str], list[str]]:
    """An argparse type: a comma-separated list of design names, each one of ``known`` (or a former name)."""

    def parse(text: str) -> list[str]:
        names = [FORMER_NAMES.get(n.strip(), n.strip()) for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"unknown design {', '.join(unknown) or repr(text)} "
                                             f"(choose from {', '.join(known)})")
        return names

    return parse


def add_fleet_arguments(parser: argparse.ArgumentParser) -> None:
    from tokenpools.replay.fleet import compare
    from tokenpools.replay.fleet.balancers import BALANCERS
    from tokenpools.replay.fleet.model import FleetConfig
    from tokenpools.replay.fleet.trace import TraceConfig

    fleet_defaults, trace_defaults = FleetConfig(proxies=1, policy=compare.EXACT), TraceConfig()
    count, whole = number(int, 1, True, "a whole number"), number(int, 0, True, "a whole number")
    positive = number(float, 0, False, "a number of seconds")
    parser.add_argument("--proxies", type=count, default=10, metavar="P", help="proxies in the fleet (default 10)")
    parser.add_argument("--lb", choices=sorted(BALANCERS), default="random",
                        help="the load balancer in front of them (default random; key_affinity: an entitlement's "
                             "requests all reach one proxy)")
    parser.add_argument("--design", type=_design_list(compare.designs()), action="append", default=None,
                        metavar="NAME[,NAME...]",
                        help=f"distribution designs to measure, repeatable: {', '.join(compare.designs())} "
                             f"(default {DEFAULT_DESIGN}, as policy.fleet_enforcement: fleet-wide counts; shares: "
                             "each proxy holds a share of every limit, set every tick; split, its former name, is "
                             "still accepted)")
    parser.add_argument("--growth-fraction", type=number(float, 1, True, "a number"), action="append", default=[],
                        metavar="F", help="also measure counts with this growth fraction f, as counts_f<F> "
                                          "(repeatable; counts' own f is 2)")
    parser.add_argument("--entitlements", type=count, default=100, metavar="E",
                        help="guaranteed entitlements in the trace (default 100)")
    parser.add_argument("--duration-s", type=positive, default=30.0, metavar="S",
                        help="event time of the trace (default 30)")
    parser.add_argument("--load", type=number(float, 0, False, "a fraction"), default=trace_defaults.load,
                        metavar="F",
                        help=f"offered load as a fraction of every limit (default {trace_defaults.load:g})")
    parser.add_argument("--seed", type=whole, default=1, metavar="N",
                        help="draws the trace and the balancer (default 1)")
    parser.add_argument("--tick-s", type=positive, default=fleet_defaults.tick_s, metavar="S",
                        help=f"window width: the agents decide at every end (default {fleet_defaults.tick_s:g})")
    parser.add_argument("--counts-interval-s", type=positive, default=fleet_defaults.counts_interval_s,
                        metavar="S", help="how often the agents publish the fleet's counts, counts designs "
                             f"(default {fleet_defaults.counts_interval_s:g})")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR", help="also write DIR/results.json")


def fleet(args: argparse.Namespace) -> int:
    """Run the exact enforcer and each design on one trace; print the comparison."""
    import json
    import sys

    from tokenpools.replay.fleet import compare
    from tokenpools.replay.fleet.table import exact_line, settings_line, terminal_table
    from tokenpools.tables import console_for
    from tokenpools.replay.fleet.trace import TraceConfig

    if args.out is not None:  # before the runs: an --out that cannot be a directory fails at once
        args.out.mkdir(parents=True, exist_ok=True)
    chosen = [name for names in (args.design or [[DEFAULT_DESIGN]]) for name in names]
    chosen += [compare.variant_name(f) for f in args.growth_fraction]
    designs = list(dict.fromkeys(chosen))
    trace_config = TraceConfig(entitlements=args.entitlements, duration_s=args.duration_s, load=args.load)
    configs = compare.grid([args.proxies], [args.lb], designs, args.tick_s, args.counts_interval_s)
    trace = compare.trace_for(trace_config, args.seed)
    exact = compare.exact(trace, args.seed)
    rows = list(compare.design_runs(trace, configs, args.seed, exact, compare.policies_with(args.growth_fraction)))
    document = compare.document(trace_config, trace, args.seed, exact, rows)
    if args.out is not None:
        (args.out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {args.out / 'results.json'}", file=sys.stderr)
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    console = console_for()
    console.print(settings_line(trace_config, trace, args.seed, configs[0]), highlight=False)
    console.print(f"fleet: {args.proxies} proxies behind a {args.lb} balancer", highlight=False)
    console.print(exact_line(exact), highlight=False)
    console.print(terminal_table(exact, rows, console.width))
    return 0
