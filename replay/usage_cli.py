"""``tokenpools usage``: usage per tenant, entitlement, model and day or month, from the ledger or a log; and
``--reconcile``, which checks that the ledger's totals equal the completion events' (docs/budgets.md#usage).

Sources: without a log, the ``usage`` topic (the ledger); with ``LOG`` (or ``--log LOG``, the same), the completion
events of a recorded log, by UTC day or by the day of ``--tz ZONE``. ``--config FILE`` prices the usage at the
entitlements' budget weights (``--budget NAME`` picks the budget). ``--reconcile`` compares the events of ``--log``
with a ledger (``--ledger``: the log's own ``usage`` table by default, another log directory, or ``topic``), prints
every (tenant, entitlement, model, day) that differs, and exits 0 only when there is none (1 otherwise). The events
side leaves out, as the agents' ledger does, the completions beyond ``budgets.usage_retention_days``
(``usage.within_retention``), and says how many.
"""

from __future__ import annotations

import argparse
import sys
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

from tokenpools.errors import PermanentError

if TYPE_CHECKING:
    import polars as pl

    from tokenpools.config.loader import LoadedConfig
    from tokenpools.config.settings import Settings
    from tokenpools.core.budgets import Weights
    from tokenpools.replay.usage import Filters, Names

EXIT_EQUAL = 0
EXIT_DIFFERENT = 1
TOPIC = "topic"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("log_path", nargs="?", type=Path, default=None, metavar="LOG",
                        help="aggregate the completion events of this recorded log, as `tokenpools replay LOG` reads "
                             "it (default: read the usage topic)")
    parser.add_argument("--log", type=Path, default=None, metavar="LOG", help="the same as the positional LOG")
    parser.add_argument("--by", choices=["day", "month"], default="day",
                        help="group by day or month (default day), UTC unless --tz")
    parser.add_argument("--tz", default=None, metavar="ZONE",
                        help="days and months of this IANA time zone, e.g. Europe/Berlin, or `budget`: that of the "
                             "--config budgets (--budget NAME) (needs a LOG: the usage topic keeps UTC days); "
                             "--since and --until are its days too")
    parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                        help="add cost_units: the tokens priced at the weights of these entitlements' budgets "
                             "(the YAML the proxy reads)")
    parser.add_argument("--budget", default=None, metavar="NAME",
                        help="with --config: price at the weights of the budget of this name (needed when an "
                             "entitlement's budgets price differently)")
    parser.add_argument("--tenant", action="append", default=[], help="only this tenant (repeatable)")
    parser.add_argument("--entitlement", action="append", default=[], help="only this entitlement (repeatable)")
    parser.add_argument("--since", metavar="DATE", help="from this UTC day on, inclusive (YYYY-MM-DD, or YYYY-MM: "
                        "the month's first day)")
    parser.add_argument("--until", metavar="DATE", help="up to this UTC day, exclusive (YYYY-MM-DD or YYYY-MM)")
    parser.add_argument("--csv", type=Path, metavar="PATH", help="also write the table as CSV")
    parser.add_argument("--parquet", type=Path, metavar="PATH", help="also write the table as Parquet")
    parser.add_argument("--reconcile", action="store_true",
                        help="compare the events of --log with the ledger per (tenant, entitlement, model, day); "
                             "print every difference; exit 0 only when there is none")
    parser.add_argument("--ledger", default=None, metavar="DIR|topic",
                        help="the ledger --reconcile compares with: a log directory with the usage topic recorded, "
                             "or `topic` (default: the --log itself)")
    parser.add_argument("--timeout-s", type=float, default=60.0,
                        help="how long reading the usage topic to its end may take, seconds (default 60)")


def day_of(value: str | None, flag: str) -> str | None:
    """A ``--since``/``--until`` value as the YYYY-MM-DD it stands for (YYYY-MM: the month's first day)."""
    if value is None:
        return None
    text = f"{value}-01" if len(value) == 7 else value
    try:
        return date.fromisoformat(text).isoformat()
    except ValueError:
        raise PermanentError(f"{flag} expects YYYY-MM-DD or YYYY-MM, got {value!r}") from None


def log_of(args: argparse.Namespace) -> Path | None:
    """The log named by the positional LOG or ``--log`` (the same option; naming two different logs is an error)."""
    if args.log_path is not None and args.log is not None and args.log_path != args.log:
        raise PermanentError(f"two logs named: {args.log_path} and --log {args.log} (--log is the positional LOG; "
                             f"name one)")
    return args.log if args.log is not None else args.log_path


