"""This proxy's view of its entitlements' budget accounts, and the budget check (docs/budgets.md#enforcement).

Per (entitlement, budget) the view holds the agents' latest account (a ``BudgetStatus`` from the budgets topic: the
highest version wins, an older one is ignored) and this proxy's own spending that record may not include yet: its
completions with an event time at or after the record's ``through_ms``, dropped once a newer record's
``through_ms`` passes them. Per entitlement it holds the reservations of its requests in flight (each request's
n_in and output estimate, priced at each budget's weights when compared). The check admits a request while

    allowance - published spending - own spending - reservations >= the request's reservation

(``core.budgets.admits``), for every budget of the entitlement.

Which account is in force at ``now``:
- the record's, while ``now`` is in its period (and the spec's period and time zone are the record's);
- after the record's period ended, the next period's account (``core.budgets.account_at``): its rollover is
  computed from the record's spending, an estimate until the agents publish the new period's account (the other
  proxies' spending after ``through_ms`` is unknown here; the agents' record corrects it);
- with no record yet (or none of the spec's period and time zone, after a spec change), a fresh account of the
  current period (``account_at(spec, None, now)``: the bare amount) and this proxy's own spending in it. Without
  Kafka that is all a proxy ever knows.

A spec change is in force at the next check (the specs are read at each call): a budget added is checked at once, a
removed one no more; new weights reprice the spending at once; a new period or time zone starts from own spending
until the agents' record of it; a new amount is in the allowance when the agents publish it (a record's allowance
includes a rollover the proxy cannot recompute).

A tenant budget (``BudgetScope.TENANT``, docs/budgets.md#tenant-budgets) is one budget shared by every entitlement
of the tenant declaring it, on any pool. The agents publish one record per entitlement, its *part* (its own spending
in the period); the account in force sums, for the spec's current period, the latest part of every entitlement of
the tenant (each part counted once: the latest version of its key), plus, per entitlement, this proxy's own
spending after that part's ``through_ms`` (after the period's start with no part of the period yet) and the
reservations of this proxy's entitlements declaring it. The parts' sum per period (spending and reservations in
flight per proxy) is kept as their records arrive (``_PartSum``), so a check costs the same whatever the number of
parts: it adds only this proxy's own entitlements' spending and reservations. Its allowance is the spec's amount
(a tenant budget has no rollover), so a new amount is in force at the next check. Which of this proxy's entitlements declare it is learnt
at each check (the spec then in force): one that stops declaring it no longer adds its reservations; the spending
it made in the period stays counted (its part, its own completions) until the reset.

Stale views (docs/budgets.md#stale-views): per key the book notes when the latest record arrived (``apply``'s
``received_ms``); own spending settled at or after that moment waits for the agents. ``unavailable`` names the
first budget whose policy is ``refuse`` and whose oldest such spending has waited longer than ``stale_after_ms``
(``core.budgets.refuses_stale``): its requests get 503 ``budget_unavailable`` until a record arrives.

Pure: time is an argument (wall-clock ms, the events' time base); no I/O. Lives on the event loop.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from tokenpools.core.budget_reservations import pending_units
from tokenpools.core.budgets import (
    NEVER_END_MS, Account, BudgetScope, BudgetSpec, OnStale, Period, Usage, account_at, admits, iso_ms, refuses_stale,
    retry_after_ms)
from tokenpools.topics.records import BudgetStatus

MAX_OWN_ENTRIES = 65_536
"""Own completions kept per account between two records. Past it the two oldest merge into one at the later time:
counted until a record covers the later one (at worst a little longer than needed, never less)."""


@dataclass(frozen=True, slots=True)
class StaleRule:
    """The ``budgets`` settings of stale views, in the units the check uses: the default policy (a budget's own
    ``on_stale`` wins), how long own spending may wait for a record, and the 503's Retry-After (about one publish
    interval: when a record may have arrived)."""

    on_stale: OnStale = OnStale.SPEND
    stale_after_ms: int = 30_000
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        if self.stale_after_ms <= 0:
            raise ValueError(f"`stale_after_ms` must be positive, got {self.stale_after_ms}")
        if self.retry_after_s < 1:
            raise ValueError(f"`retry_after_s` must be >= 1, got {self.retry_after_s}")

    @classmethod
    def of(cls, budgets: object) -> StaleRule:
        """From a ``tokenpools.config.BudgetsSettings`` (typed loosely: this module stays import-light)."""
        return cls(budgets.on_stale, max(1, round(budgets.stale_after_s * 1000)),  # type: ignore[attr-defined]
                   max(1, math.ceil(budgets.publish_interval_s)))  # type: ignore[attr-defined]


class RecordResult(StrEnum):
    APPLIED = "applied"
    STALE = "stale"  # a version not newer than the one held for the key


@dataclass(frozen=True, slots=True)
class Published:
    """The agents' latest account of one budget (of a tenant budget: one entitlement's part), as the check uses it."""

    version: int
    period: Period
    time_zone: str
    account: Account
    through_ms: int
    scope: BudgetScope = BudgetScope.ENTITLEMENT
    tenant: str = ""
    reserved_tokens: Mapping[str, int] = field(default_factory=dict)  # proxy → its reservations in flight at through

    @classmethod
    def of(cls, record: BudgetStatus) -> Published:
        spent = Usage(record.spent.prompt_tokens, record.spent.cached_prompt_tokens, record.spent.completion_tokens,
                      record.spent.requests)
        return cls(record.version, record.period, record.time_zone,
                   Account(record.period_start_ms, record.period_end_ms, record.allowance, spent), record.through_ms,
                   record.scope, record.tenant, dict(record.reserved_tokens))


@dataclass(frozen=True, slots=True)
class BudgetState:
    """One budget at one instant as this proxy sees it: the account in force and what the proxy adds to it."""

    spec: BudgetSpec
    account: Account  # published spending (or none) in the period in force
    pending: Usage  # own spending the account does not include, plus the reservations in flight
    levels: Mapping[str, int] = field(default_factory=dict)  # the record's reservations in flight per proxy (summed
    proxy_id: str = ""  # over a tenant budget's parts); this proxy's own level among them is not counted

    @property
    def pending_units(self) -> float:
        """What the check adds to the account's spending: this proxy's own pending spending and the other proxies'
        reservations in flight at the record's ``through_ms`` (``core.budget_reservations.pending_units``)."""
        weights = self.spec.weights
        return pending_units(self.pending.cost(weights), self.levels, self.proxy_id, weights)

    @property
    def remaining_units(self) -> float:
        return self.account.remaining(self.spec.weights) - self.pending_units


