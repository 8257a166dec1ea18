"""What the agents see of the world at a tick: a pool's ``PoolView`` over the runtime's spec catalogue, and the
newest heartbeat of every proxy replica.

The catalogue itself (``tokenpools.runtime.specs``) is shared with the other components; the view is the agents'
own, so it is built here, as a function of the catalogue.
"""

from __future__ import annotations

from tokenpools.runtime.specs import Catalogue
from tokenpools.streams.table.pool_state import PoolView
from tokenpools.topics.records import ProxyHeartbeat


def pool_view(catalogue: Catalogue, pool: str) -> PoolView | None:
    """The pool's spec and all its entitlements (oldest first, statuses applied); None for an unknown pool."""
    spec = catalogue.pool(pool)
    return None if spec is None else PoolView(spec, catalogue.entitlements_of(pool), catalogue.history_of(pool))


class ProxyBook:
    """The newest heartbeat of every proxy replica (from the compacted heartbeats topic)."""

    def __init__(self) -> None:
        self._beats: dict[str, ProxyHeartbeat] = {}

    def apply(self, beat: ProxyHeartbeat) -> bool:
        """Keep the newer heartbeat; False when ``beat`` is older than the one known (a replayed record)."""
        known = self._beats.get(beat.proxy_id)
        if known is not None and known.t_ms > beat.t_ms:
            return False
        self._beats[beat.proxy_id] = beat
        return True

    def forget(self, proxy_id: str) -> None:
        self._beats.pop(proxy_id, None)

    def snapshot(self) -> dict[str, ProxyHeartbeat]:
        return dict(self._beats)
