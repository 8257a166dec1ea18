"""The fleet model's load balancers: round robin is exact, key affinity is stable, random is seeded and uniform."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tokenpools.replay.fleet.balancers import BALANCERS, KeyAffinity, RandomBalancer, RoundRobin

NAMES = [f"e{i:03d}" for i in range(200)]


def test_round_robin_visits_the_proxies_in_turn_whatever_the_entitlement() -> None:
    balancer = RoundRobin(7, random.Random(0))
    picks = [balancer.pick(NAMES[i % 3]) for i in range(1000)]
    assert picks[:9] == [0, 1, 2, 3, 4, 5, 6, 0, 1]
    assert sorted(Counter(picks).values()) == [142] + [143] * 6  # ⌊1000/7⌋ or ⌈1000/7⌉ each


def test_key_affinity_sends_an_entitlement_to_one_proxy_always_and_in_every_instance() -> None:
    first, second = KeyAffinity(10, random.Random(1)), KeyAffinity(10, random.Random(2))
    for name in NAMES:
        picks = {first.pick(name) for _ in range(5)}
        assert picks == {second.pick(name)}
    assert [first.homes(n) for n in ("e0", "e1", "e2")] == [(4,), (3,), (0,)]  # pinned: the hash is stable


def test_key_affinity_spreads_the_entitlements_over_the_proxies() -> None:
    balancer = KeyAffinity(10, random.Random(0))
    homes = Counter(balancer.pick(name) for name in NAMES)
    assert set(homes) == set(range(10))
    assert max(homes.values()) <= 2 * len(NAMES) / 10


def test_a_new_proxy_takes_entitlements_only_for_itself() -> None:
    """Rendezvous hashing: growing the fleet moves an entitlement only to the new proxy, never between old ones."""
    before, after = KeyAffinity(10, random.Random(0)), KeyAffinity(11, random.Random(0))
    moved = [n for n in NAMES if before.pick(n) != after.pick(n)]
    assert moved and all(after.pick(n) == 10 for n in moved)


def test_key_affinity_over_k_proxies_takes_its_k_homes_in_turn() -> None:
    balancer = KeyAffinity(10, random.Random(0), k=3)
    for name in NAMES[:20]:
        homes = balancer.homes(name)
        assert len(set(homes)) == 3 and homes[0] == KeyAffinity(10, random.Random(0)).pick(name)
        assert [balancer.pick(name) for _ in range(6)] == [*homes, *homes]
    assert KeyAffinity(2, random.Random(0), k=5).homes("e0") in {(0, 1), (1, 0)}  # k is capped at the fleet


def test_random_is_uniform_and_repeats_with_its_seed() -> None:
    balancer, again = RandomBalancer(10, random.Random(7)), RandomBalancer(10, random.Random(7))
    picks = [balancer.pick(NAMES[i % 50]) for i in range(20_000)]
    assert picks == [again.pick(NAMES[i % 50]) for i in range(20_000)]
    counts = Counter(picks)
    assert set(counts) == set(range(10))
    assert all(abs(n - 2000) < 5 * 2000**0.5 for n in counts.values())  # within 5 standard deviations


def test_the_registry_builds_every_balancer_the_same_way_and_refuses_an_empty_fleet() -> None:
    for name, cls in BALANCERS.items():
        assert 0 <= cls(3, random.Random(0)).pick("e") < 3, name
        with pytest.raises(ValueError, match="proxies"):
            cls(0, random.Random(0))
    with pytest.raises(ValueError, match="k"):
        KeyAffinity(3, random.Random(0), k=0)
