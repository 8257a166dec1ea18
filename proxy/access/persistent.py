"""An immutable map whose update copies only what it changes: the proxy's views are swapped whole on the event loop,
and a change of one entry must not copy 20,000 (``tenancy``, ``live_specs``).

The entries are spread over ``BUCKETS`` small dicts by their key's hash; ``evolve`` returns a new map sharing every
bucket it does not touch, so one change costs a copy of the bucket list and of the touched buckets (about
``len / BUCKETS`` entries each). Neither map is ever mutated: a reader holding the old one keeps seeing it whole.
Iteration order is the buckets' order, not insertion order.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

BUCKETS = 256
_EMPTY: dict = {}


class PersistentMap(Mapping[K, V], Generic[K, V]):
    __slots__ = ("_buckets", "_len")

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        buckets: list[dict[K, V]] = [{} for _ in range(BUCKETS)]
        for key, value in (items.items() if isinstance(items, Mapping) else items):
            buckets[hash(key) % BUCKETS][key] = value
        self._buckets = tuple(b or _EMPTY for b in buckets)
        self._len = sum(len(b) for b in buckets)

    def evolve(self, changes: Mapping[K, V | None]) -> PersistentMap[K, V]:
        """A new map with ``changes`` applied (a value None removes its key); this one is left as it was."""
        if not changes:
            return self
        buckets = list(self._buckets)
        copied: set[int] = set()
        size = self._len
        for key, value in changes.items():
            i = hash(key) % BUCKETS
            if i not in copied:
                buckets[i] = dict(buckets[i])
                copied.add(i)
            bucket = buckets[i]
            had = key in bucket
            if value is None:
                if had:
                    del bucket[key]
                    size -= 1
            else:
                bucket[key] = value
                size += not had
        new: PersistentMap[K, V] = PersistentMap.__new__(PersistentMap)
        new._buckets, new._len = tuple(b or _EMPTY for b in buckets), size
        return new

    def __getitem__(self, key: K) -> V:
        return self._buckets[hash(key) % BUCKETS][key]

    def get(self, key: K, default=None):  # type: ignore[no-untyped-def, override]
        return self._buckets[hash(key) % BUCKETS].get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._buckets[hash(key) % BUCKETS]

    def __iter__(self) -> Iterator[K]:
        for bucket in self._buckets:
            yield from bucket

    def __len__(self) -> int:
        return self._len

    def __repr__(self) -> str:
        return f"PersistentMap({dict(self.items())!r})"
