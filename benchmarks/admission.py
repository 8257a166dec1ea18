"""Cost of one admission decision (admit + release) on the proxy's in-memory controller.

    .venv/bin/python benchmarks/admission.py                 # 5 runs of 200,000 pairs per path
    .venv/bin/python benchmarks/admission.py --calls 500000 --runs 7
    .venv/bin/python benchmarks/admission.py --pure          # the pure-Python core even where a compiled one exists

A controller holds 20 entitlements (guaranteed, elastic, spot, preemptible). Each call is one ``admit`` that passes
all six checks and reserves, followed by the ``release`` that settles it with a partial usage, at a clock that
advances 1 ms per call so the token bucket refills on every decision. Paths:

- uncontended: the pool has room, the contention check is skipped;
- contended: 16 spot requests fill the 16-slot pool, so every decision compares against the in-flight minimum
  (and is admitted: its priority is higher);
- refused: a contended decision that fails the priority check (no reservation, no release);
- contended at K distinct priorities: ``--distinct`` (default 10,000) in-flight requests, each admitted at its own
  priority, fill the pool, so the in-flight minimum is taken over K distinct values (a scan would cost O(K)).

The baselines are measured in the same process and loop shape: an empty Python function call and a dict lookup.
Each figure is the median of the runs; the target is <= 10 us per decision.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tokenpools import accel

if TYPE_CHECKING:
    from tokenpools.core.admission import AdmissionController

# (the core is imported in main(), after ``--pure`` has chosen the build)

TARGET_US = 10.0
N_ENTITLEMENTS = 20
POOL_SLOTS = 16


def build_controller(pool_concurrency: int) -> AdmissionController:
    from tokenpools.core.admission import AdmissionController, EntitlementLimits
    from tokenpools.core.capacity import Capacity
    from tokenpools.core.classes import ServiceClass
    from tokenpools.core.spec import EntitlementSpec

    classes = (ServiceClass.GUARANTEED, ServiceClass.ELASTIC, ServiceClass.ELASTIC, ServiceClass.SPOT,
               ServiceClass.PREEMPTIBLE)
    ctl = AdmissionController(pool_concurrency=pool_concurrency, kv_bytes_per_token=147_456, default_max_tokens=256,
                              token_bucket_window_s=10.0)
    for i in range(N_ENTITLEMENTS):
        cls = classes[i % len(classes)]
        baseline = Capacity(1e6, 1e15, 64.0) if cls.has_baseline else Capacity()
        spec = EntitlementSpec(f"tenant-{i:02d}", "pool", cls, 500.0 + 100 * i, baseline)
        ctl.upsert_entitlement(spec, EntitlementLimits(64, 1e6, 1e15, priority=10.0 + i), 0.0)
    return ctl


def pairs(ctl: AdmissionController, names: list[str], calls: int, start_s: float) -> int:
    """Time ``calls`` admit+release pairs; returns elapsed ns."""
    admit, release = ctl.admit, ctl.release
    ids = [f"req-{i}" for i in range(1024)]
    n_names = len(names)
    now = start_s
    t0 = time.perf_counter_ns()
    for i in range(calls):
        now += 0.001
        decision = admit(names[i % n_names], ids[i & 1023], 120, 128, now)
        release(decision.ticket, 180, now)  # type: ignore[arg-type]
    elapsed = time.perf_counter_ns() - t0
    assert ctl.in_flight_of(names[0]) == 0
    return elapsed


def refusals(ctl: AdmissionController, name: str, calls: int) -> int:
    admit = ctl.admit
    t0 = time.perf_counter_ns()
    for i in range(calls):
        admit(name, "refused", 120, 128, 1.0)
    return time.perf_counter_ns() - t0


def empty_calls(calls: int) -> int:
    def f(a: object, b: object, c: object, d: object, e: object) -> None:
        return None

    t0 = time.perf_counter_ns()
    for i in range(calls):
        f(i, i, i, i, i)
    return time.perf_counter_ns() - t0


def dict_lookups(calls: int) -> int:
    table = {f"tenant-{i:02d}": i for i in range(N_ENTITLEMENTS)}
    keys = list(table)
    t0 = time.perf_counter_ns()
    for i in range(calls):
        table[keys[i % N_ENTITLEMENTS]]
    return time.perf_counter_ns() - t0


def min_scans(distinct: int, calls: int) -> int:
    """What the contention check cost when it scanned the distinct in-flight priorities."""
    counts = {1.0 + k * 1e-6: 1 for k in range(distinct)}
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        min(counts)
    return time.perf_counter_ns() - t0


def median_ns_per_call(measure: Callable[[], int], calls: int, runs: int) -> float:
    return statistics.median(measure() / calls for _ in range(runs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="calls per run (default 200,000)")
    parser.add_argument("--runs", type=int, default=5, help="runs per figure; the median is printed (default 5)")
    parser.add_argument("--pure", action="store_true", help="use the pure-Python core even if a compiled one exists")
    parser.add_argument("--distinct", type=int, default=10_000,
                        help="distinct in-flight priorities in the last path (default 10,000)")
    args = parser.parse_args()
    calls, runs = args.calls, args.runs
    if args.pure:
        accel.use_pure_python()
    from tokenpools.core.admission import EntitlementLimits

    uncontended = build_controller(pool_concurrency=10**6)
    contended = build_controller(pool_concurrency=POOL_SLOTS)
    spot = [n for n in contended.entitlement_names() if n.endswith(("03", "08"))][0]
    for k in range(POOL_SLOTS):  # fill the pool with low-priority (non-evictable) spot requests
        contended.set_limits(spot, EntitlementLimits(64, 1e6, 1e15, priority=1.0), 0.0)
        assert contended.admit(spot, f"fill-{k}", 10, 10, 0.0).admitted
    assert contended.contended and contended.min_in_flight_priority() == 1.0
    names = [n for n in contended.entitlement_names() if n != spot]
    refused_name = names[0]
    contended_refusing = build_controller(pool_concurrency=POOL_SLOTS)
    for k in range(POOL_SLOTS):
        contended_refusing.admit("tenant-19", f"fill-{k}", 10, 10, 0.0)  # priority 29: everyone below is refused
    assert not contended_refusing.admit(refused_name, "probe", 120, 128, 1.0).admitted

    many = build_controller(pool_concurrency=args.distinct)
    for k in range(args.distinct):  # every in-flight request at a priority of its own, all below the deciders'
        many.set_limits(spot, EntitlementLimits(10**6, 1e12, 1e18, priority=1.0 + k * 1e-6), 0.0)
        assert many.admit(spot, f"fill-{k}", 1, 1, 0.0).admitted
    assert many.contended and many.min_in_flight_priority() == 1.0

    clock = [0.0]

    def run_pairs(ctl: AdmissionController, who: list[str]) -> Callable[[], int]:
        def measure() -> int:
            clock[0] += calls * 0.001 + 1.0
            return pairs(ctl, who, calls, clock[0])
        return measure

    baseline_call = median_ns_per_call(lambda: empty_calls(calls), calls, runs)
    baseline_dict = median_ns_per_call(lambda: dict_lookups(calls), calls, runs)
    scan_calls = max(1, calls // 100)
    baseline_scan = median_ns_per_call(lambda: min_scans(args.distinct, scan_calls), scan_calls, runs)
    results = {
        "uncontended admit+release": median_ns_per_call(run_pairs(uncontended, uncontended.entitlement_names()),
                                                        calls, runs),
        "contended admit+release": median_ns_per_call(run_pairs(contended, names), calls, runs),
        "contended refusal (low priority)": median_ns_per_call(
            lambda: refusals(contended_refusing, refused_name, calls), calls, runs),
        f"contended, K={args.distinct:,} distinct priorities": median_ns_per_call(run_pairs(many, names), calls, runs),
    }

    print(accel.describe())
    print(f"python {platform.python_version()} on {platform.machine()}, {calls:,} calls x {runs} runs (median), "
          f"{N_ENTITLEMENTS} entitlements, {POOL_SLOTS}-slot pool when contended")
    print(f"{'baseline: empty function call (5 args)':<48} {baseline_call / 1000:>8.3f} us")
    print(f"{'baseline: dict lookup':<48} {baseline_dict / 1000:>8.3f} us")
    print(f"{f'baseline: min() over {args.distinct:,} priorities (a scan)':<48} {baseline_scan / 1000:>8.3f} us")
    worst = 0.0
    for label, ns in results.items():
        print(f"{label:<48} {ns / 1000:>8.3f} us   = {ns / baseline_call:6.1f} x empty call, "
              f"{ns / baseline_dict:6.1f} x dict lookup")
        worst = max(worst, ns / 1000)
    verdict = "within" if worst <= TARGET_US else "OVER"
    print(f"worst decision {worst:.3f} us: {verdict} the {TARGET_US:g} us target")
    return 0 if worst <= TARGET_US else 1


if __name__ == "__main__":
    sys.exit(main())
