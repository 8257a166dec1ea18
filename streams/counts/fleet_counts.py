"""The fleet's counts of one pool, kept in event time for the counts records the agents publish (docs/fleet.md).

Every ``counts_interval_ms`` the agents tell the proxies of a pool, per entitlement and for the pool, how many
requests are in flight across the fleet, how many proxies are active and how full the fleet's token bucket is,
all as of one instant t (``topics.counts``). A proxy combines that with what it knows of itself at t
(``proxy.own_ledger``) to decide what it may admit until the next record (``core.fleet``).

``FleetCounts`` (one per pool, in memory) is the pure part. ``note`` takes the pool's admissions, refusals and
completions in any order, as the partitions deliver them; ``advance(t_ms, ...)`` applies, in event-time order,
those before t and leaves the rest pending; ``record`` reads the counts at the instant reached. An event that
arrives for an instant already passed (only a proxy with no watermark can send one) is applied at once: the
counts stay right, only its order in the bucket is lost. So identical events give identical records however
the batches were cut.

- in flight N_e: admissions less completions, per proxy (never below 0: a completion of a request admitted before
  this worker started). A proxy that is no longer live (``record``'s ``live``) takes its requests with it;
- active A_e: proxies with a request of e in flight at t or an attempt (admitted or refused) in the
  ``demand_window_ms`` before t; the pool's: the same over all its entitlements;
- bucket B_e: refilled at the entitlement's current tokens/s limit up to its depth (rate × the pool's
  ``token_bucket_window_s``), charged by admissions' reservations, refunded at completion (reserved − used, which
  may be negative), exactly as one proxy's bucket would be if it had seen every request. It starts full.
- reserved R_e: per proxy, the tokens its requests admitted and not completed reserved (+ an admission's
  ``cost_tokens``, − a completion's ``reserved_tokens``: ``core.budget_reservations.reserve``). Not in the
  counts record: the budget records carry it (``reserved``, read by ``streams.ledger_shell``), so a proxy spends
  the other proxies' reservations in flight (docs/budgets.md#the-others-reservations-in-flight). A proxy whose
  in-flight count falls to 0 has nothing reserved either.

A sharded pool (docs/scaling.md#the-two-stage-topology) has one ``FleetCounts`` per shard, on the worker that folds
the shard's events: it sees every event of the shard's entitlements, so their N_e, A_e and B_e are exact, and its
pool row is the shard's subtotal: the proxies add up the in flight, and count the pool's active proxies as the
union of the ids each shard's record carries (a proxy active in two shards is one).

Kept in memory, not in the changelog: after a restart or a rebalance the worker seeds the in-flight levels and
their reserved tokens from the pool's state (``seed``), which counts every folded admission and completion
(``pool_state.track_in_flight``), and starts the buckets full, so the first records after a takeover err towards
admitting for at most one bucket depth. The budget records after a takeover carry the reservations of the requests
then in flight, as the old worker's did.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tokenpools.core.budget_reservations import reserve
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.topics.counts import CountsRecord, counts_record
from tokenpools.topics.records import RequestCompleted, RequestDecided

_ADMIT, _REFUSE, _COMPLETE = 0, 1, 2


@dataclass(slots=True)
class _Entitlement:
    in_flight: dict[str, int] = field(default_factory=dict)  # proxy → level at the cursor (only > 0)
    reserved: dict[str, int] = field(default_factory=dict)  # proxy → tokens its requests in flight reserved (> 0)
    last_attempt_ms: dict[str, int] = field(default_factory=dict)  # proxy → its newest attempt before the cursor
    bucket: float | None = None  # tokens at ``bucket_ms``; None: full (no rate known yet)
    bucket_ms: int = 0


@dataclass(frozen=True, slots=True)
class Rate:
    """An entitlement's current token limit as its bucket uses it."""

    tokens_per_s: float
    depth_tokens: float


