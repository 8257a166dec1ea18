"""Cost of one pool's control tick as the agents run it, in both fleet-enforcement modes, against a baseline build.

    .venv/bin/python benchmarks/tick.py                      # E = 400, P = 200, against the build before the rework
    .venv/bin/python benchmarks/tick.py --baseline none      # this build alone
    .venv/bin/python benchmarks/tick.py --entitlements 100 --proxies 50 --runs 9 --json

One seeded pool: 16 ready replicas (32 at most) of 20,000 tokens/s, 64 GiB of KV and 256 slots each; E entitlements
of mixed classes (dedicated, guaranteed, elastic, spot, preemptible as 1:2:4:2:1), baselines of 1-8 slots, a third of
the burstable ones with a burst ceiling; P proxies heartbeating for the pool. Three windows of traffic: per
entitlement and window 2-30 decisions (80 % admitted, 70 % of those completed within 2 s) each at a random proxy, and
a backend-metrics sample per window. The first two windows are ticked first (so signals, in-flight levels and, in
shares mode, the previous grants exist); the third window's tick is timed:

- ``pool tick``: ``streams.pool_state.tick``: the windows closed, the control tick, the limit update (in shares mode
  with every proxy's held-back share), the effective-limit records and the scale command. The agents' timer holds the
  event loop for this (and the table write below), one pool at a time;
- ``+ table write``: the pool tick and its state serialised for the table: what the timer does for a pool without
  yielding to the loop;
- ``processor tick``: ``PoolProcessor.tick`` of the same window, the pool's state stored as a batch would have left
  it: the pool tick, the state written to the table (serialised), every record encoded and handed to a send (kept in
  memory, nothing produced): one pool's whole timer path, its sends included.

Each in ``counts`` mode (the default, ``policy.fleet_enforcement=counts``: an update carries no per-proxy shares)
and ``shares`` mode. Times are the CPU time of the measuring process (``time.process_time``): the least of every
run (the median in brackets), since on a shared machine wall time counts the others' work and even CPU time only
ever grows with their load (the load average is printed; ratios between the builds hold better than either figure).

The baseline is the same measurement on another build of this package, in the same run: ``--baseline REV`` (a git
revision; default the commit before the tick was reworked) is installed from ``git archive`` into a temporary
directory, non-editable, and both builds are measured in fresh processes of the same interpreter, alternately. Each
build's outputs are digested (every record the pool tick and the processor produce, encoded, and the stored state);
the two builds must agree. Target: a pool tick <= 50 ms at E = 400, P = 200, in both modes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tokenpools import accel
from tokenpools_dev import baseline

DEFAULT_BASELINE = "21ac07d"  # the commit before the tick was reworked (plain floats, sparse split, yields)
TARGET_MS = 50.0
FIGURES = {"pool_tick_ms": "pool tick", "loop_held_ms": "+ table write", "processor_tick_ms": "processor tick"}
BASE_MS = 1_700_000_000_000
WIDTH_MS, GRACE_MS = 1000, 300
POOL = "bench"
MODES = ("counts", "shares")
ROOT = Path(__file__).resolve().parent.parent


# ---- the scenario (public API only: it runs against the baseline build too) ----------------------------------

def scenario(entitlements: int, proxies: int, shares: bool, seed: int) -> dict[str, Any]:
    """The pool, its entitlements, the proxies' heartbeats, the parameters, and the state with three windows of
    events folded and the first two ticked."""
    from tokenpools.core.capacity import Capacity
    from tokenpools.core.classes import ServiceClass
    from tokenpools.core.outcomes import AdmissionOutcome
    from tokenpools.core.spec import EntitlementSpec, PoolSpec
    from tokenpools.streams.table import pool_state
    from tokenpools.streams.table.batch import fold
    from tokenpools.streams.table.params import StreamParams
    from tokenpools.topics.records import BackendMetricsSample, ProxyHeartbeat, RequestCompleted, RequestDecided

    rng = random.Random(seed)
    pool = PoolSpec(POOL, "model", Capacity(20_000.0, 64.0 * 2**30, 256.0), min_replicas=1, max_replicas=32,
                    replicas=16)
    mix = ([ServiceClass.DEDICATED] + [ServiceClass.GUARANTEED] * 2 + [ServiceClass.ELASTIC] * 4
           + [ServiceClass.SPOT] * 2 + [ServiceClass.PREEMPTIBLE])
    specs = []
    for i in range(entitlements):
        cls = mix[i % len(mix)]
        slots = rng.randint(1, 8)
        baseline = Capacity(slots * 40.0, slots * 2.0**28, float(slots)) if cls.has_baseline else Capacity()
        ceiling = None
        if cls is not ServiceClass.GUARANTEED and rng.random() < 1 / 3:
            ceiling = Capacity(baseline.tokens_per_s * 3 + 100, baseline.kv_bytes * 3 + 2.0**30,
                               baseline.concurrency * 3 + 4)
        specs.append(EntitlementSpec(f"tenant-{i:04d}", POOL, cls, rng.choice([500.0, 1000.0, 5000.0, 30_000.0]),
                                     baseline, burst_ceiling=ceiling))
    ids = [f"proxy-{j:04d}" for j in range(proxies)]
    beats = {p: ProxyHeartbeat(proxy_id=p, t_ms=BASE_MS + 2 * WIDTH_MS, pools=(POOL,), started_ms=BASE_MS - 60_000)
             for p in ids}
    params = StreamParams(width_ms=WIDTH_MS, grace_ms=GRACE_MS, proxy_shares=shares)
    events: list[tuple[Any, int]] = []
    for w in range(3):
        start, end = BASE_MS + w * WIDTH_MS, BASE_MS + 3 * WIDTH_MS - 1
        for spec in specs:
            for _ in range(rng.randint(2, 30)):
                t_ms, proxy, admitted = start + rng.randrange(WIDTH_MS), rng.choice(ids), rng.random() < 0.8
                n = len(events)
                events.append((RequestDecided(
                    request_id=f"r{n}", pool=POOL, entitlement=spec.name, proxy_id=proxy, t_ms=t_ms,
                    outcome=AdmissionOutcome.ADMITTED if admitted else AdmissionOutcome.REFUSED_CONCURRENCY,
                    reason="bench", prompt_tokens_est=100, max_tokens=200, cost_tokens=300,
                    kv_bytes=300 * 147_456 if admitted else 0, priority=1.0), t_ms))
                if admitted and rng.random() < 0.7:
                    done = min(t_ms + rng.randrange(2000), end)
                    events.append((RequestCompleted(
                        request_id=f"r{n}", pool=POOL, entitlement=spec.name, proxy_id=proxy, t_ms=done,
                        admitted_t_ms=t_ms, status="ok", prompt_tokens=100, completion_tokens=150,
                        reserved_tokens=300, kv_bytes=300 * 147_456, ttft_s=0.1, e2e_s=1.0), done))
        t_ms = start + WIDTH_MS // 2
        events.append((BackendMetricsSample(pool=POOL, t_ms=t_ms, replicas_ready=16, waiting=2.0), t_ms))
    events.sort(key=lambda e: e[1])
    items = [(record, pool_state.Position("requests/0", i, ts)) for i, (record, ts) in enumerate(events)]
    state, outcomes = fold(pool_state.new(POOL, WIDTH_MS), items, params)
    state = pool_state.track_in_flight(state, items, outcomes)
    view = pool_state.PoolView(pool, tuple(specs))
    state = pool_state.tick(state, view, BASE_MS + 2 * WIDTH_MS + GRACE_MS, params, beats).state  # windows 0 and 1
    return {"view": view, "state": state, "params": params, "beats": beats,
            "horizon_ms": BASE_MS + 3 * WIDTH_MS + GRACE_MS}


class _Catalogue:
    """What ``PoolProcessor`` reads of the spec catalogue, for the one pool."""

    def __init__(self, view: Any) -> None:
        self.view = view
        self.pools = (POOL,)  # the processor's tick looks for sharded pools among them

    def pool(self, name: str) -> Any:
        return self.view.pool if name == POOL else None

    def entitlements_of(self, pool: str) -> tuple[Any, ...]:
        return self.view.entitlements if pool == POOL else ()

    def history_of(self, pool: str) -> tuple[Any, ...]:
        return ()  # the membership never changes here: every window is ticked with today's


def pool_tick(s: dict[str, Any]) -> tuple[float, float, bytes]:
    """CPU seconds of ``pool_state.tick`` of the third window, of it and the table write that follows it (what
    the timer does without yielding), and a digest of what it returns."""
    from tokenpools.streams.table import pool_state
    from tokenpools.streams.table import state as table_state
    from tokenpools.topics.codec import encode

    gc.collect()  # every run starts with the same garbage: none
    t0 = time.process_time()
    out = pool_state.tick(s["state"], s["view"], s["horizon_ms"], s["params"], s["beats"])
    cpu_s = time.process_time() - t0
    stored = _stored(table_state, out.state)
    held_s = time.process_time() - t0
    digest = hashlib.sha256()
    for record in [*out.updates, *out.effective, *([out.scale] if out.scale else [])]:
        digest.update(encode(record))
    digest.update(repr((out.windows, out.skipped, out.departed)).encode())
    digest.update(_canonical(table_state, out.state) if stored else b"")
    return cpu_s, held_s, digest.digest()


def _stored(table_state: Any, state: Any) -> bytes:
    """The state as the tick writes it to the table: the whole value (state version 1) or the snapshot (2)."""
    if table_state.STATE_VERSION == 1:
        return table_state.dump(state, 0)
    return table_state.group_writes(table_state.Stored(state, 0), state, 0)[0][-1][1]


def _canonical(table_state: Any, state: Any) -> bytes:
    """The state in a form both builds give alike (for the digest)."""
    return json.dumps(table_state.to_dict(state), sort_keys=True).encode()


def processor_tick(s: dict[str, Any]) -> tuple[float, bytes]:
    """CPU seconds of ``PoolProcessor.tick`` of the third window (the state stored as a batch leaves it), and a
    digest of everything it sends and stores."""
    from tokenpools.runtime.clock import FakeClock
    from tokenpools.runtime.deadletter import DeadLetters
    from tokenpools.streams.table import state as table_state
    from tokenpools.streams.metrics import StreamMetrics
    from tokenpools.streams.processor import DictStore, PoolProcessor
    from tokenpools.streams.views import ProxyBook
    from tokenpools.topics.declarations import topics_for

    sent: list[tuple[str, bytes, bytes | None]] = []

    async def send(topic: str, key: bytes, value: bytes | None) -> None:
        sent.append((topic, key, value))

    topics, metrics, book = topics_for("bench."), StreamMetrics(), ProxyBook()
    for beat in s["beats"].values():
        book.apply(beat)
    dead = DeadLetters(topics.dead_letters.name, "bench", FakeClock(BASE_MS), send=send)
    processor = PoolProcessor(s["params"], topics, _Catalogue(s["view"]), book, DictStore(), send, dead, metrics)
    if table_state.STATE_VERSION == 1:  # as the batch that folded the pool's events leaves it
        processor._put(table_state.table_key(POOL), s["state"], 0)
    else:
        processor.put_state(s["state"], 0)
    loop = asyncio.new_event_loop()
    try:
        gc.collect()
        t0 = time.process_time()
        loop.run_until_complete(processor.tick(s["horizon_ms"]))
        cpu_s = time.process_time() - t0
    finally:
        loop.close()
    digest = hashlib.sha256()
    for topic, key, value in sent:
        digest.update(topic.encode() + b"\0" + key + b"\0" + (value or b""))
    if table_state.STATE_VERSION == 1:
        state = processor._load(table_state.table_key(POOL), POOL)
    elif not hasattr(processor, "pool_table"):  # a build before the pool table was the processor's collaborator
        state = processor._held(POOL).state
    else:
        state = processor.pool_table.held(POOL).state
    digest.update(_canonical(table_state, state))
    return cpu_s, digest.digest()


def worker(entitlements: int, proxies: int, runs: int, seed: int) -> dict[str, Any]:
    """This process's build: every mode's pool and processor ticks, ``runs`` times each (ms), and their digests."""
    out: dict[str, Any] = {}
    for mode in MODES:
        s = scenario(entitlements, proxies, mode == "shares", seed)
        pool = [pool_tick(s) for _ in range(runs)]
        whole = [processor_tick(s) for _ in range(runs)]
        out[mode] = {"pool_tick_ms": [t * 1000 for t, _, _ in pool], "loop_held_ms": [t * 1000 for _, t, _ in pool],
                     "processor_tick_ms": [t * 1000 for t, _ in whole],
                     "digest": hashlib.sha256(pool[0][2] + whole[0][1]).hexdigest(),
                     "stable": len({d for _, _, d in pool}) == 1 and len({d for _, d in whole}) == 1}
    return out


# ---- the driver -----------------------------------------------------------------------------------------------

def measure(site: Path | None, args: argparse.Namespace, runs: int) -> dict[str, Any]:
    """One worker process: this build (``site`` None) or the one installed at ``site``."""
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = str(site)  # before the editable install's finder, which only answers what is left
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--entitlements", str(args.entitlements),
               "--proxies", str(args.proxies), "--runs", str(runs), "--seed", str(args.seed)]
    stdout = baseline.run_worker(command, env, tempfile.gettempdir())
    return json.loads(stdout)


def summary(builds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per build and mode, the least and the median of every run of every round (ms). The least is the figure: on a
    shared machine the others' work only ever adds to a run's time."""
    out: dict[str, Any] = {}
    for build, rounds in builds.items():
        out[build] = {}
        for mode in MODES:
            runs = {key: [t for r in rounds for t in r[mode][key]] for key in FIGURES}
            out[build][mode] = {
                **{key: min(times) for key, times in runs.items()},
                **{f"{key}_median": statistics.median(times) for key, times in runs.items()},
                "digest": rounds[0][mode]["digest"],
                "stable": all(r[mode]["stable"] and r[mode]["digest"] == rounds[0][mode]["digest"] for r in rounds),
            }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entitlements", type=int, default=400, help="E, entitlements in the pool (default 400)")
    parser.add_argument("--proxies", type=int, default=200, help="P, live proxies of the pool (default 200)")
    parser.add_argument("--runs", type=int, default=5, help="timed ticks per mode and round (default 5)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="worker processes per build, run alternately with the baseline's (default 2)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--baseline", default=DEFAULT_BASELINE,
                        help=f"git revision to compare with (default {DEFAULT_BASELINE}, the tick before its rework; "
                             "'none': this build alone)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        baseline.alias_moved()  # a baseline cut before the sub-packages answers today's module names
        print(json.dumps(worker(args.entitlements, args.proxies, args.runs, args.seed)))
        return 0
    started = time.perf_counter()
    builds: dict[str, list[dict[str, Any]]] = {"this": []}
    with tempfile.TemporaryDirectory(prefix="tick-bench-") as tmp:
        site = None
        if args.baseline != "none":
            site = baseline.install(ROOT, args.baseline, Path(tmp))
            builds["baseline"] = []
        for _ in range(args.rounds):
            builds["this"].append(measure(None, args, args.runs))
            if site is not None:
                builds["baseline"].append(measure(site, args, max(1, args.runs // 2)))  # it is the slow one
    figures = summary(builds)
    this = figures["this"]
    base = figures.get("baseline")
    met = all(this[m]["pool_tick_ms"] <= TARGET_MS for m in MODES)
    document = {
        "machine": {"platform": platform.platform(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "build": accel.describe(), "load_average": os.getloadavg()},
        "scenario": {"entitlements": args.entitlements, "proxies": args.proxies, "seed": args.seed,
                     "runs": args.runs, "rounds": args.rounds},
        "baseline": args.baseline, "figures": figures,
        "ratios": {m: {k: base[m][k] / this[m][k] for k in FIGURES} for m in MODES} if base else None,
        "outputs_equal": all(base[m]["digest"] == this[m]["digest"] for m in MODES) if base else None,
        "target": {"pool_tick_ms_at_most": TARGET_MS, "met": met},
        "total_s": time.perf_counter() - started,
    }
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(accel.describe())
        print(f"python {platform.python_version()} on {platform.platform()} ({os.cpu_count()} cores, load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}); CPU ms, least (median) of {args.rounds} x "
              f"{args.runs} runs")
        print(f"E = {args.entitlements}, P = {args.proxies}, seed {args.seed}; baseline: {args.baseline}\n")
        print(f"{'mode':<8} {'figure':<16} {'this':>16} {'baseline':>18} {'ratio':>7}")
        for mode in MODES:
            for key, label in FIGURES.items():
                mine = f"{this[mode][key]:7.1f} ({this[mode][key + '_median']:6.1f})"
                b = f"{base[mode][key]:8.1f} ({base[mode][key + '_median']:7.1f})" if base else f"{'-':>18}"
                r = f"{base[mode][key] / this[mode][key]:6.1f}x" if base else f"{'-':>7}"
                print(f"{mode:<8} {label:<16} {mine:>16} {b:>18} {r}")
        if base:
            print(f"\noutputs equal to the baseline's: {document['outputs_equal']}")
        print(f"target: pool tick <= {TARGET_MS:g} ms in both modes: {'met' if met else 'MISSED'}")
        print(f"total {document['total_s']:.1f} s")
    return 0 if met and document["outputs_equal"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
