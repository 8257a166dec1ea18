"""A budget enforced by a fleet of proxies from a published ledger, and its overshoot (docs/budgets.md#enforcement).

N proxies enforce one entitlement's budget. The agents fold every completion into the account (in event time) and
publish it every ``publish_interval_s``: the spending of every completion before ``through`` = the publication
time − ``watermark_lag_s``, reaching every proxy ``kafka_lag_s`` later. A proxy admits a request when the core's
check (``core.budgets.admits``) passes on the latest record it has, less its own spending the record does not
include: its completions at or after ``through`` and the reservations of its requests in flight
(``request_units``: the prompt and the output *estimate*), and, by default, the other proxies' reservations in flight
the record carries (``publish_in_flight`` below). A request completes after its service time and spends
what it actually used, which may be more than its estimate (up to ``max_tokens``).

Nothing reads a clock: arrivals, the balancer and every request's size and duration come from ``seed``, events run
in integer ms of event time, and at equal times completions come first, then records arriving, then publications,
then arrivals. The run lies inside one period of the budget (checked), so "the end of the period" is the end of
the run, when everything in flight has completed.

What a run measures (``BudgetFleetRun``): the overshoot (spent − allowance, at least 0) beside three bounds. With
t* the last admission (at proxy i*, whose record counted the completions before τ*):
- ``bound_exact``: the reservations of the *other* proxies' requests not completed by τ* (the spending i* could not
  see), plus every request's use beyond its reservation. The overshoot never exceeds it (derived in
  docs/budgets.md#the-overshoot-measured); the property test checks it on every run.
- ``bound_interval``: the reservations the fleet admitted in one staleness interval (publish interval + Kafka lag
  + watermark lag) before t*, plus the use beyond reservations — which ignores the other proxies' requests *in
  flight*: the record counts completions only, so those are invisible too, and this one is not a bound.
- ``bound_in_flight``: the reservations admitted in one staleness interval plus the longest request's duration
  before t*, plus the use beyond reservations: a bound that needs only the fleet's admissions, and holds.
- ``bound_proxies``: (proxies − 1) × the units i*'s record left, plus the use beyond reservations — not a bound
  either: another proxy's last admissions were checked against an older record, which left more.

``publish_in_flight`` is the product's rule (docs/budgets.md#the-others-reservations-in-flight): each record also
carries, per proxy, the tokens reserved by its requests in flight at ``through`` (admitted before it, not completed
before it), folded from the admissions and completions in event time as the agents fold them
(``core.budget_reservations.reserve``), and a proxy adds the *other* proxies' to its own spending
(``core.budget_reservations.pending_units``, as ``proxy.budgets`` does). Without it, records carry completions only
(the product before the levels existed). What i* could not see is then only what the others admitted at or after τ*:
- ``bound_admitted_since``: the reservations of the other proxies' requests admitted at or after τ*, plus the use
  beyond reservations. It bounds the overshoot in that mode (the property test checks it), and is about one
  staleness interval's admissions by the fleet; without ``publish_in_flight`` it is not a bound.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field, replace

from tokenpools.core.budget_reservations import pending_units, reserve
from tokenpools.core.budgets import Account, BudgetSpec, Period, Usage, Weights, account_at, admits, request_units

_COMPLETE, _RECORD, _PUBLISH, _ARRIVE = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class BudgetFleetConfig:
    """One fleet run: the proxies, the budget, the publication, the load."""

    proxies: int
    budget: BudgetSpec
    rate_per_s: float  # fleet-wide Poisson arrivals
    duration_s: float  # arrivals stop then; the run ends when the last request completes
    publish_interval_s: float = 1.0  # budgets.publish_interval_s
    kafka_lag_s: float = 0.05  # a record reaches the proxies this long after it is published
    watermark_lag_s: float = 0.1  # a record counts the completions before its publication time minus this
    prompt_tokens: tuple[int, int] = (100, 1000)  # uniform, inclusive
    max_tokens: int = 512
    estimate_tokens: int = 256  # the output estimate a request reserves; max_tokens: no request exceeds it
    output_tokens: tuple[int, int] = (1, 512)  # what a request actually generates, uniform, at most max_tokens
    service_s: tuple[float, float] = (1.0, 20.0)  # how long a request runs, uniform
    origin_ms: int = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a period's start for day, week and month budgets
    seed: int = 0
    publish_in_flight: bool = True  # records carry each proxy's reservations in flight at ``through`` (module doc)

    def __post_init__(self) -> None:
        if self.proxies < 1:
            raise ValueError(f"`proxies` must be >= 1, got {self.proxies}")
        for name in ("rate_per_s", "duration_s", "publish_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"`{name}` must be positive, got {getattr(self, name)}")
        if self.kafka_lag_s < 0 or self.watermark_lag_s < 0:
            raise ValueError("`kafka_lag_s` and `watermark_lag_s` must be >= 0")
        if not 0 <= self.estimate_tokens <= self.max_tokens or self.output_tokens[1] > self.max_tokens:
            raise ValueError("need 0 <= estimate_tokens <= max_tokens and output_tokens within max_tokens")
        if not 0 < self.service_s[0] <= self.service_s[1]:
            raise ValueError(f"`service_s` must be 0 < low <= high, got {self.service_s}")
        last_ms = self.origin_ms + round((self.duration_s + self.service_s[1]) * 1000)
        if self.budget.period is not Period.NEVER and self.budget.period_at(self.origin_ms) != self.budget.period_at(last_ms):
            raise ValueError("the run must lie inside one period of the budget (so its end is the period's end)")

    @property
    def staleness_ms(self) -> int:
        """How old, at most, the spending a proxy sees is: one publication interval plus both lags."""
        return round((self.publish_interval_s + self.kafka_lag_s + self.watermark_lag_s) * 1000)


@dataclass(slots=True)
class _Request:
    proxy: int
    admitted_ms: int
    completed_ms: int
    reserved: float  # units
    reserved_tokens: int  # its prompt and output estimate: what its admission event's ``cost_tokens`` says
    used: Usage  # tokens it actually spent
    cost: float  # ... in units


@dataclass(slots=True)
class _Proxy:
    name: str  # its proxy id in the records' levels
    record: Account
    through_ms: int
    own_completed: list[tuple[int, float]] = field(default_factory=list)  # (event time, units), at/after through
    reserved: float = 0.0  # units of its requests in flight
    levels: dict[str, int] = field(default_factory=dict)  # the record's: proxy → tokens reserved in flight at through

    def pending(self, weights: Weights) -> float:
        own = self.reserved + math.fsum(units for _, units in self.own_completed)
        return pending_units(own, self.levels, self.name, weights)


@dataclass(frozen=True, slots=True)
class BudgetFleetRun:
    """What one run measured (units of the budget)."""

    proxies: int
    allowance: float
    spent: float
    admitted: int
    refused: int
    overshoot: float  # max(0, spent − allowance)
    beyond_reservation: float  # the sum of every request's use beyond its reservation
    bound_exact: float
    bound_interval: float
    bound_in_flight: float
    bound_proxies: float  # (proxies − 1) × what i*'s record left, plus the use beyond reservations
    bound_admitted_since: float  # the others' reservations admitted at or after τ*, plus the use beyond them


def run(config: BudgetFleetConfig) -> BudgetFleetRun:
    """One deterministic run of ``config``."""
    spec, weights = config.budget, config.budget.weights
    rng = random.Random(f"{config.seed}:budget-fleet")
    origin = config.origin_ms
    account = account_at(spec, None, origin)
    start = Account(account.start_ms, account.end_ms, account.allowance)
    proxies = [_Proxy(str(i), start, origin) for i in range(config.proxies)]
    heap: list[tuple[int, int, int, int]] = []  # (t_ms, kind, seq, payload)
    seq = 0

    t_s = rng.expovariate(config.rate_per_s)
    end_arrivals_ms = origin + round(config.duration_s * 1000)
    while origin + round(t_s * 1000) < end_arrivals_ms:
        heap.append((origin + round(t_s * 1000), _ARRIVE, seq, 0))
        seq += 1
        t_s += rng.expovariate(config.rate_per_s)
    interval_ms = round(config.publish_interval_s * 1000)
    for k in range(1, int(config.duration_s / config.publish_interval_s) + 1):
        heap.append((origin + k * interval_ms, _PUBLISH, seq, 0))
        seq += 1
    heapq.heapify(heap)

    requests: list[_Request] = []
    completions: list[tuple[int, Usage]] = []  # (event time, tokens), in event time: the agents' ledger
    records: list[tuple[Account, int, dict[str, int]]] = []  # published (account, through, levels), in order
    ledger_index = 0  # completions folded into ``folded`` so far
    reservations: list[tuple[int, str, int]] = []  # admissions (+) and completions (−) in event time: the agents' view
    reservations_index = 0  # ... folded into ``levels`` so far
    levels: dict[str, int] = {}  # proxy → tokens reserved in flight, as of the last publication's ``through``
    folded = start
    watermark_ms, kafka_ms = round(config.watermark_lag_s * 1000), round(config.kafka_lag_s * 1000)
    last_admission: tuple[int, int, int, float] | None = None  # (t, proxy, through of its record, what it left)
    refused = 0

    while heap:
        t, kind, _, payload = heapq.heappop(heap)
        if kind == _COMPLETE:
            req = requests[payload]
            proxy = proxies[req.proxy]
            proxy.reserved -= req.reserved
            proxy.own_completed.append((t, req.cost))
            completions.append((t, req.used))
            reservations.append((t, proxy.name, -req.reserved_tokens))
        elif kind == _PUBLISH:
            through = t - watermark_ms
            while ledger_index < len(completions) and completions[ledger_index][0] < through:
                folded = Account(folded.start_ms, folded.end_ms, folded.allowance,
                                 folded.spent + completions[ledger_index][1])
                ledger_index += 1
            while reservations_index < len(reservations) and reservations[reservations_index][0] < through:
                _, name, delta = reservations[reservations_index]
                reserve(levels, name, delta)
                reservations_index += 1
            records.append((folded, through, dict(levels) if config.publish_in_flight else {}))
            heapq.heappush(heap, (t + kafka_ms, _RECORD, seq, len(records) - 1))
            seq += 1
        elif kind == _RECORD:
            record, through, record_levels = records[payload]
            for proxy in proxies:
                proxy.record, proxy.through_ms, proxy.levels = record, through, record_levels
                proxy.own_completed = [c for c in proxy.own_completed if c[0] >= through]
        else:
            p = rng.randrange(config.proxies)
            prompt = rng.randint(*config.prompt_tokens)
            output = rng.randint(*config.output_tokens)
            service_ms = round(rng.uniform(*config.service_s) * 1000)
            proxy = proxies[p]
            units = request_units(prompt, config.estimate_tokens, weights)
            if not admits(proxy.record, weights, proxy.pending(weights), units):
                refused += 1
                continue
            proxy.reserved += units
            used = Usage(prompt, 0, output, 1)
            tokens = prompt + config.estimate_tokens
            requests.append(_Request(p, t, t + service_ms, units, tokens, used, used.cost(weights)))
            reservations.append((t, proxy.name, tokens))
            heapq.heappush(heap, (t + service_ms, _COMPLETE, seq, len(requests) - 1))
            seq += 1
            last_admission = (t, p, proxy.through_ms, proxy.record.remaining(weights))

    spent = math.fsum(r.cost for r in requests)
    allowance = start.allowance
    beyond = math.fsum(max(0.0, r.cost - r.reserved) for r in requests)
    exact = interval = in_flight = proxies_bound = since = beyond
    if last_admission is not None:
        t_last, p_last, tau, left = last_admission
        proxies_bound += (config.proxies - 1) * max(0.0, left)
        longest_ms = max(r.completed_ms - r.admitted_ms for r in requests)
        exact += math.fsum(r.reserved for r in requests if r.proxy != p_last and r.completed_ms >= tau)
        since += math.fsum(r.reserved for r in requests if r.proxy != p_last and r.admitted_ms >= tau)
        interval += math.fsum(r.reserved for r in requests if t_last - config.staleness_ms < r.admitted_ms <= t_last)
        in_flight += math.fsum(r.reserved for r in requests
                               if t_last - config.staleness_ms - longest_ms < r.admitted_ms <= t_last)
    return BudgetFleetRun(config.proxies, allowance, spent, len(requests), refused, max(0.0, spent - allowance),
                          beyond, exact, interval, in_flight, proxies_bound, since)



FLEET_SIZES = (1, 2, 4, 8)


def _ratio(value: float, bound: float) -> float:
    return value / bound if bound > 0 else 0.0


BOUNDS = ("bound_exact", "bound_in_flight", "bound_interval", "bound_proxies", "bound_admitted_since")


@dataclass(frozen=True, slots=True)
class SizeFigures:
    """One fleet size over the seeds: the largest overshoot (units), its largest ratio to the allowance, and to
    each bound (``BOUNDS``)."""

    proxies: int
    overshoot: float
    allowance_ratio: float
    bound_ratios: tuple[float, ...]


def figures(base: BudgetFleetConfig, sizes: tuple[int, ...] = FLEET_SIZES, seeds: int = 5) -> list[SizeFigures]:
    """The overshoot ÷ the allowance and ÷ each bound for every fleet size, the largest over ``seeds`` runs."""
    out = []
    for n in sizes:
        runs = [run(_with(base, n, seed)) for seed in range(seeds)]
        out.append(SizeFigures(n, max(r.overshoot for r in runs), max(_ratio(r.overshoot, r.allowance) for r in runs),
                               tuple(max(_ratio(r.overshoot, getattr(r, bound)) for r in runs) for bound in BOUNDS)))
    return out


def measure(base: BudgetFleetConfig, sizes: tuple[int, ...] = FLEET_SIZES, seeds: int = 5) -> list[str]:
    """``figures`` as table lines."""
    header = ("| proxies | overshoot (units, max) | ÷ allowance | ÷ bound_exact | ÷ bound_in_flight | ÷ bound_interval "
              "| ÷ bound_proxies | ÷ bound_admitted_since |")
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for f in figures(base, sizes, seeds):
        lines.append(f"| {f.proxies} | {f.overshoot:.0f} | {f.allowance_ratio:.4f} | "
                     + " | ".join(f"{x:.3f}" for x in f.bound_ratios) + " |")
    return lines


def _with(base: BudgetFleetConfig, proxies: int, seed: int) -> BudgetFleetConfig:
    return replace(base, proxies=proxies, seed=base.seed + seed)
