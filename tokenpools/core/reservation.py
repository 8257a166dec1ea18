"""How many output tokens to reserve for a request: a running high quantile of the completions seen, never above
``max_tokens`` (docs/reservations.md).

Reserving ``max_tokens`` is always safe but, for a client that sends none, the pool default is several times what
it produces, so the tokens/s bucket admits a fraction of what the backend could serve. Settlement is exact
whatever is reserved (``AdmissionController.release`` refunds or charges the difference), so the reservation only
decides *when* tokens are charged, not *how many*: a reservation below the real use moves part of the charge to
completion (or, for a stream, to the moment it is produced).

Per (entitlement, max_tokens class) this keeps the completion tokens of the last ``window_completions``
completions, in arrival order (a ring) and sorted (a list kept with ``bisect``). The class is the bit length of
``max_tokens`` — powers of two: (2^(k-1), 2^k] — so requests with similar caps share a distribution and the
number of keys per entitlement is at most ~20. An update costs O(log N) comparisons plus one ``list.insert`` and
one ``del`` (memmoves of at most N pointers, N ≤ a few hundred: well under a microsecond); a query is O(1).
Memory is bounded: N values per key. Nothing here reads a clock: the order of ``observe`` calls is the
completions' order, which the proxy and the replayer both supply.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class ReservationConfig:
    """``quantile``: q in (0, 1]; 1.0 turns the estimate off (reserve ``max_tokens``, the conservative reading of
    "the highest output a request may produce"). ``window_completions``: N, how many recent completions per key the
    quantile is taken over. ``min_completions``: below this many completions for a key, reserve ``max_tokens``."""

    quantile: float = 0.95
    window_completions: int = 256
    min_completions: int = 20

    def __post_init__(self) -> None:
        if not 0.0 < self.quantile <= 1.0:
            raise ValueError(f"`quantile` must be in (0, 1], got {self.quantile}")
        if self.window_completions < 1:
            raise ValueError(f"`window_completions` must be >= 1, got {self.window_completions}")
        if not 1 <= self.min_completions <= self.window_completions:
            raise ValueError(f"`min_completions` must be in [1, window_completions={self.window_completions}], "
                             f"got {self.min_completions}")

    @property
    def enabled(self) -> bool:
        return self.quantile < 1.0


OFF = ReservationConfig(quantile=1.0)

_bisect_left: Final = bisect_left  # (Final: compiled, C statics, not a module lookup per call)
_bisect_right: Final = bisect_right


class _Window:
    """The last N values of one key, in arrival order (a ring: ``ring[next]`` is the oldest once it is full) and
    sorted."""

    __slots__ = ("ring", "size", "next", "ordered")

    def __init__(self, size: int) -> None:
        self.ring: list[int] = []
        self.size = size
        self.next = 0  # where the next value goes once the ring is full (the oldest's place)
        self.ordered: list[int] = []

    def add(self, value: int) -> None:
        ring, ordered = self.ring, self.ordered
        if len(ring) < self.size:
            ring.append(value)
        else:  # the oldest leaves
            position = self.next
            ordered.pop(_bisect_left(ordered, ring[position]))
            ring[position] = value
            self.next = position + 1 if position + 1 < self.size else 0
        ordered.insert(_bisect_right(ordered, value), value)  # (insort)


class OutputEstimator:
    """Per (entitlement, max_tokens class) running quantile of completion tokens. One per pool at one proxy."""

    __slots__ = ("config", "_windows")

    def __init__(self, config: ReservationConfig = OFF) -> None:
        self.config = config
        self._windows: dict[tuple[str, int], _Window] = {}

    def estimate(self, entitlement: str, max_tokens: int) -> int:
        """The output tokens to reserve: min(max_tokens, the q-quantile of the key's window) once the key has
        ``min_completions`` completions, else ``max_tokens``. The quantile is the nearest-rank one: the
        ⌈q·n⌉-th smallest of the n values held."""
        config = self.config
        if config.quantile >= 1.0:
            return max_tokens
        window = self._windows.get((entitlement, max_tokens.bit_length()))
        if window is None:
            return max_tokens
        ordered = window.ordered
        n = len(ordered)
        if n < config.min_completions:
            return max_tokens
        rank = math.ceil(config.quantile * n - 1e-9)  # ⌈q·n⌉, not one rank higher for 0.95·20 = 19.000…01
        value = ordered[min(n, max(1, rank)) - 1]
        return value if value < max_tokens else max_tokens

    def observe(self, entitlement: str, max_tokens: int, completion_tokens: int) -> None:
        """Learn one finished request's completion tokens (only requests that ran to their end: a truncated
        count would bias the quantile low)."""
        if self.config.quantile >= 1.0:
            return
        if completion_tokens < 0 or max_tokens < 0:
            raise ValueError(f"tokens must be >= 0, got max_tokens={max_tokens}, completion={completion_tokens}")
        key = (entitlement, max_tokens.bit_length())
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = _Window(self.config.window_completions)
        window.add(min(completion_tokens, max_tokens) if max_tokens else completion_tokens)

    def forget(self, entitlement: str) -> None:
        """Drop an entitlement's windows (it left the pool)."""
        for key in [k for k in self._windows if k[0] == entitlement]:
            del self._windows[key]

    def samples(self, entitlement: str, max_tokens: int) -> int:
        window = self._windows.get((entitlement, max_tokens.bit_length()))
        return len(window.ring) if window is not None else 0