class FleetCounts:
    """One pool's fleet counts: pending events, and the levels at ``cursor_ms``."""

    def __init__(self, pool: str, demand_window_ms: int) -> None:
        if demand_window_ms < 0:
            raise ValueError(f"`demand_window_ms` must be >= 0, got {demand_window_ms}")
        self.pool = pool
        self.demand_window_ms = demand_window_ms
        self.cursor_ms: int | None = None
        # heap of (t_ms, seq, kind, entitlement, proxy, the bucket's tokens, the reservation's tokens)
        self._pending: list[tuple[int, int, int, str, str, int, int]] = []
        self._seq = 0
        self._of: dict[str, _Entitlement] = {}

    # ---- input -------------------------------------------------------------------------------------------------
    def note(self, records: Iterable[RequestDecided | RequestCompleted]) -> None:
        """Admissions, refusals and completions of this pool (other records and unknown keys are skipped)."""
        for record in records:
            name = record.entitlement
            if name is None or record.pool != self.pool:
                continue
            if isinstance(record, RequestDecided):
                admitted = record.outcome is AdmissionOutcome.ADMITTED
                kind, tokens = (_ADMIT, record.cost_tokens) if admitted else (_REFUSE, 0)
                reserved = tokens
            else:
                kind = _COMPLETE
                tokens = record.reserved_tokens - record.prompt_tokens - record.completion_tokens  # the refund
                reserved = -record.reserved_tokens
            self._seq += 1
            heapq.heappush(self._pending, (record.t_ms, self._seq, kind, name, record.proxy_id, tokens, reserved))

    def seed(self, in_flight: Mapping[str, Mapping[str, int]],
             reserved: Mapping[str, Mapping[str, int]] | None = None) -> None:
        """Start from these per-proxy in-flight levels (entitlement → proxy → n), e.g. a restored pool state's, and
        the tokens those requests reserved (the state's ``reserved``; a proxy with nothing in flight reserves
        nothing, and a sum below 0 counts as 0)."""
        for name, per_proxy in in_flight.items():
            entry = self._of.setdefault(name, _Entitlement())
            tokens = (reserved or {}).get(name, {})
            for proxy, n in per_proxy.items():
                if n > 0:
                    entry.in_flight[proxy] = n
                    if tokens.get(proxy, 0) > 0:
                        entry.reserved[proxy] = tokens[proxy]

    # ---- advance -----------------------------------------------------------------------------------------------
    def advance(self, t_ms: int, rates: Mapping[str, Rate]) -> None:
        """Apply, in event-time order, every pending event before ``t_ms``; the cursor moves to ``t_ms``.

        ``rates`` are the entitlements' current token limits (absent: the bucket is left as it is)."""
        start = self.cursor_ms
        end = t_ms if start is None else max(t_ms, start)  # an instant already passed: apply what came for it
        pending = self._pending
        while pending and pending[0][0] < end:
            at_ms, _, kind, name, proxy, tokens, reserved = heapq.heappop(pending)
            self._apply(at_ms if start is None else max(at_ms, start), kind, name, proxy, tokens, reserved,
                        rates.get(name))
        self.cursor_ms = end

    def _apply(self, at_ms: int, kind: int, name: str, proxy: str, tokens: int, reserved: int,
               rate: Rate | None) -> None:
        entry = self._of.get(name)
        if entry is None:
            entry = self._of[name] = _Entitlement()
        if kind == _COMPLETE:
            n = entry.in_flight.get(proxy, 0) - 1
            if n > 0:
                entry.in_flight[proxy] = n
                reserve(entry.reserved, proxy, reserved)
            else:  # nothing in flight: nothing reserved (whatever a takeover left the level at)
                entry.in_flight.pop(proxy, None)
                entry.reserved.pop(proxy, None)
            self._charge(entry, at_ms, -tokens, rate)
            return
        entry.last_attempt_ms[proxy] = max(at_ms, entry.last_attempt_ms.get(proxy, at_ms))
        if kind == _ADMIT:
            entry.in_flight[proxy] = entry.in_flight.get(proxy, 0) + 1
            reserve(entry.reserved, proxy, reserved)
            self._charge(entry, at_ms, tokens, rate)

    @staticmethod
    def _charge(entry: _Entitlement, at_ms: int, tokens: int, rate: Rate | None) -> None:
        if rate is None:
            return
        level = _refilled(entry, at_ms, rate)
        entry.bucket = min(rate.depth_tokens, level - tokens)
        entry.bucket_ms = at_ms

    # ---- output ------------------------------------------------------------------------------------------------
    def reserved(self, name: str) -> dict[str, int]:
        """Entitlement ``name``'s reserved tokens in flight per proxy at the cursor (empty before any ``advance``)."""
        entry = self._of.get(name)
        return dict(entry.reserved) if entry is not None else {}

    def record(self, limits_version: int, names: Iterable[str], rates: Mapping[str, Rate], live: set[str],
               proxies: int, shard: int = 0, shards: int = 1) -> CountsRecord:
        """The counts at the cursor for ``names`` (the order of the limit update of ``limits_version``).

        ``live``: the pool's live proxies; in-flight requests of any other proxy are forgotten (they went with it).
        ``proxies``: how many proxies the record tells the proxies to count with (the live ones, at least 1).
        ``shard`` of ``shards``: a sharded pool's shard, whose book saw only its own entitlements' events: the
        record holds those (``topics.counts.owned``), the pool's row is the shard's subtotal, and the ids of its
        active proxies let a proxy count the pool's distinct ones over the shards."""
        t_ms = self.cursor_ms
        if t_ms is None:
            raise ValueError("`record` before `advance`: the counts have no instant yet")
        since = t_ms - self.demand_window_ms
        in_flight: dict[str, int] = {}
        active: dict[str, int] = {}
        bucket: dict[str, float] = {}
        pool_active: set[str] = set()
        pool_in_flight = 0
        for name, entry in self._of.items():
            for proxy in [p for p in entry.in_flight if p not in live]:
                del entry.in_flight[proxy]
            if entry.reserved.keys() - entry.in_flight.keys():
                entry.reserved = {p: n for p, n in entry.reserved.items() if p in entry.in_flight}
            for proxy in [p for p, at in entry.last_attempt_ms.items() if at < since]:
                del entry.last_attempt_ms[proxy]
            n = sum(entry.in_flight.values())
            here = set(entry.in_flight) | set(entry.last_attempt_ms)
            in_flight[name], active[name] = n, len(here)
            pool_in_flight += n
            pool_active |= here
            rate = rates.get(name)
            if rate is not None:
                bucket[name] = _refilled(entry, t_ms, rate)
        for name, rate in rates.items():
            bucket.setdefault(name, rate.depth_tokens)  # nothing seen: full
        for name in [n for n, e in self._of.items() if not e.in_flight and not e.last_attempt_ms
                     and (n not in rates or bucket[n] >= rates[n].depth_tokens)]:
            del self._of[name]  # nothing in flight, no recent demand, bucket full: nothing to remember
        return counts_record(self.pool, limits_version, t_ms, list(names), in_flight=in_flight, active=active,
                             bucket_tokens=bucket, pool_in_flight=pool_in_flight, pool_active=len(pool_active),
                             proxies=max(1, proxies), shard=shard, shards=shards, active_proxies=pool_active)


def _refilled(entry: _Entitlement, at_ms: int, rate: Rate) -> float:
    if entry.bucket is None:
        return rate.depth_tokens
    elapsed_s = max(0, at_ms - entry.bucket_ms) / 1000.0
    return min(rate.depth_tokens, entry.bucket + elapsed_s * rate.tokens_per_s)
