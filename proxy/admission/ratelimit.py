"""OpenAI's rate-limit headers, from the entitlement's live state at its admission decision (pure).

Clients written for OpenAI read ``x-ratelimit-*`` to pace themselves. Token pools has no requests-per-minute or
tokens-per-minute window; each header maps onto the limit that plays that part here:

| header | here |
|---|---|
| ``x-ratelimit-limit-requests`` | the entitlement's concurrency limit at this proxy (requests in flight at once) |
| ``x-ratelimit-remaining-requests`` | that limit less the requests it has in flight, after this decision |
| ``x-ratelimit-reset-requests`` | when a slot frees: ``0s`` while one is free, else the wait a concurrency refusal would carry (k × S ÷ n) |
| ``x-ratelimit-limit-tokens`` | the token bucket's depth: tokens/s limit × the pool's ``tokenBucketWindowSeconds`` |
| ``x-ratelimit-remaining-tokens`` | the bucket's level, after this decision's reservation (whole tokens, rounded down) |
| ``x-ratelimit-reset-tokens`` | when the bucket is full again at the current refill rate |

Durations use OpenAI's format: ``20ms``, ``1.5s``, ``6m0s``, ``1h2m3s``. They describe this proxy's view at the
decision; with several proxies the limits are this proxy's share of the fleet's. A refusal carries them as well,
beside its ``Retry-After``.
"""

from __future__ import annotations

import math
from typing import Protocol

from tokenpools.core.admission import EntitlementLimits


class LimitState(Protocol):
    """What the headers read of the pool's admission controller."""

    token_bucket_window_s: float

    def limits_of(self, name: str) -> EntitlementLimits: ...

    def in_flight_of(self, name: str) -> int: ...

    def bucket_tokens_of(self, name: str, now_s: float) -> float: ...

    def next_slot_ms(self, name: str) -> int: ...


def openai_duration(seconds: float) -> str:
    """``0s``, ``20ms``, ``1.5s``, ``6m0s``, ``1h2m3s``: milliseconds below a second, whole minutes and hours above."""
    if seconds <= 0:
        return "0s"
    ms = math.ceil(seconds * 1000)
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:g}s"
    total_s = math.ceil(ms / 1000)
    hours, rest = divmod(total_s, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes}m{secs}s" if hours else f"{minutes}m{secs}s"


def ratelimit_headers(state: LimitState, name: str, now_s: float) -> dict[str, str]:
    """The six headers for entitlement ``name``; none for one the controller does not hold (not admitted here)."""
    try:
        limits = state.limits_of(name)
    except KeyError:
        return {}
    depth = limits.tokens_per_s * state.token_bucket_window_s
    level = min(depth, max(0.0, state.bucket_tokens_of(name, now_s)))
    refill_s = (depth - level) / limits.tokens_per_s if limits.tokens_per_s > 0 else 0.0
    return {
        "x-ratelimit-limit-requests": str(limits.concurrency),
        "x-ratelimit-remaining-requests": str(max(0, limits.concurrency - state.in_flight_of(name))),
        "x-ratelimit-reset-requests": openai_duration(state.next_slot_ms(name) / 1000),
        "x-ratelimit-limit-tokens": str(math.floor(depth)),
        "x-ratelimit-remaining-tokens": str(math.floor(level)),
        "x-ratelimit-reset-tokens": openai_duration(refill_s),
    }
