"""Throughput of the backend simulator: a seeded Poisson trace pushed through a pool sized to keep up.

    .venv/bin/python benchmarks/backend_sim.py                    # 1 h at 100 req/s, 64 default replicas
    .venv/bin/python benchmarks/backend_sim.py --driver tick      # collect events once per simulated second
    .venv/bin/python benchmarks/backend_sim.py --pure             # the pure-Python simulator even if compiled

Each request has a uniform 32-176-token prompt and a uniform 64-176-token output. With the default calibration
one replica serves ~1.95 such requests/s at full load, so 100 req/s needs ~51 replicas; 64 keep the pool at
~80% and the queues short (8 replicas, the first guess, would fall behind without bound). Drivers:
``arrival`` calls ``advance(t)`` before every ``submit`` (the finest interleaving a replayer can ask for);
``tick`` submits arrivals as they come and calls ``advance`` once per simulated second. Prints simulated
seconds per wall second and per CPU second (the replayer needs >= 1000), requests per wall second, and the
speed of a plain Python loop on this machine, to compare results across machines. The first line says which
build runs: mypyc-compiled (``scripts/build-accel.sh``) or pure Python (``tokenpools.accel``).
"""

from __future__ import annotations

import argparse
import random
import time

from tokenpools import accel

# (the simulator is imported in main(), after ``--pure`` has chosen the build)


def poisson_trace(rate_per_s: float, duration_s: float, seed: int) -> list[tuple[float, int, int]]:
    """(arrival_s, prompt_tokens, output_tokens) for a Poisson arrival process, reproducible from ``seed``."""
    rng = random.Random(seed)
    trace = []
    t = rng.expovariate(rate_per_s)
    while t < duration_s:
        trace.append((t, rng.randint(32, 176), rng.randint(64, 176)))
        t += rng.expovariate(rate_per_s)
    return trace


def python_loop_ns_per_iteration() -> float:
    """A machine-speed yardstick: the best of five 1M-iteration ``x += i`` loops."""
    best = float("inf")
    for _ in range(5):
        start, x = time.perf_counter(), 0
        for i in range(1_000_000):
            x += i
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=3600.0)
    parser.add_argument("--rate-per-s", type=float, default=100.0)
    parser.add_argument("--replicas", type=int, default=64)
    parser.add_argument("--driver", choices=("arrival", "tick"), default="arrival")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pure", action="store_true", help="use the pure-Python simulator even if it is compiled")
    args = parser.parse_args()
    if args.pure:
        accel.use_pure_python()
    from tokenpools.replay.backend.model import ReplicaModel
    from tokenpools.replay.backend.records import Completed
    from tokenpools.replay.backend.simulator import BackendSim

    print(accel.describe())

    trace = poisson_trace(args.rate_per_s, args.duration_s, args.seed)
    ids = [f"req-{i}" for i in range(len(trace))]
    sim = BackendSim(ReplicaModel(), replicas=args.replicas, seed=args.seed)
    advance, submit = sim.advance, sim.submit
    events: list = []

    start, start_cpu = time.perf_counter(), time.process_time()
    if args.driver == "arrival":
        for rid, (t, prompt, output) in zip(ids, trace):
            events += advance(t)
            submit(rid, t, prompt, output)
    else:
        next_tick_s = 1.0
        for rid, (t, prompt, output) in zip(ids, trace):
            if t >= next_tick_s:
                events += advance(next_tick_s)
                next_tick_s += 1.0
            submit(rid, t, prompt, output)
    while (t_next := sim.next_event_s()) is not None:
        events += advance(t_next)
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - start_cpu

    ttfts = sorted(e.ttft_s for e in events if type(e) is Completed)
    simulated_s = args.duration_s  # the trace's span; draining its tail is included in the timings
    shape = f"{args.rate_per_s:g} req/s for {args.duration_s:g} s, seed {args.seed}"
    print(f"requests            {len(trace):>12,}  ({shape})")
    print(f"replicas            {args.replicas:>12}  x {sim.model.max_num_seqs} slots, driver '{args.driver}'")
    print(f"completed           {len(ttfts):>12,}")
    print(f"events              {len(events):>12,}")
    print(f"wall / CPU          {wall_s:>12.3f} s / {cpu_s:.3f} s")
    print(f"speed               {simulated_s / wall_s:>12,.0f} x real time ({simulated_s / cpu_s:,.0f} x per CPU s)")
    print(f"throughput          {len(trace) / wall_s:>12,.0f} requests / wall s")
    print(f"TTFT mean / p99     {sum(ttfts) / len(ttfts):>8.3f} s / {ttfts[int(0.99 * len(ttfts))]:.3f} s")
    print(f"python loop         {python_loop_ns_per_iteration():>12.1f} ns / iteration (machine yardstick)")


if __name__ == "__main__":
    main()
