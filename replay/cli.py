"""Command handlers: ``tokenpools record``, ``replay`` and ``experiment`` (rows of ``tokenpools.cli.COMMANDS``).

``experiment --mode`` chooses among rows too: ``sim`` here, and the modes installed distributions add through the
entry-point group ``tokenpools.experiment_modes`` (read when the experiment's parser is built, never at import).

Each ``add_*_arguments(parser)`` adds the subcommand's options and each handler returns an exit code. ``--set``
items arrive in ``args.overrides`` (Settings keys, plus ``load.*`` and ``replay.*`` for the replayer's own knobs).
Heavy imports happen inside the handlers, so ``tokenpools --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tokenpools.argtypes import out_dir, positive
from tokenpools.commands import EXPERIMENT_MODES_GROUP, Command, discover, resolve
from tokenpools.errors import PermanentError

if TYPE_CHECKING:
    from tokenpools.replay.recorder import Recorder, RecorderStats


# ---------------------------------------------------------------- record


def add_record_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=out_dir, required=True,
                        help="log directory (Parquet, partitioned by hour; made once Kafka answers)")
    parser.add_argument("--topics", default=("requests,completions,backend_metrics,specs,limits,scale,"
                                             "usage,budgets,budget_alerts"),
                        help="which topics to record, by their field in tokenpools.topics.Topics (comma-separated)")
    parser.add_argument("--group-id", default="tokenpools-recorder", help="consumer group (its offsets make a rerun resume)")
    parser.add_argument("--batch-size", type=positive(int), default=5000,
                        help="records per Parquet file, at most (default 5000)")
    parser.add_argument("--idle-exit-s", type=positive(float), default=None,
                        help="stop after this many seconds without records; idle proxies' watermarks are none "
                             "(default: run until interrupted)")
    parser.add_argument("--no-progress", action="store_true", help="no progress display")


def record(args: argparse.Namespace) -> int:
    import asyncio

    from tokenpools.config import load_settings
    from tokenpools.replay.recorder import Recorder, RecorderConfig
    from tokenpools.runtime.kafka import KafkaClients

    settings = load_settings(None, args.overrides)
    config = RecorderConfig(
        out_dir=args.out, topics=tuple(t.strip() for t in args.topics.split(",") if t.strip()),
        group_id=args.group_id, batch_size=args.batch_size, idle_exit_s=args.idle_exit_s,
    )
    kafka = KafkaClients(settings.kafka)
    try:
        recorder = Recorder(kafka, config, show_progress=not args.no_progress)
    except ValueError as exc:  # an unknown topic name
        raise PermanentError(f"--topics: {exc}") from None
    asyncio.run(kafka.require_reachable("recorder"))  # (an --out that cannot be a directory failed in the parser)
    args.out.mkdir(parents=True, exist_ok=True)
    stats = asyncio.run(_record_until_stopped(recorder))
    print(f"recorded {stats.records} records into {stats.files} files under {args.out} "
          f"({stats.skipped} already on disk, {stats.rejected} rejected)", file=sys.stderr)
    return 0


async def _record_until_stopped(recorder: Recorder) -> RecorderStats:
    """Run the recorder until it ends (``--idle-exit-s``) or SIGTERM/SIGINT stops it: a stop writes what is
    buffered and commits it, then the command ends normally (a Deployment's pod is stopped with SIGTERM; as a
    container's PID 1 the process would otherwise not even die of it, and its buffer would wait for SIGKILL)."""
    import asyncio
    import signal

    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(recorder.run())
    signals = (signal.SIGINT, signal.SIGTERM)
    for sig in signals:
        loop.add_signal_handler(sig, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        if not task.cancelled():  # cancelled from outside, not by a signal
            raise
        return recorder.stats
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


# ---------------------------------------------------------------- replay


def add_replay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log", type=Path, metavar="LOG", help="a log directory written by `tokenpools record`")
    parser.add_argument("--config", type=Path, required=True, help="the pool and entitlements (YAML) to replay against")
    parser.add_argument("--out", type=out_dir, default="out/replay",
                        help="output directory (default out/replay; made once the input is checked)")
    parser.epilog = ("The replayer's own knobs go through --set/--sweep too: replay.backend=sim (default: the backend "
                     "simulator serves) or recorded (each request takes the service time the log recorded for it, so "
                     "a live log's decisions are reproduced); replay.backend_waiting=tick|off.")
    parser.add_argument("--policy", default="token-pools", help="registered policy: token-pools (default) or none")
    parser.add_argument("--capacity-change", action="append", default=[], metavar="T=SLOTS",
                        help="set every replica's slots at T seconds after the log's start (the Exp-2 outage: "
                             "--capacity-change 30=8 --capacity-change 120=16); repeatable")
    parser.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                        help="replay once per grid point and tabulate the outcomes (repeatable: a cartesian grid)")
    parser.add_argument("--budget", action="append", default=[], metavar="ENTITLEMENT[.NAME]=AMOUNT/PERIOD[/TZ]",
                        help="add a budget to an entitlement, or change its budget NAME (default name: the period), "
                             "for this replay: had it had this budget, when would it have run out? e.g. "
                             "--budget copilot=5e6/month/Europe/Berlin; PERIOD is day, week, month or never; "
                             "repeatable; also --set replay.budget=...")


def _capacity_changes(items: list[str]) -> list[tuple[float, int]]:
    changes = []
    for item in items:
        t, sep, slots = item.partition("=")
        try:
            changes.append((float(t), int(slots)))
        except ValueError:
            raise PermanentError(f"--capacity-change expects T=SLOTS such as 30=8, got {item!r}") from None
        if not sep:
            raise PermanentError(f"--capacity-change expects T=SLOTS such as 30=8, got {item!r}")
        if changes[-1][0] < 0 or changes[-1][1] < 1:
            raise PermanentError(f"--capacity-change needs T >= 0 seconds and SLOTS >= 1 (a replica serves at least "
                                 f"one request), got {item!r}")
    twice = sorted({t for t, _ in changes if sum(1 for u, _ in changes if u == t) > 1})
    if twice:
        raise PermanentError(f"--capacity-change names T={', '.join(f'{t:g}' for t in twice)} twice; give one "
                             f"number of slots for each time")
    return sorted(changes)


def replay(args: argparse.Namespace) -> int:
    from tokenpools.config import load_config
    from tokenpools.replay.budget_options import split_budget_items
    from tokenpools.replay.experiments import recorded_params
    from tokenpools.replay.log_replay import replay_log, sweep_log
    from tokenpools.replay.scenario import ReplayParams

    config = load_config(args.config)
    changes = _capacity_changes(args.capacity_change)
    budget_items, overrides = split_budget_items(args.overrides)
    budgets = [*budget_items, *args.budget]

    def params_for(items: list[str]) -> ReplayParams:
        return recorded_params(config.settings_values, items)

    _refuse_unread_policy_settings(args.policy, "--set", [item.partition("=")[0].strip() for item in overrides])
    if args.sweep:  # every point's settings checked before the first replay
        from tokenpools.replay.sweep import check_points, parse_grid

        check_points(params_for, parse_grid(args.sweep), fixed=overrides)
        _refuse_unread_policy_settings(args.policy, "--sweep", list(parse_grid(args.sweep)),
                                       " (every row would be the same)")
        from tokenpools.replay.sweep import terminal_table
        from tokenpools.tables import console_for

        grid = parse_grid(args.sweep)
        df = sweep_log(args.log, config, params_for, overrides, args.sweep, changes, args.policy, args.out, budgets)
        console = console_for()
        console.print(terminal_table(df, list(grid), console.width))
        console.print(f"wrote {args.out / 'sweep.csv'} and {args.out / 'sweep.md'} (every column)", highlight=False)
        return 0
    params = params_for(overrides)
    summary = replay_log(args.log, config, params, changes, args.policy, args.out, budgets)
    print(summary)
    return 0


def _refuse_unread_policy_settings(policy: str, option: str, keys: list[str], consequence: str = "") -> None:
    """A ``policy.*`` key given to a registered policy that decides nothing (``none``) changes nothing: refused
    rather than ignored (docs/conventions.md#exit-codes)."""
    from tokenpools.replay.baseline import POLICIES

    unread = [key for key in keys if key.startswith("policy.")]
    if unread and not getattr(POLICIES.get(policy), "controlled", True):
        raise PermanentError(f"{option} {', '.join(unread)}: --policy {policy} decides nothing, so no policy.* "
                             f"setting changes its replay{consequence}")


# ---------------------------------------------------------------- experiment

SIM = Command("sim", "tokenpools.replay.cli:experiment_sim", "replay over the backend simulator (default)")


def experiment_modes() -> tuple[Command, ...]:
    """``--mode`` choices: ``sim`` and the modes installed distributions add (tokenpools-dev adds ``live``)."""
    found = discover(EXPERIMENT_MODES_GROUP, taken={SIM.name})
    for problem in found.problems:
        print(f"tokenpools experiment: {problem}", file=sys.stderr)
    return (SIM, *found.commands)


def add_experiment_arguments(parser: argparse.ArgumentParser, modes: Sequence[Command] | None = None) -> None:
    """The options, with ``--mode`` offering ``modes`` (default: the installed ones) and each mode's own options."""
    modes = experiment_modes() if modes is None else tuple(modes)
    parser.add_argument("name", choices=["exp1", "exp2"], help="the paper's experiment")
    parser.add_argument("--mode", choices=[m.name for m in modes], default=SIM.name,
                        help="; ".join(f"{m.name}: {m.help}" for m in modes))
    parser.add_argument("--out", type=out_dir, default=None, help="output directory (default out/<name>)")
    parser.add_argument("--config", type=Path, default=None, help="pool and entitlements (default examples/<name>.yaml)")
    parser.add_argument("--sweep", action="append", default=None, metavar="KEY=V1,V2,...",
                        help="a parameter grid to tabulate (repeatable); default: the demo's sweep for this experiment")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    own: dict[str, tuple[argparse.Action, ...]] = {}
    for mode in modes:  # e.g. live's --time-scale, --kubernetes, --proxies
        add_mode_arguments = resolve(mode.arguments) if mode.arguments is not None else None
        if add_mode_arguments is not None:
            before = len(parser._actions)
            add_mode_arguments(parser)
            own[mode.name] = tuple(parser._actions[before:])
    parser.set_defaults(_experiment_modes=modes, _mode_options=own)


def other_modes_options(args: argparse.Namespace) -> list[str]:
    """The options given (not at their default) that belong to a mode other than ``args.mode``."""
    return [action.option_strings[0] for name, actions in getattr(args, "_mode_options", {}).items()
            if name != args.mode for action in actions
            if action.option_strings and getattr(args, action.dest, action.default) != action.default]


def experiment(args: argparse.Namespace) -> int:
    """Run the chosen ``--mode``'s handler (one of the modes the parser offered)."""
    given = other_modes_options(args)
    if given:
        raise PermanentError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not apply to --mode "
                             f"{args.mode} (see tokenpools experiment --help for each mode's options)")
    mode = next(m for m in args._experiment_modes if m.name == args.mode)
    run = resolve(mode.run)
    if run is None:
        raise PermanentError(f"--mode {mode.name}: {mode.run} is not defined")
    return int(run(args))


def experiment_sim(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tokenpools.replay import runner
    from tokenpools.replay.cli_progress import print_headline, progress_bar

    out = args.out or Path("out") / args.name
    grids = {args.name: (tuple(args.sweep),)} if args.sweep else {args.name: runner.DEMO_SWEEPS.get(args.name, ())}
    command = f"tokenpools experiment {args.name} --mode sim --out {out}" + "".join(f" --set {o}" for o in args.overrides)
    runner.check([args.name], args.overrides, grids, args.config)  # before the progress bar and any work
    out.mkdir(parents=True, exist_ok=True)
    console = Console(stderr=True)
    with progress_bar(console, args.name, runner.steps([args.name], grids, args.overrides),
                      enabled=not args.no_progress) as advance:
        results = runner.run([args.name], out, args.overrides, command=command, sweeps=grids, config=args.config,
                             progress=advance)
    print_headline(console, results, out)
    return 0
