"""Stream agents end to end on a real Kafka broker: producer → agents worker → limit updates.

    .venv/bin/python benchmarks/pipeline.py                       # all three measurements, own broker
    .venv/bin/python benchmarks/pipeline.py --bootstrap 127.0.0.1:19092 --mode live --rate 25000
    .venv/bin/python benchmarks/pipeline.py --mode drain --profile out/agents.prof   # where the time goes

The worker is the real command (``python -m tokenpools agents``) in its own process; this script produces and
measures. Settings: tick_s=1, grace_s=0.3 (as in the integration tests; ``--grace-s`` changes it), ``--pools`` pools spread over the
partitions, two entitlements each (elastic copilot, spot batch).

Events are packed per (topic, pool) into ``event_batch`` records the way the proxy packs them (``--pack-events``,
``--pack-bytes``, and only events within ``--pack-span-ms`` of event time, sent in time order; ``--pack-events 1``
produces every event as its own Kafka record, as before batching).

- ``drain``: ``--events`` records produced first (as recent history), then the worker starts: its processing rate
  from the first record to the last (events counter on its /metrics), and its CPU time per record.
- ``live``: records produced at ``--rate`` per second for ``--duration-s`` with live timestamps while the worker
  runs: the rate it sustains, how far behind it falls (lag at the end, time to drain), and whether every window's
  limit update still comes within a tick of its deadline.
- ``reaction``: light background traffic; ``--overloads`` times, a spot entitlement suddenly asks for ~10× the
  pool; the time from the overload's first record to the first limit update with ``contended`` (decomposed into
  waiting for the window to end, the grace, and the agents' own latency).

The producer sends watermarks as a proxy does (``--watermarks on``, the default: every record carries the
proxy's id and watermark, idle (topic, pool) keys get a watermark-only record every 100 ms, and the proxy
heartbeats), so the agents close a window once the watermarks have passed its end instead of at end + grace;
``--watermarks off`` produces what a proxy without them sends; ``both`` runs each mode twice on the same broker,
without and then with, for a before/after of the same run. The reaction to compare with the target
(≤ 1 tick + 200 ms) is the one with the default grace: ``--grace-s 2``.

The machine is reported (cores, load average) because other processes share it: CPU time per record is the
figure that does not depend on them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson

from tokenpools.config import KafkaSettings
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.streams.admin import ensure_topics
from tokenpools.topics.codec import encode
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.records import LimitUpdate
from tokenpools.topics.shards import event_key, keys_of
from tokenpools_dev.streams import bench
from tokenpools_dev.streams import harness
from tokenpools_dev.streams import scripted

WIDTH_MS = 1000


def config_yaml(pools: int, shards: int = 1) -> str:
    docs = []
    for i in range(pools):
        pool = (scripted.CONFIG_YAML.replace(scripted.POOL, f"pool-{i}").replace("name: copilot", f"name: copilot-{i}")
                .replace("name: batch", f"name: batch-{i}").replace("pool-a-vllm", f"pool-{i}-vllm"))
        if shards > 1:
            pool = pool.replace("  defaults: {maxTokens: 64}\n", f"  defaults: {{maxTokens: 64}}\n  shards: {shards}\n", 1)
            for k in range(1, SHARDED_ENTITLEMENTS):  # a hot pool has many tenants: spread over the shards
                for name in ("copilot", "batch"):
                    head, sep, rest = pool.partition(f"metadata: {{name: {name}-{i}}}")
                    doc = rest.split("---")[0].replace(f"name: {name}-{i}", f"name: {name}-{i}-{k}")
                    pool += f"---\napiVersion: tokenpools.io/v1alpha1\nkind: TokenEntitlement\n" \
                            f"metadata: {{name: {name}-{i}-{k}}}{doc}"
        docs.append(pool)
    return "---\n".join(docs)


SHARDED_ENTITLEMENTS = 8  # per class and pool, with --shards > 1


class Records:
    """Pre-built JSON templates; ``make`` fills in the varying fields (orjson: ~2 µs a record, not pydantic's 20)."""

    def __init__(self) -> None:
        events = scripted.scripted_events(0, WIDTH_MS, scripted.two_class_phases(4))
        self.decided = orjson.loads(encode(next(r for r, _ in events if r.record_type == "request_decided")))
        self.refused = dict(self.decided, outcome="concurrency", reason="concurrency", kv_bytes=0)
        self.completed = orjson.loads(encode(next(r for r, _ in events if r.record_type == "request_completed")))
        self.n = 0
        self.key = ""  # the event key of the last request made (its shard's, for a sharded pool)

    def make(self, pool: int, t_ms: int, overload: bool = False, shards: int = 1) -> list[tuple[str, bytes]]:
        """One request: a decision and (if admitted) its completion; as (kind, value)."""
        self.n += 1
        rid = f"r{self.n}"
        entitlement = f"batch-{pool}" if overload or self.n % 3 == 0 else f"copilot-{pool}"
        if shards > 1 and (k := self.n // 3 % SHARDED_ENTITLEMENTS):
            entitlement += f"-{k}"
        self.key = f"pool-{pool}" if shards <= 1 else event_key(f"pool-{pool}", entitlement, shards)
        if overload:
            return [("requests", orjson.dumps(dict(self.refused, request_id=rid, pool=f"pool-{pool}",
                                                   entitlement=entitlement, t_ms=t_ms, cost_tokens=1000)))]
        decided = dict(self.decided, request_id=rid, pool=f"pool-{pool}", entitlement=entitlement, t_ms=t_ms)
        done = dict(self.completed, request_id=rid, pool=f"pool-{pool}", entitlement=entitlement, t_ms=t_ms + 5,
                    admitted_t_ms=t_ms)
        return [("requests", orjson.dumps(decided)), ("completions", orjson.dumps(done))]


class Run:
    def __init__(self, args: argparse.Namespace, bootstrap: str, workdir: Path, watermarks: bool = True) -> None:
        self.args, self.bootstrap, self.workdir, self.watermarks = args, bootstrap, workdir, watermarks
        uid = uuid.uuid4().hex[:6]
        self.topics = topics_for(f"bench-{uid}.", partitions=args.partitions)
        self.app_id = f"bench-agents-{uid}"
        self.port = bench.free_port()
        self.config = workdir / "pools.yaml"
        self.config.write_text(config_yaml(args.pools, args.shards))

    async def setup(self) -> None:
        await ensure_topics(KafkaClients(KafkaSettings(bootstrap_servers=self.bootstrap)), self.topics)


def producer_for(run: Run, records: Records) -> bench.Producer:
    args = run.args
    proxy = records.decided["proxy_id"] if run.watermarks else None
    pools = tuple(f"pool-{i}" for i in range(args.pools))
    return bench.Producer(run.bootstrap, run.topics, args.pack_events, args.pack_bytes, args.pack_span_ms, proxy_id=proxy,
                      keys=tuple(k for p in pools for k in keys_of(p, args.shards)),
                      pools=tuple(f"pool-{i}" for i in range(args.pools)))


def worker(run: Run, tag: str, profile: str | None = None, port: int | None = None) -> object:
    import subprocess

    settings = ["streams.tick_s=1", f"streams.grace_s={run.args.grace_s}", f"kafka.bootstrap_servers={run.bootstrap}",
                f"kafka.topic_prefix={run.topics.requests.name.removesuffix('requests')}", f"streams.app_id={run.app_id}",
                f"kafka.topic_partitions={run.topics.requests.partitions}"]  # as created: fewer would be refused
    prefix = [sys.executable, "-c", bench.PROFILED, profile] if profile else [sys.executable, "-m", "tokenpools"]
    command = [*prefix, "agents", "--config", str(run.config), "--fast-join", "--http-port", str(port or run.port),
               "--log-level", "WARNING", "--batch-max", str(run.args.batch_max)]
    for item in settings:
        command += ["--set", item]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENPOOLS_")}
    log = open(run.workdir / f"{tag}.log", "ab")  # noqa: SIM115
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


async def drain(run: Run) -> dict[str, float]:
    args, records = run.args, Records()
    now = int(time.time() * 1000)
    span_ms = max(WIDTH_MS, int(args.events / 20))  # ~20 records/ms of history, ending now
    producer = await producer_for(run, records).start()
    items: list[tuple[int, int, str, bytes]] = []
    while producer.sent + len(items) < args.events:
        t = now - span_ms + (producer.sent + len(items)) * span_ms // args.events
        pool = random.randrange(args.pools)
        made = records.make(pool, t, shards=args.shards)
        items += [(records.key, t, kind, value) for kind, value in made]
        if len(items) >= 20_000:
            await producer.send(items)
            items = []
    await producer.send(items)
    await producer.stop()
    total = producer.sent
    ports = [run.port] + [bench.free_port() for _ in range(args.workers - 1)]
    processes = [worker(run, f"drain{i}", args.profile if i == 0 else None, port) for i, port in enumerate(ports)]
    sampler = None
    try:
        for port in ports:
            await bench.wait_up(port)
        if args.sample:
            sampler = bench.sample(processes[0].pid, args.sample)  # type: ignore[attr-defined]
        cpu0 = [bench.cpu_s(p.pid) for p in processes]  # type: ignore[attr-defined]
        first, count = None, 0
        while count < total:
            counts = [await bench.processed(port) for port in ports]
            count = sum(counts)
            if first is None and all(c > 0 for c in counts):  # every worker has its partitions: steady state
                first = (time.monotonic(), count)
            await asyncio.sleep(0.25)
        if first is None:  # one worker drained every record before another had a partition: no shared rate
            raise RuntimeError(f"the records were drained before all {args.workers} workers had partitions; "
                               "pass more --events")
        elapsed = time.monotonic() - first[0]
        counted = {}
        for port in ports:
            for k, v in (await bench.outcomes(port)).items():
                counted[k] = counted.get(k, 0) + v
        cpu = sum(bench.cpu_s(p.pid) - c for p, c in zip(processes, cpu0))  # type: ignore[attr-defined]
        threads = bench.thread_cpu_s(processes[0].pid)  # type: ignore[attr-defined]
    finally:
        if sampler is not None:
            sampler.send_signal(2)
            sampler.wait(30)
        for process in processes:
            harness.stop(process)  # type: ignore[arg-type]
    if args.sample:
        print(bench.where_the_time_goes(Path(args.sample)))
    rate = (total - first[1]) / elapsed
    print("  worker CPU by thread (s, including start-up): "
          + ", ".join(f"{n} {v:.1f}" for n, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v >= 0.1))
    baseline = await bench.faust_baseline(run.bootstrap, run.topics, producer.messages) if args.baseline else {}
    return {**baseline, "workers": args.workers, "records": total, "kafka_messages": producer.messages, **counted,
            "records_per_s": rate,
            "cpu_us_per_record": cpu / total * 1e6, "records_per_cpu_s": total / cpu}


async def live(run: Run) -> dict[str, float]:
    args, records = run.args, Records()
    process = worker(run, "live")
    limits = await harness.Collector(run.bootstrap, run.topics.limits.name).start()
    producer = await producer_for(run, records).start()
    try:
        await bench.wait_up(run.port)
        await asyncio.sleep(3)  # group joined, first ticks done
        cpu0, start = bench.cpu_s(process.pid), time.time()  # type: ignore[attr-defined]
        base = await bench.processed(run.port)
        step_s = 0.02
        while (elapsed := time.time() - start) < args.duration_s:
            due = int(args.rate / 2 * elapsed) - producer.sent // 2  # requests (2 records each) due by now
            items = []
            now = int(time.time() * 1000)
            for _ in range(max(0, due)):
                pool = random.randrange(args.pools)
                made = records.make(pool, now, shards=args.shards)
                items += [(records.key, now, kind, value) for kind, value in made]
            if items:
                await producer.send(items, now)
            await asyncio.sleep(step_s)
        produced_s = time.time() - start
        done_during = await bench.processed(run.port) - base
        cpu = bench.cpu_s(process.pid) - cpu0  # type: ignore[attr-defined]
        drain_deadline = time.time() + args.drain_timeout_s
        while await bench.processed(run.port) - base < producer.sent and time.time() < drain_deadline:
            await asyncio.sleep(0.25)
        left = producer.sent - (await bench.processed(run.port) - base)
        done_s = time.time() - start
        await asyncio.sleep(1.5)
        lateness = [arrived - (u.version + args.grace_s * 1000) / 1000 for u, arrived in zip(limits.records, limits.arrived_s)
                    if start + 2 < u.version / 1000 < start + produced_s]
    finally:
        await producer.stop()
        await limits.stop()
        harness.stop(process)  # type: ignore[arg-type]
    return {"offered_records_per_s": producer.sent / produced_s,
            "processed_while_offered_per_s": done_during / produced_s,
            "lag_at_end_records": producer.sent - done_during,
            "drain_after_end_s": (done_s - produced_s) if left <= 0 else float("nan"),
            "cpu_us_per_record": cpu / max(1, done_during) * 1e6,
            "update_after_deadline_p50_ms": statistics.median(lateness) * 1000 if lateness else float("nan"),
            "update_after_deadline_max_ms": max(lateness) * 1000 if lateness else float("nan")}


async def reaction(run: Run) -> dict[str, float]:
    args, records = run.args, Records()
    process = worker(run, "reaction")
    limits = await harness.Collector(run.bootstrap, run.topics.limits.name).start()
    producer = await producer_for(run, records).start()
    samples = []
    try:
        await bench.wait_up(run.port)
        await asyncio.sleep(2)
        rng = random.Random(3)
        for _ in range(args.overloads):
            quiet_until = time.time() + 3 + rng.random()  # a random phase within the window
            while time.time() < quiet_until:  # ~3 requests/s: well within the pool's 480 tokens/s
                now = int(time.time() * 1000)
                await producer.send([(0, now, k, v) for k, v in records.make(0, now)], now)
                await asyncio.sleep(0.3)
            first_ms = int(time.time() * 1000)
            window_end = (first_ms // WIDTH_MS + 1) * WIDTH_MS
            while time.time() * 1000 < first_ms + 2 * WIDTH_MS:
                now = int(time.time() * 1000)
                await producer.send([(0, now, k, v) for _ in range(20) for k, v in records.make(0, now, overload=True)],
                                    now)
                await asyncio.sleep(0.02)

            def reacted(r: list[LimitUpdate]) -> bool:
                return any(u.pool == "pool-0" and u.version >= window_end and u.contended for u in r)

            got = await limits.wait_for(reacted, 10)
            quiet = [u for u in got if u.pool == "pool-0" and first_ms - 2 * WIDTH_MS <= u.version < window_end - WIDTH_MS]
            assert quiet and not any(u.contended for u in quiet), "the quiet windows must not be contended"
            index = next(i for i, u in enumerate(got) if u.pool == "pool-0" and u.version >= window_end and u.contended)
            update: LimitUpdate = got[index]
            arrived_ms = limits.arrived_s[index] * 1000
            samples.append((arrived_ms - first_ms, window_end - first_ms, arrived_ms - (update.version + args.grace_s * 1000),
                            update.version - window_end, arrived_ms - update.version))
            await asyncio.sleep(2)  # let the overload pass
    finally:
        await producer.stop()
        await limits.stop()
        harness.stop(process)  # type: ignore[arg-type]
    total = [s[0] for s in samples]
    return {"overloads": len(samples), "reaction_p50_ms": statistics.median(total), "reaction_max_ms": max(total),
            "to_window_end_p50_ms": statistics.median(s[1] for s in samples),
            "agents_after_deadline_p50_ms": statistics.median(s[2] for s in samples),
            "agents_after_deadline_max_ms": max(s[2] for s in samples),
            "after_window_end_p50_ms": statistics.median(s[4] for s in samples),
            "after_window_end_max_ms": max(s[4] for s in samples),
            "windows_late": sum(1 for s in samples if s[3] > 0)}


async def main_async(args: argparse.Namespace) -> None:
    from tokenpools_dev.devstack.kafka import KafkaBroker

    broker = None
    bootstrap = args.bootstrap
    with tempfile.TemporaryDirectory(prefix="tokenpools-bench-") as tmp:
        if bootstrap is None:
            broker = KafkaBroker(workdir=Path(tmp) / "kafka").start()
            bootstrap = broker.bootstrap
        try:
            print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (other processes share "
                  f"the cores), a Python loop at {bench.python_loop_ns():.0f} ns/iteration; broker {bootstrap}")
            modes = ["drain", "live", "reaction"] if args.mode == "all" else [args.mode]
            marks = {"on": [True], "off": [False], "both": [False, True]}[args.watermarks]
            for mode, marked in [(m, w) for m in modes for w in marks]:
                run = Run(args, bootstrap, Path(tmp), marked)
                await run.setup()
                result = await {"drain": drain, "live": live, "reaction": reaction}[mode](run)
                label = f"{mode} (watermarks {'on' if marked else 'off'}, grace {args.grace_s} s)"
                print(f"{label}: " + ", ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
                                               for k, v in result.items()), flush=True)
            if args.profile:
                import pstats

                pstats.Stats(args.profile).sort_stats("tottime").print_stats(25)
        finally:
            if broker is not None:
                broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="an existing broker (default: start one with tokenpools_dev.devstack)")
    parser.add_argument("--mode", choices=["all", "drain", "live", "reaction"], default="all")
    parser.add_argument("--events", type=int, default=300_000, help="records for --mode drain")
    parser.add_argument("--workers", type=int, default=1, help="agents processes in --mode drain (split partitions)")
    parser.add_argument("--rate", type=float, default=25_000, help="records/s offered in --mode live")
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--drain-timeout-s", type=float, default=30.0, help="live: wait this long for the lag")
    parser.add_argument("--grace-s", type=float, default=0.3, help="streams.grace_s of the worker")
    parser.add_argument("--pools", type=int, default=4)
    parser.add_argument("--shards", type=int, default=1, help="every pool's shards (its events spread over "
                        f"<pool>#<k> keys, {SHARDED_ENTITLEMENTS} entitlements per class): the hot-pool figure is "
                        "--pools 1 --shards 2 --workers 2 against --workers 1")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch-max", type=int, default=5000)
    parser.add_argument("--overloads", type=int, default=6)
    parser.add_argument("--pack-events", type=int, default=500,
                        help="events per Kafka record, packed per (topic, pool) as the proxy does; 1: unbatched")
    parser.add_argument("--pack-bytes", type=int, default=64 << 10, help="bytes per packed Kafka record at most")
    parser.add_argument("--pack-span-ms", type=int, default=5,
                        help="events of one (topic, pool) within this much event time share a record (the proxy's "
                             "linger is 5 ms)")
    parser.add_argument("--watermarks", choices=["on", "off", "both"], default="on",
                        help="send the proxy's watermarks (both: each mode without, then with)")
    parser.add_argument("--profile", help="run the drain worker under cProfile, write the stats here")
    parser.add_argument("--baseline", action="store_true",
                        help="also time a do-nothing Faust agent over the same records (drain mode)")
    parser.add_argument("--sample", help="sample the drain worker with py-spy, collapsed stacks to this file")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
