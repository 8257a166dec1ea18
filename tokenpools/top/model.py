"""What ``tokenpools top`` shows, from the records it reads: records in, rows out (pure: no Kafka, no clock).

Three compacted topics feed it, each read from the beginning, each keeping the newest record per key:

- **limits** (``LimitUpdate``, key ``pool`` or ``pool#page``): per pool, every entitlement's fleet-wide limit
  (tokens/s, slots), priority and debt. A large pool's update comes as pages of one version; they are put together
  with ``topics.limits.PageAssembler``, as the proxies do, and a version is shown only once every page is held. An
  update not newer than the one shown is ignored. This topic decides which pools and entitlements there are.
- **effective-limits** (``EffectiveLimit``, key ``<pool>/<entitlement>``): the entitlement's service class and what
  the agents measured in the tick's window (requests in flight at its end, refusals in it).
- **usage** (``UsageRecord``, key ``<tenant>/<entitlement>/<model>/<day>``): today's tokens and requests, summed
  over models (the day is the caller's, UTC; cumulative records, the newest per key is the day so far).

A null value (tombstone) removes its key. A record that does not decode is counted, never shown and never fatal.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import TypeVar

from tokenpools.topics.codec import DecodeError, decode
from tokenpools.topics.limits import PageAssembler, pool_of_key
from tokenpools.topics.records import EffectiveLimit, LimitUpdate, Record, UsageRecord

R = TypeVar("R", bound=Record)


class Applied(StrEnum):
    """What one record did to the view."""

    SHOWN = "shown"  # newer than what was held: the view changed
    PENDING = "pending"  # a page of a version whose other pages have not come yet
    STALE = "stale"  # not newer than what is shown (a compacted topic's older copy, or a re-delivery)
    REMOVED = "removed"  # a tombstone: its key left
    INVALID = "invalid"  # did not decode (not JSON, unknown schema_version, wrong shape)


@dataclass(frozen=True, slots=True)
class PoolRow:
    """One pool's update as shown: the version in force and the pool's capacity."""

    pool: str
    version: int
    t_ms: int  # the tick's time
    contended: bool
    capacity_tokens_per_s: float
    capacity_slots: int
    entitlements: int


@dataclass(frozen=True, slots=True)
class Row:
    """One entitlement of one pool. ``None``: not known yet (no effective-limit record; no measured window)."""

    pool: str
    entitlement: str
    service_class: str | None
    priority: float
    debt: float
    limit_tokens_per_s: float
    limit_slots: int
    in_flight: int | None  # at the end of the last measured window
    refused: int | None  # refusals in the last measured window
    today_tokens: int  # prompt + completion tokens today (UTC), over every model
    today_requests: int


def utc_day(now_ms: int) -> str:
    """The UTC date of ``now_ms`` as the usage topic spells days (YYYY-MM-DD)."""
    return datetime.fromtimestamp(now_ms / 1000, tz=UTC).date().isoformat()


class TopModel:
    """The newest record of every key of the three topics, and counts of what each record did."""

    def __init__(self) -> None:
        self._limits: dict[str, LimitUpdate] = {}  # pool → newest whole update
        self._pages = PageAssembler()
        self._effective: dict[tuple[str, str], EffectiveLimit] = {}  # (pool, entitlement) → newest
        self._usage: dict[str, UsageRecord] = {}  # record key → newest
        self.applied: Counter[Applied] = Counter()

    # ------------------------------------------------------------ records in

    def apply_limits(self, key: bytes | None, value: bytes | None) -> Applied:
        if value is None:
            pool = pool_of_key(key or b"").decode("utf-8", "replace")
            gone = key is not None and b"#" not in key and self._limits.pop(pool, None) is not None
            return self._count(Applied.REMOVED if gone else Applied.STALE)
        page = self._decode(LimitUpdate, value)
        if page is None:
            return self._count(Applied.INVALID)
        whole = self._pages.add(page)
        if whole is None:
            return self._count(Applied.PENDING)
        held = self._limits.get(whole.pool)
        if held is not None and held.version >= whole.version:
            return self._count(Applied.STALE)
        self._limits[whole.pool] = whole
        return self._count(Applied.SHOWN)

    def apply_effective(self, key: bytes | None, value: bytes | None) -> Applied:
        if value is None:
            pool, _, entitlement = (key or b"").decode("utf-8", "replace").partition("/")
            gone = self._effective.pop((pool, entitlement), None) is not None
            return self._count(Applied.REMOVED if gone else Applied.STALE)
        record = self._decode(EffectiveLimit, value)
        if record is None:
            return self._count(Applied.INVALID)
        at = (record.pool, record.entitlement)
        held = self._effective.get(at)
        if held is not None and held.version >= record.version:
            return self._count(Applied.STALE)
        self._effective[at] = record
        return self._count(Applied.SHOWN)

    def apply_usage(self, key: bytes | None, value: bytes | None) -> Applied:
        name = (key or b"").decode("utf-8", "replace")
        if value is None:
            gone = self._usage.pop(name, None) is not None
            return self._count(Applied.REMOVED if gone else Applied.STALE)
        record = self._decode(UsageRecord, value)
        if record is None:
            return self._count(Applied.INVALID)
        held = self._usage.get(name)
        if held is not None and held.version >= record.version:
            return self._count(Applied.STALE)
        self._usage[name] = record
        return self._count(Applied.SHOWN)

    # ------------------------------------------------------------ rows out

    def pools(self, only: Collection[str] = ()) -> tuple[PoolRow, ...]:
        """Every pool with a whole update (those in ``only``, if given), by name."""
        return tuple(
            PoolRow(u.pool, u.version, u.t_ms, u.contended, u.capacity_tokens_per_s, u.capacity_concurrency,
                    len(u.entitlements))
            for pool, u in sorted(self._limits.items()) if not only or pool in only)

    def rows(self, today: str, only: Collection[str] = ()) -> tuple[Row, ...]:
        """One row per entitlement of every pool shown (those in ``only``, if given), by pool then entitlement;
        ``today`` is the day (YYYY-MM-DD, UTC) whose usage is shown."""
        used: dict[tuple[str, str], tuple[int, int]] = {}
        for record in self._usage.values():
            if record.day == today:
                tokens, requests = used.get((record.pool, record.entitlement), (0, 0))
                used[(record.pool, record.entitlement)] = (
                    tokens + record.usage.prompt_tokens + record.usage.completion_tokens,
                    requests + record.usage.requests)
        rows = []
        for pool, update in sorted(self._limits.items()):
            if only and pool not in only:
                continue
            for e in sorted(update.entitlements, key=lambda e: e.name):
                effective = self._effective.get((pool, e.name))
                measured = effective.measured if effective is not None else None
                tokens, requests = used.get((pool, e.name), (0, 0))
                rows.append(Row(
                    pool, e.name, effective.service_class.value if effective is not None else None, e.priority,
                    e.debt, e.tokens_per_s, e.concurrency,
                    measured.in_flight_at_end if measured is not None else None,
                    measured.refused if measured is not None else None, tokens, requests))
        return tuple(rows)

    # ------------------------------------------------------------ helpers

    def _count(self, applied: Applied) -> Applied:
        self.applied[applied] += 1
        return applied

    @staticmethod
    def _decode(cls: type[R], value: bytes) -> R | None:
        try:
            return decode(cls, value)
        except DecodeError:
            return None
