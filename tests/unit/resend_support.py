"""Events with the identity a proxy gives them (``core.resends``), and copies of them as a spool re-send leaves them.

``numbered`` numbers decisions (with an entitlement) and completions as a proxy process does: per (entitlement,
proxy, kind) 1, 2, 3, ... in the order given, under ``PROXY_START_MS``. ``resent`` inserts copies of some of them
later in the sequence (the broker holds the re-send at a new offset, after the original), with a Kafka timestamp
at or after the original's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from tokenpools.topics.records import Record, RequestCompleted, RequestDecided

PROXY_START_MS = 1_699_999_000_000

R = TypeVar("R", bound=Record)


def numbered(events: Sequence[tuple[R, int | None]], start_ms: int = PROXY_START_MS) -> list[tuple[R, int | None]]:
    counters: dict[tuple[str, str, str], int] = {}
    out: list[tuple[R, int | None]] = []
    for record, ts in events:
        if isinstance(record, (RequestDecided, RequestCompleted)) and record.entitlement is not None:
            key = (record.entitlement, record.proxy_id, record.record_type)
            counters[key] = counters.get(key, 0) + 1
            record = record.model_copy(update={"proxy_start_ms": start_ms, "sequence": counters[key]})
        out.append((record, ts))
    return out


def resent(events: Sequence[tuple[R, int | None]], copies: Sequence[tuple[int, int, int]]
           ) -> tuple[list[tuple[R, int | None]], list[bool]]:
    """``events`` with copies: ``(i, after, delay_ms)`` puts a copy of event ``i`` after event ``i + after`` (at the
    end if beyond it), ``delay_ms`` after the original's Kafka timestamp (None stays None). Also, per item of the
    result, whether it is a copy."""
    inserted: dict[int, list[tuple[R, int | None]]] = {}
    for i, after, delay_ms in copies:
        if not events:
            break
        i %= len(events)
        record, ts = events[i]
        inserted.setdefault(min(i + after, len(events) - 1), []).append((record, None if ts is None else ts + delay_ms))
    out: list[tuple[R, int | None]] = []
    copy: list[bool] = []
    for k, item in enumerate(events):
        out.append(item)
        copy.append(False)
        for again in inserted.get(k, []):
            out.append(again)
            copy.append(True)
    return out, copy
