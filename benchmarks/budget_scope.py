"""What a proxy pays for the budgets topic: records it does not enforce, and a tenant budget's check (docs/budgets.md).

    .venv/bin/python benchmarks/budget_scope.py              # a few seconds
    .venv/bin/python benchmarks/budget_scope.py --runs 7 --passes 40

(a) Following the topic: 1,000 entitlement budgets on 20 pools (50 per pool); this proxy serves one pool, so it
enforces 50 of them. Each pass hands the follower (``proxy.inputs.budget_follower``) one record of every account, at
a new version, under the key the agents write (``streams.budgets.ledger.status_key``) and, as the baseline measured
in the same run, under the form before scopes were keyed (``<pool>/<entitlement>/<budget>``, which the follower must
decode to learn a record's scope). Figures: records handled per second and CPU (process time) per record.

(b) A tenant budget's check per request (``BudgetBook.check``) for a tenant of N parts (N = 1, 10, 100): one
entitlement of this proxy, with its own spending and a reservation in flight, and N - 1 parts of other pools' entitlements
with reservations of 3 other proxies. Figure: microseconds per check, and its ratio to N = 1 measured in the same run.

Each figure is the median of the runs.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from datetime import datetime

from tokenpools.core.budgets import BudgetScope, BudgetSpec, Period, Usage, period_bounds
from tokenpools.proxy.admission.budgets import BudgetBook
from tokenpools.proxy.inputs.budget_follower import BudgetFollower
from tokenpools.proxy.observability.metrics import ProxyMetrics
from tokenpools.runtime.clock import FakeClock
from tokenpools.streams.budgets.ledger import status_key
from tokenpools.topics.codec import encode
from tokenpools.topics.records import BudgetStatus

NOW_MS = int(datetime.fromisoformat("2026-12-04T12:00:00+00:00").timestamp() * 1000)
POOLS, PER_POOL = 20, 50
DAILY = BudgetSpec("daily", Period.DAY, 10_000_000)
SHARED = BudgetSpec("shared", Period.DAY, 10_000_000, scope=BudgetScope.TENANT)


def status(pool: str, entitlement: str, spec: BudgetSpec, version: int, tenant: str = "acme",
           reserved: dict[str, int] | None = None) -> BudgetStatus:
    start, end = period_bounds(spec.period, spec.time_zone, NOW_MS)
    return BudgetStatus(pool=pool, entitlement=entitlement, tenant=tenant, budget=spec.name, scope=spec.scope,
                        period=spec.period, time_zone=spec.time_zone, period_start_ms=start, period_end_ms=end,
                        allowance=spec.amount, spent={"prompt_tokens": 1000 + version, "cached_prompt_tokens": 10,
                                                      "completion_tokens": 500, "requests": 7},
                        spent_units=1510 + version, version=version, t_ms=NOW_MS - 100, through_ms=NOW_MS - 100,
                        reserved_tokens=reserved or {"p1": 300, "p2": 200})


def follow(passes: int, old_keys: bool) -> tuple[float, float, int]:
    """(wall s, CPU s, records) for ``passes`` passes over every account."""
    records = []
    for version in range(1, passes + 1):
        for p in range(POOLS):
            for e in range(PER_POOL):
                record = status(f"pool-{p:02d}", f"ent-{p:02d}-{e:02d}", DAILY, version)
                key = f"{record.pool}/{record.entitlement}/{record.budget}" if old_keys else status_key(record)
                records.append((key.encode(), encode(record)))
    follower = BudgetFollower(BudgetBook(proxy_id="p0"), {"pool-00": object()}, ProxyMetrics(),
                              FakeClock(wall_ms=NOW_MS))
    handle = follower.handle
    wall, cpu = time.perf_counter(), time.process_time()
    for offset, (key, value) in enumerate(records):
        handle(value, "budgets", 0, offset, key)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    applied = sum(n for (pool, result), n in follower.metrics.budget_records.items() if result == "applied")
    assert applied == passes * PER_POOL, applied  # this pool's accounts, every pass
    return wall, cpu, len(records)


def tenant_check(parts: int, calls: int) -> float:
    """Microseconds per tenant-budget check with ``parts`` parts."""
    book = BudgetBook(proxy_id="p0")
    book.apply(status("pool-00", "gold", SHARED, 1), NOW_MS)
    for i in range(parts - 1):
        book.apply(status(f"pool-{1 + i % (POOLS - 1):02d}", f"other-{i}", SHARED, 1,
                          reserved={"p1": 100, "p2": 50, "p3": 20}), NOW_MS)
    book.settle("gold", (SHARED,), "done", NOW_MS - 10, Usage(100, 0, 50, 1))
    book.reserve("gold", "busy", Usage(200, 0, 256))
    request, check = Usage(100, 0, 256), book.check
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        if check("gold", (SHARED,), request, NOW_MS, 3_600_000, "acme") is not None:
            raise AssertionError("the benchmark's budget is large enough to admit every check")
    return (time.perf_counter_ns() - t0) / calls / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--passes", type=int, default=20, help="versions of every account per run (default 20)")
    parser.add_argument("--calls", type=int, default=20_000, help="tenant checks per run and N (default 20,000)")
    args = parser.parse_args()
    print(f"{platform.node() or 'unknown host'}, Python {platform.python_version()}; {args.runs} runs, medians")
    print(f"(a) {POOLS * PER_POOL} entitlement budgets, {PER_POOL} enforced here, {args.passes} passes per run")
    base_rate = base_cpu = 0.0
    for label, old in (("old key form (baseline)", True), ("keys as the agents write them", False)):
        runs = [follow(args.passes, old) for _ in range(args.runs)]
        rate = statistics.median(n / wall for wall, _, n in runs)
        cpu_us = statistics.median(cpu / n * 1e6 for _, cpu, n in runs)
        if old:
            base_rate, base_cpu = rate, cpu_us
        print(f"  {label:32s} {rate:12,.0f} records/s  {cpu_us:7.2f} us CPU/record  "
              f"x{rate / base_rate:5.2f} rate, x{cpu_us / base_cpu:5.2f} CPU of the baseline")
    print(f"(b) a tenant budget's check, {args.calls:,} per run")
    one = 0.0
    tenant_check(1, args.calls)  # warm-up
    for parts in (1, 10, 100):
        us = statistics.median(tenant_check(parts, args.calls) for _ in range(args.runs))
        one = one or us
        print(f"  N = {parts:3d} parts  {us:7.2f} us/check  x{us / one:5.2f} of N = 1")


if __name__ == "__main__":
    main()
