"""Per-proxy watermarks: a window closes as soon as every live proxy has handed over its events before the window's
end, and at end + grace otherwise.

A proxy's packed records carry its id and a watermark W (``topics.batches``): every event of that proxy for that
(topic, pool) with ``t_ms`` < W is in this record or an earlier one on the partition. Records are processed in
offset order per partition, so once the agent has folded a record, the watermark it carries holds for what the
agent has seen. ``WatermarkBook`` keeps, per pool, the newest watermark of every (event topic, proxy) — in memory
only: after a restart or a rebalance they are unknown until new records arrive, and windows close at end + grace
as before (never wrongly).

The rule (``close_horizon``, pure): the timer closes every window whose end + grace ≤ the horizon it is given
(``pool_state.tick``). A window [start, end) may close early — before end + grace — when the partition's horizon
is ≥ end and every live proxy of the pool has a watermark ≥ end on every event topic; with no live proxy or a
live proxy without a watermark on some topic it closes at end + grace. A silent or dead proxy therefore delays a
window by the grace at most, as without watermarks.

Live proxies (``live_proxies``, pure): those with a heartbeat for the pool within the heartbeat TTL of the
horizon, and those whose records (events or watermarks) for the pool were seen within the TTL — a proxy whose
events arrive before its first heartbeat reached the agent counts as live, and holds windows back until it
declares a watermark.

The one way an early close makes an event late that would have been counted: a proxy that the agent knows
nothing of yet (no heartbeat read, no record of its processed) hands over events of a window after the other
proxies' watermarks closed it — i.e. its first record reaches Kafka after end (+ the others' few ms), though
its events are older than the end. A proxy sends its first record (a watermark at least) as soon as its
producer connects and heartbeats at start, so this needs a proxy that starts within a few ms of a window's end
and is slow to connect; such events are counted as late and dead-lettered, as any late event.

Backend-metrics samples (from the controllers, not the proxies) carry no watermark: a window closed early uses
the samples read by then (``capacity_at`` at the window's end; a sample is kept for ``staleness``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tokenpools.topics.records import ProxyHeartbeat

Marks = Mapping[tuple[str, str], int]  # (event topic, proxy id) → watermark (ms)


def close_horizon(horizon_ms: int, width_ms: int, grace_ms: int, live: Iterable[str], marks: Marks,
                  topics: tuple[str, ...]) -> int:
    """The horizon to close this pool's windows by: ``horizon_ms`` itself, or — when there are live proxies and
    each has a watermark on every one of ``topics`` — end + grace of the last window whose end is ≤ the horizon
    and ≤ every live proxy's watermark (whichever is later)."""
    if width_ms <= 0:
        raise ValueError(f"`width_ms` must be positive, got {width_ms}")
    low = horizon_ms
    found = False
    for proxy in live:
        for topic in topics:
            mark = marks.get((topic, proxy))
            if mark is None:
                return horizon_ms
            low = min(low, mark)
        found = True
    if not found or not topics:
        return horizon_ms
    return max(horizon_ms, low // width_ms * width_ms + grace_ms)


def live_proxies(pool: str, horizon_ms: int, ttl_ms: int, heartbeats: Mapping[str, ProxyHeartbeat],
                 seen: Mapping[str, int]) -> set[str]:
    """Proxies with a heartbeat for ``pool`` within ``ttl_ms`` of the horizon, and proxies whose records for the pool
    were seen (``seen``: proxy → newest Kafka timestamp) within it."""
    live = {p for p, beat in heartbeats.items() if pool in beat.pools and horizon_ms - beat.t_ms <= ttl_ms}
    live |= {p for p, ts in seen.items() if horizon_ms - ts <= ttl_ms}
    return live


@dataclass(slots=True)
class _PoolMarks:
    partition: int
    marks: dict[tuple[str, str], int] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)


class WatermarkBook:
    """The newest watermark per (pool, event topic, proxy) and when each proxy was last seen, in memory."""

    def __init__(self, topics: tuple[str, ...], width_ms: int) -> None:
        if width_ms <= 0:
            raise ValueError(f"`width_ms` must be positive, got {width_ms}")
        self.topics = topics
        self.width_ms = width_ms
        self._pools: dict[str, _PoolMarks] = {}

    def _of(self, pool: str, partition: int) -> _PoolMarks:
        entry = self._pools.get(pool)
        if entry is None or entry.partition != partition:
            entry = self._pools[pool] = _PoolMarks(partition)
        return entry

    def note(self, pool: str, partition: int, topic: str, proxy: str, watermark_ms: int, seen_ms: int) -> bool:
        """A record of ``proxy`` with a watermark was folded. True when the watermark passed a window end (the
        timer may have a window to close early)."""
        entry = self._of(pool, partition)
        entry.seen[proxy] = max(entry.seen.get(proxy, seen_ms), seen_ms)
        if topic not in self.topics:
            return False
        key = (topic, proxy)
        old = entry.marks.get(key)
        if old is not None and old >= watermark_ms:
            return False
        entry.marks[key] = watermark_ms
        return old is None or old // self.width_ms < watermark_ms // self.width_ms

    def saw(self, pool: str, partition: int, proxy: str, seen_ms: int) -> None:
        """Events of ``proxy`` for ``pool`` were folded (from a record without a watermark)."""
        entry = self._of(pool, partition)
        entry.seen[proxy] = max(entry.seen.get(proxy, seen_ms), seen_ms)

    def marks(self, pool: str) -> dict[tuple[str, str], int]:
        entry = self._pools.get(pool)
        return dict(entry.marks) if entry else {}

    def horizon(self, pool: str, horizon_ms: int, grace_ms: int, ttl_ms: int,
                heartbeats: Mapping[str, ProxyHeartbeat]) -> int:
        """``close_horizon`` for ``pool`` with what is known; proxies not seen for ``ttl_ms`` are forgotten."""
        entry = self._pools.get(pool)
        if entry is None:
            return horizon_ms
        stale = [p for p, ts in entry.seen.items() if horizon_ms - ts > ttl_ms]
        for proxy in stale:
            del entry.seen[proxy]
            for topic in self.topics:
                entry.marks.pop((topic, proxy), None)
        live = live_proxies(pool, horizon_ms, ttl_ms, heartbeats, entry.seen)
        return close_horizon(horizon_ms, self.width_ms, grace_ms, live, entry.marks, self.topics)

    def counted_through(self, pool: str, now_ms: int, ttl_ms: int,
                        heartbeats: Mapping[str, ProxyHeartbeat]) -> tuple[int | None, set[str]]:
        """(the instant before which every live proxy of ``pool`` has handed over its events on every event topic,
        or None when some live proxy has stated no watermark yet; the live proxies). The counts instant."""
        entry = self._pools.get(pool)
        seen = entry.seen if entry else {}
        live = live_proxies(pool, now_ms, ttl_ms, heartbeats, seen)
        if not live or entry is None:
            return None, live
        low = now_ms
        for proxy in live:
            for topic in self.topics:
                mark = entry.marks.get((topic, proxy))
                if mark is None:
                    return None, live
                low = min(low, mark)
        return low, live

    def forget(self, partitions: Iterable[int] | None = None) -> None:
        """Drop what is known of these partitions' pools (all, with None): after a rebalance."""
        if partitions is None:
            self._pools.clear()
            return
        gone = set(partitions)
        for pool in [p for p, e in self._pools.items() if e.partition in gone]:
            del self._pools[pool]
