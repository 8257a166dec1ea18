"""Replay speed: a synthetic one-hour log at 100 requests/s through the core and the backend simulator.

    .venv/bin/python benchmarks/replay_speed.py [--hours 1] [--rate 100] [--queue-off] [--profile] [--pure | --compare N]

The log is written to Parquet and read back like a recorded one (``tokenpools replay``'s path); the replay is
timed on its own. Speed-up = simulated seconds ÷ replay seconds (wall clock, and CPU time of this process, which
does not count other processes on a busy machine). Target: ≥ 1000×, i.e. one hour in ≤ 3.6 s. ``--profile`` adds
where the time goes: each stage's own time (simulator, admission, windows, tick, policy glue, replayer loop) as a
share of the profile and in µs per request. The same log is replayed twice, with the proxy's admission queue on
(the Settings default, as the demo runs it) and off (``policy.queue_slo_fraction=0``: refused at once, the replayer
before the queue), and the two costs are compared; ``--queue-off`` runs only the second.

The first line says which build runs (``tokenpools.accel``: the mypyc-compiled simulator that
``scripts/build-accel.sh`` builds, or pure Python). ``--pure`` uses the pure-Python modules even when compiled
ones exist; ``--compare N`` runs the compiled and the pure build N times each, alternately, in fresh processes,
and prints both speeds, their ratio, and whether the two builds' replays are identical (a digest of every
decision and completion).
"""

from __future__ import annotations

import argparse
from collections import Counter
import cProfile
import hashlib
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenpools import accel

if TYPE_CHECKING:
    from tokenpools.replay.replayer import ReplayResult
    from tokenpools.replay.scenario import Scenario

# (the replay modules are imported in the functions, after ``--pure`` has chosen the build)

GIB = 2**30
MIX = (  # entitlement, class name, SLO ms, share of the request rate, baseline slots
    ("interactive", "GUARANTEED", 1000.0, 0.25, 128),
    ("copilot", "ELASTIC", 500.0, 0.25, 128),
    ("batch", "ELASTIC", 30000.0, 0.30, 128),
    ("spot", "SPOT", 60000.0, 0.20, 0),
)


def synthetic_scenario(hours: float, rate: float, replicas: int, seed: int = 7, backend_waiting: str = "tick",
                       queue: bool = True) -> Scenario:
    from tokenpools.core.capacity import Capacity
    from tokenpools.core.classes import ServiceClass
    from tokenpools.core.spec import EntitlementSpec, PoolSpec
    from tokenpools.core.waiting import QueueConfig
    from tokenpools.replay.experiments import replica_model_for
    from tokenpools.replay.load import Lengths, LoadSpec, RetryPolicy, poisson_arrivals
    from tokenpools.replay.scenario import EPOCH_MS, ReplayParams, Scenario

    per_replica = Capacity(480.0, 8 * GIB, 16.0)
    pool = PoolSpec("bench", "synthetic", per_replica, min_replicas=replicas, max_replicas=replicas, replicas=replicas,
                    default_max_tokens=128)
    per_slot = per_replica.scaled(1 / 16)
    ents = tuple(
        EntitlementSpec(name, "bench", ServiceClass[cls], slo,
                        per_slot.scaled(slots) if ServiceClass[cls].has_baseline else Capacity())
        for name, cls, slo, _, slots in MIX
    )
    lengths = Lengths(32, 96)
    loads = [LoadSpec(name, rate * share, lengths, lengths) for name, _, _, share, _ in MIX]
    duration = hours * 3600
    return Scenario("bench", pool, ents, tuple(poisson_arrivals(loads, duration, seed)), duration,
                    replica_model=replica_model_for(pool), retry=RetryPolicy(max_retries=0),
                    params=ReplayParams(sample_s=5.0, backend_waiting=backend_waiting,
                                        queue=QueueConfig() if queue else QueueConfig(slo_fraction=0.0)),
                    origin_ms=EPOCH_MS, seed=seed)


def digest(result: ReplayResult) -> str:
    """SHA-256 of every decision and completion of a replay, to compare two builds' outputs."""
    h = hashlib.sha256()
    for table in (result.decisions, result.completions):
        for name in type(table).__dataclass_fields__:
            h.update(repr((name, getattr(table, name))).encode())
    h.update(repr((result.samples.pool, result.samples.by_entitlement, result.abandoned, result.pending,
                   result.preempted, result.evicted, result.end_s)).encode())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=100.0, help="requests per second (default 100)")
    parser.add_argument("--replicas", type=int, default=32, help="backend replicas of 16 slots (default 32)")
    parser.add_argument("--backend-waiting", choices=["tick", "off"], default="tick",
                        help="the proxy's view of the backend queue (replay.backend_waiting; default tick)")
    parser.add_argument("--queue-off", action="store_true",
                        help="the proxy refuses at once (policy.queue_slo_fraction=0) instead of queueing")
    parser.add_argument("--profile", action="store_true", help="also print where the time goes")
    parser.add_argument("--pure", action="store_true", help="use the pure-Python modules even if compiled ones exist")
    parser.add_argument("--compare", type=int, metavar="N", default=0,
                        help="run the compiled and the pure build N times each, alternately, and compare them")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # (one run's figures, for --compare)
    args = parser.parse_args(argv)
    if args.compare:
        return _compare(args, argv if argv is not None else sys.argv[1:])
    if args.pure:
        accel.use_pure_python()
    from tokenpools.replay import logio
    from tokenpools.replay.replayer import replay

    queues = [False] if args.queue_off else [True] if args.json else [True, False]
    generated = {queue: synthetic_scenario(args.hours, args.rate, args.replicas, backend_waiting=args.backend_waiting,
                                           queue=queue) for queue in queues}
    first = generated[queues[0]]
    scenarios: dict[bool, Scenario] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # the trace as a recorded log: every request is one decision to replay (one log for both queue settings)
        log = Path(tmp) / "log"
        logio.write_log(replay(first, "none"), log)
        t0 = time.perf_counter()
        for queue, g in generated.items():
            scenarios[queue], _ = logio.scenario_from_log(log, g.pool, g.entitlements, g.params)
        read_s = (time.perf_counter() - t0) / len(generated)
    if not args.json:
        print(accel.describe())
        read = scenarios[queues[0]]
        n, simulated = len(read.arrivals), read.duration_s
        print(f"trace: {n} requests over {simulated:.0f} s ({n / simulated:.1f} req/s), {args.replicas} replicas × 16 "
              f"slots; read from Parquet in {read_s:.2f} s")
    cost = {queue: _timed_replay(args, scenario, queue) for queue, scenario in scenarios.items()}
    if len(cost) == 2:
        print(f"queue on: {cost[True] / cost[False]:.2f}× the CPU per request of queue off (same log, same process)")
    return 0


