"""The ``tokenpools`` command: one composition root for every subcommand.

Subcommands are rows of ``COMMANDS`` (``tokenpools.commands.Command``). A row names, as "module:function" strings,
the function that runs it (``run(args: argparse.Namespace) -> int``) and, optionally, the one that adds its
arguments (``add_arguments(parser: argparse.ArgumentParser) -> None``). Nothing is imported until a subcommand is
chosen: ``tokenpools --help`` reads only the table, and ``tokenpools X ...`` imports X's module alone. A row whose
function is not written yet (no module, or the module lacks it) is listed as "(not available yet)" and exits 2 when
run. Other installed distributions add rows through the entry-point group ``tokenpools.commands``, read when
``main`` runs (tokenpools-dev adds ``up``, ``down`` and ``load``); they cannot replace a row of this table.

Adding a subcommand is one row, e.g.::

    Command("proxy", "tokenpools.proxy.main:run", "...", arguments="tokenpools.proxy.main:add_arguments")

Every subcommand accepts ``--log-level`` (logging is configured here, before ``run``) and, unless its row says it
reads no settings (``settings=False``), ``--set group.field=VALUE`` (repeatable; settings overrides, in
``args.overrides``).

Exit codes, one rule for every command (docs/conventions.md#exit-codes): 0 fine; 1 a finding, which only a
command's own return value says (``usage --reconcile`` found a difference); 2 bad input or environment: a usage
error, a ``ConfigError`` (each problem on its line, ``FILE:LINE: …``), any other ``TokenPoolsError`` or an
``OSError`` (one line), every such line beginning ``tokenpools COMMAND:`` as argparse's do (``validate``'s report of
its files' problems excepted: ``FILE:LINE:`` first, as editors read a checker's output); a command not available
yet, a service or stack that stopped on its environment; 70 an exception nothing classifies (a bug: its traceback is printed); 130 interrupted. Bad input is
answered in one line, never a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from tokenpools.commands import COMMANDS_GROUP, Command, discover, resolve
from tokenpools.errors import ConfigError, TokenPoolsError

EXIT_OK = 0
EXIT_FINDING = 1  # returned by a command that found what it looks for (a difference, a target not met)
EXIT_INVALID = 2
EXIT_BUG = 70  # an exception nothing classifies: a bug, its traceback printed (sysexits' EX_SOFTWARE), never 1
EXIT_INTERRUPTED = 130


COMMANDS: tuple[Command, ...] = (
    Command("validate", "tokenpools.cli:validate", "check config files; print capacity, binding, priorities and limits",
            arguments="tokenpools.cli:add_validate_arguments"),
    Command("demo", "tokenpools.replay.demo:run", "replay the paper's Exp 1 and Exp 2, token pools vs no admission control",
            arguments="tokenpools.replay.demo:add_arguments"),
    Command("hash-key", "tokenpools.cli:hash_key", "print the SHA-256 of API keys read from stdin, for apiKeys[].sha256",
            settings=False),
    Command("proxy", "tokenpools.proxy.main:run", "run the admission proxy (OpenAI-compatible)",
            arguments="tokenpools.proxy.main:add_arguments"),
    Command("agents", "tokenpools.streams.main:run", "run the stream agents (usage, debt, priority, limits)",
            arguments="tokenpools.streams.main:add_arguments"),
    Command("controller", "tokenpools.controllers.main:run", "run the controllers (metrics, scaler, entitlements)",
            arguments="tokenpools.controllers.main:add_arguments"),
    Command("record", "tokenpools.replay.cli:record", "record topics to Parquet",
            arguments="tokenpools.replay.cli:add_record_arguments"),
    Command("replay", "tokenpools.replay.cli:replay", "replay a recorded log through the policy in event time",
            arguments="tokenpools.replay.cli:add_replay_arguments"),
    Command("tune", "tokenpools.replay.tune.cli:run",
            "search the settings for the best outcomes on a recorded log (Optuna; parallel, or on a Ray cluster)",
            arguments="tokenpools.replay.tune.cli:add_arguments"),
    Command("experiment", "tokenpools.replay.cli:experiment", "run a paper experiment (Exp 1, Exp 2) and report",
            arguments="tokenpools.replay.cli:add_experiment_arguments"),
    Command("fleet", "tokenpools.replay.fleet.cli:fleet",
            "model P proxies behind a load balancer: a distribution design's refusals, false refusals and overshoot "
            "against one exact enforcer on the same seeded trace",
            arguments="tokenpools.replay.fleet.cli:add_fleet_arguments", settings=False),
    Command("usage", "tokenpools.replay.usage_cli:run",
            "usage per tenant, entitlement, model and day or month, from the usage topic or a recorded log; "
            "--reconcile checks the ledger against the completion events",
            arguments="tokenpools.replay.usage_cli:add_arguments"),
    Command("calibrate", "tokenpools.calibrate.cli:run",
            "measure one backend replica's throughput and TTFT as concurrency grows; propose the pool's perReplica",
            arguments="tokenpools.calibrate.cli:add_arguments", settings=False),
    Command("top", "tokenpools.top.app:run",
            "a live view of every pool's limits, priorities, debt and today's usage, from the limits topic",
            arguments="tokenpools.top.app:add_arguments"),
)


class OneLineParser(argparse.ArgumentParser):
    """argparse, answering a usage error in one line (``tokenpools X: error: … (see tokenpools X --help)``), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_INVALID, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _common_options(settings: bool) -> argparse.ArgumentParser:
    common = OneLineParser(add_help=False)
    group = common.add_argument_group("common options")
    if settings:
        group.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                           help="override a setting, e.g. --set policy.alpha_debt=2.0 (repeatable; wins over "
                                "TOKENPOOLS_* env)")
    group.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                       help="log level (default INFO)")
    common.set_defaults(overrides=[])
    return common


