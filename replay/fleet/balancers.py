"""Load balancers in front of the proxy fleet: which proxy (0 … P−1) a request reaches.

- ``random``: uniform, from the seeded ``random.Random`` passed in;
- ``round_robin``: proxies in turn, whatever the entitlement (exact: every proxy gets ⌊n/P⌋ or ⌈n/P⌉ of n);
- ``key_affinity``: an entitlement's requests go to the ``k`` proxies (default 1) that rank highest by a stable hash
  of (entitlement, proxy) (rendezvous hashing), taken in turn; the same on every machine and run (BLAKE2b, not
  Python's salted ``hash``), and adding a proxy moves only the entitlements whose new top-k includes it.

``BALANCERS`` maps each name to its class; every class is built as ``cls(proxies, rng, **options)``.
"""

from __future__ import annotations

import hashlib
import random
from typing import Protocol


class Balancer(Protocol):
    def pick(self, entitlement: str) -> int:
        """The proxy (0 … P−1) this entitlement's next request goes to."""
        ...


def _check(proxies: int) -> None:
    if proxies < 1:
        raise ValueError(f"`proxies` must be >= 1, got {proxies}")


class RandomBalancer:
    """Uniform over the proxies, from the seeded generator."""

    def __init__(self, proxies: int, rng: random.Random) -> None:
        _check(proxies)
        self._proxies = proxies
        self._rng = rng

    def pick(self, entitlement: str) -> int:
        return self._rng.randrange(self._proxies)


class RoundRobin:
    """Proxies in turn across all requests, starting at proxy 0."""

    def __init__(self, proxies: int, rng: random.Random) -> None:
        _check(proxies)
        self._proxies = proxies
        self._next = 0

    def pick(self, entitlement: str) -> int:
        proxy = self._next
        self._next = (proxy + 1) % self._proxies
        return proxy


def rendezvous_rank(entitlement: str, proxy: int) -> int:
    """A stable 64-bit score of (entitlement, proxy): the same on every machine, run and Python process."""
    digest = hashlib.blake2b(f"{entitlement}\0{proxy}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class KeyAffinity:
    """Each entitlement sticks to its ``k`` highest-ranked proxies (rendezvous hashing), used in turn."""

    def __init__(self, proxies: int, rng: random.Random, k: int = 1) -> None:
        _check(proxies)
        if k < 1:
            raise ValueError(f"`k` must be >= 1, got {k}")
        self._proxies = proxies
        self._k = min(k, proxies)
        self._homes: dict[str, tuple[int, ...]] = {}
        self._turn: dict[str, int] = {}

    def homes(self, entitlement: str) -> tuple[int, ...]:
        """The proxies this entitlement's requests go to, best-ranked first."""
        homes = self._homes.get(entitlement)
        if homes is None:
            ranked = sorted(range(self._proxies), key=lambda p: (-rendezvous_rank(entitlement, p), p))
            homes = self._homes[entitlement] = tuple(ranked[: self._k])
        return homes

    def pick(self, entitlement: str) -> int:
        homes = self.homes(entitlement)
        if len(homes) == 1:
            return homes[0]
        turn = self._turn.get(entitlement, 0)
        self._turn[entitlement] = (turn + 1) % len(homes)
        return homes[turn]


BALANCERS: dict[str, type[RandomBalancer] | type[RoundRobin] | type[KeyAffinity]] = {
    "random": RandomBalancer,
    "round_robin": RoundRobin,
    "key_affinity": KeyAffinity,
}
