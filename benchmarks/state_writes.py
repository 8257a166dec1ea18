"""Changelog writes of the agents' pool-state table per batch and per tick, and restore time, against a baseline build.

    .venv/bin/python benchmarks/state_writes.py                      # E = 400, P = 200, against the one-value layout
    .venv/bin/python benchmarks/state_writes.py --baseline none      # this build alone
    .venv/bin/python benchmarks/state_writes.py --entitlements 100 --proxies 50 --json

The pool of ``benchmarks/tick.py`` (E entitlements, P proxies, three windows of traffic folded, two ticked), in
``counts`` mode (the default, ``policy.fleet_enforcement=counts``) and ``shares`` mode, stored by a
``PoolProcessor`` whose table records every write, then:

- ``batch``: one batch of 500 events of the next window (60 % decisions at a random entitlement and proxy, 80 %
  of them admitted; 40 % completions), as ``PoolProcessor.process`` folds it: the changelog records it writes
  and their bytes (key + value);
- ``tick``: the next ``PoolProcessor.tick`` (the third window closed): its records and bytes;
- ``after batch``, ``after tick``: the table as the changelog holds it then (compacted: the newest value per key,
  no tombstones), its keys and bytes, and the time to restore it: the records applied to an empty store and the
  pool's state rebuilt from it by a fresh processor, as after a restart (CPU ms, the least of ``--runs``).

The baseline (``--baseline REV``, default the revision before the table was split into parts, where the whole
state is one value per pool) is installed from ``git archive`` into a temporary directory and measured in a fresh
process of the same interpreter; both builds must end with equal states. Target: bytes per batch <= 10 % of the
baseline's, in both modes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import hashlib
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tokenpools_dev import baseline

DEFAULT_BASELINE = "67fa663"  # the one-value layout (state version 1)
TARGET_RATIO = 0.10
BATCH_EVENTS = 500
MODES = ("counts", "shares")
ROOT = Path(__file__).resolve().parent.parent


def _batch(s: dict[str, Any], seed: int) -> list[Any]:
    """``BATCH_EVENTS`` raw records of the window after the scenario's three, on a source of their own."""
    from tick import BASE_MS, POOL, WIDTH_MS

    from tokenpools.core.outcomes import AdmissionOutcome
    from tokenpools.streams.processor import RawEvent
    from tokenpools.topics.codec import encode
    from tokenpools.topics.records import RequestCompleted, RequestDecided

    rng = random.Random(seed)
    names = [e.name for e in s["view"].entitlements]
    proxies = sorted(s["beats"])
    out = []
    for n in range(BATCH_EVENTS):
        t_ms = BASE_MS + 3 * WIDTH_MS + n * 100 // BATCH_EVENTS
        entitlement, proxy = rng.choice(names), rng.choice(proxies)
        if rng.random() < 0.6:
            admitted = rng.random() < 0.8
            record: Any = RequestDecided(
                request_id=f"b{n}", pool=POOL, entitlement=entitlement, proxy_id=proxy, t_ms=t_ms,
                outcome=AdmissionOutcome.ADMITTED if admitted else AdmissionOutcome.REFUSED_CONCURRENCY,
                reason="bench", prompt_tokens_est=100, max_tokens=200, cost_tokens=300,
                kv_bytes=300 * 147_456 if admitted else 0, priority=1.0)
        else:
            record = RequestCompleted(
                request_id=f"c{n}", pool=POOL, entitlement=entitlement, proxy_id=proxy, t_ms=t_ms,
                admitted_t_ms=t_ms - 500, status="ok", prompt_tokens=100, completion_tokens=150, reserved_tokens=300,
                kv_bytes=300 * 147_456, ttft_s=0.1, e2e_s=0.5)
        out.append(RawEvent("bench.requests", 0, n, t_ms + 3, POOL.encode(), encode(record)))
    return out


def _processor(s: dict[str, Any], store: Any) -> Any:
    from tick import BASE_MS, _Catalogue

    from tokenpools.runtime.clock import FakeClock
    from tokenpools.runtime.deadletter import DeadLetters
    from tokenpools.streams.metrics import StreamMetrics
    from tokenpools.streams.processor import PoolProcessor
    from tokenpools.streams.views import ProxyBook
    from tokenpools.topics.declarations import topics_for

    async def send(topic: str, key: bytes, value: bytes | None) -> None:
        return None

    topics, book = topics_for("bench."), ProxyBook()
    for beat in s["beats"].values():
        book.apply(beat)
    dead = DeadLetters(topics.dead_letters.name, "bench", FakeClock(BASE_MS), send=send)
    return PoolProcessor(s["params"], topics, _Catalogue(s["view"]), book, store, send, dead, StreamMetrics())


