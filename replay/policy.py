"""The token-pools control plane as the replayer drives it: the proxy's admission state plus the agents' tick.

Nothing here decides anything itself. Admission is ``core.admission.AdmissionController`` (the proxy's object),
usage windows are ``core.windows`` (the stream agents' algebra), the tick is ``core.tick.pool_tick`` (the function the
agents run per closed window: binding, ℓ̄*, ``control_tick``, whole slots) and scaling is ``core.scaling.Stabilizer``;
this class only wires them together in event time the way the proxy and the agents are wired over Kafka:

- every decision and completion becomes a ``UsageEvent`` in the entitlement's window (what the agents derive from
  the request and completion topics);
- every ``tick_s`` the windows are closed, ``pool_tick`` runs on the samples at the closed window's end, and the
  limits and priorities of its members (the entitlements Bound then) are applied with ``set_limits``; one it does
  not bind keeps the limits it has, as a proxy keeps static ones for an entitlement a limit update leaves out;
  ``set_pool`` gets the pool's slots and the backend's waiting queue as seen at the tick (the proxy learns both
  from the limit update, so between ticks it decides on the tick's view). A tick told to ``hold`` its limits (the
  replayer's, when a recorded log says when the live proxy got them) keeps them pending, in tick order, until
  ``put_in_force``: the agents' part (windows, signals, scaling) is done at the tick all the same;
- joining entitlements start with the fail-static limits (``static_limits``) until the next tick, with the last
  tick's ℓ̄* (the proxy's, from the last limit update) or, before any, the mean over the entitlements joined;
- a request refused for a reason time can fix waits in the proxy's ``core.waiting.AdmissionQueue`` (docs/queueing.md):
  ``admit`` returns its ``Waiter``, ``drain`` resolves waiters (the replayer calls it after every release, limit
  change and at ``next_wake_s``), and a decision's usage event is stamped at the final decision, as the proxy's
  ``request_decided`` is;
- an entitlement's budgets (docs/budgets.md#replay) are checked first, for every class, by ``BudgetLedger`` (the
  core's budget functions on an exact ledger in event time): a request they cannot take is refused
  ``budget_exhausted`` at once; one they take holds its reservation until it completes (or is refused after all).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Final

from tokenpools.core import windows
from tokenpools.core.accumulator import Accumulator
from tokenpools.core.admission import AdmissionController, Decision, EntitlementLimits, Ticket
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.capacity import Capacity
from tokenpools.core.priority import mean_slo_ms, priority
from tokenpools.core.reservation import OutputEstimator
from tokenpools.core.rounding import round_half_even
from tokenpools.core.scaling import Stabilizer, protected_floor
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.tick import Signals, pool_tick, static_limits
from tokenpools.core.waiting import AdmissionQueue, Waiter, WaitOutcome, WaitRoom
from tokenpools.replay.backend.state import NS_PER_S as _NS_PER_S
from tokenpools.replay.budgets import BudgetLedger, BudgetPeriod
from tokenpools.replay.scenario import ReplayParams

# (Final: compiled, C statics rather than a dict lookup on every use)
_ADMITTED: Final = windows.UsageKind.ADMITTED
_COMPLETED: Final = windows.UsageKind.COMPLETED
_REFUSED: Final = windows.UsageKind.REFUSED
_REFUSED_BUDGET: Final = AdmissionOutcome.REFUSED_BUDGET
_QUEUE_FULL: Final = WaitOutcome.QUEUE_FULL
_TOO_LONG: Final = WaitOutcome.TOO_LONG
_ZERO_LIMIT: Final = WaitOutcome.ZERO_LIMIT


@dataclass(frozen=True, slots=True)
class EntitlementTick:
    """One entitlement at one tick: the signals, priority and limits the tick produced, and what it measured."""

    t_s: float
    entitlement: str
    priority: float
    debt: float
    burst: float
    limit_concurrency: int
    limit_tokens_per_s: float
    used_tokens_per_s: float
    demand_tokens_per_s: float
    used_concurrency: float


@dataclass(frozen=True, slots=True)
class HeldLimits:
    """What one tick sends the proxy, until it is put in force: its members' limits, the pool's slots and the
    backend's waiting queue."""

    limits: tuple[tuple[str, EntitlementLimits], ...]
    pool_concurrency: int
    backend_waiting: int


