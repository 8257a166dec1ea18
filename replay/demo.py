"""``tokenpools demo``: both paper experiments, token pools against no admission control, in about a minute.

``run_demo(out_dir)`` is the project's main job (``make demo``): it replays Exp 1 and Exp 2 under both policies and
both load models (open loop: Poisson arrivals; closed loop: clients that wait for their answers; ``--set
load.mode=open`` runs one), runs the small parameter sweeps of the report, and writes ``report.md``,
``results.json``, the figures, each replay's log (readable by ``tokenpools replay``) and the sweep tables to
``out_dir``, with a progress bar on stderr.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

DEFAULT_OUT = Path("out/demo")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--no-sweeps", action="store_true", help="skip the parameter sweeps of the report")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar on stderr (the closing table stays)")


def run_demo(out_dir: Path, overrides: Sequence[str] = (), sweeps: bool = True, show_progress: bool = True) -> int:
    """Replay both experiments under both policies and write the report; 0 on success."""
    import sys

    from tokenpools.replay import runner
    from tokenpools.replay.cli_progress import progress_bar
    from tokenpools.tables import console_for

    names = ("exp1", "exp2")
    grids = runner.DEMO_SWEEPS if sweeps else {}
    command = "tokenpools demo --out " + str(out_dir) + "".join(f" --set {o}" for o in overrides)
    runner.check(names, overrides, grids)  # before the progress bar and any work: bad input is one line
    out_dir.mkdir(parents=True, exist_ok=True)
    console = console_for(sys.stderr)
    with progress_bar(console, "demo", runner.steps(names, grids, overrides), enabled=show_progress) as advance:
        results = runner.run(names, out_dir, overrides, command=command, sweeps=grids, progress=advance)
    from tokenpools.replay.cli_progress import print_headline

    print_headline(console, results, out_dir)
    return 0


def run(args: argparse.Namespace) -> int:
    return run_demo(args.out, getattr(args, "overrides", ()), sweeps=not args.no_sweeps,
                    show_progress=not args.no_progress)
