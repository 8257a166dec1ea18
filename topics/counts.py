"""The fleet's counts of one pool: the record the agents publish every ``counts_interval_ms`` on the counts topic
(key: the pool's name, UTF-8) and every proxy of the pool reads (docs/fleet.md).

The encoding is binary and little-endian, because every proxy reads every record of its pools about ten times a
second: a header, the pool's name, then three arrays in the entitlement order of the pool's ``LimitUpdate`` of
version ``limits_version`` (sorted by name), which every proxy already holds. 10 bytes per entitlement plus 33 and
the name, whatever the number of proxies (a sharded pool's records add 4 and their active proxies' ids, ~8 bytes
each for the replicas of one deployment); topics/README.md documents the layout for other readers (the readable view
is the effective-limits topic). A proxy compares the record's key with its pools' names before it decodes anything.

A sharded pool (``topics.shards``, docs/scaling.md#the-two-stage-topology) has one record per shard, all keyed by
the pool's name: format 3, whose header adds the shard and the pool's shard count, whose arrays hold only the
shard's own entitlements (``owned``: the update's order, restricted to those the owner rule gives the shard), with
the shard's subtotal of the pool's in flight, and which ends with the ids of the shard's active proxies (sorted,
front-coded), so that a proxy counts the pool's active proxies exactly: the size of their union over the shards
(a proxy with demand in two shards is one proxy). A proxy combines the latest record of each shard
(``proxy.pools``). A one-shard pool's record is format 1, byte for byte what it always was. Format 2, the sharded
record before it carried the ids, is refused with its own error: its pool row cannot be combined exactly.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tokenpools.topics.shards import shard_of

_HEADER = struct.Struct("<BQQIIIHH")  # format, limits version, t_ms, E, pool in flight, pool active, proxies,
#                                        len(name)
_SHARD = struct.Struct("<HH")  # format 3 only, after the header: shard, shards
BUCKET_MAX_TOKENS = 2**31 - 1  # a deeper bucket is sent as this: it still holds any request's reservation
COUNTS_FORMAT = 1  # one record per pool
SHARDED_FORMAT = 3  # one record per shard of a sharded pool, with its active proxies' ids
RETIRED_SHARDED_FORMAT = 2  # a shard's record without the ids (its pool active only a subtotal): refused


@dataclass(frozen=True, slots=True)
class CountsRecord:
    """The fleet's counts of one pool at one instant, as every proxy of the pool reads it.

    The entitlements carry no names: their order is the order of the pool's ``LimitUpdate`` of version
    ``limits_version`` (sorted by name), which every proxy already holds, so the record is 10 bytes per entitlement
    (in flight u32, active proxies u16, bucket level i32 whole tokens, rounded up and saturated) plus a header, whatever P is.
    """

    pool: str
    limits_version: int  # the LimitUpdate whose entitlement order the arrays follow
    t_ms: int  # the counts instant (event time)
    pool_in_flight: int
    pool_active: int  # proxies that saw any request of the pool in the demand window (a shard's: of its entitlements)
    proxies: int  # the pool's live proxies: a proxy that saw no demand counts itself among at most this many
    in_flight: tuple[int, ...]  # N_e
    active: tuple[int, ...]  # A_e
    bucket_tokens: tuple[int, ...]  # B_e, whole tokens rounded up (may be negative), within i32
    shard: int = 0  # a sharded pool's: whose entitlements (``owned``) and subtotal of the pool's row this is
    shards: int = 1  # the pool's shards when the record was built (1: format 1, the whole pool)
    active_proxies: tuple[str, ...] = ()  # a shard's record: the ids of its ``pool_active`` proxies, sorted

    def __post_init__(self) -> None:
        if not len(self.in_flight) == len(self.active) == len(self.bucket_tokens):
            raise ValueError("`in_flight`, `active` and `bucket_tokens` must have one entry per entitlement")
        if not 0 <= self.shard < self.shards <= 0xFFFF:
            raise ValueError(f"shard {self.shard} of {self.shards} out of range")
        if self.shards == 1 and self.active_proxies:
            raise ValueError("a one-shard record carries no proxy ids (format 1): its `pool_active` is exact")
        if self.shards > 1 and len(self.active_proxies) != self.pool_active:
            raise ValueError(f"shard {self.shard}: {len(self.active_proxies)} active proxies' ids for "
                             f"`pool_active` {self.pool_active}")
        if any(a >= b for a, b in zip(self.active_proxies, self.active_proxies[1:])):
            raise ValueError("`active_proxies` must be sorted and distinct")


def owned(names: Sequence[str], shard: int, shards: int) -> list[str]:
    """The entitlements of ``names`` whose events (hence counts) are in ``shard``, in ``names``' order."""
    return list(names) if shards <= 1 else [n for n in names if shard_of(n, shards) == shard]