@dataclass(frozen=True, slots=True)
class PoolTick:
    t_s: float
    contended: bool
    backend_waiting: int
    capacity_concurrency: int
    mean_slo_ms: float
    desired_replicas: int
    replicas: int


class TokenPoolsPolicy:
    """Admission + windows + control tick for one pool. ``POLICIES["token-pools"]``."""

    name = "token-pools"
    controlled = True

    def __init__(self, pool: PoolSpec, params: ReplayParams, origin_ms: int = 0) -> None:
        self.pool = pool
        self.params = params
        self.origin_ms = origin_ms
        self.admission = AdmissionController(
            pool_concurrency=int(pool.capacity().concurrency),
            kv_bytes_per_token=pool.kv_bytes_per_token,
            default_max_tokens=pool.default_max_tokens,
            token_bucket_window_s=pool.token_bucket_window_s,
            retry_after_s=params.retry_after_s,
            estimator=OutputEstimator(params.reservation),
            enforcement=pool.enforcement,
        )
        self.queue = AdmissionQueue(self.admission, params.queue, WaitRoom(params.max_waiters))
        self.queue_outcomes: dict[str, dict[str, int]] = {}  # entitlement -> WaitOutcome value -> requests
        self.wait_starts: list[tuple[float, str, str]] = []  # (t_s, entitlement, the refusal the wait started with)
        self._queue_full = self._too_long = self._zero_limit = 0  # the queue's counts of those outcomes so far (to attribute new ones)
        self.specs: dict[str, EntitlementSpec] = {}
        self.windows: dict[str, Accumulator] = {}  # the core's window state, summed in place between ticks
        self.signals: dict[str, Signals] = {}
        self.mean_slo_ms: float | None = None  # ℓ̄* after the last tick (None until a tick had members)
        self.slot_fraction = 1.0
        self.replicas = pool.replicas
        self.stabilizer = Stabilizer(pool.replicas)
        self.entitlement_ticks: list[EntitlementTick] = []
        self.pool_ticks: list[PoolTick] = []
        self.budgets = BudgetLedger(origin_ms, params.budget_retry_after_max_s)
        self.held: deque[HeldLimits] = deque()  # ticks' limits not yet in force (``tick(hold=True)``), oldest first

    # ---- membership and capacity ------------------------------------------------------------------------
    def join(self, spec: EntitlementSpec, now_s: float) -> None:
        self.specs[spec.name] = spec
        self.queue.set_spec(spec)
        self.budgets.join(spec, now_s)
        self.windows[spec.name] = Accumulator(windows.empty(self.params.window_ms))
        self.signals[spec.name] = Signals()
        mean_slo = self.mean_slo_ms
        if mean_slo is None:
            mean_slo = mean_slo_ms(s.slo_ms for s in self.specs.values())
        limits = static_limits(self.pool, list(self.specs.values()), mean_slo, self.params.constants,
                               self.params.limit_config)
        static = limits[spec.name]
        priority = self._static_priority(spec, mean_slo)
        self.admission.upsert_entitlement(
            spec, EntitlementLimits(int(static.concurrency), static.tokens_per_s, static.kv_bytes, priority), now_s
        )

    def leave(self, name: str, now_s: float) -> list[Waiter]:
        """Remove ``name``; its waiters are refused as not Bound (returned, resolved, for the caller to answer)."""
        gone = Decision(AdmissionOutcome.REFUSED_NOT_BOUND, f"entitlement {name} is no longer Bound")
        withdrawn = self.queue.withdraw_entitlement(name, gone, now_s)
        for waiter in withdrawn:
            self._count(name, WaitOutcome.WITHDRAWN)
            self.budgets.release(waiter.request_id)
        self.specs.pop(name, None)
        self.windows.pop(name, None)
        self.signals.pop(name, None)
        self.admission.remove_entitlement(name)
        return withdrawn

    def set_capacity(self, slots_per_replica: int, max_num_seqs: int, backend_waiting: int) -> None:
        self.slot_fraction = slots_per_replica / max_num_seqs
        self.admission.set_pool(int(self.capacity().concurrency), backend_waiting)

    def capacity(self) -> Capacity:
        return self.pool.per_replica.scaled(self.replicas * self.slot_fraction)

    def _static_priority(self, spec: EntitlementSpec, mean_slo_ms: float) -> float:
        return priority(spec.service_class, spec.slo_ms, mean_slo_ms, 0.0, 0.0, self.params.constants)

    # ---- the request path (the proxy) -------------------------------------------------------------------
    def admit(self, entitlement: str, request_id: str, prompt_tokens: int, max_tokens: int | None,
              now_s: float) -> Decision | Waiter:
        """The proxy's answer: a final ``Decision``, or the ``Waiter`` that ``drain`` resolves later."""
        if entitlement in self.budgets.books:  # its budgets first, for every class; a refusal never waits
            cap = self.pool.default_max_tokens if max_tokens is None else max_tokens
            refusal = self.budgets.check(entitlement, request_id, prompt_tokens,
                                         self.output_reservation(entitlement, cap), now_s)
            if refusal is not None:
                self._decided(entitlement, refusal, prompt_tokens, max_tokens, now_s)
                return refusal
        result = self.queue.admit(entitlement, request_id, prompt_tokens, max_tokens, now_s)
        if isinstance(result, Waiter):  # the wait starts with its refusal, demand the agents see now (as live)
            self._decided(entitlement, result.decision, prompt_tokens, max_tokens, now_s)
            self.wait_starts.append((now_s, entitlement, result.decision.outcome.value))
            return result
        if result.ticket is None:  # refused at once: did it find no room in the queue, or too long a wait?
            self.budgets.release(request_id)
            outcomes = self.queue.outcomes
            full, too_long = outcomes[_QUEUE_FULL], outcomes[_TOO_LONG]
            if full != self._queue_full:
                self._queue_full = full
                self._count(entitlement, _QUEUE_FULL)
            elif too_long != self._too_long:
                self._too_long = too_long
                self._count(entitlement, _TOO_LONG)
            elif outcomes[_ZERO_LIMIT] != self._zero_limit:
                self._zero_limit = outcomes[_ZERO_LIMIT]
                self._count(entitlement, _ZERO_LIMIT)
        self._decided(entitlement, result, prompt_tokens, max_tokens, now_s)
        return result

    def drain(self, now_s: float) -> list[Waiter]:
        """Resolve the waiters whose check passes now or whose deadline has come (see ``AdmissionQueue.drain``)."""
        resolved = self.queue.drain(now_s)
        for waiter in resolved:
            outcome = waiter.outcome
            assert outcome is not None  # (drain returns resolved waiters)
            self._count(waiter.entitlement, outcome)
            if waiter.decision.ticket is None:
                self.budgets.release(waiter.request_id)
            self._decided(waiter.entitlement, waiter.decision, waiter.prompt_tokens, waiter.max_tokens, now_s)
        return resolved

    def next_wake_s(self) -> float | None:
        """The queue's next wake on the replay's clock, whole ns (the backend simulator's), never before the moment
        the queue named: a wake between two ns would advance the simulator to the later one, and the events it met
        there would come before the drain at the earlier one; one before the named moment would drain nothing and
        name the same moment again."""
        due = self.queue.next_wake_s()
        if due is None:
            return None
        ns = math.ceil(due * _NS_PER_S)
        on_clock = ns / _NS_PER_S
        return on_clock if on_clock >= due else (ns + 1) / _NS_PER_S

    def _decided(self, entitlement: str, decision: Decision, prompt_tokens: int, max_tokens: int | None,
                 now_s: float) -> None:
        """A decision's usage event in its entitlement's window, at the decision's time: a final one, or the refusal
        a wait starts with (the proxy publishes it at once, with ``waits``)."""
        window = self.windows.get(entitlement)
        if window is not None and decision.outcome is not _REFUSED_BUDGET:  # (no demand, as live)
            t_ms = self.origin_ms + round_half_even(now_s * 1000)
            ticket = decision.ticket
            if ticket is not None:
                window.add_values(_ADMITTED, t_ms, ticket.reserved_tokens, 0, ticket.reserved_kv_bytes)
            else:
                cap = self.pool.default_max_tokens if max_tokens is None else max_tokens
                window.add_values(_REFUSED, t_ms, prompt_tokens + self.output_reservation(entitlement, cap))

    def _count(self, entitlement: str, outcome: WaitOutcome) -> None:
        counts = self.queue_outcomes.get(entitlement)
        if counts is None:
            counts = self.queue_outcomes[entitlement] = {}
        value = outcome.value
        counts[value] = counts.get(value, 0) + 1

    def output_reservation(self, entitlement: str, max_tokens: int) -> int:
        """The output tokens a request capped at ``max_tokens`` reserves now (the proxy's output estimate)."""
        return self.admission.output_reservation(entitlement, max_tokens)

    def completed(self, ticket: Ticket, used_tokens: int, now_s: float, completion_tokens: int | None = None) -> None:
        """Settle a request; ``completion_tokens`` (given when it ran to its end) teaches the output estimate."""
        self.admission.release(ticket, used_tokens, now_s)
        if completion_tokens is not None:
            self.admission.observe(ticket, completion_tokens)
        completion = 0 if completion_tokens is None else completion_tokens  # None: evicted, charged its prompt
        if self.budgets.reserved:  # (nothing to settle without a budget: spare the call)
            self.budgets.settle(ticket.request_id, used_tokens - completion, completion, now_s)
        window = self.windows.get(ticket.entitlement)
        if window is not None:
            window.add_values(_COMPLETED, self.origin_ms + round_half_even(now_s * 1000), 0, used_tokens,
                              ticket.reserved_kv_bytes)

    def in_flight(self) -> dict[str, int]:
        return {name: self.admission.in_flight_of(name) for name in self.specs}

    def budget_periods(self) -> list[BudgetPeriod]:
        """Every budget's periods as the replay's ledger saw them (docs/budgets.md#replay)."""
        return self.budgets.periods()

    # ---- the control tick (the stream agents) -----------------------------------------------------------
    def tick(self, now_s: float, backend_waiting: int, ready_replicas: int, hold: bool = False) -> int | None:
        """Close the windows, run ``pool_tick``, apply its members' limits (``hold``: keep them for
        ``put_in_force``, after those held before). Returns a new replica target, or None."""
        params = self.params
        self.replicas = ready_replicas
        now_ms = self.origin_ms + round(now_s * 1000)
        grace_ms = round(params.grace_s * 1000)
        samples: dict[str, windows.UsageSample | None] = {}
        for name, window in self.windows.items():
            closed = window.close(now_ms, grace_ms)
            samples[name] = closed[-1] if closed else None
        capacity = self.capacity()
        ticked = pool_tick(self.pool, list(self.specs.values()), (now_ms - grace_ms) / 1000.0, previous=self.signals,
                           previous_mean_slo_ms=self.mean_slo_ms, mean_slo_frozen=params.mean_slo == "frozen",
                           samples=samples, capacity=capacity, backend_waiting=backend_waiting,
                           constants=params.constants, limit_config=params.limit_config, scaling=params.scaling)
        result = ticked.tick
        members = ticked.members
        self.signals = dict(result.signals)
        self.mean_slo_ms = ticked.mean_slo_ms
        sent: list[tuple[str, EntitlementLimits]] = []
        for e in members:
            lim = result.limits[e.name]
            slots = ticked.concurrency[e.name]
            prio = result.priorities[e.name]
            sent.append((e.name, EntitlementLimits(slots, lim.tokens_per_s, lim.kv_bytes, prio,
                                                   e.name in ticked.yielding)))
            sample = samples[e.name]
            sig = result.signals[e.name]
            self.entitlement_ticks.append(EntitlementTick(
                now_s, e.name, prio, sig.debt, sig.burst, slots, lim.tokens_per_s,
                sample.used.tokens_per_s if sample else 0.0, sample.demand.tokens_per_s if sample else 0.0,
                sample.used.concurrency if sample else 0.0,
            ))
        waiting = ticked.backend_waiting
        self.held.append(HeldLimits(tuple(sent), int(capacity.concurrency), waiting))
        if not hold:
            self.put_in_force(now_s)
        floor = protected_floor(self.pool, members)
        self.stabilizer, target = self.stabilizer.step(now_s, result.desired_replicas, floor, params.scaling)
        self.pool_ticks.append(PoolTick(now_s, result.contended, waiting, int(capacity.concurrency),
                                        ticked.mean_slo_ms or 1.0, result.desired_replicas, target))
        return target if self.pool.max_replicas > self.pool.min_replicas else None

    def put_in_force(self, now_s: float) -> None:
        """Apply the oldest held tick's limits, as the proxy applies a limit update when it arrives: an entitlement
        that left since is skipped, one that joined since keeps the limits it has. Nothing held: nothing to do."""
        if not self.held:
            return
        update = self.held.popleft()
        for name, limits in update.limits:
            if name in self.specs:
                self.admission.set_limits(name, limits, now_s)
        self.admission.set_pool(update.pool_concurrency, update.backend_waiting)
