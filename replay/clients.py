"""The client model of a what-if log replay: what a refused client does, fitted from the attempts its log holds.

A log replay sends each request's first attempt at the time it reached the proxy; what its client does after a
refusal the replay makes is this model's (``replayer`` asks ``retry_delay_ms``):

- **a refusal the log has too** (the same attempt of the same request was refused live) keeps what the client did
  then: its retry comes as long after the replay's estimate as it came after the live one (the *offset*, below), or
  the client gives up there as it did live. So a log replayed under the policy that made it makes its decisions
  again, retries included;
- **a refusal the log does not have** (the live proxy admitted that attempt, or the request ended earlier) draws
  from the client's fit: whether it retries at all (the share of clients that retried after their k-th refusal,
  k = 0, 1, …; none after more refusals than any client of the log took), and when: the estimate the refusal
  carries (``retry_after_ms``) plus an offset drawn from the offsets observed (retry arrival − refusal decision −
  its estimate; an offset, not a ratio, because a client that honours ``retry-after-ms`` sleeps the estimate and
  then adds its own jitter). A refusal without an estimate (401/403, not Bound) is retried as the log's such
  refusals were, after one of their observed delays; none observed: never.

A fit is per entitlement when the log holds at least ``MIN_REFUSALS`` refusals of it that were either retried or
given up (a refusal too close to the log's end to tell is left out), else the pool's (all entitlements together);
a log without a single such refusal (a run without admission control) says nothing of its clients, so the
model assumes the load generator's (``load.RetryPolicy`` defaults: the estimate + 0–100 ms, at most 5 retries)
and says so (``Basis.ASSUMED``).

Pure and deterministic: a refusal's two draws (retry or not; which offset) are the two halves of a BLAKE2b digest
of ``"<seed>:<request>:<attempt>"``, so one request's retries do not change when another's do, and the same seed
gives the same replay. (A hash, not a ``random.Random`` seeded per refusal: seeding the Mersenne Twister cost a
tenth of a queue-on replay.)
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

MIN_REFUSALS = 20  # an entitlement with fewer observed refusals takes the pool's fit
ASSUMED_RETRIES = 5  # the load generator's (load.RetryPolicy) when the log cannot say
ASSUMED_JITTER_MS = 100


class Basis(StrEnum):
    """Where an entitlement's fit comes from."""

    ENTITLEMENT = "entitlement"  # its own refusals
    POOL = "pool"  # too few of its own: all the log's refusals
    ASSUMED = "assumed"  # the log has no refusal to learn from: the load generator's defaults


@dataclass(frozen=True, slots=True)
class ClientFit:
    """How one entitlement's (or the pool's) clients treated refusals."""

    basis: Basis
    refusals: int  # refusals with an estimate it was fitted on (retried or given up)
    retry_share: tuple[float, ...]  # k -> share of refusals (with an estimate) of attempt k that were retried
    offsets_ms: tuple[int, ...]  # sorted: retry arrival − refusal decision − its retry_after_ms
    bare_retry_share: float = 0.0  # the same after a refusal without an estimate
    bare_delays_ms: tuple[int, ...] = ()  # sorted: retry arrival − refusal decision, for those

    def __post_init__(self) -> None:
        if any(not 0.0 <= s <= 1.0 for s in (*self.retry_share, self.bare_retry_share)):
            raise ValueError(f"retry shares must be in [0, 1], got {self.retry_share}, {self.bare_retry_share}")
        if any(s > 0 for s in self.retry_share) and not self.offsets_ms:
            raise ValueError("a fit that retries needs at least one observed offset")
        if self.bare_retry_share > 0 and not self.bare_delays_ms:
            raise ValueError("a fit that retries bare refusals needs at least one observed delay")

    @property
    def max_retries(self) -> int:
        """The most retries any client took (a refused client after that many gives up)."""
        return sum(1 for s in self.retry_share if s > 0)

    @property
    def never_retried(self) -> float:
        """The share of clients that gave up at their first refusal (with an estimate)."""
        return 1.0 - self.retry_share[0] if self.retry_share else 1.0

    def describe(self) -> dict[str, object]:
        """The fit as the replay's summary shows it (offsets in seconds, rounded)."""
        return {
            "basis": self.basis.value, "refusals": self.refusals, "max_retries": self.max_retries,
            "never_retried": round(self.never_retried, 4), "retry_share": [round(s, 4) for s in self.retry_share],
            "offset_p50_s": _quantile_s(self.offsets_ms, 0.5), "offset_p90_s": _quantile_s(self.offsets_ms, 0.9),
            "bare_retry_share": round(self.bare_retry_share, 4),
        }


class RecordedPath(NamedTuple):
    """What one request's client did live: the offset of each recorded retry (from the refusal before it:
    decision + estimate; a refusal without one: from the decision), and whether it gave up after its last attempt."""

    offsets_ms: tuple[int, ...]
    gave_up: bool