BUDGET_ZONE = "budget"


def time_zone_of(args: argparse.Namespace, log: Path | None, config: LoadedConfig | None) -> str:
    """The zone ``--tz`` names: an IANA name, or ``budget``: that of ``--config``'s budgets (``--budget NAME``)."""
    from tokenpools.core.budgets import zone
    from tokenpools.replay.usage import UTC, budget_zone

    if args.tz is None:
        return UTC
    name = args.tz
    if name == BUDGET_ZONE:
        if config is None:
            raise PermanentError("--tz budget needs --config FILE: the entitlements whose budget's time zone to use")
        try:
            name = budget_zone(config.entitlements, args.budget)
        except ValueError as exc:
            raise PermanentError(f"--tz budget: {exc} (--budget NAME, or --tz ZONE)") from None
    try:
        zone(name)
    except ValueError as exc:
        raise PermanentError(f"--tz: {exc}") from None
    if args.reconcile:
        raise PermanentError("--tz applies to the table, not to --reconcile (the ledger keeps UTC days)")
    if log is None and name != UTC:
        raise PermanentError(f"--tz {args.tz} needs a LOG: the usage topic keeps UTC days, and its totals cannot be "
                             f"split into another zone's days")
    return name


def config_of(args: argparse.Namespace) -> LoadedConfig | None:
    from tokenpools.config import load_config

    if args.config is None:
        if args.budget is not None:
            raise PermanentError("--budget needs --config FILE: the entitlements whose budgets price the usage")
        return None
    if args.reconcile:
        raise PermanentError("--config applies to the table, not to --reconcile (which compares tokens, not prices)")
    return load_config(args.config)


def priced_config(args: argparse.Namespace, config: LoadedConfig | None) -> tuple[dict[str, Weights] | None, Names]:
    """From ``--config`` (and ``--budget``): the weights each entitlement's usage is priced at (None: no pricing
    asked for), and the tenants and models it names."""
    from tokenpools.replay.usage import Names, budget_weights

    if config is None:
        return None, Names()
    names = Names(tenants={name: e.tenant for name, e in config.entitlements.items() if e.tenant},
                  models={name: p.model for name, p in config.pools.items() if p.model})
    try:
        return budget_weights(config.entitlements, args.budget), names
    except ValueError as exc:
        raise PermanentError(f"--config {args.config}: {exc}"
                             + ("" if args.budget is not None else " (--budget NAME)")) from None


def run(args: argparse.Namespace) -> int:
    from tokenpools.config import load_settings
    from tokenpools.replay import usage, usage_sources

    settings = load_settings(None, args.overrides)  # checked whatever the source: a bad --set is never ignored
    args.log = log_of(args)
    config = config_of(args)
    time_zone = time_zone_of(args, args.log, config)
    weights, names = priced_config(args, config)
    if args.timeout_s <= 0:
        raise PermanentError(f"--timeout-s must be positive, got {args.timeout_s}")
    filters = usage.Filters(tenants=tuple(args.tenant), entitlements=tuple(args.entitlement),
                            since_day=day_of(args.since, "--since"), until_day=day_of(args.until, "--until"))
    if filters.since_day is not None and filters.until_day is not None and filters.since_day >= filters.until_day:
        raise PermanentError(f"--since {args.since} is not before --until {args.until} (--until is exclusive): "
                             f"no day is in that range")
    for flag, path in (("--csv", args.csv), ("--parquet", args.parquet)):
        if path is not None and not path.parent.is_dir():
            raise PermanentError(f"{flag} {path}: no such directory {path.parent}")
    if args.reconcile:
        if args.log is None:
            raise PermanentError("--reconcile needs --log DIR: the completion events to compare the ledger with")
        return reconcile(args, filters, settings)
    if args.ledger is not None:
        raise PermanentError("--ledger applies to --reconcile only")
    if args.log is not None:
        rows, source = usage_sources.log_events(args.log, time_zone, names), f"the completion events of {args.log}"
    else:
        rows, source = _topic_rows(args, settings), "the usage topic"
    check_names(rows, filters, source)
    warning = usage_sources.stand_in_warning(args.log, names) if args.log is not None else None
    if warning is not None:  # the table is right, but its labels are not the ones asked for: say so, once
        print(warning, file=sys.stderr)
    table = usage.aggregate(rows, usage.By(args.by), filters)
    zone = "UTC" if time_zone == usage.UTC else time_zone
    if table.is_empty() and not rows.is_empty():  # every row left out: say by what, not only an empty table
        print(nothing_selected(args, rows, source, zone), file=sys.stderr)
    if weights == {}:  # --config for the names alone, or a file without budgets: no column of blanks
        print(f"warning: no {usage.COST}: no entitlement in {args.config} has a budget"
              + (f" {args.budget}" if args.budget else ""), file=sys.stderr)
    elif weights is not None:
        table = usage.price(table, weights)
        unpriced = sorted(set(table.filter(table[usage.COST].is_null())["entitlement"].to_list()))
        if unpriced:
            print(f"warning: no {usage.COST} for {', '.join(unpriced)}: no such entitlement in {args.config}, or "
                  f"it has no budget" + (f" {args.budget}" if args.budget else ""), file=sys.stderr)
    if args.csv is not None:
        table.write_csv(args.csv)
    if args.parquet is not None:
        table.write_parquet(args.parquet)
    _print_table(table, f"usage by {args.by} ({zone}), from {source}")
    return EXIT_EQUAL