def _timed_replay(args: argparse.Namespace, scenario: Scenario, queue: bool) -> float:
    """Replay ``scenario`` under token pools and print its figures (with --json, one line of them); returns its µs
    of CPU per request."""
    from tokenpools.replay.replayer import replay

    n = len(scenario.arrivals)
    simulated = scenario.duration_s
    wall0, cpu0 = time.perf_counter(), time.process_time()
    result = replay(scenario, "token-pools")
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    if args.json:
        print(json.dumps({"compiled": accel.compiled(), "cpu_s": cpu, "wall_s": wall, "simulated_s": simulated,
                          "requests": n, "digest": digest(result)}))
        return 1e6 * cpu / n
    admitted = sum(1 for o in result.decisions.outcome if o == "admitted")
    reasons = Counter(o for o in result.decisions.outcome if o != "admitted")
    busy = sum(s[1] for s in result.samples.pool) / max(1, len(result.samples.pool))
    waited = sum(1 for q in result.decisions.queued_s if q > 0)
    print(f"replay (token pools, backend_waiting={args.backend_waiting}, queue {'on' if queue else 'off'}: "
          f"{waited} waited): {admitted} admitted, {n - admitted} refused "
          f"({', '.join(f'{k} {v}' for k, v in sorted(reasons.items()))}); mean {busy:.0f} of {16 * args.replicas} "
          "slots busy")
    print(f"  replay time: {wall:.2f} s wall, {cpu:.2f} s CPU; {1e6 * cpu / n:.1f} µs CPU per request")
    print(f"  speed-up over real time: {simulated / wall:.0f}× (wall), {simulated / cpu:.0f}× (CPU)  [target ≥ 1000×]")
    if args.profile:
        profile = cProfile.Profile()
        profile.enable()
        replay(scenario, "token-pools")
        profile.disable()
        _breakdown(pstats.Stats(profile), n, cpu)
    return 1e6 * cpu / n


def _compare(args: argparse.Namespace, argv: list[str]) -> int:
    """Alternate compiled and pure runs in fresh processes (so neither build's import is cached)."""
    base = [a for i, a in enumerate(argv) if a not in ("--profile", "--pure") and not a.startswith("--compare")
            and not (i > 0 and argv[i - 1] == "--compare")]
    print(accel.describe())
    if not accel.compiled():
        print("nothing is compiled: run scripts/build-accel.sh first")
        return 1
    runs: dict[str, list[dict[str, Any]]] = {"compiled": [], "pure": []}
    for i in range(args.compare):
        for build in ("compiled", "pure"):
            cmd = [sys.executable, __file__, *base, "--json"] + (["--pure"] if build == "pure" else [])
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            run = json.loads(out)
            runs[build].append(run)
            print(f"  run {i + 1} {build:8s}: {run['cpu_s']:.2f} s CPU, {run['wall_s']:.2f} s wall, "
                  f"{1e6 * run['cpu_s'] / run['requests']:.1f} µs CPU/request, "
                  f"{run['simulated_s'] / run['cpu_s']:.0f}× real time (CPU)", flush=True)
    med = {b: statistics.median(r["cpu_s"] for r in rs) for b, rs in runs.items()}
    simulated = runs["compiled"][0]["simulated_s"]
    digests = {r["digest"] for rs in runs.values() for r in rs}
    print(f"median CPU: compiled {med['compiled']:.2f} s ({simulated / med['compiled']:.0f}×), pure "
          f"{med['pure']:.2f} s ({simulated / med['pure']:.0f}×); compiled is {med['pure'] / med['compiled']:.2f}× "
          "faster  [target ≥ 1000×]")
    print("outputs: " + ("identical in every run (one digest)" if len(digests) == 1
                         else f"DIFFER: {len(digests)} distinct digests"))
    return 0 if len(digests) == 1 else 1


# Where a function's own time goes, by the file that defines it (first match wins).
_STAGES = (
    ("replay/backend/", "backend simulator"),
    ("core/admission.py", "core admission (admit, release)"),
    ("core/retry_estimates.py", "core admission (admit, release)"),
    ("core/waiting.py", "core admission queue (admit, drain, next wake)"),
    ("core/accumulator.py", "core windows (Accumulator)"),
    ("core/windows.py", "core windows (close)"),
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
