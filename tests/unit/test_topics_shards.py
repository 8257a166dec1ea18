"""The event key of a sharded pool: stable across processes, one key per entitlement, parsable back."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenpools.core.capacity import Capacity
from tokenpools.core.spec import PoolSpec
from tokenpools.topics.shards import ShardKey, event_key, keys_of, parse_key, shard_of, too_many_shards

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-.", min_size=1, max_size=30)


def test_a_one_shard_pool_keeps_its_own_key() -> None:
    assert event_key("pool-a", "gold", 1) == "pool-a"
    assert keys_of("pool-a", 1) == ("pool-a",)


def test_the_shard_is_crc32_of_the_name_mod_shards_not_pythons_hash() -> None:
    assert shard_of("gold", 4) == zlib.crc32(b"gold") % 4 == 1  # a fixed value: every process, every language
    assert event_key("pool-a", "gold", 4) == "pool-a#1"
    assert event_key("pool-a", None, 4) == "pool-a"  # an unknown key's refusal: the pool's own key


@given(NAMES, NAMES, st.integers(1, 64))
def test_every_key_parses_back_to_its_pool_and_shard(pool: str, entitlement: str, shards: int) -> None:
    key = event_key(pool, entitlement, shards)
    parsed = parse_key(key)
    assert parsed.pool == pool
    assert parsed.shard == (None if shards == 1 else shard_of(entitlement, shards))
    assert key in keys_of(pool, shards)


def test_a_plain_name_parses_as_the_pool_itself() -> None:
    assert parse_key("pool-a") == ShardKey("pool-a", None)
    assert parse_key("#3") == ShardKey("#3", None)


def test_shards_are_checked_in_the_spec_and_against_the_partitions() -> None:
    with pytest.raises(ValueError, match="shards"):
        PoolSpec("p", "m", Capacity(1, 1, 1), shards=0)
    assert PoolSpec("p", "m", Capacity(1, 1, 1)).shards == 1
    assert too_many_shards([("a", 4), ("b", 33)], 32) == [
        "pool b: `shards` 33 exceeds the topics' 32 partitions (kafka.topic_partitions)"]