def counts_record(pool: str, limits_version: int, t_ms: int, names: Sequence[str], *, in_flight: Mapping[str, int],
                  active: Mapping[str, int], bucket_tokens: Mapping[str, float], pool_in_flight: int,
                  pool_active: int, proxies: int, shard: int = 0, shards: int = 1,
                  active_proxies: Collection[str] = ()) -> CountsRecord:
    """The record at ``t_ms`` with ``names``' counts in that order (absent counts are 0, an absent bucket full); a
    bucket level is rounded up (a proxy's cap never falls below the exact level) and saturated to the wire's i32.
    With ``shards`` > 1, ``names`` are the limits order and the record holds ``shard``'s own (``owned``), and
    ``active_proxies`` are the ids of the shard's ``pool_active`` proxies (ignored for a one-shard record)."""
    names = owned(names, shard, shards)
    ids = tuple(sorted(set(active_proxies))) if shards > 1 else ()
    return CountsRecord(
        pool, limits_version, t_ms, pool_in_flight, pool_active if shards > 1 else min(pool_active, 0xFFFF),
        min(proxies, 0xFFFF), tuple(in_flight.get(n, 0) for n in names),
        tuple(min(active.get(n, 0), 0xFFFF) for n in names),
        tuple(_saturated(bucket_tokens.get(n, math.inf)) for n in names), shard, shards, ids,
    )


def pool_active_of(records: Iterable[CountsRecord]) -> int:
    """The pool's active proxies from the latest record of each of its shards (one record for a one-shard pool): the
    number of distinct ids over the shards' records, a proxy active in two shards counted once."""
    records = list(records)
    if len(records) == 1 and records[0].shards == 1:
        return records[0].pool_active
    return len(set().union(*(r.active_proxies for r in records)))


def _saturated(tokens: float) -> int:
    if math.isinf(tokens):
        return BUCKET_MAX_TOKENS if tokens > 0 else -BUCKET_MAX_TOKENS
    return max(-BUCKET_MAX_TOKENS, min(BUCKET_MAX_TOKENS, math.ceil(tokens)))


def encode_counts(record: CountsRecord) -> bytes:
    """Little-endian: the header (format 3: then shard and shards, u16 each), the pool's name (UTF-8), the three
    arrays (u32, u16, i32) in limits order, then (format 3) the ``pool_active`` ids, front-coded. A one-shard record
    is format 1."""
    n = len(record.in_flight)
    name = record.pool.encode()
    sharded = record.shards > 1
    return b"".join((
        _HEADER.pack(SHARDED_FORMAT if sharded else COUNTS_FORMAT, record.limits_version, record.t_ms, n,
                     record.pool_in_flight, record.pool_active, record.proxies, len(name)),
        _SHARD.pack(record.shard, record.shards) if sharded else b"",
        name,
        struct.pack(f"<{n}I", *record.in_flight),
        struct.pack(f"<{n}H", *record.active),
        struct.pack(f"<{n}i", *record.bucket_tokens),
        _front_coded(record.active_proxies) if sharded else b"",
    ))


