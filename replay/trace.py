"""The recorded log on disk: one Parquet table per topic, partitioned by hour, schema-checked on read.

Layout of a log directory (what ``tokenpools record`` writes and ``tokenpools replay`` reads)::

    LOG/<table>/hour=YYYY-MM-DDTHH/part-p<partition>-o<first offset>.parquet   (part-local-o… when not from Kafka)

``<table>`` is the record type (``request_decided``, ``request_completed``, ``backend_metrics``, …); the hour is
the UTC hour of the record's event time ``t_ms``. Columns are the record's fields, derived from the models in
``tokenpools.topics`` (so the Parquet schema follows the topic contract): scalars become typed columns, nested
values (tuples, dicts, sub-records) a JSON text column. Every file also carries ``kafka_partition`` and
``kafka_offset`` (-1 when the rows did not come from Kafka, e.g. a replayer's own output), which is what makes
re-recording idempotent and reading deterministic (rows sort by event time, then partition, then offset).

Reading checks every file's schema against the contract and fails with the file, the column and what was
expected — never a silent cast. Extra columns are allowed (a newer writer may add some); a missing column is
allowed only for a scalar field with a default (a file written before the field was added to the record, as
the topic contract adds fields), and reads as that default.
"""

from __future__ import annotations

import datetime as _dt
import enum
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
import polars as pl
from pydantic import BaseModel

from tokenpools.errors import PermanentError
from tokenpools.topics.records import RECORD_TYPES, Record

META_COLUMNS: dict[str, pl.DataType] = {"kafka_partition": pl.Int32(), "kafka_offset": pl.Int64()}
REQUESTS = "request_decided"
COMPLETIONS = "request_completed"


class TraceSchemaError(PermanentError):
    """A Parquet file does not have the columns or types the log format requires."""


def _scalar_dtype(tp: Any) -> pl.DataType | None:
    """The polars type of a scalar annotation, or None if the value must be stored as JSON text."""
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) is typing.Literal:
        values = typing.get_args(tp)
        return _scalar_dtype(type(values[0]))
    if isinstance(tp, type):
        if issubclass(tp, enum.Enum) or issubclass(tp, str):
            return pl.String()
        if issubclass(tp, bool):
            return pl.Boolean()
        if issubclass(tp, int):
            return pl.Int64()
        if issubclass(tp, float):
            return pl.Float64()
    return None


