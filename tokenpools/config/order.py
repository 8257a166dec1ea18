"""The place of each document in a set that changes one document at a time, in O(log n).

A configuration's problems name a document by its 1-based position ("document 7"), and the loader checks
documents in that order (the first entitlement to list an API key owns it). A set that is edited in place keeps
the order of a dict: a document replaced keeps its place, one removed and added again goes last. Positions are
counted with a Fenwick tree over slots handed out in insertion order (1 while the slot's key is present, 0 after),
so finding one costs O(log n) however many documents came and went; slots are renumbered once the free ones
outnumber the live ones, which keeps the tree's size within twice the set's (amortised O(1) per change).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

_SLACK = 64  # free slots always tolerated, so a small set is not renumbered on every change


class InsertionOrder(Generic[K]):
    """Keys in insertion order: ``position`` (1-based) and ``rank`` (compares two keys) of any present key."""

    def __init__(self, keys: Iterable[K] = ()) -> None:
        self._slot: dict[K, int] = {}  # in slot order: keys are only ever appended
        self._tree: list[int] = [0]  # 1-based Fenwick tree over slots
        for key in keys:
            self.add(key)

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, key: object) -> bool:
        return key in self._slot

    def add(self, key: K) -> None:
        """Put ``key`` last, unless it is present (then it keeps its place)."""
        if key in self._slot:
            return
        if len(self._tree) > 2 * len(self._slot) + _SLACK:
            self._renumber()
        i = len(self._tree)
        # node i sums the slots (i - lowbit(i), i]: all but i are in the tree already
        self._tree.append(1 + self._prefix(i - 1) - self._prefix(i - (i & -i)))
        self._slot[key] = i

    def remove(self, key: K) -> None:
        """Forget ``key`` (KeyError if absent)."""
        i, n = self._slot.pop(key), len(self._tree)
        while i < n:
            self._tree[i] -= 1
            i += i & -i

    def position(self, key: K) -> int:
        """How many present keys were put before ``key``, plus one (KeyError if absent)."""
        return self._prefix(self._slot[key])

    def rank(self, key: K) -> int:
        """A number that orders present keys as their positions do (not a position; changes on renumbering)."""
        return self._slot[key]

    def _prefix(self, i: int) -> int:
        total, tree = 0, self._tree
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total

    def _renumber(self) -> None:
        keys = list(self._slot)
        n = len(keys)
        self._slot = {key: i for i, key in enumerate(keys, start=1)}
        tree = [0] + [1] * n
        for i in range(1, n + 1):  # the O(n) build: each node passes its sum to its parent
            parent = i + (i & -i)
            if parent <= n:
                tree[parent] += tree[i]
        self._tree = tree
