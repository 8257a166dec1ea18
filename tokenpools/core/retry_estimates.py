"""Retry estimates: when a request a limit just refused would pass the same check, nothing else happening
(docs/semantics.md#retry-after), and the service times those estimates learn from.

``core.admission`` puts them on its refusals as ``retry_after_ms``, and ``retry_after_s`` = ceil(ms / 1000), at
least 1 (HTTP's whole seconds); the proxy's queue (``core.waiting``) compares the uncapped slot estimate with a
request's deadline; the rate-limit headers give the next slot:

- token budget: the exact millisecond at which the bucket holds the cost at the current rate (the smallest whole ms
  at which ``admit`` would pass, nothing else happening: ``bucket_fits`` is ``admit``'s own refill arithmetic); a
  cost above the bucket's depth never fits: the bucket's window (60 s at a zero rate), as a sign to stop retrying;
- concurrency, KV, low priority: when enough slots free, k × S ÷ n, where n is the requests in flight (the
  entitlement's, or the pool's for low priority), k the releases the check needs and S the mean time a request
  holds its slot, an EWMA (``service_ewma_alpha``) of admission → release learned from every release
  (``learn_service_s``), one per entitlement and one for the pool: O(1) per decision. An entitlement with no
  release yet uses the pool's; with none at all, or nothing in flight, the ceiling. Clamped to
  [``retry_floor_ms``, ``retry_after_s`` × 1000] (``slot_wait_ms``); the queue's estimate has the floor but no
  ceiling, and is None where there is nothing to estimate from (``slot_estimate_ms``).

Pure arithmetic on numbers: the controller owns the state and passes what each estimate reads. Compiled with
``core.admission`` (``tokenpools.accel``), so its calls into this module are native.
"""

from __future__ import annotations

import math
from typing import Final

NEVER_FITS_AT_ZERO_RATE_S: Final = 60  # the wait of a token-budget refusal whose bucket does not refill at all


def whole_seconds(wait_ms: int) -> int:
    """``retry_after_s`` of a wait: whole seconds rounded up, at least 1 (HTTP's ``Retry-After``)."""
    return max(1, math.ceil(wait_ms / 1000))


def learn_service_s(mean_s: float, held_s: float, alpha: float) -> float:
    """One step of the EWMA of how long a request holds its slot: the first sample as it is (0: nothing learned)."""
    return held_s if mean_s == 0 else mean_s + alpha * (held_s - mean_s)


def bucket_fits(cost: int, level: float, updated_s: float, depth: float, rate: float, now_s: float, ms: int) -> bool:
    """Whether a bucket at ``level`` at ``updated_s`` holds ``cost`` at ``now_s + ms / 1000``: ``admit``'s own refill
    arithmetic (``budget_wait_ms`` searches the first whole ms at which it does)."""
    elapsed = (now_s + ms / 1000) - updated_s
    return cost <= (min(depth, level + elapsed * rate) if elapsed > 0 else level)


def budget_wait_ms(cost: int, level: float, updated_s: float, depth: float, rate: float, now_s: float) -> int:
    """The smallest whole ms after ``now_s`` at which a bucket refilling at ``rate > 0`` up to ``depth >= cost``
    holds ``cost``: the closed form, then a step or two either way for float rounding."""
    wait_ms = max(1, math.ceil((cost - level) / rate * 1000))
    while wait_ms > 1 and bucket_fits(cost, level, updated_s, depth, rate, now_s, wait_ms - 1):
        wait_ms -= 1
    while not bucket_fits(cost, level, updated_s, depth, rate, now_s, wait_ms):
        wait_ms += 1
    return wait_ms


def never_fits_wait_s(window_s: float, rate: float) -> int:
    """The wait of a cost the bucket can never hold at this rate: its window (60 s at a zero rate), at least 1 s."""
    return max(1, math.ceil(window_s) if rate > 0 else NEVER_FITS_AT_ZERO_RATE_S)


def slot_wait_ms(service_s: float, pool_service_s: float, in_flight: int, releases: int, floor_ms: int,
                 ceiling_ms: int) -> int:
    """k × S ÷ n for a refusal's ``retry_after_ms``: ``releases`` slots to free among ``in_flight`` requests, each
    holding one for ``service_s`` (the pool's ``pool_service_s`` while that is 0), clamped to [floor, ceiling]; the
    ceiling when nothing was learned or nothing is in flight."""
    mean_s = service_s if service_s > 0 else pool_service_s
    if mean_s > 0 and in_flight > 0:
        return min(ceiling_ms, max(floor_ms, math.ceil(max(1, releases) * mean_s / in_flight * 1000)))
    return ceiling_ms


def slot_estimate_ms(service_s: float, in_flight: int, releases: int, floor_ms: int) -> int | None:
    """k × S ÷ n for the queue: at least ``floor_ms``, not capped; None when nothing was learned (``service_s`` 0) or
    nothing is in flight: there is no estimate then, not a long one."""
    if service_s <= 0 or in_flight <= 0:
        return None
    return max(floor_ms, math.ceil(max(1, releases) * service_s / in_flight * 1000))
