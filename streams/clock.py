"""The agents' only clock. Logic takes time as an argument; this shell object supplies it (tests pass a fake).

``wall_ms`` is epoch milliseconds (event time, the control tick's horizon); ``now_s`` is monotonic (rate limits).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def wall_ms(self) -> int: ...

    def now_s(self) -> float: ...


class SystemClock:
    __slots__ = ()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def now_s(self) -> float:
        return time.monotonic()
