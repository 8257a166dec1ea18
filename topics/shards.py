"""The event key of a sharded pool (docs/scaling.md#the-two-stage-topology): which shard an entitlement's events
go to, and how a key names its pool and shard.

A pool with ``shards`` = 1 keys its events by its name, as every pool always did. A pool with more keys each
entitlement's events ``<pool>#<k>``, k = CRC-32 of the entitlement's name (UTF-8) mod ``shards``: a hash every
language has and that never changes between processes (Python's ``hash`` of a str does), so every proxy puts an
entitlement's admissions, refusals and completions under one key, hence on one partition. Records of no
entitlement (an unknown API key's refusal, the backend metrics) keep the pool's own key.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import NamedTuple

SEPARATOR = "#"


class ShardKey(NamedTuple):
    pool: str
    shard: int | None  # None: the pool's own key (a one-shard pool, or a record of no entitlement)


def shard_of(entitlement: str, shards: int) -> int:
    """The shard of ``entitlement``'s events in a pool of ``shards`` shards (0 when there is one)."""
    if shards < 1:
        raise ValueError(f"`shards` must be >= 1, got {shards}")
    return zlib.crc32(entitlement.encode()) % shards if shards > 1 else 0


def event_key(pool: str, entitlement: str | None, shards: int) -> str:
    """The Kafka key of an event of ``entitlement`` in ``pool``: the pool's name, or ``<pool>#<k>`` when sharded."""
    if shards <= 1 or entitlement is None:
        return pool
    return f"{pool}{SEPARATOR}{shard_of(entitlement, shards)}"


def parse_key(key: str) -> ShardKey:
    """The pool and shard a key names (pool names are DNS names: they never hold ``#``)."""
    pool, sep, shard = key.rpartition(SEPARATOR)
    if sep and pool and shard.isdigit():
        return ShardKey(pool, int(shard))
    return ShardKey(key, None)


def too_many_shards(shards: Iterable[tuple[str, int]], partitions: int) -> list[str]:
    """The problems of pools with more shards than the pool-keyed topics have partitions (their shards could not
    all be on partitions of their own), each naming the pool; ``shards`` is (pool, shards) pairs."""
    return [f"pool {pool}: `shards` {n} exceeds the topics' {partitions} partitions (kafka.topic_partitions)"
            for pool, n in shards if n > partitions]


def keys_of(pool: str, shards: int) -> tuple[str, ...]:
    """Every key ``pool``'s events may carry: its own, and each shard's when it has more than one."""
    return (pool,) + tuple(f"{pool}{SEPARATOR}{k}" for k in range(shards)) if shards > 1 else (pool,)