@dataclass(frozen=True, slots=True)
class BudgetRefusal:
    """A request the budget ``state`` cannot take: it needed ``units``."""

    entitlement: str
    state: BudgetState
    units: float
    retry_after_ms: int
    tenant: str = ""

    @property
    def resets_at(self) -> str | None:
        """The reset as RFC 3339 in the budget's time zone; None for a budget that never resets."""
        end = self.state.account.end_ms
        return None if end >= NEVER_END_MS else iso_ms(end, self.state.spec.time_zone)

    @property
    def retry_after_s(self) -> int:
        return max(1, math.ceil(self.retry_after_ms / 1000))

    @property
    def reason(self) -> str:
        spec, state = self.state.spec, self.state
        left = max(0.0, state.remaining_units)
        reset = f"it resets at {self.resets_at}" if self.resets_at is not None else "it does not reset"
        whose = (f"tenant {self.tenant} (entitlement {self.entitlement})" if spec.scope is BudgetScope.TENANT
                 else f"entitlement {self.entitlement}")
        return (f"budget {spec.name} of {whose} is exhausted: {_units(left)} of "
                f"{_units(state.account.allowance)} units left this {spec.period.value} period, the request reserves "
                f"{_units(self.units)}; {reset}")

    def detail(self) -> dict[str, object]:
        """What the 429's body says of the budget (``error.budget``)."""
        spec, state = self.state.spec, self.state
        return {"name": spec.name, "period": spec.period.value, "time_zone": spec.time_zone,
                "resets_at": self.resets_at, "allowance": state.account.allowance,
                "remaining": max(0.0, state.remaining_units), "request": self.units}


def _units(x: float) -> str:
    return f"{x:.6g}"


