"""``tokenpools usage``: usage per tenant, entitlement, model and day or month, from the ledger or a log; and
``--reconcile``, which checks that the ledger's totals equal the completion events' (docs/budgets.md#usage).

Sources: without ``--log``, the ``usage`` topic (the ledger); with ``--log DIR``, the completion events of a
recorded log. ``--reconcile`` compares the events of ``--log`` with a ledger (``--ledger``: the log's own ``usage``
table by default, another log directory, or ``topic``), prints every (tenant, entitlement, model, day) that
differs, and exits 0 only when there is none (1 otherwise). The events side leaves out, as the agents' ledger does,
the completions beyond ``budgets.usage_retention_days`` (``usage.within_retention``), and says how many.
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

    from tokenpools.config.settings import Settings
    from tokenpools.replay.usage import Filters

EXIT_EQUAL = 0
EXIT_DIFFERENT = 1
TOPIC = "topic"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log", type=Path, default=None, metavar="DIR",
                        help="aggregate the completion events of this recorded log (default: read the usage topic)")
    parser.add_argument("--by", choices=["day", "month"], default="day", help="group by UTC day or month (default day)")
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


def run(args: argparse.Namespace) -> int:
    from tokenpools.config import load_settings
    from tokenpools.replay import usage, usage_sources

    settings = load_settings(None, args.overrides)  # checked whatever the source: a bad --set is never ignored
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
    rows = usage_sources.log_events(args.log) if args.log is not None else _topic_rows(args, settings)
    source = f"the completion events of {args.log}" if args.log is not None else "the usage topic"
    check_names(rows, filters, source)
    warning = usage_sources.stand_in_warning(args.log) if args.log is not None else None
    if warning is not None:  # the table is right, but its labels are not the ones asked for: say so, once
        print(warning, file=sys.stderr)
    table = usage.aggregate(rows, usage.By(args.by), filters)
    if args.csv is not None:
        table.write_csv(args.csv)
    if args.parquet is not None:
        table.write_parquet(args.parquet)
    _print_table(table, f"usage by {args.by}, from {source}")
    return EXIT_EQUAL


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
    from rich.table import Table

    from tokenpools.config.render import make_console
    from tokenpools.replay.usage import COUNTS, NO_LABELS

    show_labels = table.filter(table["labels"] != NO_LABELS).height > 0
    out = Table(title=title, title_justify="left")
    key = [c for c in table.columns if c not in COUNTS and c != "labels"]
    for name in key:
        out.add_column(name)
    for name in COUNTS:
        out.add_column(name.replace("_", " "), justify="right")
    if show_labels:
        out.add_column("labels")
    for row in table.iter_rows(named=True):
        cells = [str(row[c]) for c in key] + [f"{row[c]:,}" for c in COUNTS]
        out.add_row(*cells, *([row["labels"]] if show_labels else []))
    if table.height:
        out.add_section()
        out.add_row("total", *[""] * (len(key) - 1), *[f"{table[c].sum():,}" for c in COUNTS],
                    *([""] if show_labels else []))
    make_console().print(out)
