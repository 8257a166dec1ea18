#!/usr/bin/env python3
"""Follow the tokenpools effective-limits topic and print a live table of every entitlement's fleet-wide limits.

A standalone example for systems outside tokenpools: it needs only ``aiokafka`` (and ``jsonschema``, if installed,
to validate each record against the published JSON Schema, ``topics/schemas/effective_limit.v1.json``). It does not
import tokenpools.

The topic is compacted and keyed ``<pool>/<entitlement>``: reading it from the beginning gives the latest record of
every entitlement, then every new one (one per entitlement per tick). A null value (tombstone) means the
entitlement left its pool; the table drops it. Records of a ``schema_version`` this reader does not know are
skipped and counted, never guessed at.

    python examples/effective_limits.py --bootstrap 127.0.0.1:9092
    python examples/effective_limits.py --bootstrap HOST:PORT --max-records 100 --timeout-s 30   # then exit

On a terminal the table is redrawn after every batch of records; otherwise (a pipe, a file) it is printed once, at
exit. The last line is a summary: records read, tombstones, invalid and unknown-version records.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_TOPIC = "tokenpools.effective-limits"
DEFAULT_SCHEMA = Path(__file__).resolve().parent.parent / "topics" / "schemas" / "effective_limit.v1.json"
KNOWN_SCHEMA_VERSION = 1
GIB = 2**30
COLUMNS = ("pool", "entitlement", "class", "w_e", "d_e", "b_e", "limit conc", "limit tok/s", "limit KV GiB",
           "in flight", "used tok/s", "contended", "version")


def load_validator(path: Path | None) -> Any:
    """A JSON Schema validator for the records, or None when jsonschema is not installed or no schema is given."""
    if path is None:
        return None
    try:
        import jsonschema
    except ImportError:
        print("jsonschema not installed: records are not validated", file=sys.stderr)
        return None
    schema = json.loads(path.read_text())
    return jsonschema.Draft202012Validator(schema)


class Table:
    """The latest record per key, as a reader of the compacted topic keeps it, with counts of what was read."""

    def __init__(self, validator: Any) -> None:
        self.validator = validator
        self.rows: dict[str, dict[str, Any]] = {}
        self.read = self.tombstones = self.invalid = self.unknown_version = 0

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        self.read += 1
        name = key.decode("utf-8", "replace") if key is not None else ""
        if value is None:
            self.tombstones += 1
            self.rows.pop(name, None)
            return
        try:
            record = json.loads(value)
        except ValueError:
            self.invalid += 1
            print(f"{name}: not JSON", file=sys.stderr)
            return
        if not isinstance(record, dict) or record.get("schema_version") != KNOWN_SCHEMA_VERSION:
            self.unknown_version += 1
            return
        if self.validator is not None:
            errors = sorted(self.validator.iter_errors(record), key=lambda e: list(e.path))
            if errors:
                self.invalid += 1
                print(f"{name}: invalid: {errors[0].message}", file=sys.stderr)
                return
        known = self.rows.get(name)
        if known is None or known["version"] <= record["version"]:
            self.rows[name] = record

    def render(self) -> str:
        now_ms = time.time() * 1000
        lines = [_row(COLUMNS)]
        for _, r in sorted(self.rows.items()):
            limit, measured = r["limit"], r.get("measured") or {}
            age_s = (now_ms - r["window_end_ms"]) / 1000
            lines.append(_row((
                r["pool"], r["entitlement"], r["service_class"], f"{r['priority']:.3g}", f"{r['debt']:+.2f}",
                f"{r['burst']:.2f}", str(limit["concurrency"]), f"{limit['tokens_per_s']:.1f}",
                f"{limit['kv_bytes'] / GIB:.2f}", str(measured.get("in_flight_at_end", "-")),
                f"{measured['tokens_per_s']:.1f}" if measured else "-", "yes" if r["contended"] else "no",
                f"{r['version']} ({age_s:.0f} s ago)")))
        return "\n".join(lines)

    def summary(self) -> str:
        return (f"{len(self.rows)} entitlements; read {self.read} records, {self.tombstones} tombstones, "
                f"{self.invalid} invalid, {self.unknown_version} of an unknown schema_version")


def _row(cells: tuple[str, ...]) -> str:
    widths = (14, 16, 11, 7, 6, 6, 10, 11, 12, 9, 10, 9, 0)
    return " ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()


async def follow(args: argparse.Namespace) -> Table:
    from aiokafka import AIOKafkaConsumer

    table = Table(load_validator(None if args.no_validate else args.schema))
    consumer = AIOKafkaConsumer(args.topic, bootstrap_servers=args.bootstrap, group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False, client_id="effective-limits")
    live = sys.stdout.isatty()
    deadline = time.monotonic() + args.timeout_s if args.timeout_s else None
    await consumer.start()
    try:
        while args.max_records is None or table.read < args.max_records:
            if deadline is not None and time.monotonic() >= deadline:
                break
            batches = await consumer.getmany(timeout_ms=200)
            for messages in batches.values():
                for message in messages:
                    table.apply(message.key, message.value)
            if batches and live:
                print("\x1b[H\x1b[J" + table.render() + "\n" + table.summary(), flush=True)
    finally:
        await consumer.stop()
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers, e.g. 127.0.0.1:9092")
    parser.add_argument("--topic", default=DEFAULT_TOPIC, help=f"the topic (prefix + effective-limits; default "
                        f"{DEFAULT_TOPIC})")
    parser.add_argument("--schema", type=Path, default=DEFAULT_SCHEMA, help="the record's JSON Schema file")
    parser.add_argument("--no-validate", action="store_true", help="do not validate records against the schema")
    parser.add_argument("--max-records", type=int, default=None, metavar="N", help="exit after N records")
    parser.add_argument("--timeout-s", type=float, default=None, metavar="S", help="exit after S seconds")
    args = parser.parse_args(argv)
    try:
        table = asyncio.run(follow(args))
    except KeyboardInterrupt:
        return 0
    if not sys.stdout.isatty():
        print(table.render())
    print(table.summary())
    return 1 if table.invalid else 0


if __name__ == "__main__":
    sys.exit(main())