@dataclass(slots=True)
class _Own:
    """One account's own completions not yet covered by a record, oldest first, and their sum."""

    entries: deque[tuple[int, Usage]] = field(default_factory=deque)
    total: Usage = field(default_factory=Usage)

    def add(self, t_ms: int, usage: Usage, max_entries: int) -> None:
        entries = self.entries
        if not entries or entries[-1][0] <= t_ms:
            entries.append((t_ms, usage))
        else:  # a clock step back: keep the order
            entries.insert(bisect.bisect_right(entries, t_ms, key=lambda e: e[0]), (t_ms, usage))
        self.total = self.total + usage
        if len(entries) > max_entries:
            (_, first), (t_second, second) = entries.popleft(), entries.popleft()
            entries.appendleft((t_second, first + second))

    def drop_before(self, cut_ms: int) -> None:
        entries = self.entries
        while entries and entries[0][0] < cut_ms:
            self.total = _minus(self.total, entries.popleft()[1])


def _discard(index: dict[tuple[str, str], dict[str, None]], group: tuple[str, str], entitlement: str) -> None:
    members = index.get(group)
    if members is not None:
        members.pop(entitlement, None)
        if not members:
            del index[group]


def _minus(a: Usage, b: Usage) -> Usage:
    return Usage(a.prompt - b.prompt, a.cached_prompt - b.cached_prompt, a.completion - b.completion,
                 a.requests - b.requests)


@dataclass(slots=True)
class _PartSum:
    """The sum of a tenant budget's parts of one period (as the records held now say): their spending and their
    reservations in flight per proxy, kept as parts arrive so that a check does not walk them."""

    spent: Usage = field(default_factory=Usage)
    levels: dict[str, int] = field(default_factory=dict)
    parts: int = 0

    def add(self, part: Published, sign: int) -> None:
        self.spent = self.spent + part.account.spent if sign > 0 else _minus(self.spent, part.account.spent)
        self.parts += sign
        for proxy, tokens in part.reserved_tokens.items():
            level = self.levels.get(proxy, 0) + sign * tokens
            if level:
                self.levels[proxy] = level
            else:
                self.levels.pop(proxy, None)


def _period_of(part: Published) -> tuple[Period, str, int]:
    return part.period, part.time_zone, part.account.start_ms


