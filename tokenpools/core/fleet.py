"""The ``counts`` design's pure rules: what one proxy may hold, given the fleet's counts at the last counts instant.

Every ``counts_interval_s`` the agents publish, per entitlement e (and for the pool), at that instant t (event time):
the fleet in flight N_e, the number A_e of active proxies (below), and the
fleet token bucket level B_e (refilled at the limit, charged by the fleet's admissions, refunded at settlement).
A proxy knows its own in flight at t (it records its own count at every counts instant) and whether it was active. From them, with headroom H = max(0, L − N) and P proxies:

- **growth** g = min(H, max(1, ⌈f · H / A⌉)) for an active proxy; a proxy that saw no demand counts itself in:
  g = min(H, max(1, ⌈f · H / min(P, A + 1)⌉)); g = 0 when H = 0. When the fleet holds more than L (the limit
  was lowered or capacity lost), the proxy's share is ⌊own · L / N⌋ instead (Σ over the fleet ≤ L; one proxy: L),
  so the excess drains as requests end. Otherwise the proxy may hold own + g slots until the next
  counts arrive. With one proxy g = H (any f ≥ 1), so it decides as the exact enforcer. Summed over the fleet, the
  most one record lets the fleet grow is ``growth_bound`` = A⌈fH/A⌉ + (P − A)⌈fH/min(P, A + 1)⌉ (every proxy
  growing at once), so the limits in force from one record hold the fleet to N + Σ g; only proxies that receive
  requests grow, so in practice the overshoot is bounded by the admissions in one interval plus the delay (see
  docs/fleet.md);
- **token budget** b = min(B, max(R, f · B / A)) for an active proxy, min(B, max(R, f · B / min(P, A + 1))) for
  another one (R: the largest reservation a request can make, so a proxy can always take one request the fleet
  has tokens for), ≤ B. The proxy's bucket keeps the fleet's rate and depth (it only ever sees its own spending,
  so it is at least as full as the fleet's); when the counts of instant t arrive at t_a it is lowered, never
  raised, to the budget b plus the refill since t less what the proxy itself spent since t (charges less refunds,
  which it records like its own in flight): level = min(level, b + r·(t_a − t) − spent) (``bucket_level``,
  applied with ``AdmissionController.set_bucket_tokens``). So from t on a proxy spends at most b plus the refill,
  and with one proxy the cap never binds below its level (b = B, its own bucket): it decides as the exact one;
- the **pool** is one more row: its concurrency is treated as one more limit, with the fleet's pool in flight, so
  the contention check sees the fleet's pool, not a per-proxy split.

A proxy is *active* for e when it saw a request for e in the last ``demand_window_s`` or holds one in flight.
"""

from __future__ import annotations

import math


def growth(headroom: int, active: int, proxies: int, was_active: bool, fraction: float) -> int:
    """How many slots beyond its own in flight a proxy may take until the next counts (g above)."""
    if headroom <= 0:
        return 0
    if math.isinf(fraction):
        return headroom  # unbounded: every proxy may take the whole headroom
    among = active if was_active and active > 0 else min(proxies, active + 1)
    return min(headroom, max(1, math.ceil(fraction * headroom / among)))


def slot_share(limit: int, fleet_in_flight: int, own: int, active: int, proxies: int, was_active: bool,
               fraction: float) -> int:
    """The concurrency a proxy enforces: its own in flight at the counts instant plus its growth; when the fleet
    holds more than the limit (a limit lowered, capacity lost), its proportional part of the limit,
    ⌊own · L / N⌋, so the fleet shrinks back to the limit as requests end instead of refilling what ends."""
    if fleet_in_flight > limit:
        return min(own, own * max(0, limit) // fleet_in_flight)
    return own + growth(limit - fleet_in_flight, active, proxies, was_active, fraction)


def growth_bound(headroom: int, active: int, proxies: int, fraction: float) -> int:
    """The most the whole fleet can grow on one counts record: every proxy takes its g at once."""
    if headroom <= 0:
        return 0
    active = min(active, proxies)
    g_active = growth(headroom, active, proxies, True, fraction) if active else 0
    return active * g_active + (proxies - active) * growth(headroom, active, proxies, False, fraction)


def token_budget(bucket: float, active: int, proxies: int, was_active: bool, fraction: float,
                 reservation_tokens: float) -> float:
    """The tokens a proxy may spend from the counts instant on (b above; never above the fleet bucket B)."""
    if bucket <= 0:
        return bucket  # the fleet is overdrawn: nothing to spend until the refill brings it back
    among = active if was_active and active > 0 else min(proxies, active + 1)
    return min(bucket, max(reservation_tokens, fraction * bucket / among))


def bucket_level(level: float, budget: float, tokens_per_s: float, since_counts_s: float, spent: float) -> float:
    """The proxy's bucket level once the counts arrive: its own level, capped by what the counts leave it."""
    return min(level, budget + tokens_per_s * since_counts_s - spent)
