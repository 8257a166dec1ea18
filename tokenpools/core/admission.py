"""Per-request admission: the six ordered checks (docs/semantics.md#admission) and reserve-then-settle accounting.

One idea: a pool's admission in one proxy, the checks that decide a request and the accounting those checks read,
kept in one class because the check and the charge must happen in the same synchronous call.

The proxy (and the replayer) keep one ``AdmissionController`` per pool in memory. ``admit`` runs the checks and,
only when all pass, reserves n_in + an output estimate (``core.reservation``: a running high quantile of the
entitlement's completions, never above max_tokens; max_tokens itself when the estimate is off) tokens, the
request's KV bytes (sized by max_tokens) and a concurrency slot in the same synchronous call: there is no await between check and charge, so concurrent requests can never both pass a check
that only one of them fits (the check-then-charge bug). ``release`` settles with the actual usage (refunding the
unused part of the reservation, or charging what ran past it) or, on abort, with what was consumed so far; a stream
that runs past its reservation is charged as it goes (``charge``), so settlement is exact whatever was reserved
(docs/reservations.md).

Choices the paper leaves open (docs/paper.md#choices-the-paper-leaves-open), made here:
- token budget = a token bucket per entitlement: refill at the current tokens/s limit, depth = limit × the pool's
  ``token_bucket_window_s``; a request must fit entirely (no overdraft);
- contended = pool in-flight ≥ the pool's concurrency (this proxy's share) or the backend reports a waiting queue;
  the reported queue is a sample taken at the last tick, so every release counts it down by one (a freed slot
  takes a queued request): a stale sample cannot latch contention for a whole tick and drain the pool;
- each in-flight request keeps the priority it was admitted with; a request under contention must have a priority
  strictly greater than the minimum of those. The minimum comes from a min-heap of the distinct in-flight
  priorities with lazy deletion (a priority whose last request left is dropped when it reaches the top, and the
  heap is rebuilt once stale entries outnumber live ones), so a decision costs O(log K) amortised in the number K
  of distinct in-flight priorities, not the O(K) of a scan;
- every refusal for a limit carries ``retry_after_ms``, the estimate of when the same request's check would pass,
  and ``retry_after_s``, it in whole seconds (``core.retry_estimates``: exact for the token budget, k × S ÷ n for a
  slot, S the EWMAs of admission → release this controller teaches on every release, one per entitlement and one
  for the pool);
- a request of an unprotected class is refused (low priority) for the free slots the protected entitlements' limits
  leave unused and have not lent (``kept_for_protected``): nonzero only while the pool is over-committed, e.g. by a
  removed entitlement's requests that still run (docs/semantics.md#slots-kept-for-protected-limits);
- a protected request admitted into a full pool evicts the newest preemptible in-flight request, if any; each
  victim is handed out once (a second protected request gets the next-newest);
- a ticket settles into the ledger it was reserved from, exactly once: releasing it again, or after its
  entitlement was removed and added back, changes nothing;
- an entitlement in shadow (``core.enforcement``: its own ``enforcement``, else the pool's) whose request fails a
  limit check is admitted anyway, reserving exactly what a passing request reserves (its bucket may go below zero),
  and the decision carries the refusal it would have been (``would_refuse``); it evicts no one
  (docs/shadow.md).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from tokenpools.core.classes import EntitlementState, ServiceClass
from tokenpools.core.enforcement import SHADOWABLE, Enforcement
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.reservation import OutputEstimator
from tokenpools.core.retry_estimates import (
    budget_wait_ms,
    learn_service_s,
    never_fits_wait_s,
    slot_estimate_ms,
    slot_wait_ms,
    whole_seconds,
)
from tokenpools.core.rounding import round_half_even
from tokenpools.core.spec import EntitlementSpec


@dataclass(frozen=True, slots=True)
class EntitlementLimits:
    """The effective limits in force for one entitlement (at one proxy), plus the priority its requests carry."""

    concurrency: int
    tokens_per_s: float
    kv_bytes: float
    priority: float
    yields: bool = False  # the limit is below the baseline because a higher priority holds more than its own

    def __post_init__(self) -> None:
        if self.concurrency < 0 or self.tokens_per_s < 0 or self.kv_bytes < 0:
            raise ValueError(f"limits must be >= 0, got {self}")


class Ticket(NamedTuple):
    """What an admitted request holds until it is released.

    Ticket and Decision are built on every request: they are NamedTuples (immutable, hashable) rather than frozen
    dataclasses, whose construction through ``object.__setattr__`` costs about 4× as much (benchmarks/admission.py).
    """

    request_id: str
    entitlement: str
    reserved_tokens: int
    reserved_kv_bytes: int
    priority: float
    admitted_s: float
    evictable: bool
    max_tokens: int = 0  # the client's output cap (what the output estimate learns under)


class Decision(NamedTuple):
    """The outcome of one ``admit`` call; ``evict`` lists in-flight tickets the caller must abort."""

    outcome: AdmissionOutcome
    reason: str
    retry_after_s: int = 0
    ticket: Ticket | None = None
    max_tokens: int = 0
    evict: tuple[Ticket, ...] = ()
    retry_after_ms: int = 0  # the estimate behind retry_after_s, 0 when not retryable (or admitted)
    would_refuse: AdmissionOutcome | None = None  # a shadow admission: the refusal enforce would have given
    would_retry_after_ms: int = 0  # ... and the retry_after_ms it would have carried

    @property
    def admitted(self) -> bool:
        return self.outcome is AdmissionOutcome.ADMITTED


_new: Final = tuple.__new__  # a NamedTuple without its Python-level __new__ (compiled: no call into the interpreter)
_TICKET: Final = Ticket  # (the classes as C statics when compiled, not looked up in the module's dict)
_DECISION: Final = Decision


def _ticket(request_id: str, entitlement: str, reserved_tokens: int, reserved_kv_bytes: int, priority: float,
            admitted_s: float, evictable: bool, max_tokens: int) -> Ticket:
    """``Ticket(...)``, every field given, built as the hot path builds it."""
    return _new(_TICKET, (request_id, entitlement, reserved_tokens, reserved_kv_bytes, priority, admitted_s, evictable,
                         max_tokens))


def _decision(outcome: AdmissionOutcome, reason: str, retry_after_s: int, retry_after_ms: int,
              ticket: Ticket | None = None, max_tokens: int = 0, evict: tuple[Ticket, ...] = ()) -> Decision:
    """``Decision(...)`` (not in shadow), built as the hot path builds it."""
    return _new(_DECISION, (outcome, reason, retry_after_s, ticket, max_tokens, evict, retry_after_ms, None, 0))


@dataclass(slots=True)
class _Ledger:
    """Mutable per-entitlement state at one proxy, with what the checks read of its spec on every request, kept in
    step with ``spec`` by ``set_spec`` (compiled, each field of the spec, a plain dataclass, is a lookup by name)."""

    spec: EntitlementSpec
    limits: EntitlementLimits
    bucket_tokens: float
    bucket_updated_s: float
    in_flight: int = 0
    kv_reserved_bytes: int = 0
    service_s: float = 0.0  # EWMA of admission → release, 0 until the first release
    name: str = field(init=False, default="")  # the spec's
    bound: bool = field(init=False, default=False)  # its state is Bound
    expires_at_s: float | None = field(init=False, default=None)
    protected: bool = field(init=False, default=False)  # its class is
    evictable: bool = field(init=False, default=False)  # its class is preemptible
    enforcement: Enforcement | None = field(init=False, default=None)  # its own (None: the pool's)
    _texts: tuple[float, float, str, str] | None = field(init=False, default=None)  # (rate, depth, as printed)

    def __post_init__(self) -> None:
        self.set_spec(self.spec)

    def set_spec(self, spec: EntitlementSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.bound = spec.state is EntitlementState.BOUND
        self.expires_at_s = spec.expires_at_s
        self.protected = spec.service_class.protected
        self.evictable = spec.service_class is ServiceClass.PREEMPTIBLE
        self.enforcement = spec.enforcement

    def bucket_depth(self, window_s: float) -> float:
        return self.limits.tokens_per_s * window_s

    def bucket_texts(self, rate: float, depth: float) -> tuple[str, str]:
        """The bucket's depth and refill rate as a token-budget refusal prints them, formatted once per limit (a
        waiting head is refused again at every release)."""
        texts = self._texts
        if texts is None or texts[0] != rate or texts[1] != depth:
            texts = self._texts = (rate, depth, format(depth, ".0f"), format(rate, ".4g"))
        return texts[2], texts[3]

    def refill(self, now_s: float, window_s: float) -> None:
        # inlined (same arithmetic, same order) in AdmissionController.admit and .release, the hot path
        elapsed = now_s - self.bucket_updated_s
        if elapsed > 0:
            rate = self.limits.tokens_per_s
            self.bucket_tokens = min(rate * window_s, self.bucket_tokens + elapsed * rate)
            self.bucket_updated_s = now_s


# (Final: compiled, a C static each; a plain module name is a dict lookup on every use)
_EXPIRED: Final = EntitlementState.EXPIRED
_ADMITTED: Final = AdmissionOutcome.ADMITTED
_TOKEN_BUDGET: Final = AdmissionOutcome.REFUSED_TOKEN_BUDGET
_SHADOWABLE: Final = SHADOWABLE


@dataclass(slots=True)
class AdmissionController:
    """In-memory admission state of one pool at one proxy. Time is always an argument."""

    pool_concurrency: int
    kv_bytes_per_token: int
    default_max_tokens: int
    token_bucket_window_s: float
    retry_after_s: int = 1
    backend_waiting: int = 0
    in_flight: int = 0
    retry_floor_ms: int = 50
    service_ewma_alpha: float = 0.2
    service_s: float = 0.0  # the pool's EWMA of admission → release, 0 until the first release
    _ledgers: dict[str, _Ledger] = field(default_factory=dict)
    _protected: dict[str, _Ledger] = field(default_factory=dict)  # the protected ones among _ledgers
    _limits_sum: int = 0  # Σ concurrency limits over _ledgers
    _protected_limits: int = 0  # Σ concurrency limits over _protected
    _priorities: dict[float, int] = field(default_factory=dict)  # in-flight requests per distinct priority
    _heap: list[float] = field(default_factory=list)  # min-heap over _priorities' keys, plus stale entries
    _in_heap: set[float] = field(default_factory=set)  # the values _heap holds (each at most once)
    _evictable: dict[str, Ticket] = field(default_factory=dict)
    _live: dict[str, tuple[Ticket, _Ledger]] = field(default_factory=dict)
    estimator: OutputEstimator = field(default_factory=OutputEstimator)  # default: off, reserve max_tokens
    _charged: dict[str, int] = field(default_factory=dict)  # tokens charged past the reservation while in flight
    enforcement: Enforcement = Enforcement.ENFORCE  # the pool's mode; an entitlement's own overrides it

    def __post_init__(self) -> None:
        if self.retry_after_s < 1:
            raise ValueError(f"`retry_after_s` must be >= 1, got {self.retry_after_s}")
        if self.token_bucket_window_s <= 0:
            raise ValueError(f"`token_bucket_window_s` must be positive, got {self.token_bucket_window_s}")
        if not 1 <= self.retry_floor_ms <= self.retry_after_s * 1000:
            raise ValueError(f"`retry_floor_ms` must be in [1, retry_after_s × 1000], got {self.retry_floor_ms}")
        if not 0 < self.service_ewma_alpha <= 1:
            raise ValueError(f"`service_ewma_alpha` must be in (0, 1], got {self.service_ewma_alpha}")

    # ---- state updates -------------------------------------------------------------------------------------
    def upsert_entitlement(self, spec: EntitlementSpec, limits: EntitlementLimits, now_s: float) -> None:
        """Add an entitlement (bucket starts full) or replace its spec and limits (in-flight state is kept)."""
        ledger = self._ledgers.get(spec.name)
        if ledger is None:
            depth = limits.tokens_per_s * self.token_bucket_window_s
            ledger = self._ledgers[spec.name] = _Ledger(spec, limits, bucket_tokens=depth, bucket_updated_s=now_s)
            self._limits_sum += limits.concurrency
        else:
            ledger.refill(now_s, self.token_bucket_window_s)
            self.set_limits(spec.name, limits, now_s)  # (counted under its old class, then moved to its new one)
            if self._protected.pop(spec.name, None) is not None:
                self._protected_limits -= limits.concurrency
            ledger.set_spec(spec)
        if spec.service_class.protected:
            self._protected[spec.name] = ledger
            self._protected_limits += limits.concurrency

    def remove_entitlement(self, name: str) -> None:
        ledger = self._ledgers.pop(name, None)
        if ledger is not None:
            self._limits_sum -= ledger.limits.concurrency
            if self._protected.pop(name, None) is not None:
                self._protected_limits -= ledger.limits.concurrency
        self.estimator.forget(name)

    def set_limits(self, name: str, limits: EntitlementLimits, now_s: float) -> None:
        """Apply new limits: the bucket is refilled at the old rate up to now, then clamped to the new depth."""
        ledger = self._ledgers[name]
        ledger.refill(now_s, self.token_bucket_window_s)
        change = limits.concurrency - ledger.limits.concurrency
        self._limits_sum += change
        if ledger.spec.service_class.protected:
            self._protected_limits += change
        ledger.limits = limits
        ledger.bucket_tokens = min(ledger.bucket_tokens, ledger.bucket_depth(self.token_bucket_window_s))

    def set_bucket_tokens(self, name: str, tokens: float, now_s: float) -> None:
        """Set the bucket's level to ``tokens`` at ``now_s`` (clamped to the depth; it may be below zero), for a proxy
        told its budget by the fleet (docs/fleet.md): it refills at the current rate from ``now_s`` on. O(1)."""
        ledger = self._ledgers[name]
        ledger.refill(now_s, self.token_bucket_window_s)
        ledger.bucket_tokens = min(tokens, ledger.bucket_depth(self.token_bucket_window_s))

    def set_pool(self, concurrency: int, backend_waiting: int) -> None:
        self.pool_concurrency = concurrency
        self.backend_waiting = backend_waiting

    def limits_of(self, name: str) -> EntitlementLimits:
        return self._ledgers[name].limits

    def entitlement_names(self) -> list[str]:
        return list(self._ledgers)

    def in_flight_of(self, name: str) -> int:
        return self._ledgers[name].in_flight

    def kv_reserved_of(self, name: str) -> int:
        return self._ledgers[name].kv_reserved_bytes

    def bucket_tokens_of(self, name: str, now_s: float) -> float:
        ledger = self._ledgers[name]
        ledger.refill(now_s, self.token_bucket_window_s)
        return ledger.bucket_tokens

    def next_slot_ms(self, name: str) -> int:
        """When the entitlement may have a request admitted for concurrency: 0 while a slot is free, else the wait a
        concurrency refusal would carry (``retry_after_ms``: k × S ÷ n, module doc)."""
        ledger = self._ledgers[name]
        releases = ledger.in_flight - ledger.limits.concurrency + 1
        return 0 if releases <= 0 else slot_wait_ms(ledger.service_s, self.service_s, ledger.in_flight, releases,
                                                    self.retry_floor_ms, self.retry_after_s * 1000)

    def slot_estimate_ms(self, name: str, outcome: AdmissionOutcome) -> int | None:
        """When a request of ``name`` just refused with ``outcome`` (concurrency, KV or low priority) would pass: the
        k × S ÷ n of its refusal's ``retry_after_ms``, at least ``retry_floor_ms`` but not capped at ``retry_after_s``
        (the queue compares it with a deadline, not with HTTP's hint). None before any release taught S, or with
        nothing in flight: there is no estimate then, not a long one."""
        ledger = self._ledgers[name]
        if outcome is AdmissionOutcome.REFUSED_LOW_PRIORITY and not self._yielded(ledger):
            service_s, in_flight = self.service_s, self.in_flight
            releases = max(self.in_flight - self.pool_concurrency + 1, self.backend_waiting)
        else:
            service_s = ledger.service_s if ledger.service_s > 0 else self.service_s
            in_flight = ledger.in_flight
            releases = 1 if outcome is AdmissionOutcome.REFUSED_KV else ledger.in_flight - ledger.limits.concurrency + 1
        return slot_estimate_ms(service_s, in_flight, releases, self.retry_floor_ms)

    @staticmethod
    def _yielded(ledger: _Ledger) -> bool:
        """Whether a low-priority refusal of this entitlement now is its concurrency limit's (check 3, the limit
        yielded to higher priorities): its slot is one of its own releases, not the pool's."""
        return ledger.limits.yields and ledger.in_flight >= ledger.limits.concurrency

    def kept_for_protected(self) -> int:
        """Free slots no other class may take: what the protected entitlements' limits leave unused, as far as the
        limits have not lent it (the pool minus the other entitlements' limits, minus what the protected hold).
        Nonzero only while the pool is over-committed, which the limits never do by themselves: in-flight requests of
        a removed entitlement (its limit given away at the next tick while they still run), or a limit shrunk below
        what its owner holds. O(protected entitlements)."""
        unused = held = 0
        protected_limits = 0
        for ledger in self._protected.values():
            limit, in_flight = ledger.limits.concurrency, ledger.in_flight
            protected_limits += limit
            held += in_flight
            if limit > in_flight:
                unused += limit - in_flight
        if unused == 0:
            return 0
        left = self.pool_concurrency - (self._limits_sum - protected_limits) - held
        return min(unused, left) if left > 0 else 0

    @property
    def contended(self) -> bool:
        return self.in_flight >= self.pool_concurrency or self.backend_waiting > 0

    def min_in_flight_priority(self) -> float | None:
        """The lowest priority among in-flight requests, None when nothing is in flight. O(log K) amortised."""
        heap = self._heap
        priorities = self._priorities
        while heap:
            top = heap[0]
            if top in priorities:
                return top
            heapq.heappop(heap)  # its last request left: drop it now that it is on top
            self._in_heap.discard(top)
        return None

    def _track_priority(self, priority: float) -> None:
        """Count one more in-flight request at ``priority``; a new value enters the heap once."""
        priorities = self._priorities
        count = priorities.get(priority, 0)
        priorities[priority] = count + 1
        if count == 0 and priority not in self._in_heap:
            heap = self._heap
            if len(heap) > 2 * len(priorities) + 16:  # mostly stale: rebuild from the live values, O(K) once
                heap[:] = list(priorities)
                heapq.heapify(heap)
                self._in_heap = set(heap)
            else:
                heapq.heappush(heap, priority)
                self._in_heap.add(priority)

    # ---- the decision --------------------------------------------------------------------------------------
    def admit(
        self,
        entitlement: str | None,
        request_id: str,
        prompt_tokens: int,
        max_tokens: int | None,
        now_s: float,
    ) -> Decision:
        """Run the six checks in order; the first failure wins. Reserves on success.

        A limit refusal of an entitlement in shadow is turned into an admission that carries it (``_shadow``).
        Raises ValueError for a negative token count (it would mint tokens into the bucket) and for a request id
        that is already in flight (tickets are settled by id).
        """
        decision = self._check(entitlement, request_id, prompt_tokens, max_tokens, now_s)
        if decision.ticket is None and decision.outcome in _SHADOWABLE and entitlement is not None:
            ledger = self._ledgers[entitlement]  # a limit refusal: the entitlement is known
            own = ledger.enforcement
            if (self.enforcement if own is None else own) is Enforcement.SHADOW:
                return self._shadow(ledger, decision, request_id, prompt_tokens, max_tokens, now_s)
        return decision

    def _shadow(self, ledger: _Ledger, refusal: Decision, request_id: str, prompt_tokens: int,
                max_tokens: int | None, now_s: float) -> Decision:
        """Admit a request its limits refused, as a passing request is admitted (same cost, KV, slot, priority;
        the bucket, already refilled to ``now_s`` by the check, may go below zero), but evicting no one: a request
        that enforce would have refused must not cost another request its run (docs/shadow.md)."""
        spec = ledger.spec
        out_tokens = self.default_max_tokens if max_tokens is None else max_tokens
        cost = prompt_tokens + self.estimator.estimate(spec.name, out_tokens)
        kv_bytes = (prompt_tokens + out_tokens) * self.kv_bytes_per_token
        ticket = self._reserve(ledger, request_id, cost, kv_bytes, out_tokens, now_s)
        return Decision(_ADMITTED, f"admitted in shadow; would refuse: {refusal.reason}", 0, ticket, out_tokens, (),
                        0, refusal.outcome, refusal.retry_after_ms)

    def _reserve(self, ledger: _Ledger, request_id: str, cost: int, kv_bytes: int, out_tokens: int,
                 now_s: float) -> Ticket:
        """Charge an admitted request to its ledger and the pool and return its ticket."""
        live = self._live
        if request_id in live:
            raise ValueError(f"request {request_id!r} is already in flight")
        priority = ledger.limits.priority
        evictable = ledger.evictable
        ticket = _ticket(request_id, ledger.name, cost, kv_bytes, priority, now_s, evictable, out_tokens)
        live[request_id] = (ticket, ledger)
        ledger.bucket_tokens -= cost
        ledger.in_flight += 1
        ledger.kv_reserved_bytes += kv_bytes
        self.in_flight += 1
        self._track_priority(priority)
        if evictable:
            self._evictable[request_id] = ticket
        return ticket

    def _check(self, entitlement: str | None, request_id: str, prompt_tokens: int, max_tokens: int | None,
               now_s: float) -> Decision:
        """``admit`` as enforce decides it: the six checks, and the reservation when they all pass."""
        # 1. key -> entitlement; it must be Bound (and not past its expiry)
        ledger = self._ledgers.get(entitlement) if entitlement is not None else None
        if ledger is None:
            return Decision(AdmissionOutcome.REFUSED_UNKNOWN_KEY, "unknown or missing API key")
        expires_at_s = ledger.expires_at_s
        if not ledger.bound or (expires_at_s is not None and now_s >= expires_at_s):
            spec = ledger.spec
            state = _EXPIRED if spec.is_expired(now_s) else spec.state
            return Decision(AdmissionOutcome.REFUSED_NOT_BOUND, f"entitlement {spec.name} is {state.value}")
        name = ledger.name
        # 2. output length bound
        out_tokens = self.default_max_tokens if max_tokens is None else max_tokens
        if prompt_tokens < 0 or out_tokens < 0:
            raise ValueError(f"prompt_tokens and max_tokens must be >= 0, got {prompt_tokens}, {out_tokens}")
        cost = prompt_tokens + self.estimator.estimate(name, out_tokens)
        limits = ledger.limits
        # 3. concurrency; below the baseline because a higher priority won the rest: the low-priority refusal
        if ledger.in_flight >= limits.concurrency:
            if limits.yields:
                return self._slot_refusal(
                    AdmissionOutcome.REFUSED_LOW_PRIORITY,
                    f"entitlement {name} has {ledger.in_flight} requests in flight, its limit is "
                    f"{limits.concurrency}: the rest of its baseline went to higher priorities (its priority "
                    f"{limits.priority:.4g})",
                    ledger.service_s, ledger.in_flight, ledger.in_flight - limits.concurrency + 1,
                )
            return self._slot_refusal(
                AdmissionOutcome.REFUSED_CONCURRENCY,
                f"entitlement {name} has {ledger.in_flight} requests in flight, its limit is {limits.concurrency}",
                ledger.service_s, ledger.in_flight, ledger.in_flight - limits.concurrency + 1,
            )
        # 4. token budget (the bucket refill is _Ledger.refill, inlined)
        window_s = self.token_bucket_window_s
        elapsed = now_s - ledger.bucket_updated_s
        if elapsed > 0:
            rate = limits.tokens_per_s
            ledger.bucket_tokens = min(rate * window_s, ledger.bucket_tokens + elapsed * rate)
            ledger.bucket_updated_s = now_s
        if cost > ledger.bucket_tokens:
            return self._budget_refusal(ledger, cost, window_s, now_s)
        # 5. KV cache
        kv_bytes = (prompt_tokens + out_tokens) * self.kv_bytes_per_token  # KV is held, not settled: sized by the cap
        if ledger.kv_reserved_bytes + kv_bytes > limits.kv_bytes:
            return self._slot_refusal(
                AdmissionOutcome.REFUSED_KV,
                f"entitlement {name} would hold {ledger.kv_reserved_bytes + kv_bytes} KV bytes, "
                f"its limit is {int(limits.kv_bytes)}",
                ledger.service_s, ledger.in_flight, 1,
            )
        # 6. contention: strictly above the lowest priority in flight
        evict: tuple[Ticket, ...] = ()
        priority = limits.priority
        if (self.in_flight < self.pool_concurrency <= self.in_flight + self._protected_limits
                and not ledger.protected):  # (kept slots are at most the protected limits: O(1) mostly)
            kept = self.kept_for_protected()
            if kept > 0 and self.in_flight + kept >= self.pool_concurrency:
                return self._slot_refusal(
                    AdmissionOutcome.REFUSED_LOW_PRIORITY,
                    f"the pool's {self.pool_concurrency - self.in_flight} free slots are kept for the unused limits "
                    f"of its protected entitlements", self.service_s, self.in_flight,
                    self.in_flight + kept - self.pool_concurrency + 1)
        if self.in_flight >= self.pool_concurrency or self.backend_waiting > 0:  # self.contended, inlined
            floor = self.min_in_flight_priority()
            if floor is not None and not priority > floor:
                return self._slot_refusal(
                    AdmissionOutcome.REFUSED_LOW_PRIORITY,
                    f"pool is contended and priority {format(limits.priority, '.4g')} does not exceed the in-flight "
                    f"minimum {format(floor, '.4g')}",
                    self.service_s, self.in_flight, max(self.in_flight - self.pool_concurrency + 1, self.backend_waiting),
                )
            if ledger.protected and self.in_flight >= self.pool_concurrency and self._evictable:
                evict = (self._evictable.pop(next(reversed(self._evictable))),)  # handed out once
        # reserve (same synchronous call as the checks: no await between check and charge)
        ticket = self._reserve(ledger, request_id, cost, kv_bytes, out_tokens, now_s)
        return _decision(_ADMITTED, "admitted", 0, 0, ticket, out_tokens, evict)

    def _budget_refusal(self, ledger: _Ledger, cost: int, window_s: float, now_s: float) -> Decision:
        """A token-budget refusal; its wait is the smallest whole ms after which ``admit`` passes (module doc)."""
        rate = ledger.limits.tokens_per_s
        depth = ledger.bucket_depth(window_s)
        name = ledger.name
        # (floats are formatted with format(), not in the f-string: compiled, a format spec formats every field)
        if cost > depth or rate <= 0:  # never fits at this rate: the window (60 s at a zero rate), as today
            wait_s = never_fits_wait_s(window_s, rate)
            reason = (f"request needs {cost} tokens but entitlement {name}'s bucket holds at most "
                      f"{format(depth, '.0f')}" if cost > depth else
                      f"request needs {cost} tokens, entitlement {name} has {format(ledger.bucket_tokens, '.0f')} of "
                      f"{format(depth, '.0f')} (refill {format(rate, '.4g')} tokens/s)")
            return _decision(_TOKEN_BUDGET, reason, wait_s, wait_s * 1000)
        level = ledger.bucket_tokens
        wait_ms = budget_wait_ms(cost, level, ledger.bucket_updated_s, depth, rate, now_s)
        depth_text, rate_text = ledger.bucket_texts(rate, depth)
        # format(level, ".0f") is str(round(level)) for level >= 1 (no sign of zero to print), without a float format
        level_text = str(round_half_even(level)) if level >= 1.0 else format(level, ".0f")
        return _decision(
            _TOKEN_BUDGET,
            f"request needs {cost} tokens, entitlement {name} has {level_text} of {depth_text} "
            f"(refill {rate_text} tokens/s)",
            whole_seconds(wait_ms), wait_ms,
        )

    def _slot_refusal(self, outcome: AdmissionOutcome, reason: str, service_s: float, in_flight: int,
                      releases: int) -> Decision:
        """A refusal that waits for ``releases`` slots to free among ``in_flight`` requests, each holding one for
        ``service_s`` on average (0: not learned yet); its wait is bounded (module doc)."""
        ms = slot_wait_ms(service_s, self.service_s, in_flight, releases, self.retry_floor_ms,
                          self.retry_after_s * 1000)
        return _decision(outcome, reason, whole_seconds(ms), ms)

    def release(self, ticket: Ticket, used_tokens: int, now_s: float) -> int:
        """Settle (completion) or abort: free the slot and KV, refund ``reserved − used`` tokens. Returns the refund.

        ``used_tokens`` is the actual prompt + completion tokens (a partial count for an abort). Using more than was
        reserved (the prompt or output estimate was low) charges the difference, so the bucket can go below zero:
        that is what keeps its long-run rate exact. What ``charge`` took while the request ran counts as reserved.
        A ticket that is not in flight (already released) is ignored and 0 is returned. The refund goes to the
        ledger the ticket was reserved from, which is detached if its entitlement was removed meanwhile.
        """
        request_id = ticket.request_id
        live = self._live
        entry = live.pop(request_id, None)
        if entry is None:
            return 0
        if entry[0] is not ticket and entry[0] != ticket:  # a stale ticket whose id is in flight again
            live[request_id] = entry
            return 0
        ledger = entry[1]
        refund = ticket.reserved_tokens - used_tokens
        if self._charged:
            refund += self._charged.pop(request_id, 0)
        priorities = self._priorities
        priority = ticket.priority
        count = priorities.get(priority, 0)
        if count <= 1:
            priorities.pop(priority, None)
        else:
            priorities[priority] = count - 1
        if ticket.evictable:
            self._evictable.pop(request_id, None)
        self.in_flight -= 1
        if self.backend_waiting > 0:  # the freed slot goes to a request the backend had queued
            self.backend_waiting -= 1
        ledger.in_flight -= 1
        ledger.kv_reserved_bytes -= ticket.reserved_kv_bytes
        held_s = now_s - ticket.admitted_s  # the service time the slot estimates of refusals learn from
        if held_s >= 0:
            alpha = self.service_ewma_alpha
            ledger.service_s = learn_service_s(ledger.service_s, held_s, alpha)
            self.service_s = learn_service_s(self.service_s, held_s, alpha)
        # refill (_Ledger.refill, inlined), then refund without overfilling
        rate = ledger.limits.tokens_per_s
        depth = rate * self.token_bucket_window_s
        elapsed = now_s - ledger.bucket_updated_s
        if elapsed > 0:
            ledger.bucket_tokens = min(depth, ledger.bucket_tokens + elapsed * rate)
            ledger.bucket_updated_s = now_s
        ledger.bucket_tokens = min(depth, ledger.bucket_tokens + refund)
        return refund

    def charge(self, ticket: Ticket, used_tokens: int, now_s: float) -> int:
        """Charge an in-flight request's use so far beyond what it reserved (a stream past its output estimate), so a
        long stream cannot run far past its reservation unseen by the bucket. ``used_tokens`` is the cumulative
        prompt + completion count so far; only its growth past the reservation and earlier charges is charged (the
        bucket may go below zero). ``release`` later settles against reservation + charges. Returns the tokens
        charged now (0 for a ticket that is not in flight). O(1)."""
        entry = self._live.get(ticket.request_id)
        if entry is None or (entry[0] is not ticket and entry[0] != ticket):
            return 0
        charged = self._charged.get(ticket.request_id, 0)
        extra = used_tokens - ticket.reserved_tokens - charged
        if extra <= 0:
            return 0
        ledger = entry[1]
        ledger.refill(now_s, self.token_bucket_window_s)
        ledger.bucket_tokens -= extra
        self._charged[ticket.request_id] = charged + extra
        return extra

    def observe(self, ticket: Ticket, completion_tokens: int) -> None:
        """Teach the output estimate a finished request's completion tokens (one that ran to its end)."""
        self.estimator.observe(ticket.entitlement, ticket.max_tokens, completion_tokens)

    def fits_bucket(self, entitlement: str, prompt_tokens: int, max_tokens: int | None) -> bool:
        """Whether the request's cost (what ``admit`` would reserve) is within its entitlement's bucket depth at the
        current rate: a cost above it never passes the token-budget check, however long it waits."""
        ledger = self._ledgers.get(entitlement)
        if ledger is None:
            return False
        out_tokens = self.default_max_tokens if max_tokens is None else max_tokens
        cost = prompt_tokens + self.estimator.estimate(entitlement, out_tokens)
        return ledger.limits.tokens_per_s > 0 and cost <= ledger.bucket_depth(self.token_bucket_window_s)

    def output_reservation(self, entitlement: str, max_tokens: int) -> int:
        """The output tokens ``admit`` would reserve now for a request of ``entitlement`` capped at ``max_tokens``."""
        return self.estimator.estimate(entitlement, max_tokens)
