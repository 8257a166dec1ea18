"""The log format: schemas follow the topic contract, hour partitions, deterministic bytes, clear schema errors."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tokenpools.replay import trace
from tokenpools.topics import RequestDecided
from tokenpools_dev import builders

HOUR_MS = 3_600_000
T0 = 1_772_150_400_000


def _decided(i: int, t_ms: int) -> RequestDecided:
    return builders.decided(f"r{i}", t_ms, pool="p", entitlement="a", proxy_id="x", prompt_tokens_est=10,
                            max_tokens=20, cost_tokens=30, kv_bytes=30, priority=93.8)


def test_schemas_follow_the_records() -> None:
    schema = trace.SCHEMAS[trace.REQUESTS]
    assert schema["t_ms"] == pl.Int64() and schema["priority"] == pl.Float64() and schema["outcome"] == pl.String()
    assert "record_type" not in schema and schema["kafka_offset"] == pl.Int64()
    assert trace.SCHEMAS["limit_update"]["entitlements"] == pl.String()  # nested values are JSON text


def test_rows_are_partitioned_by_hour_and_read_back_in_order(tmp_path: Path) -> None:
    records = [_decided(i, T0 + HOUR_MS - 2000 + i * 1000) for i in range(4)]  # two before, two after the hour
    df = trace.frame(trace.REQUESTS, [trace.record_row(r, 0, 10 + i) for i, r in enumerate(records)])
    paths = trace.write_partitioned(tmp_path, trace.REQUESTS, df, partition=0, first_offset=-1)
    assert [p.parent.name for p in paths] == ["hour=2026-02-27T00", "hour=2026-02-27T01"]
    assert [p.name for p in paths] == ["part-p0-o000000000010.parquet", "part-p0-o000000000012.parquet"]
    back = trace.read_table(tmp_path, trace.REQUESTS)
    assert back["request_id"].to_list() == ["r0", "r1", "r2", "r3"]
    assert trace.max_offsets(tmp_path, trace.REQUESTS) == {0: 13}


def test_same_rows_give_the_same_bytes(tmp_path: Path) -> None:
    df = trace.frame(trace.REQUESTS, [trace.record_row(_decided(i, T0 + i), 0, i) for i in range(50)])
    trace.write_parquet(df, tmp_path / "a.parquet")
    trace.write_parquet(df, tmp_path / "b.parquet")
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()


def test_a_malformed_file_is_rejected_with_the_file_and_the_columns(tmp_path: Path) -> None:
    folder = tmp_path / trace.REQUESTS / "hour=2026-02-27T00"
    folder.mkdir(parents=True)
    bad = pl.DataFrame({"request_id": ["r1"], "t_ms": ["not a number"], "outcome": ["admitted"]})
    bad.write_parquet(folder / "part-p0-o000000000000.parquet")
    with pytest.raises(trace.TraceSchemaError) as info:
        trace.read_table(tmp_path, trace.REQUESTS)
    message = str(info.value)
    assert "part-p0-o000000000000.parquet" in message
    assert "column 't_ms' has type String, expected Int64" in message
    assert "column 'priority' is missing (expected Float64)" in message


def test_a_file_that_is_not_parquet_is_rejected(tmp_path: Path) -> None:
    folder = tmp_path / trace.REQUESTS / "hour=2026-02-27T00"
    folder.mkdir(parents=True)
    (folder / "part-p0-o000000000000.parquet").write_text("hello")
    with pytest.raises(trace.TraceSchemaError, match="not a readable Parquet file"):
        trace.read_table(tmp_path, trace.REQUESTS)


def test_a_file_written_before_a_defaulted_field_existed_reads_it_as_its_default(tmp_path: Path) -> None:
    """The topic contract adds fields with a default (retry_after_ms): an older log still reads, the column as its
    default; a required column stays required, and writing still needs every column."""
    df = trace.frame(trace.REQUESTS, [trace.record_row(_decided(i, T0 + i), 0, i) for i in range(3)])
    older = df.drop("retry_after_ms")
    folder = tmp_path / trace.REQUESTS / "hour=2026-02-27T00"
    folder.mkdir(parents=True)
    older.write_parquet(folder / "part-p0-o000000000000.parquet")
    back = trace.read_table(tmp_path, trace.REQUESTS)
    assert back.schema == trace.SCHEMAS[trace.REQUESTS]
    assert back["retry_after_ms"].to_list() == [0, 0, 0] and back["request_id"].to_list() == ["r0", "r1", "r2"]
    with pytest.raises(trace.TraceSchemaError, match="retry_after_ms"):
        trace.write_partitioned(tmp_path / "w", trace.REQUESTS, older, partition=0, first_offset=-1)
    older.drop("priority").write_parquet(folder / "part-p0-o000000000000.parquet")
    with pytest.raises(trace.TraceSchemaError, match="'priority' is missing"):
        trace.read_table(tmp_path, trace.REQUESTS)


def test_a_file_written_before_would_refuse_existed_reads_it_as_none(tmp_path: Path) -> None:
    """``would_refuse`` (docs/shadow.md) is absent from the wire while unset: a record without it is a row with
    None, and a log written before the column existed reads as None too."""
    df = trace.frame(trace.REQUESTS, [trace.record_row(_decided(i, T0 + i), 0, i) for i in range(3)])
    assert df["would_refuse"].to_list() == [None, None, None]
    folder = tmp_path / trace.REQUESTS / "hour=2026-02-27T00"
    folder.mkdir(parents=True)
    df.drop("would_refuse").write_parquet(folder / "part-p0-o000000000000.parquet")
    back = trace.read_table(tmp_path, trace.REQUESTS)
    assert back.schema == trace.SCHEMAS[trace.REQUESTS] and back["would_refuse"].to_list() == [None, None, None]