def nothing_selected(args: argparse.Namespace, rows: pl.DataFrame, source: str, zone: str) -> str:
    """The warning for a selection that leaves out every row (names that exist, but not together; days the
    source has none of): which options selected nothing, and the days the source does have."""
    given = [f"{flag} {value}" for flag, values in (("--tenant", args.tenant), ("--entitlement", args.entitlement))
             for value in values]
    given += [f"{flag} {value}" for flag, value in (("--since", args.since), ("--until", args.until)) if value]
    days = rows["day"]
    return (f"warning: no usage in {source} matches {' '.join(given)}: the table is empty (its days run from "
            f"{days.min()} to {days.max()}, {zone})")


def check_names(rows: pl.DataFrame, filters: Filters, source: str) -> None:
    """A --tenant or --entitlement that ``rows`` never name is an error naming the ones they do (not an empty
    table, which reads as "no usage")."""
    for flag, column, wanted in (("--tenant", "tenant", filters.tenants),
                                 ("--entitlement", "entitlement", filters.entitlements)):
        known = sorted(set(rows[column].to_list()))
        unknown = [name for name in wanted if name not in known]
        if unknown:
            raise PermanentError(f"{flag} {', '.join(unknown)}: no such {column} in {source} "
                                 f"(it has: {', '.join(known) or 'none'})")


def reconcile(args: argparse.Namespace, filters: Filters, settings: Settings) -> int:
    from tokenpools.replay import usage, usage_sources

    retention_days = settings.budgets.usage_retention_days
    events, beyond = usage_sources.log_ledger_events(args.log, retention_days)
    check_names(events, filters, f"the completion events of {args.log}")
    if beyond:
        print(f"left out: {beyond} completion events beyond the ledger's retention (budgets.usage_retention_days "
              f"{retention_days}: older than that many UTC days before their entitlement's newest completion so far, "
              f"counted nowhere and dead-lettered by the agents)")
    if args.ledger == TOPIC:
        ledger, name = _topic_rows(args, settings), "the usage topic"
    else:
        where = args.log if args.ledger is None else Path(args.ledger)
        ledger, name = usage_sources.log_ledger(where), f"the usage records of {where}"
    differences = usage.reconcile(events, ledger, filters)
    keys = usage.aggregate(events, usage.By.DAY, filters).height
    if differences.is_empty():
        print(f"reconciled: the completion events of {args.log} and {name} agree on all {keys} "
              f"(tenant, entitlement, model, day) totals")
        return EXIT_EQUAL
    for line in usage.describe(differences):
        print(line)
    print(f"not reconciled: {differences.height} (tenant, entitlement, model, day) totals differ between the "
          f"completion events of {args.log} and {name}", file=sys.stderr)
    return EXIT_DIFFERENT


def _topic_rows(args: argparse.Namespace, settings: Settings) -> pl.DataFrame:
    import asyncio

    from tokenpools.replay import usage_sources
    from tokenpools.runtime.kafka import KafkaClients

    kafka = KafkaClients(settings.kafka)

    async def read() -> list:
        await kafka.require_reachable("usage")
        return await usage_sources.read_topic(kafka, args.timeout_s)

    return usage_sources.records_rows(asyncio.run(read()))


def _print_table(table: pl.DataFrame, title: str) -> None:
    from tokenpools.replay.usage import COUNTS, NO_LABELS
    from tokenpools.replay.usage_table import render
    from tokenpools.tables import console_for

    show_labels = table.filter(table["labels"] != NO_LABELS).height > 0
    console = console_for()  # COLUMNS, else the terminal's width, else (a pipe) wide
    console.print(render(table, COUNTS, show_labels, title, console.width))
