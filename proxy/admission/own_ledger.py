"""What this proxy itself did, by its own event time: the half of the counts design the agents cannot know.

The agents' counts of instant t (``topics.counts``) count every event with ``t_ms`` < t, the proxy's own
included, and reach the proxy some time later. To turn them into its limits (``core.fleet``) the proxy needs,
per entitlement, its own in flight *at t*, the tokens it charged less what it refunded *since t*, and whether it
was active at t (a request in flight, or an attempt in the demand window before t). ``OwnLedger`` keeps a short
log of its admissions, refusals and releases, stamped with the same wall-clock ``t_ms`` as the events it sends,
and answers those questions for any recent t (``at``). Entries older than ``horizon_ms`` are dropped: counts
that old are not followed anyway (the proxy's counts TTL).

Pure: time is an argument; the shell calls it on the admission path (one append per event).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OwnAt:
    """This proxy at instant t, per entitlement (absent: 0 / not active)."""

    in_flight: dict[str, int]  # its own requests in flight at t
    spent_since: dict[str, int]  # tokens it charged less tokens it refunded, from t to now
    active: frozenset[str]  # entitlements it was active for at t
    pool_in_flight: int  # Σ in_flight
    pool_active: bool  # any request of the pool in flight at t or attempted in the demand window before t


class OwnLedger:
    """One pool's own events at one proxy. Not thread-safe; lives on the event loop."""

    def __init__(self, demand_window_ms: int, horizon_ms: int) -> None:
        if demand_window_ms < 0 or horizon_ms <= 0:
            raise ValueError(f"`demand_window_ms` must be >= 0 and `horizon_ms` positive, got {demand_window_ms}, "
                             f"{horizon_ms}")
        self.demand_window_ms = demand_window_ms
        self.horizon_ms = horizon_ms + demand_window_ms  # an instant t needs the attempts of its demand window
        self._log: deque[tuple[int, str, int, int]] = deque()  # (t_ms, entitlement, Δ in flight, Δ tokens)
        self.in_flight: dict[str, int] = {}  # now
        self.largest_reservation_tokens = 0  # the largest reservation asked for so far (``core.fleet.token_budget``'s R)

    def admitted(self, name: str, t_ms: int, reserved_tokens: int) -> None:
        self.in_flight[name] = self.in_flight.get(name, 0) + 1
        self.largest_reservation_tokens = max(self.largest_reservation_tokens, reserved_tokens)
        self._append(t_ms, name, 1, reserved_tokens)

    def refused(self, name: str, t_ms: int, cost_tokens: int) -> None:
        self.largest_reservation_tokens = max(self.largest_reservation_tokens, cost_tokens)
        self._append(t_ms, name, 0, 0)

    def released(self, name: str, t_ms: int, refund_tokens: int) -> None:
        """An admitted request ended; ``refund_tokens`` = reserved − used (negative when it used more)."""
        n = self.in_flight.get(name, 0) - 1
        if n > 0:
            self.in_flight[name] = n
        else:
            self.in_flight.pop(name, None)
        self._append(t_ms, name, -1, -refund_tokens)

    def charged(self, name: str, t_ms: int, tokens: int) -> None:
        """An in-flight request was charged ``tokens`` past its reservation (a stream beyond its output estimate)."""
        self._append(t_ms, name, 0, tokens)

    def _append(self, t_ms: int, name: str, slots: int, tokens: int) -> None:
        log = self._log
        log.append((t_ms, name, slots, tokens))
        if log[0][0] < t_ms - self.horizon_ms:
            while log and log[0][0] < t_ms - self.horizon_ms:
                log.popleft()

    def at(self, t_ms: int) -> OwnAt:
        """This proxy at ``t_ms``: today's levels less what happened from ``t_ms`` on, and the demand before it."""
        in_flight = dict(self.in_flight)
        spent: dict[str, int] = {}
        attempted: set[str] = set()
        since = t_ms - self.demand_window_ms
        for at_ms, name, slots, tokens in reversed(self._log):
            if at_ms >= t_ms:
                if slots:
                    in_flight[name] = in_flight.get(name, 0) - slots
                if tokens:
                    spent[name] = spent.get(name, 0) + tokens
            elif at_ms >= since:
                if slots >= 0:  # an admission or a refusal; a release is not an attempt
                    attempted.add(name)
            else:
                break
        held = {name: n for name, n in in_flight.items() if n > 0}
        active = frozenset(attempted | set(held))
        return OwnAt(held, spent, active, sum(held.values()), bool(active))