class _VersionAction(argparse.Action):
    """--version, looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from importlib.metadata import version

        print(f"tokenpools {version('tokenpools')}")
        parser.exit()


DEV_DISTRIBUTION = "tokenpools-dev"  # (named, never imported: its commands come through entry points)


def build_parser(chosen: str | None = None, commands: Sequence[Command] = COMMANDS) -> argparse.ArgumentParser:
    """The parser; only the ``chosen`` subcommand gets its own arguments (the others are not imported)."""
    origins = sorted({c.origin for c in commands if c.origin is not None})
    added = "".join(f" Commands marked [{o}] are added by the installed distribution {o}, not the product"
                    + (": the development tooling (a local stack, a load generator)." if o == DEV_DISTRIBUTION else ".")
                    for o in origins)
    parser = OneLineParser(
        prog="tokenpools",
        description="Token pools: admission, fair share and autoscaling for multi-tenant LLM inference.",
        epilog="Run `tokenpools COMMAND --help` for a command's options." + added,
    )
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = {True: _common_options(settings=True), False: _common_options(settings=False)}
    for command in commands:
        available = command.available()
        help_text = command.help if available else f"{command.help} (not available yet)"
        if command.origin is not None:
            help_text = f"[{command.origin}] {help_text}"
        p = sub.add_parser(command.name, help=help_text, description=help_text,
                           parents=[common[command.settings]])
        p.set_defaults(_command=command)
        if command.name == chosen and available and command.arguments is not None:
            add_arguments = resolve(command.arguments)
            if add_arguments is not None:
                add_arguments(p)
    return parser


def installed_commands() -> tuple[Command, ...]:
    """``COMMANDS`` and the rows installed distributions add (each one skipped is reported on stderr)."""
    found = discover(COMMANDS_GROUP, taken={c.name for c in COMMANDS})
    for problem in found.problems:
        print(f"tokenpools: {problem}", file=sys.stderr)
    return COMMANDS + found.commands


def main(argv: Sequence[str] | None = None, commands: Sequence[Command] | None = None) -> int:
    """Run the subcommand ``argv`` names; ``commands`` replaces the installed table (``installed_commands()``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = installed_commands() if commands is None else commands
    chosen = next((a for a in argv if not a.startswith("-")), None)
    command = next((c for c in commands if c.name == chosen), None)
    if command is not None and not command.available() and not {"-h", "--help"} & set(argv):
        print(f"tokenpools {command.name}: not available yet ({command.run} is not implemented)", file=sys.stderr)
        return EXIT_INVALID
    parser = build_parser(chosen, commands)
    try:
        args, unknown = parser.parse_known_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors: argparse has printed what it had to
        return exc.code if isinstance(exc.code, int) else EXIT_INVALID
    command = args._command
    if unknown:
        what = (f"--set: {command.name} reads no settings" if "--set" in unknown
                else f"unrecognized arguments: {' '.join(unknown)}")
        print(f"tokenpools {command.name}: error: {what} (see tokenpools {command.name} --help)", file=sys.stderr)
        return EXIT_INVALID
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run = resolve(command.run)
    if run is None:
        print(f"tokenpools {command.name}: not available yet ({command.run} is not defined)", file=sys.stderr)
        return EXIT_INVALID
    try:
        result = run(args)
    except ConfigError as exc:
        named = f"tokenpools {command.name}: "
        for problem in map(str, exc.problems):  # (a problem labelled with the command already is printed as it is)
            print(problem if problem.startswith(named) else named + problem, file=sys.stderr)
        return EXIT_INVALID
    except TokenPoolsError as exc:  # bad input or environment, found at run time
        print(f"tokenpools {command.name}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except OSError as exc:  # a path that cannot be read or written, a connection refused
        print(f"tokenpools {command.name}: {_os_error(exc)}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception:  # a bug: Python's own exit code, 1, would read as a finding to a script
        import traceback

        traceback.print_exc()
        print(f"tokenpools {command.name}: internal error (a bug; the traceback above says where), exit {EXIT_BUG}",
              file=sys.stderr)
        return EXIT_BUG
    return EXIT_OK if result is None else int(result)


def _os_error(exc: OSError) -> str:
    """One line for an OSError: its reason and the path it was about (``str(exc)`` for those without)."""
    if exc.strerror and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    return " ".join(str(exc).split()) or type(exc).__name__  # e.g. a TimeoutError (an OSError) has no text


# ---------------------------------------------------------------- validate


def add_validate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML files of TokenPool/TokenEntitlement documents")
    parser.add_argument("--now", metavar="RFC3339", help="evaluate expiresAt at this time (default: now)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only problems and one line per file")


def validate(args: argparse.Namespace) -> int:
    """Load every file; print its tables, or every problem of every invalid file to stderr (exit 2)."""
    import time
    from datetime import datetime

    from tokenpools.config import load_config, load_settings
    from tokenpools.config.render import make_console, render
    from tokenpools.config.summary import summarize

    if args.now is None:
        now_s = time.time()
    else:
        try:
            now_s = datetime.fromisoformat(args.now).timestamp()
        except ValueError:
            print(f"tokenpools validate: --now must be an RFC 3339 timestamp, got {args.now!r}", file=sys.stderr)
            return EXIT_INVALID
    console = make_console()
    failed = 0
    for path in args.files:
        try:
            config = load_config(path)
            settings = load_settings(config.settings_values, args.overrides)
        except ConfigError as exc:
            failed += 1
            for problem in exc.problems:
                print(problem, file=sys.stderr)  # a checker's report: FILE:LINE first, as editors read it
            continue
        if not args.quiet:
            render(console, config, summarize(config, settings.policy, now_s), settings.policy)
        console.print(f"{path}: valid ({_count(len(config.pools), 'pool')}, "
                      f"{_count(len(config.entitlements), 'entitlement')})", highlight=False)
    return EXIT_INVALID if failed else EXIT_OK


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


# ---------------------------------------------------------------- hash-key


def hash_key(args: argparse.Namespace) -> int:
    """One digest per non-empty line of stdin (prompted without echo on a terminal: keys stay out of history)."""
    from tokenpools.config.keys import hash_api_key

    if sys.stdin.isatty():
        import getpass

        keys = [getpass.getpass("API key: ")]
    else:
        keys = [line.strip() for line in sys.stdin]
    keys = [k for k in keys if k]
    if not keys:
        print("tokenpools hash-key: no key given on stdin", file=sys.stderr)
        return EXIT_INVALID
    for key in keys:
        print(hash_api_key(key))
    return EXIT_OK
