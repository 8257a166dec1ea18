"""What a proxy reads per update: under today's design the whole pool's ``LimitUpdate``, every proxy's share in it;
under ``counts`` one ``CountsRecord`` per pool, E entitlements' counts in a compact binary encoding.

``limit_update`` builds the record the agents publish (``topics.limits.build_limit_update``, its concurrency held
back by the agents) from a policy's grants, field for field, so its encoded size is the bytes every proxy reads
per tick. The model runs no tick of the policy core, so the signals are those of a tick with nothing measured
(debt 0, burst 0), the priority is the one in the fleet limits and the pool is never contended.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass

from tokenpools.core.admission import EntitlementLimits
from tokenpools.core.capacity import Capacity
from tokenpools.topics.records import EntitlementLimit, LimitUpdate, ProxyShare


def limit_update(limits: Mapping[str, EntitlementLimits], pool: Capacity, mean_slo_ms: float,
                 shares: Mapping[str, Mapping[str, tuple[int, float, float]]], pool_slots: Mapping[str, int],
                 t_ms: int, pool_name: str = "pool") -> LimitUpdate:
    """The update of version ``t_ms`` (the window's end, as the agents number them) carrying ``shares``."""
    entitlements = tuple(
        EntitlementLimit(name=name, priority=lim.priority, debt=0.0, burst=0.0, tokens_per_s=lim.tokens_per_s,
                         kv_bytes=lim.kv_bytes, concurrency=lim.concurrency)
        for name, lim in sorted(limits.items())
    )
    proxies = tuple(
        ProxyShare(proxy_id=proxy, pool_concurrency=pool_slots[proxy], entitlements=dict(shares[proxy]))
        for proxy in sorted(shares)
    )
    return LimitUpdate(
        pool=pool_name, version=t_ms, t_ms=t_ms, contended=False, backend_waiting=0.0, mean_slo_ms=mean_slo_ms,
        capacity_tokens_per_s=pool.tokens_per_s, capacity_kv_bytes=pool.kv_bytes,
        capacity_concurrency=int(pool.concurrency), entitlements=entitlements, proxies=proxies,
    )


_HEADER = struct.Struct("<BQQIIIH")
BUCKET_MAX_TOKENS = 2**31 - 1  # a deeper bucket is sent as this: it still holds any request's reservation  # format, limits version, t_ms, E, pool in flight, pool active, len(pool name)
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
    in_flight: tuple[int, ...]  # N_e
    active: tuple[int, ...]  # A_e
    bucket_tokens: tuple[int, ...]  # B_e, whole tokens rounded up (may be negative), within i32

    def __post_init__(self) -> None:
        if not len(self.in_flight) == len(self.active) == len(self.bucket_tokens):
            raise ValueError("`in_flight`, `active` and `bucket_tokens` must have one entry per entitlement")


def encode_counts(record: CountsRecord) -> bytes:
    """Little-endian: the header, the pool's name (UTF-8), then the three arrays (u32, u16, i32) in limits order."""
    n = len(record.in_flight)
    name = record.pool.encode()
    return b"".join((
        _HEADER.pack(COUNTS_FORMAT, record.limits_version, record.t_ms, n, record.pool_in_flight,
                     record.pool_active, len(name)),
        name,
        struct.pack(f"<{n}I", *record.in_flight),
        struct.pack(f"<{n}H", *record.active),
        struct.pack(f"<{n}i", *record.bucket_tokens),
    ))


def decode_counts(data: bytes) -> CountsRecord:
    """The inverse of ``encode_counts``; raises ValueError on another format or a short record."""
    try:
        fmt, version, t_ms, n, pool_in_flight, pool_active, name_len = _HEADER.unpack_from(data, 0)
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
    return CountsRecord(pool, version, t_ms, pool_in_flight, pool_active, in_flight, active, bucket)