def _recording_store() -> Any:
    from tokenpools.streams.processor import DictStore

    class Recording(DictStore):
        def __init__(self) -> None:
            super().__init__()
            self.log: list[tuple[bytes, bytes | None]] = []

        def put(self, key: bytes, value: Any, partition: int) -> None:
            self.log.append((key, value))
            super().put(key, value, partition)

    return Recording()


def _seed(processor: Any, state: Any) -> None:
    """The scenario's state stored as a batch leaves it (either build's way)."""
    from tokenpools.streams.table import state as table_state

    if table_state.STATE_VERSION == 1:
        processor._put(table_state.table_key(state.pool), state, 0)
    else:
        processor.put_state(state, 0)


def _held(processor: Any, pool: str) -> Any:
    from tokenpools.streams.table import state as table_state

    if table_state.STATE_VERSION == 1:
        return processor._load(table_state.table_key(pool), pool)
    if not hasattr(processor, "pool_table"):  # a build before the pool table was the processor's collaborator
        return processor._held(pool).state
    return processor.pool_table.held(pool).state


def _written(log: list[tuple[bytes, bytes | None]]) -> dict[str, int]:
    """The pool state's records: the usage ledgers the agents keep in the same table (``ledger/...``, one per
    entitlement a batch completed for) are another structure, which the one-value baseline did not have."""
    pool = [(k, v) for k, v in log if not k.startswith(b"ledger/")]
    return {"records": len(pool), "bytes": sum(len(k) + len(v or b"") for k, v in pool)}


