"""The proxy's watermarks: "every event of mine for this (topic, pool) with t_ms < W is in this record or before".

The agents close a window as soon as every live proxy's watermark has passed its end instead of waiting out the
grace (``streams.watermarks``), so a watermark must never run ahead of an event the proxy has not handed over yet.
The event pipeline keeps, per watermarked (topic, key), the event times of its *outstanding* events — emitted and
not yet delivered: in the queue, held by the sender, in flight in the producer (a failed delivery goes to the
spool and would come after a later record), in the spool or being drained. An event leaves the set only when the
broker acknowledged it, or when it was dropped for good. A record's watermark is then

    W = min(now, the oldest outstanding event time, leaving out the events of the same producer batch)

(``now`` from the proxy's clock: an event emitted later is stamped later, since the handlers stamp ``t_ms`` and
emit without awaiting in between; one stamped below a watermark already declared — a wall clock stepped back — is
counted as a violation). The events of the record itself and of the records before it in the same producer batch
are left out: a batch is appended by the broker whole or not at all. A watermark-only record (an envelope with no
events) states ``W = min(now, oldest outstanding)``: everything older was acknowledged, so it is earlier on the
partition whatever the order of sends. The sender sends one per key at most every ``interval_s`` when the key sent
nothing else in that time, so an idle proxy does not hold windows back. While the broker is away (degraded) none
are sent; the drain's records carry watermarks, held at the oldest event still in the spool.

A spool line that turns out corrupt in the drain holds its key's watermark until the process restarts (its event
is lost and its time unknown): the agents then close that pool's windows at end + grace, as without watermarks.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

Key = tuple[str, str]  # (topic, key = pool)


@dataclass(frozen=True, slots=True)
class WatermarkOptions:
    """``proxy_id``: this proxy (the agents tell the proxies apart by it); ``keys``: the (event topic, pool) pairs it
    sends watermarks for even when idle (its pools × requests and completions); other keys of ``topics`` get
    watermarks once they had an event; ``interval_s``: an idle key's watermark-only record at most this often."""

    proxy_id: str
    topics: tuple[str, ...]
    pools: tuple[str, ...] = ()
    interval_s: float = 0.1

    def __post_init__(self) -> None:
        if not self.proxy_id:
            raise ValueError("`proxy_id` must not be empty")
        if not self.topics:
            raise ValueError("`topics` must name at least one event topic")
        if not 0.005 <= self.interval_s <= 60:
            raise ValueError(f"`interval_s` must be in 0.005..60 s, got {self.interval_s}")

    @property
    def keys(self) -> tuple[Key, ...]:
        return tuple((t, p) for t in self.topics for p in self.pools)


class Outstanding:
    """A multiset of event times (ms) with the minimum at hand: a heap of distinct times and their counts."""

    __slots__ = ("_heap", "_counts", "size")

    def __init__(self) -> None:
        self._heap: list[int] = []
        self._counts: dict[int, int] = {}
        self.size = 0

    def add(self, t_ms: int) -> None:
        n = self._counts.get(t_ms, 0)
        if n == 0:
            heapq.heappush(self._heap, t_ms)
        self._counts[t_ms] = n + 1
        self.size += 1

    def remove(self, t_ms: int) -> None:
        n = self._counts.get(t_ms, 0)
        if n == 0:
            raise KeyError(f"no outstanding event at {t_ms}")
        if n == 1:
            del self._counts[t_ms]
        else:
            self._counts[t_ms] = n - 1
        self.size -= 1

    def low(self, leaving_out: Counter[int] | None = None) -> int | None:
        """The oldest time, leaving out ``leaving_out`` (a multiset of times known to be in this set)."""
        heap, counts = self._heap, self._counts
        while heap and heap[0] not in counts:
            heapq.heappop(heap)  # removed lazily
        if not leaving_out or not heap:
            return heap[0] if heap else None
        stash = []
        while heap:
            t = heap[0]
            if t not in counts:
                heapq.heappop(heap)
                continue
            if counts[t] > leaving_out.get(t, 0):
                break
            stash.append(heapq.heappop(heap))
        found = heap[0] if heap else None
        for t in stash:
            heapq.heappush(heap, t)
        return found


class WatermarkTracker:
    """The outstanding event times per watermarked key, and the watermark each record may state."""

    def __init__(self, options: WatermarkOptions) -> None:
        self.options = options
        self.topics = frozenset(options.topics)
        self._keys: dict[Key, Outstanding] = {k: Outstanding() for k in options.keys}
        self.declared: dict[Key, int] = {}  # the highest watermark stated per key
        self._stated_at: dict[Key, float] = {}  # when (monotonic s) a record last stated a watermark for the key
        self.violations = 0  # events emitted with t_ms below a watermark already stated for their key

    def keys(self) -> list[Key]:
        return [k for k in self._keys if k[1]]

    def tracks(self, topic: str) -> bool:
        return topic in self.topics

    def add(self, topic: str, key: str, t_ms: int) -> None:
        k = (topic, key)
        out = self._keys.get(k)
        if out is None:
            out = self._keys[k] = Outstanding()
        declared = self.declared.get(k)
        if declared is not None and t_ms < declared:
            self.violations += 1
        out.add(t_ms)

    def done(self, topic: str, key: str, t_ms: int | None) -> None:
        """Delivered or dropped for good: the event no longer holds the watermark."""
        out = self._keys.get((topic, key))
        if out is not None and t_ms is not None and out.size:
            try:
                out.remove(t_ms)
            except KeyError:  # not one of ours (a spooled event of an untracked run): nothing held
                pass

    def watermark(self, topic: str, key: str, now_ms: int, leaving_out: Iterable[int] = ()) -> int:
        k = (topic, key)
        out = self._keys.get(k)
        excluded = Counter(leaving_out)
        low = out.low(excluded) if out is not None else None
        mark = now_ms if low is None else min(now_ms, low)
        if mark > self.declared.get(k, -1):
            self.declared[k] = mark
        return mark

    def stated(self, topic: str, key: str, now_s: float) -> None:
        """A record with a watermark for the key went out at ``now_s``: its idle-key record is due later."""
        self._stated_at[(topic, key)] = now_s

    def due(self, now_s: float) -> tuple[list[Key], float]:
        """The keys whose last watermark went out ``interval_s`` or more ago (or never): each is owed a
        watermark-only record now; and how long until the next of the others falls due (5 ms..``interval_s``)."""
        interval_s = self.options.interval_s
        due: list[Key] = []
        waits = [interval_s]
        for k in self.keys():
            at = self._stated_at.get(k, -1e18)
            if now_s - at >= interval_s:
                due.append(k)
            else:
                waits.append(at + interval_s - now_s)
        return due, max(0.005, min(waits))

    def outstanding(self, topic: str, key: str) -> int:
        out = self._keys.get((topic, key))
        return out.size if out is not None else 0
