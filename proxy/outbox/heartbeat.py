"""Every few seconds: "proxy X is alive and serves pools P". The agents split limits across live proxies."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

from tokenpools.proxy.outbox.events import EventPipeline
from tokenpools.runtime.clock import Clock
from tokenpools.topics.records import ProxyHeartbeat


def heartbeat(proxy_id: str, pools: tuple[str, ...], started_ms: int, clock: Clock) -> ProxyHeartbeat:
    return ProxyHeartbeat(proxy_id=proxy_id, t_ms=clock.wall_ms(), pools=pools, started_ms=started_ms)


async def beat(events: EventPipeline, topic: str, proxy_id: str, pools: Collection[str], clock: Clock,
               interval_s: float) -> None:
    """``pools``: the proxy's pools as they are at each beat (the live dict: pools come and go with the specs)."""
    started_ms = clock.wall_ms()
    while True:
        events.emit(topic, proxy_id, heartbeat(proxy_id, tuple(pools), started_ms, clock))
        await asyncio.sleep(interval_s)
