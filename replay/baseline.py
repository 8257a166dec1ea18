"""The no-admission-control baseline (the paper's comparison, §5.1): a pass-through gateway, and the registry.

Every request is admitted and forwarded; the backend's own queue absorbs whatever does not fit. It keeps the
same bookkeeping interface as ``TokenPoolsPolicy`` so the replayer treats both alike (policies are
registered plugins, and ``tests/unit/test_replay_policies.py`` runs every registered policy against the shared
invariants: docs/conventions.md#registered-policies).
"""

from __future__ import annotations

from collections.abc import Callable

from tokenpools.core.admission import Decision, Ticket
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.waiting import Waiter
from tokenpools.replay.budgets import BudgetPeriod
from tokenpools.replay.policy import EntitlementTick, PoolTick, TokenPoolsPolicy
from tokenpools.replay.scenario import ReplayParams

_ADMITTED = AdmissionOutcome.ADMITTED


class NoAdmissionPolicy:
    """Admit everything, decide nothing. ``POLICIES["none"]``."""

    name = "none"
    controlled = False

    def __init__(self, pool: PoolSpec, params: ReplayParams, origin_ms: int = 0) -> None:
        self.pool = pool
        self.params = params
        self.specs: dict[str, EntitlementSpec] = {}
        self._in_flight: dict[str, int] = {}
        self.queue_outcomes: dict[str, dict[str, int]] = {}  # (nothing waits: a pass-through gateway)
        self.wait_starts: list[tuple[float, str, str]] = []
        self.entitlement_ticks: list[EntitlementTick] = []
        self.pool_ticks: list[PoolTick] = []

    def join(self, spec: EntitlementSpec, now_s: float) -> None:
        self.specs[spec.name] = spec
        self._in_flight.setdefault(spec.name, 0)

    def leave(self, name: str, now_s: float) -> list[Waiter]:
        self.specs.pop(name, None)
        return []

    def set_capacity(self, slots_per_replica: int, max_num_seqs: int, backend_waiting: int) -> None:
        return None

    def admit(self, entitlement: str, request_id: str, prompt_tokens: int, max_tokens: int | None,
              now_s: float) -> Decision | Waiter:
        if max_tokens is None:
            max_tokens = self.pool.default_max_tokens
        cost = prompt_tokens + max_tokens
        ticket = Ticket(request_id, entitlement, cost, cost * self.pool.kv_bytes_per_token, 0.0, now_s, False)
        self._in_flight[entitlement] = self._in_flight.get(entitlement, 0) + 1
        return Decision(_ADMITTED, "admitted (no admission control)", 0, ticket, max_tokens)

    def drain(self, now_s: float) -> list[Waiter]:
        return []

    def next_wake_s(self) -> float | None:
        return None

    def output_reservation(self, entitlement: str, max_tokens: int) -> int:
        return max_tokens  # nothing is reserved; the cost it records is n_in + max_tokens

    def completed(self, ticket: Ticket, used_tokens: int, now_s: float, completion_tokens: int | None = None) -> None:
        self._in_flight[ticket.entitlement] -= 1

    def in_flight(self) -> dict[str, int]:
        return {name: self._in_flight.get(name, 0) for name in self.specs}

    def tick(self, now_s: float, backend_waiting: int, ready_replicas: int, hold: bool = False) -> int | None:
        return None

    def put_in_force(self, now_s: float) -> None:
        return None  # (no limits to put in force)

    def budget_periods(self) -> list[BudgetPeriod]:
        return []  # no admission control enforces no budget either


PolicyFactory = Callable[[PoolSpec, ReplayParams, int], "TokenPoolsPolicy | NoAdmissionPolicy"]

POLICIES: dict[str, PolicyFactory] = {
    "token-pools": TokenPoolsPolicy,
    "none": NoAdmissionPolicy,
}