def _strip_optional(tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return tp


def schema_of(record_type: type[Record]) -> dict[str, pl.DataType]:
    """The Parquet columns of one record type, in field order (``record_type`` itself is the table name)."""
    schema: dict[str, pl.DataType] = {}
    for name, field in record_type.model_fields.items():
        if name == "record_type":
            continue
        dtype = _scalar_dtype(_strip_optional(field.annotation))
        schema[name] = dtype if dtype is not None else pl.String()
    schema.update(META_COLUMNS)
    return schema


def _json_fields(record_type: type[Record]) -> frozenset[str]:
    return frozenset(
        name for name, field in record_type.model_fields.items()
        if name != "record_type" and _scalar_dtype(_strip_optional(field.annotation)) is None
    )


def _defaults(record_type: type[Record]) -> dict[str, object]:
    """The scalar columns an older file may lack, with the value they read as: fields with a non-None default, and
    fields the wire omits while unset (``exclude_if``: absent means None, e.g. ``RequestDecided.would_refuse``)."""
    return {
        name: field.default for name, field in record_type.model_fields.items()
        if name != "record_type" and not field.is_required()
        and (field.default is not None or field.exclude_if is not None)
        and _scalar_dtype(_strip_optional(field.annotation)) is not None
    }


TABLES: dict[str, type[Record]] = dict(RECORD_TYPES)
SCHEMAS: dict[str, dict[str, pl.DataType]] = {name: schema_of(cls) for name, cls in TABLES.items()}
_JSON: dict[str, frozenset[str]] = {name: _json_fields(cls) for name, cls in TABLES.items()}
_DEFAULTS: dict[str, dict[str, object]] = {name: _defaults(cls) for name, cls in TABLES.items()}


def record_row(record: Record, partition: int = -1, offset: int = -1) -> dict[str, object]:
    """One record as a row of its table (enums as their values, nested values as JSON text)."""
    table = record.record_type
    data = record.model_dump(mode="json")
    row: dict[str, object] = {}
    json_fields = _JSON[table]
    for name in SCHEMAS[table]:
        if name in META_COLUMNS:
            continue
        value = data.get(name)  # (None for a field the wire omits while unset)
        row[name] = orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode() if name in json_fields else value
    row["kafka_partition"] = partition
    row["kafka_offset"] = offset
    return row


def frame(table: str, rows: Iterable[Mapping[str, object]] | Mapping[str, list[object]]) -> pl.DataFrame:
    """Rows (a list of dicts or a dict of columns) as a DataFrame with exactly the table's schema."""
    schema = SCHEMAS[table]
    if isinstance(rows, Mapping):
        columns = dict(rows)
        n = len(next(iter(columns.values()))) if columns else 0
        for meta in META_COLUMNS:
            columns.setdefault(meta, [-1] * n)
        return pl.DataFrame({name: columns[name] for name in schema}, schema=schema)
    return pl.DataFrame(list(rows), schema=schema, orient="row")


def hour_of(t_ms: int) -> str:
    """The partition label of an event time: ``hour=2026-12-02T14`` (UTC)."""
    start = _dt.datetime.fromtimestamp(t_ms // 3_600_000 * 3600, tz=_dt.UTC)
    return f"hour={start:%Y-%m-%dT%H}"


def write_partitioned(root: Path, table: str, df: pl.DataFrame, partition: int, first_offset: int) -> list[Path]:
    """Write rows into their hour partitions; each file is written to a temporary name and renamed (atomic)."""
    check_frame(table, df, f"{table} rows")
    if df.is_empty():
        return []
    hours = pl.from_epoch(pl.col("t_ms") // 3_600_000 * 3600, time_unit="s").dt.strftime("hour=%Y-%m-%dT%H")
    df = df.with_columns(hours.alias("__hour"))
    written: list[Path] = []
    for (hour,), part in sorted(df.partition_by("__hour", as_dict=True, maintain_order=True).items()):
        folder = root / table / str(hour)
        folder.mkdir(parents=True, exist_ok=True)
        first = int(part["kafka_offset"].min()) if first_offset < 0 else first_offset
        source = f"p{partition}" if partition >= 0 else "local"
        path = folder / f"part-{source}-o{max(first, 0):012d}.parquet"
        write_parquet(part.drop("__hour"), path)
        written.append(path)
    return written


def write_parquet(df: pl.DataFrame, path: Path) -> None:
    """Deterministic Parquet: same frame, same bytes (no statistics that depend on the writer's run)."""
    tmp = path.with_name(path.name + ".tmp")
    df.write_parquet(tmp, compression="zstd", statistics=False)
    tmp.replace(path)


def check_frame(table: str, df: pl.DataFrame | Mapping[str, pl.DataType], where: str,
                older: bool = False) -> None:
    """Raise TraceSchemaError naming ``where`` and every missing or mistyped column. ``older``: a file on disk,
    which may lack the columns of fields with a default (module doc)."""
    expected = SCHEMAS.get(table)
    if expected is None:
        raise TraceSchemaError(f"{where}: unknown table {table!r}; known tables: {sorted(SCHEMAS)}")
    found = df.schema if isinstance(df, pl.DataFrame) else df
    optional = _DEFAULTS[table] if older else {}
    problems = []
    for name, dtype in expected.items():
        if name not in found:
            if name in optional:
                continue
            problems.append(f"column {name!r} is missing (expected {dtype})")
        elif found[name] != dtype:
            problems.append(f"column {name!r} has type {found[name]}, expected {dtype}")
    if problems:
        raise TraceSchemaError(f"{where}: not a {table} table of the tokenpools log format: " + "; ".join(problems))


def table_files(root: Path, table: str) -> list[Path]:
    return sorted((root / table).glob("hour=*/*.parquet"))


def log_dir(root: Path) -> Path:
    """``root``, when it is a log directory; else a PermanentError saying what it is (a folder of logs: which)."""
    if not root.is_dir():
        raise PermanentError(f"{root}: no such log directory (write one with `tokenpools record --out {root}`)")
    if not is_log(root):  # an empty folder is an empty log (a recorder that has written nothing yet), but the
        inside = logs_under(root)  # folder of a demo's logs is not one
        if inside:
            raise PermanentError(f"{root}: not a log directory, but it holds the logs {', '.join(inside)}: name one")
    return root


def logs_under(root: Path, depth: int = 3) -> list[str]:
    """The logs in the folders below ``root``, up to ``depth`` levels down, as paths relative to it."""
    found = {path for level in range(1, depth + 1) for path in root.glob("/".join(["*"] * level))
             if path.is_dir() and is_log(path)}
    return sorted(str(path.relative_to(root)) for path in found if not any(p in found for p in path.parents))


def is_log(folder: Path) -> bool:
    """Whether ``folder`` holds a table of a recorded log (``TABLE/hour=*/``)."""
    return any(next((folder / table).glob("hour=*"), None) is not None for table in SCHEMAS)


def read_table(root: Path, table: str) -> pl.DataFrame:
    """Every file of one table, schema-checked, in a deterministic order (t_ms, partition, offset)."""
    schema = SCHEMAS[table]
    frames = []
    for path in table_files(root, table):
        try:
            found = pl.read_parquet_schema(path)
        except Exception as exc:  # polars raises several types for a file that is not Parquet
            raise TraceSchemaError(f"{path}: not a readable Parquet file ({exc})") from None
        check_frame(table, found, str(path), older=True)
        df = pl.read_parquet(path, columns=[name for name in schema if name in found])
        missing = [pl.lit(value, dtype=schema[name]).alias(name) for name, value in _DEFAULTS[table].items()
                   if name not in found]
        frames.append(df.with_columns(missing).select(list(schema)) if missing else df)
    if not frames:
        return pl.DataFrame(schema=schema)
    return pl.concat(frames, how="vertical").sort(["t_ms", "kafka_partition", "kafka_offset"], maintain_order=True)


def max_offsets(root: Path, table: str) -> dict[int, int]:
    """The highest Kafka offset already on disk per partition (what a resumed recorder must skip past)."""
    result: dict[int, int] = {}
    for path in table_files(root, table):
        df = pl.read_parquet(path, columns=["kafka_partition", "kafka_offset"])
        if df.is_empty():
            continue
        for partition, offset in df.group_by("kafka_partition").agg(pl.col("kafka_offset").max()).iter_rows():
            result[int(partition)] = max(result.get(int(partition), -1), int(offset))
    return result


def row_model(table: str) -> type[BaseModel]:
    return TABLES[table]
