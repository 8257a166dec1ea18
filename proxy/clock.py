"""The proxy's only clock. Logic takes time as an argument; this shell object is what supplies it.

``now_s`` is monotonic (durations, token-bucket refill, TTLs); ``wall_ms`` is epoch milliseconds (event
timestamps on the wire). Tests pass a fake with the same two methods.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float: ...

    def wall_ms(self) -> int: ...


class SystemClock:
    __slots__ = ()

    def now_s(self) -> float:
        return time.monotonic()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000