class BudgetBook:
    """The proxy's budget accounts (module doc). Keys are (entitlement, budget name); a tenant budget's parts are
    indexed by (tenant, budget name)."""

    def __init__(self, max_own_entries: int = MAX_OWN_ENTRIES, proxy_id: str = "") -> None:
        """``proxy_id``: this proxy's, as its events name it, so that its own level on the records is not counted
        again (it counts its own reservations as it holds them); "" only where no record names a proxy (no Kafka)."""
        if max_own_entries < 2:
            raise ValueError(f"`max_own_entries` must be >= 2, got {max_own_entries}")
        self.max_own_entries = max_own_entries
        self.proxy_id = proxy_id
        self._published: dict[tuple[str, str], Published] = {}
        self._own: dict[tuple[str, str], _Own] = {}
        self._reserved: dict[str, dict[str, Usage]] = {}  # entitlement → request id → its reservation
        self._reserved_total: dict[str, Usage] = {}
        self._parts: dict[tuple[str, str], dict[str, None]] = {}  # (tenant, budget) → entitlements with a part held
        self._members: dict[tuple[str, str], dict[str, None]] = {}  # (tenant, budget) → this proxy's declaring it
        self._member_of: dict[str, frozenset[tuple[str, str]]] = {}  # entitlement → the tenant budgets it declares
        self._former: dict[tuple[str, str], dict[str, None]] = {}  # (tenant, budget) → members that left (own spent)
        self._received_ms: dict[tuple[str, str], int] = {}  # (entitlement, budget) → when its latest record arrived
        # (tenant, budget) → (period, time zone, start) → the parts of that period summed (kept by ``apply``)
        self._part_sums: dict[tuple[str, str], dict[tuple[Period, str, int], _PartSum]] = {}
        self._own_of: dict[str, dict[str, None]] = {}  # budget name → entitlements with own spending of it here

    # ---- the agents' records ------------------------------------------------------------------------------------
    def apply(self, record: BudgetStatus, received_ms: int | None = None) -> RecordResult:
        """Hold ``record`` if its version is newer than the one held for its key; own spending it covers (event time
        before its ``through_ms``) is dropped at the next look at the account. ``received_ms``: when it arrived
        (wall-clock ms), from which own spending waits for the next record (stale views)."""
        key = (record.entitlement, record.budget)
        held = self._published.get(key)
        if held is not None and record.version <= held.version:
            return RecordResult.STALE
        if received_ms is not None:
            self._received_ms[key] = received_ms
        published = self._published[key] = Published.of(record)
        if held is not None and held.scope is BudgetScope.TENANT:
            _discard(self._parts, (held.tenant, record.budget), record.entitlement)
            self._sum_part((held.tenant, record.budget), held, -1)
        if published.scope is BudgetScope.TENANT:
            self._parts.setdefault((published.tenant, record.budget), {})[record.entitlement] = None
            self._sum_part((published.tenant, record.budget), published, 1)
        return RecordResult.APPLIED

    def _sum_part(self, group: tuple[str, str], part: Published, sign: int) -> None:
        sums = self._part_sums.setdefault(group, {})
        period = _period_of(part)
        total = sums.get(period)
        if total is None:
            total = sums[period] = _PartSum()
        total.add(part, sign)
        if not total.parts:
            del sums[period]
            if not sums:
                del self._part_sums[group]

    def published(self, entitlement: str, budget: str) -> Published | None:
        return self._published.get((entitlement, budget))

    # ---- the check ----------------------------------------------------------------------------------------------
    def state(self, entitlement: str, spec: BudgetSpec, now_ms: int, tenant: str = "") -> BudgetState:
        """The account of ``spec`` in force at ``now_ms`` and what this proxy adds to it (module doc); ``tenant``:
        the entitlement's, for a tenant budget."""
        if spec.scope is BudgetScope.TENANT:
            return self._tenant_state(tenant, spec, now_ms)
        key = (entitlement, spec.name)
        published = self._published.get(key)
        if (published is not None and published.scope is BudgetScope.ENTITLEMENT and published.period is spec.period
                and published.time_zone == spec.time_zone):
            if now_ms < published.account.end_ms:
                account, cut_ms, levels = published.account, published.through_ms, published.reserved_tokens
            else:  # the period ended: the next one's account, its rollover an estimate until the agents publish it
                account, levels = account_at(spec, published.account, now_ms), {}
                cut_ms = account.start_ms
        else:
            account, levels = account_at(spec, None, now_ms), {}
            cut_ms = account.start_ms
        own = self._own.get(key)
        spent = Usage()
        if own is not None:
            own.drop_before(cut_ms)
            spent = own.total
        return BudgetState(spec, account, spent + self._reserved_total.get(entitlement, Usage()), levels, self.proxy_id)

    def _tenant_state(self, tenant: str, spec: BudgetSpec, now_ms: int) -> BudgetState:
        """A tenant budget at ``now_ms``: the parts of its current period summed, plus per entitlement this proxy's
        own spending after its part's ``through_ms`` and the reservations of the entitlements declaring it here."""
        start, end = spec.period_at(now_ms)
        group = (tenant, spec.name)
        parts = self._parts.get(group, {})
        members = self._members.get(group, {})
        total = self._part_sums.get(group, {}).get((spec.period, spec.time_zone, start))
        spent = total.spent if total is not None else Usage()
        levels = dict(total.levels) if total is not None else {}
        pending = Usage()
        # the parts are summed already; only this proxy's own entitlements add their own spending and reservations
        holders = {e: None for e in self._own_of.get(spec.name, {}) if e in parts}
        for entitlement in {**holders, **members, **self._former.get(group, {})}:
            cut_ms = start
            part = self._published.get((entitlement, spec.name)) if entitlement in parts else None
            if (part is not None and part.period is spec.period and part.time_zone == spec.time_zone
                    and part.account.start_ms == start):
                cut_ms = max(start, part.through_ms)
            own = self._own.get((entitlement, spec.name))
            if own is not None:
                own.drop_before(cut_ms)
                pending = pending + own.total
            if entitlement in members:
                pending = pending + self._reserved_total.get(entitlement, Usage())
        return BudgetState(spec, Account(start, end, spec.amount, spent), pending, levels, self.proxy_id)

    def declare(self, entitlement: str, tenant: str, budgets: tuple[BudgetSpec, ...]) -> None:
        """``entitlement`` (of ``tenant``) declares ``budgets`` now: its reservations count in the tenant budgets
        among them, and no more in one it declared before and not now (its own spending there still does)."""
        groups = frozenset((tenant, b.name) for b in budgets if b.scope is BudgetScope.TENANT)
        before = self._member_of.get(entitlement, frozenset())
        if groups == before:
            return
        own_names = {b.name for b in budgets if b.scope is BudgetScope.ENTITLEMENT}
        for group in before - groups:
            _discard(self._members, group, entitlement)
            if group[1] not in own_names:  # its own spending in the period stays the tenant's (a budget of its own
                self._former.setdefault(group, {})[entitlement] = None  # of the name would spend it from now on)
        for group in groups - before:
            self._members.setdefault(group, {})[entitlement] = None
            _discard(self._former, group, entitlement)
        if groups:
            self._member_of[entitlement] = groups
        else:
            del self._member_of[entitlement]

    def check(self, entitlement: str, budgets: tuple[BudgetSpec, ...], request: Usage, now_ms: int,
              retry_cap_ms: int, tenant: str = "") -> BudgetRefusal | None:
        """The first of ``budgets`` that cannot take ``request`` (its n_in and output estimate), or None: admit.
        ``tenant``: the entitlement's (its tenant budgets are the tenant's, module doc)."""
        self.declare(entitlement, tenant, budgets)
        for spec in budgets:
            state = self.state(entitlement, spec, now_ms, tenant)
            units = request.cost(spec.weights)
            if not admits(state.account, spec.weights, state.pending_units, units):
                return BudgetRefusal(entitlement, state, units, retry_after_ms(state.account, now_ms, retry_cap_ms),
                                     tenant)
        return None

    def unacknowledged_since(self, entitlement: str, budget: str) -> int | None:
        """The event time of the oldest own spending of the budget settled since its latest record arrived (any
        own spending, with no record yet); None: none waits."""
        own = self._own.get((entitlement, budget))
        if own is None or not own.entries:
            return None
        received = self._received_ms.get((entitlement, budget))
        if received is None:
            return own.entries[0][0]
        i = bisect.bisect_left(own.entries, received, key=lambda e: e[0])
        return own.entries[i][0] if i < len(own.entries) else None

    def unavailable(self, entitlement: str, budgets: tuple[BudgetSpec, ...], now_ms: int, stale_after_ms: int,
                    default: OnStale) -> BudgetSpec | None:
        """The first of ``budgets`` whose policy (its own, else ``default``) is ``refuse`` and whose view is stale at
        ``now_ms``; None: none."""
        for spec in budgets:
            policy = spec.on_stale if spec.on_stale is not None else default
            if refuses_stale(policy, self.unacknowledged_since(entitlement, spec.name), now_ms, stale_after_ms):
                return spec
        return None

    # ---- reservations and settlement ----------------------------------------------------------------------------
    def reserve(self, entitlement: str, request_id: str, request: Usage) -> None:
        """Hold ``request`` against every budget of ``entitlement`` until it is released or settled."""
        held = self._reserved.setdefault(entitlement, {})
        if request_id in held:
            raise ValueError(f"request {request_id} already holds a budget reservation")
        held[request_id] = request
        self._reserved_total[entitlement] = self._reserved_total.get(entitlement, Usage()) + request

    def release(self, entitlement: str, request_id: str) -> None:
        """Give back ``request_id``'s reservation (refused after all, or settled); nothing if it holds none."""
        held = self._reserved.get(entitlement)
        request = held.pop(request_id, None) if held is not None else None
        if request is None:
            return
        total = _minus(self._reserved_total[entitlement], request)
        if held:
            self._reserved_total[entitlement] = total
        else:
            del self._reserved[entitlement], self._reserved_total[entitlement]

    def settle(self, entitlement: str, budgets: tuple[BudgetSpec, ...], request_id: str, t_ms: int,
               used: Usage) -> None:
        """A request ended at ``t_ms`` (its completion's event time) having used ``used``: its reservation is
        released and its usage is own spending of every budget of the entitlement (as of its spec now) until a
        record covers ``t_ms``."""
        self.release(entitlement, request_id)
        if used == Usage():
            return
        for spec in budgets:
            own = self._own.get((entitlement, spec.name))
            if own is None:
                own = self._own[(entitlement, spec.name)] = _Own()
                self._own_of.setdefault(spec.name, {})[entitlement] = None
            own.add(t_ms, used, self.max_own_entries)

    def reserved(self, entitlement: str) -> Usage:
        return self._reserved_total.get(entitlement, Usage())