def _digest(state: Any) -> str:
    import orjson

    data = orjson.dumps(dataclasses.asdict(state), option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    return hashlib.sha256(data).hexdigest()


def _restore(s: dict[str, Any], changelog: list[tuple[bytes, bytes | None]], runs: int,
             expected: Any) -> dict[str, Any]:
    """The changelog as compaction keeps it applied to an empty store, and the pool rebuilt from it: least CPU ms."""
    from tick import POOL

    compacted: dict[bytes, bytes | None] = {}
    for key, value in changelog:
        compacted.pop(key, None)
        compacted[key] = value
    times = []
    for _ in range(runs):
        gc.collect()
        t0 = time.process_time()
        restored = _recording_store()
        for key, value in compacted.items():
            restored.put(key, value, 0)
        again = _held(_processor(s, restored), POOL)
        times.append((time.process_time() - t0) * 1000)
        assert again == expected, "the restored state differs from the one stored"
    return {"ms": min(times), "keys": len(restored.data),
            "bytes": sum(len(k) + len(v) for k, (v, _) in restored.data.items())}


def worker(entitlements: int, proxies: int, runs: int, seed: int) -> dict[str, Any]:
    """This process's build: per mode, the batch's and the tick's writes, the table and its restore after each,
    and the final state's digest."""
    from tick import POOL, scenario

    out: dict[str, Any] = {}
    for mode in MODES:
        s = scenario(entitlements, proxies, mode == "shares", seed)
        store = _recording_store()
        processor = _processor(s, store)
        _seed(processor, s["state"])
        loop = asyncio.new_event_loop()
        try:
            mark = len(store.log)
            loop.run_until_complete(processor.process(_batch(s, seed)))
            batch = _written(store.log[mark:])
            after_batch = _restore(s, store.log, runs, _held(processor, POOL))
            mark = len(store.log)
            loop.run_until_complete(processor.tick(s["horizon_ms"]))
            tick = _written(store.log[mark:])
        finally:
            loop.close()
        state = _held(processor, POOL)
        after_tick = _restore(s, store.log, runs, state)
        out[mode] = {"batch": batch, "tick": tick, "after_batch": after_batch, "after_tick": after_tick,
                     "digest": _digest(state)}
    return out


# ---- the driver -----------------------------------------------------------------------------------------------

def measure(site: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*([str(site)] if site is not None else []), str(Path(__file__).parent)])
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--entitlements", str(args.entitlements),
               "--proxies", str(args.proxies), "--runs", str(args.runs), "--seed", str(args.seed)]
    stdout = baseline.run_worker(command, env, tempfile.gettempdir())
    return json.loads(stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entitlements", type=int, default=400, help="E, entitlements in the pool (default 400)")
    parser.add_argument("--proxies", type=int, default=200, help="P, live proxies of the pool (default 200)")
    parser.add_argument("--runs", type=int, default=3, help="timed restores per mode (default 3)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--baseline", default=DEFAULT_BASELINE,
                        help=f"git revision to compare with (default {DEFAULT_BASELINE}, the one-value layout; "
                             "'none': this build alone)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        baseline.alias_moved()  # a baseline cut before the sub-packages answers today's module names
        print(json.dumps(worker(args.entitlements, args.proxies, args.runs, args.seed)))
        return 0
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="state-writes-bench-") as tmp:
        site = baseline.install(ROOT, args.baseline, Path(tmp)) if args.baseline != "none" else None
        this = measure(None, args)
        base = measure(site, args) if site is not None else None
    ratios = {m: {"batch_bytes": this[m]["batch"]["bytes"] / base[m]["batch"]["bytes"],
                  "tick_bytes": this[m]["tick"]["bytes"] / base[m]["tick"]["bytes"],
                  "restore_after_batch_ms": this[m]["after_batch"]["ms"] / base[m]["after_batch"]["ms"],
                  "restore_after_tick_ms": this[m]["after_tick"]["ms"] / base[m]["after_tick"]["ms"]}
              for m in MODES} if base else None
    met = all(r["batch_bytes"] <= TARGET_RATIO for r in ratios.values()) if ratios else None
    equal = all(this[m]["digest"] == base[m]["digest"] for m in MODES) if base else None
    document = {
        "machine": {"platform": platform.platform(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "load_average": os.getloadavg()},
        "scenario": {"entitlements": args.entitlements, "proxies": args.proxies, "seed": args.seed,
                     "batch_events": BATCH_EVENTS, "runs": args.runs},
        "baseline": args.baseline, "this": this, "base": base, "ratios": ratios, "states_equal": equal,
        "target": {"batch_bytes_ratio_at_most": TARGET_RATIO, "met": met}, "total_s": time.perf_counter() - started,
    }
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(f"python {platform.python_version()} on {platform.platform()} ({os.cpu_count()} cores, load average "
              f"{' '.join(f'{x:.1f}' for x in os.getloadavg())})")
        print(f"E = {args.entitlements}, P = {args.proxies}, seed {args.seed}, a batch of {BATCH_EVENTS} events; "
              f"baseline: {args.baseline}\n")
        print(f"{'mode':<7} {'figure':<22} {'this':>18} {'baseline':>18} {'ratio':>8}")
        for m in MODES:
            def of(build: dict[str, Any] | None, *path: str) -> Any:
                if build is None:
                    return None
                value: Any = build[m]
                for step in path:
                    value = value[step]
                return round(value, 1) if isinstance(value, float) else value

            rows = [(label, of(this, *path), of(base, *path)) for label, path in (
                ("batch: records", ("batch", "records")), ("batch: bytes", ("batch", "bytes")),
                ("tick: records", ("tick", "records")), ("tick: bytes", ("tick", "bytes")),
                ("after batch: keys", ("after_batch", "keys")), ("after batch: bytes", ("after_batch", "bytes")),
                ("  restore CPU ms", ("after_batch", "ms")),
                ("after tick: keys", ("after_tick", "keys")), ("after tick: bytes", ("after_tick", "bytes")),
                ("  restore CPU ms", ("after_tick", "ms")))]
            for label, mine, theirs in rows:
                ratio = f"{mine / theirs:7.3f}" if theirs else f"{'-':>7}"
                other = f"{theirs:,}" if theirs is not None else "-"
                print(f"{m:<7} {label:<22} {mine:>18,} {other:>18} {ratio}")
        if base:
            print(f"\nfinal states equal to the baseline's: {equal}")
            print(f"target: batch bytes <= {TARGET_RATIO:.0%} of the baseline's in both modes: "
                  f"{'met' if met else 'MISSED'}")
        print(f"total {document['total_s']:.1f} s")
    return 0 if met is not False and equal is not False else 1


if __name__ == "__main__":
    sys.exit(main())