def _front_coded(ids: Sequence[str]) -> bytes:
    """Sorted ids, each as (bytes shared with the previous id, bytes of the rest, the rest), both lengths varints:
    replicas of one deployment share their name's prefix, so an id costs its distinct tail plus 2 bytes."""
    out = bytearray()
    previous = b""
    for text in ids:
        current = text.encode()
        shared = 0
        limit = min(len(previous), len(current))
        while shared < limit and previous[shared] == current[shared]:
            shared += 1
        _varint(out, shared)
        _varint(out, len(current) - shared)
        out += current[shared:]
        previous = current
    return bytes(out)


def _varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("counts record truncated in its active proxies' ids")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7


def _front_decoded(data: bytes, at: int, count: int, shard: int) -> tuple[str, ...]:
    """The ``count`` ids ``_front_coded`` wrote from ``data[at:]``, which they must fill exactly."""
    ids: list[str] = []
    previous = b""
    end = len(data)
    while at < end:
        if len(ids) == count:
            raise ValueError(f"counts record of shard {shard} names more active proxies than its {count}")
        shared = data[at]  # one-byte lengths (ids under 128 bytes) without the varint loop: every proxy decodes
        if shared < 0x80 and at + 1 < end and data[at + 1] < 0x80:  # ~10 of these records a second per shard
            rest = data[at + 1]
            at += 2
        else:
            shared, at = _read_varint(data, at)
            rest, at = _read_varint(data, at)
        if shared > len(previous) or at + rest > end:
            raise ValueError("counts record truncated in its active proxies' ids")
        current = previous[:shared] + data[at:at + rest]
        at += rest
        if ids and current <= previous:
            raise ValueError(f"counts record of shard {shard}: active proxies' ids not sorted and distinct")
        try:
            ids.append(current.decode())
        except UnicodeDecodeError as exc:
            raise ValueError(f"counts record of shard {shard}: an active proxy's id is not UTF-8") from exc
        previous = current
    if len(ids) != count:
        raise ValueError(f"counts record of shard {shard} names {len(ids)} active proxies, its header {count}")
    return tuple(ids)


def decode_counts(data: bytes) -> CountsRecord:
    """The inverse of ``encode_counts`` (formats 1 and 3); raises ValueError on another format (format 2, a shard's
    record without its active proxies' ids, by name) or a short, long or inconsistent record."""
    try:
        fmt, version, t_ms, n, pool_in_flight, pool_active, proxies, name_len = _HEADER.unpack_from(data, 0)
        shard, shards = _SHARD.unpack_from(data, _HEADER.size) if fmt == SHARDED_FORMAT else (0, 1)
    except struct.error as exc:
        raise ValueError(f"counts record too short: {len(data)} bytes") from exc
    if fmt == RETIRED_SHARDED_FORMAT:
        raise ValueError(f"counts record format {fmt}: a shard's record without its active proxies' ids, from an "
                         f"older agent; not followed")
    if fmt not in (COUNTS_FORMAT, SHARDED_FORMAT):
        raise ValueError(f"counts record format {fmt}, expected {COUNTS_FORMAT} or {SHARDED_FORMAT}")
    if fmt == SHARDED_FORMAT and not 0 <= shard < shards:
        raise ValueError(f"counts record of shard {shard} of {shards}")
    at = _HEADER.size + (_SHARD.size if fmt == SHARDED_FORMAT else 0)
    end = at + name_len + 10 * n
    if len(data) < end or (fmt == COUNTS_FORMAT and len(data) != end):
        raise ValueError(f"counts record of {n} entitlements has {len(data)} bytes")
    try:
        pool = data[at:at + name_len].decode()
    except UnicodeDecodeError as exc:
        raise ValueError("counts record: the pool's name is not UTF-8") from exc
    at += name_len
    in_flight = struct.unpack_from(f"<{n}I", data, at)
    active = struct.unpack_from(f"<{n}H", data, at + 4 * n)
    bucket = struct.unpack_from(f"<{n}i", data, at + 6 * n)
    ids = _front_decoded(data, end, pool_active, shard) if fmt == SHARDED_FORMAT else ()
    return CountsRecord(pool, version, t_ms, pool_in_flight, pool_active, proxies, in_flight, active, bucket, shard,
                        shards, ids)
