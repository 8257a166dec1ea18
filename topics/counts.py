"""The fleet's counts of one pool: the record the agents publish every ``counts_interval_ms`` on the counts topic
(key: the pool's name, UTF-8) and every proxy of the pool reads (docs/fleet.md).

The encoding is binary and little-endian, because every proxy reads every record of its pools about ten times a
second: a header, the pool's name, then three arrays in the entitlement order of the pool's ``LimitUpdate`` of
version ``limits_version`` (sorted by name), which every proxy already holds. 10 bytes per entitlement plus 33 and
the name, whatever the number of proxies; topics/README.md documents the layout for other readers (the readable view is
the effective-limits topic). A proxy compares the record's key with its pools' names before it decodes anything.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

_HEADER = struct.Struct("<BQQIIIHH")  # format, limits version, t_ms, E, pool in flight, pool active, proxies,
#                                        len(name)
BUCKET_MAX_TOKENS = 2**31 - 1  # a deeper bucket is sent as this: it still holds any request's reservation
COUNTS_FORMAT = 1


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
    pool_active: int  # proxies that saw any request of the pool in the demand window
    proxies: int  # the pool's live proxies: a proxy that saw no demand counts itself among at most this many
    in_flight: tuple[int, ...]  # N_e
    active: tuple[int, ...]  # A_e
    bucket_tokens: tuple[int, ...]  # B_e, whole tokens rounded up (may be negative), within i32

    def __post_init__(self) -> None:
        if not len(self.in_flight) == len(self.active) == len(self.bucket_tokens):
            raise ValueError("`in_flight`, `active` and `bucket_tokens` must have one entry per entitlement")


def counts_record(pool: str, limits_version: int, t_ms: int, names: Sequence[str], in_flight: Mapping[str, int],
                  active: Mapping[str, int], bucket_tokens: Mapping[str, float], pool_in_flight: int,
                  pool_active: int, proxies: int) -> CountsRecord:
    """The record at ``t_ms`` with ``names``' counts in that order (absent counts are 0, an absent bucket full); a
    bucket level is rounded up (a proxy's cap never falls below the exact level) and saturated to the wire's i32."""
    return CountsRecord(
        pool, limits_version, t_ms, pool_in_flight, min(pool_active, 0xFFFF), min(proxies, 0xFFFF),
        tuple(in_flight.get(n, 0) for n in names), tuple(min(active.get(n, 0), 0xFFFF) for n in names),
        tuple(_saturated(bucket_tokens.get(n, math.inf)) for n in names),
    )


def _saturated(tokens: float) -> int:
    if math.isinf(tokens):
        return BUCKET_MAX_TOKENS if tokens > 0 else -BUCKET_MAX_TOKENS
    return max(-BUCKET_MAX_TOKENS, min(BUCKET_MAX_TOKENS, math.ceil(tokens)))


def encode_counts(record: CountsRecord) -> bytes:
    """Little-endian: the header, the pool's name (UTF-8), then the three arrays (u32, u16, i32) in limits order."""
    n = len(record.in_flight)
    name = record.pool.encode()
    return b"".join((
        _HEADER.pack(COUNTS_FORMAT, record.limits_version, record.t_ms, n, record.pool_in_flight,
                     record.pool_active, record.proxies, len(name)),
        name,
        struct.pack(f"<{n}I", *record.in_flight),
        struct.pack(f"<{n}H", *record.active),
        struct.pack(f"<{n}i", *record.bucket_tokens),
    ))


def decode_counts(data: bytes) -> CountsRecord:
    """The inverse of ``encode_counts``; raises ValueError on another format or a short record."""
    try:
        fmt, version, t_ms, n, pool_in_flight, pool_active, proxies, name_len = _HEADER.unpack_from(data, 0)
    except struct.error as exc:
        raise ValueError(f"counts record too short: {len(data)} bytes") from exc
    if fmt != COUNTS_FORMAT:
        raise ValueError(f"counts record format {fmt}, expected {COUNTS_FORMAT}")
    at = _HEADER.size
    if len(data) != at + name_len + 10 * n:
        raise ValueError(f"counts record of {n} entitlements has {len(data)} bytes")
    pool = data[at:at + name_len].decode()
    at += name_len
    in_flight = struct.unpack_from(f"<{n}I", data, at)
    active = struct.unpack_from(f"<{n}H", data, at + 4 * n)
    bucket = struct.unpack_from(f"<{n}i", data, at + 6 * n)
    return CountsRecord(pool, version, t_ms, pool_in_flight, pool_active, proxies, in_flight, active, bucket)