@dataclass(frozen=True, slots=True)
class ClientModel:
    """Per entitlement, its clients' fit; per request, what its client did live. An entitlement the log never
    saw takes ``pool``."""

    pool: ClientFit
    fits: Mapping[str, ClientFit] = field(default_factory=dict)
    paths: Mapping[str, RecordedPath] = field(default_factory=dict)

    def fit_of(self, entitlement: str) -> ClientFit:
        return self.fits.get(entitlement, self.pool)

    def retry_delay_ms(self, entitlement: str, request: str, attempt: int, retry_after_ms: int,
                       seed: int) -> int | None:
        """How long after its refusal of attempt ``attempt`` (0: the first) the client of ``request`` sends its next
        attempt, in whole ms (>= 0); None: it gives up."""
        path = self.paths.get(request)
        if path is not None:
            if attempt < len(path.offsets_ms):
                return max(0, retry_after_ms + path.offsets_ms[attempt])
            if attempt == len(path.offsets_ms) and path.gave_up:
                return None
        fit = self.fit_of(entitlement)
        retries, pick = _draws(seed, request, attempt)
        if retry_after_ms > 0:
            share = fit.retry_share[attempt] if attempt < len(fit.retry_share) else 0.0
            if share <= 0.0 or (share < 1.0 and retries >= share):
                return None
            return max(0, retry_after_ms + fit.offsets_ms[_index(pick, len(fit.offsets_ms))])
        if fit.bare_retry_share <= 0.0 or (fit.bare_retry_share < 1.0 and retries >= fit.bare_retry_share):
            return None
        return fit.bare_delays_ms[_index(pick, len(fit.bare_delays_ms))]


def _draws(seed: int, request: str, attempt: int) -> tuple[float, float]:
    """Two independent uniform draws in [0, 1) for one refusal, from 53 bits of each half of a BLAKE2b digest."""
    digest = hashlib.blake2b(f"{seed}:{request}:{attempt}".encode(), digest_size=16).digest()
    return ((int.from_bytes(digest[:8], "big") >> 11) * _UNIT, (int.from_bytes(digest[8:], "big") >> 11) * _UNIT)


_UNIT = 2.0 ** -53


def _index(draw: float, n: int) -> int:
    """A draw in [0, 1) as an index in range(n), n > 0."""
    return min(n - 1, int(draw * n))


class Observed(NamedTuple):
    """One request's attempts as the fit needs them, in attempt order: (arrived_ms, decided_ms, refused,
    retry_after_ms) each."""

    request: str
    entitlement: str
    attempts: tuple[tuple[int, int, bool, int], ...]


def assumed() -> ClientFit:
    """The load generator's clients (``load.RetryPolicy()``): the estimate + a uniform 0–99 ms, at most 5 times."""
    return ClientFit(Basis.ASSUMED, 0, (1.0,) * ASSUMED_RETRIES, tuple(range(ASSUMED_JITTER_MS)))


def fit(requests: Iterable[Observed], end_ms: int, window_ms: int, min_refusals: int = MIN_REFUSALS) -> ClientModel:
    """The client model of a log: ``requests`` grouped (``attempts.group``), ``end_ms`` the log's last arrival
    (the load stops there; decisions may come later, from waiters): a last refusal whose retry would be due later
    than ``end_ms - window_ms`` (its decision + its estimate) may have been retried after the log ends, so it counts
    neither as retried nor as given up."""
    by_ent: dict[str, _Counts] = {}
    pool = _Counts()
    paths: dict[str, RecordedPath] = {}
    for req in requests:
        counts = by_ent.setdefault(req.entitlement, _Counts())
        offsets: list[int] = []
        gave_up = False
        n = len(req.attempts)
        for k, (_, decided_ms, refused, estimate_ms) in enumerate(req.attempts):
            if not refused:
                break
            offset: int | None = None
            if k + 1 < n:
                offset = req.attempts[k + 1][0] - decided_ms - estimate_ms
                offsets.append(offset)
            elif decided_ms + estimate_ms + window_ms > end_ms:
                break  # censored: the log ends before its retry could have come
            else:
                gave_up = True
            for c in (counts, pool):
                c.note(k, estimate_ms > 0, offset)
        if offsets or gave_up:
            paths[req.request] = RecordedPath(tuple(offsets), gave_up)
    pool_fit = pool.fit(Basis.POOL) if pool.refusals else assumed()
    fits = {ent: (c.fit(Basis.ENTITLEMENT) if c.refusals >= min_refusals else pool_fit) for ent, c in by_ent.items()}
    return ClientModel(pool_fit, fits, paths)


@dataclass(slots=True)
class _Counts:
    refused: list[int] = field(default_factory=list)  # k -> refusals (with an estimate) of attempt k
    retried: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    bare_refused: int = 0
    bare_delays: list[int] = field(default_factory=list)

    @property
    def refusals(self) -> int:
        return sum(self.refused) + self.bare_refused

    def note(self, k: int, estimated: bool, offset: int | None) -> None:
        if not estimated:
            self.bare_refused += 1
            if offset is not None:
                self.bare_delays.append(offset)
            return
        while len(self.refused) <= k:
            self.refused.append(0)
            self.retried.append(0)
        self.refused[k] += 1
        if offset is not None:
            self.retried[k] += 1
            self.offsets.append(offset)

    def fit(self, basis: Basis) -> ClientFit:
        shares = [r / n if n else 0.0 for r, n in zip(self.retried, self.refused)]
        while shares and shares[-1] == 0.0:  # (no client went further)
            shares.pop()
        return ClientFit(basis, self.refusals, tuple(shares), tuple(sorted(self.offsets)),
                         len(self.bare_delays) / self.bare_refused if self.bare_refused else 0.0,
                         tuple(sorted(self.bare_delays)))


def _quantile_s(values_ms: Sequence[int], q: float) -> float | None:
    if not values_ms:
        return None
    if len(values_ms) == 1:
        return values_ms[0] / 1000
    return round(statistics.quantiles(values_ms, n=100, method="inclusive")[round(q * 100) - 1] / 1000, 4)
