"""Replay speed: a synthetic one-hour log at 100 requests/s through the core and the backend simulator.

    .venv/bin/python benchmarks/replay_speed.py [--hours 1] [--rate 100] [--profile]

The log is written to Parquet and read back like a recorded one (``tokenpools replay``'s path); the replay is
timed on its own. Speed-up = simulated seconds ÷ replay seconds (wall clock, and CPU time of this process, which
does not count other processes on a busy machine). Target: ≥ 1000×, i.e. one hour in ≤ 3.6 s. ``--profile`` adds
where the time goes: each stage's own time (simulator, admission, windows, tick, policy glue, replayer loop) as a
share of the profile and in µs per request.
"""

from __future__ import annotations

import argparse
from collections import Counter
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.replay import logio
from tokenpools.replay.experiments import replica_model_for
from tokenpools.replay.load import Lengths, LoadSpec, RetryPolicy, poisson_arrivals
from tokenpools.replay.replayer import replay
from tokenpools.replay.scenario import EPOCH_MS, ReplayParams, Scenario

GIB = 2**30
MIX = (  # entitlement, class, SLO ms, share of the request rate, baseline slots
    ("interactive", ServiceClass.GUARANTEED, 1000.0, 0.25, 128),
    ("copilot", ServiceClass.ELASTIC, 500.0, 0.25, 128),
    ("batch", ServiceClass.ELASTIC, 30000.0, 0.30, 128),
    ("spot", ServiceClass.SPOT, 60000.0, 0.20, 0),
)


def synthetic_scenario(hours: float, rate: float, replicas: int, seed: int = 7, backend_waiting: str = "tick") -> Scenario:
    per_replica = Capacity(480.0, 8 * GIB, 16.0)
    pool = PoolSpec("bench", "synthetic", per_replica, min_replicas=replicas, max_replicas=replicas, replicas=replicas,
                    default_max_tokens=128)
    per_slot = per_replica.scaled(1 / 16)
    ents = tuple(
        EntitlementSpec(name, "bench", cls, slo, per_slot.scaled(slots) if cls.has_baseline else Capacity())
        for name, cls, slo, _, slots in MIX
    )
    lengths = Lengths(32, 96)
    loads = [LoadSpec(name, rate * share, lengths, lengths) for name, _, _, share, _ in MIX]
    duration = hours * 3600
    return Scenario("bench", pool, ents, tuple(poisson_arrivals(loads, duration, seed)), duration,
                    replica_model=replica_model_for(pool), retry=RetryPolicy(max_retries=0),
                    params=ReplayParams(sample_s=5.0, backend_waiting=backend_waiting), origin_ms=EPOCH_MS, seed=seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=100.0, help="requests per second (default 100)")
    parser.add_argument("--replicas", type=int, default=32, help="backend replicas of 16 slots (default 32)")
    parser.add_argument("--backend-waiting", choices=["tick", "off"], default="tick",
                        help="the proxy's view of the backend queue (replay.backend_waiting; default tick)")
    parser.add_argument("--profile", action="store_true", help="also print where the time goes")
    args = parser.parse_args(argv)

    generated = synthetic_scenario(args.hours, args.rate, args.replicas, backend_waiting=args.backend_waiting)
    with tempfile.TemporaryDirectory() as tmp:
        # the trace as a recorded log: every request is one decision to replay
        log = Path(tmp) / "log"
        result = replay(generated, "none")
        logio.write_log(result, log)
        t0 = time.perf_counter()
        scenario, recorded = logio.scenario_from_log(log, generated.pool, generated.entitlements, generated.params)
        read_s = time.perf_counter() - t0
    n = len(scenario.arrivals)
    simulated = scenario.duration_s
    wall0, cpu0 = time.perf_counter(), time.process_time()
    result = replay(scenario, "token-pools")
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    admitted = sum(1 for o in result.decisions.outcome if o == "admitted")
    reasons = Counter(o for o in result.decisions.outcome if o != "admitted")
    busy = sum(s[1] for s in result.samples.pool) / max(1, len(result.samples.pool))
    print(f"trace: {n} requests over {simulated:.0f} s ({n / simulated:.1f} req/s), {args.replicas} replicas × 16 slots; "
          f"read from Parquet in {read_s:.2f} s")
    print(f"replay (token pools, backend_waiting={args.backend_waiting}): {admitted} admitted, {n - admitted} refused "
          f"({', '.join(f'{k} {v}' for k, v in sorted(reasons.items()))}); mean {busy:.0f} of {16 * args.replicas} "
          "slots busy")
    print(f"replay time: {wall:.2f} s wall, {cpu:.2f} s CPU; {1e6 * cpu / n:.1f} µs CPU per request")
    print(f"speed-up over real time: {simulated / wall:.0f}× (wall), {simulated / cpu:.0f}× (CPU)  [target ≥ 1000×]")
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        replay(scenario, "token-pools")
        profile.disable()
        _breakdown(pstats.Stats(profile), n, cpu)
    return 0


# Where a function's own time goes, by the file that defines it (first match wins).
_STAGES = (
    ("backend_sim", "backend simulator"),
    ("core/admission.py", "core admission (admit, release)"),
    ("core/windows.py", "core windows (Accumulator)"),
    ("core/", "core tick, limits, priority, scaling"),
    ("replay/policy.py", "token-pools policy glue"),
    ("replay/replayer.py", "replayer loop"),
)


def _breakdown(stats: pstats.Stats, n: int, cpu_s: float) -> None:
    """Each stage's own (not cumulative) profiled time, as a share and as µs per request of the unprofiled CPU
    time (cProfile inflates cheap calls more than expensive ones, so the shares are approximate)."""
    own: Counter[str] = Counter()
    for (path, _, _), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        label = next((lab for key, lab in _STAGES if key in path), "other (builtins, dataclasses, enum, heapq)")
        if label.startswith("other") and ("/replay/" in path or "/core/" in path):
            label = "other replay modules"
        own[label] += tottime
    total = sum(own.values())
    print(f"per-request cost breakdown (profiled shares of the {1e6 * cpu_s / n:.1f} µs CPU per request):")
    for label, t in own.most_common():
        if t < 0.0005 * total:
            continue
        print(f"  {label:42s} {100 * t / total:5.1f} %  {1e6 * cpu_s / n * t / total:6.2f} µs/request")


if __name__ == "__main__":
    sys.exit(main())
