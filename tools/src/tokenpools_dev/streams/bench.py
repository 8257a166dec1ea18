"""Measuring tools for ``benchmarks/pipeline.py``: a fast batch producer, the worker's counters and CPU, profiles.

Nothing here is used by the agents themselves.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import sys
import time
import uuid
from pathlib import Path

import aiohttp

from tokenpools.topics.declarations import Topics


class Producer:
    """aiokafka's batch API, partitioned like the default partitioner: fast enough to out-run one agent worker.

    Records of one (topic, pool) whose timestamps fall in the same ``pack_span_ms`` slice are packed the way the
    proxy packs what it finds queued (``proxy.events``, ``topics.batches``: at most ``pack_events`` records and
    ``pack_bytes`` bytes per Kafka record, stamped with the newest record's time), and the slices go out in time
    order, as a proxy sends them; ``pack_events=1`` sends every record alone, as before batching. ``sent`` counts
    events, ``messages`` Kafka records.

    With ``proxy_id`` it also sends watermarks the way the proxy does (``proxy.watermarks``): every record of a
    ``send`` carries one — the oldest event time of that (topic, pool) still to come in this call, and for the
    last record of each key ``watermark_ms``, which the caller promises no later event will be below — and while
    running, every (topic, pool) of ``pools`` that sent nothing for ``interval_s`` gets a watermark-only record
    stating the clock (``send`` and these take one lock, so a watermark never overtakes the events it covers),
    and a heartbeat for the proxy goes out every ``heartbeat_s``."""

    def __init__(self, bootstrap: str, topics: Topics, pack_events: int = 500, pack_bytes: int = 64 << 10,
                 pack_span_ms: int = 5, proxy_id: str | None = None, pools: tuple[str, ...] = (),
                 interval_s: float = 0.1, heartbeat_s: float = 1.0, keys: tuple[str, ...] | None = None) -> None:
        self.bootstrap = bootstrap
        self.names = {"requests": topics.requests.name, "completions": topics.completions.name}
        self.heartbeats, self.heartbeat_partitions = topics.heartbeats.name, topics.heartbeats.partitions
        self.partitions = topics.requests.partitions
        self.pack_events, self.pack_bytes, self.pack_span_ms = pack_events, pack_bytes, max(1, pack_span_ms)
        self.proxy_id, self.pools, self.interval_s, self.heartbeat_s = proxy_id, pools, interval_s, heartbeat_s
        self.keys = pools if keys is None else keys  # the event keys idle watermarks go to (a sharded pool's shards)
        self.sent = 0
        self.messages = 0
        self.watermark_records = 0
        self._marked: dict[tuple[str, bytes], float] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Producer:
        from aiokafka.partitioner import murmur2

        from tokenpools_dev.kafka import local_kafka

        self._murmur = murmur2
        self.p = local_kafka(self.bootstrap).producer("bench", acks=1, linger_ms=10, max_batch_size=1 << 20,
                                                      max_request_size=8 << 20)
        await self.p.start()
        self._futures: list[asyncio.Future] = []
        self._lock = asyncio.Lock()
        if self.proxy_id is not None:
            self._task = asyncio.create_task(self._idle())
        return self

    def _partition(self, key: bytes) -> int:
        return (self._murmur(key) & 0x7FFFFFFF) % self.partitions

    async def send(self, items: list[tuple[int, int, str, bytes]], watermark_ms: int | None = None) -> None:
        """(pool, timestamp_ms, kind, value) → packed per (topic, pool) → one producer batch per topic partition;
        ``pool`` is the pool's index (key ``pool-<i>``) or the key itself.
        ``watermark_ms``: no event sent later has a smaller time (default: the newest time of ``items``)."""
        async with self._lock:
            await self._send(items, watermark_ms)

    async def _send(self, items: list[tuple[int, int, str, bytes]], watermark_ms: int | None) -> None:
        from tokenpools.topics.batches import Watermark, batch_value, envelope_bytes, pack

        runs: dict[tuple[int, str, bytes], list[tuple[int, bytes]]] = {}
        for pool, ts, kind, value in items:
            key = f"pool-{pool}" if isinstance(pool, int) else pool  # an index, or a key (``<pool>#<k>``)
            slot = (ts // self.pack_span_ms, self.names[kind], key.encode())
            runs.setdefault(slot, []).append((ts, value))
        final = watermark_ms if watermark_ms is not None else max((ts for _, ts, _, _ in items), default=0)
        units: list[tuple[str, bytes, int, list[bytes], list[int]]] = []
        for (_, topic, key), values in sorted(runs.items(), key=lambda kv: kv[0][0]):
            start = 0
            envelope = envelope_bytes(Watermark(self.proxy_id, 0) if self.proxy_id else None)
            for run in pack([v for _, v in values], self.pack_events, self.pack_bytes, envelope):
                times = [t for t, _ in values[start:start + len(run)]]
                start += len(run)
                units.append((topic, key, max(times), run, times))
        later: dict[tuple[str, bytes], int] = {}  # per key: the oldest time of the units after this one
        marks: list[int] = [final] * len(units)
        for i in range(len(units) - 1, -1, -1):
            topic, key, _, _, times = units[i]
            marks[i] = later.get((topic, key), final)
            later[(topic, key)] = min(later.get((topic, key), final), min(times))
        batches: dict[tuple[str, int], object] = {}
        for (topic, key, ts, run, _), mark in zip(units, marks):
            tp = (topic, self._partition(key))
            value = batch_value(run, Watermark(self.proxy_id, mark)) if self.proxy_id else batch_value(run)
            await self._append(batches, tp, key, value, ts)
            self._marked[(topic, key)] = time.monotonic()
            self.messages += 1
        for (topic, partition), batch in batches.items():
            self._futures.append(await self.p.send_batch(batch, topic, partition=partition))
        self.sent += len(items)

    async def _append(self, batches: dict[tuple[str, int], object], tp: tuple[str, int], key: bytes, value: bytes,
                      ts: int | None) -> None:
        batch = batches.get(tp) or batches.setdefault(tp, self.p.create_batch())
        if batch.append(key=key, value=value, timestamp=ts) is None:  # type: ignore[attr-defined]
            self._futures.append(await self.p.send_batch(batch, tp[0], partition=tp[1]))
            batch = batches[tp] = self.p.create_batch()
            batch.append(key=key, value=value, timestamp=ts)  # type: ignore[attr-defined]

    async def _idle(self) -> None:
        from tokenpools.topics.batches import Watermark, batch_value
        from tokenpools.topics.codec import encode
        from tokenpools.topics.records import ProxyHeartbeat

        assert self.proxy_id is not None
        started_ms, beat_at, wait_s = int(time.time() * 1000), 0.0, 0.0
        while True:
            await asyncio.sleep(wait_s)
            async with self._lock:
                now_s, now_ms = time.monotonic(), int(time.time() * 1000)
                batches: dict[tuple[str, int], object] = {}
                if now_s - beat_at >= self.heartbeat_s:
                    beat_at = now_s
                    beat = ProxyHeartbeat(proxy_id=self.proxy_id, t_ms=now_ms, pools=self.pools, started_ms=started_ms)
                    key = self.proxy_id.encode()
                    tp = (self.heartbeats, (self._murmur(key) & 0x7FFFFFFF) % self.heartbeat_partitions)
                    await self._append(batches, tp, key, encode(beat), None)
                wait_s = self.interval_s
                for topic in self.names.values():
                    for name in self.keys:
                        key = name.encode()
                        since = now_s - self._marked.get((topic, key), -1e9)
                        if since < self.interval_s:  # sent a record lately: due when the interval is up
                            wait_s = max(0.005, min(wait_s, self.interval_s - since))
                            continue
                        self._marked[(topic, key)] = now_s
                        value = batch_value([], Watermark(self.proxy_id, now_ms))
                        await self._append(batches, (topic, self._partition(key)), key, value, None)
                        self.watermark_records += 1
                for (topic, partition), batch in batches.items():
                    self._futures.append(await self.p.send_batch(batch, topic, partition=partition))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await asyncio.gather(*self._futures)
        await self.p.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def processed(port: int) -> int:
    """The worker's events counter (every record read, all types), or -1 while it is not up."""
    try:
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as response:
            text = await response.text()
    except aiohttp.ClientError:
        return -1
    return int(sum(float(v) for v in re.findall(r'^tokenpools_agents_events_total\{[^}]*\} (\S+)$', text, re.M)))


async def outcomes(port: int) -> dict[str, int]:
    """The worker's event outcomes (applied, late, duplicate, ignored) and dead letters by reason."""
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    found = {f"outcome_{k}": int(float(v)) for k, v in re.findall(
        r'^tokenpools_agents_event_outcomes_total\{outcome="([^"]+)"\} (\S+)$', text, re.M)}
    found |= {f"dead_{k}": int(float(v)) for k, v in re.findall(
        r'^tokenpools_agents_dead_letters_total\{reason="([^"]+)"\} (\S+)$', text, re.M)}
    return found


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds per thread (the main thread runs the agent; Faust's consumer has a thread of its own)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = "main" if task.name == str(pid) else f"thread {task.name}"
        out[name] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


# A Faust app that only counts what its agent receives, in batches, as ours does: what Faust alone costs a record.
# With "lean", Faust's fetch loop is replaced (in this throw-away process only) by one that awaits each message's
# delivery directly instead of through ``wait_first(callback(message), suspend_flow.wait())`` (two tasks and an
# ``asyncio.wait`` per record): what that one construct costs. It is an experiment, not something the agents run:
# the real loop needs ``wait_first`` so that a rebalance can interrupt a delivery blocked on a full stream buffer.
BASELINE = """
import asyncio, os, sys, tempfile, time, faust
bootstrap, topics, total, group = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4]
if sys.argv[5:] == ["lean"]:
    import faust.transport.consumer as fc

    async def lean(self, fetcher):
        read = self._read_offset
        while not (self._stopped.is_set() or fetcher._stopped.is_set()):
            async for tp, message in self.getmany(timeout=1.0):
                if read[tp] is None or message.offset >= read[tp]:
                    await self.callback(message)
                    read[tp] = message.offset
            await asyncio.sleep(0)

    fc.Consumer._drain_messages = lean
from tokenpools_dev.kafka import local_kafka
app = faust.App(group, **local_kafka(bootstrap).faust_broker("bench-baseline"), store="memory://", web_enabled=False, autodiscover=False,
                datadir=os.path.join(tempfile.gettempdir(), "tokenpools-faust-" + group),
                consumer_auto_offset_reset="earliest", broker_rebalance_timeout=2.0, broker_session_timeout=6.0,
                broker_heartbeat_interval=0.5, stream_buffer_maxsize=10000)
channel = app.topic(*topics, key_serializer="raw", value_serializer="raw")
seen = 0
done = asyncio.Event()
@app.agent(channel)
async def count(stream):
    global seen
    async for events in stream.take_events(5000, 0.05):
        seen += len(events)
        if seen >= total:
            done.set()
async def main():
    await app.start()
    while seen == 0:
        await asyncio.sleep(0.01)
    wall, cpu, first = time.monotonic(), time.process_time(), seen
    await done.wait()
    print(f"{(seen - first) / (time.monotonic() - wall):.0f} {(time.process_time() - cpu) / (seen - first) * 1e6:.1f}")
    await app.stop()
asyncio.run(main())
"""


async def faust_baseline(bootstrap: str, topics: Topics, total: int) -> dict[str, float]:
    import subprocess

    names = ",".join((topics.requests.name, topics.completions.name))
    out = {}
    for variant in ("faust_only", "faust_lean_fetch"):
        command = [sys.executable, "-c", BASELINE, bootstrap, names, str(total), f"baseline-{uuid.uuid4().hex[:6]}"]
        done = await asyncio.to_thread(subprocess.run, command + (["lean"] if "lean" in variant else []),
                                       capture_output=True, text=True, timeout=900)
        rate, cpu = done.stdout.split()[-2:]
        out |= {f"{variant}_records_per_s": float(rate), f"{variant}_cpu_us_per_record": float(cpu)}
    return out


# cProfile with the main thread's CPU clock: what each function costs in CPU, not in waiting for a contended core
PROFILED = """
import cProfile, sys, time
from tokenpools.cli import main
out = sys.argv[1]
profile = cProfile.Profile(timer=time.thread_time)
profile.enable()
try:
    code = main(sys.argv[2:])
finally:
    profile.disable()
    profile.dump_stats(out)
    print("main-thread CPU profiled:", round(time.thread_time(), 1), "s; process CPU:", round(time.process_time(), 1),
          "s", file=sys.stderr)
sys.exit(code)
"""


def sample(pid: int, out: str) -> object:
    """py-spy (if installed) sampling every thread of the worker, collapsed stacks to ``out``."""
    import shutil
    import subprocess

    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "250", "--format", "raw", "--threads",
                             "--output", out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


CATEGORIES = (  # first match wins, looked for from the innermost frame outwards
    ("decode (pydantic-core, orjson)", ("decoding.py", "codec.py", "pydantic")),
    ("fold + tick (streams, core)", ("tokenpools/streams", "tokenpools/core", "tokenpools/topics")),
    ("aiokafka client (fetch, produce)", ("aiokafka",)),
    ("faust consumer loop (per-message tasks)", ("faust/transport",)),
    ("faust streams/agents/tables", ("faust/",)),
    ("mode/asyncio event loop", ("mode/", "asyncio", "uvloop")),
)


def where_the_time_goes(path: Path) -> str:
    """Self samples by category and by thread from py-spy's collapsed stacks (``frame;frame;... count``)."""
    from collections import Counter

    by_category: Counter[str] = Counter()
    by_thread: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        n = int(count)
        total += n
        by_thread[frames[0].split(" (")[0]] += n
        for name, needles in CATEGORIES:
            if any(needle in frames[-1] for needle in needles) or (
                    name.startswith("fold") and any(needle in f for f in frames[-3:] for needle in needles)):
                by_category[name] += n
                break
        else:
            by_category["other (builtins, GC, idle waits)"] += n
    lines = [f"  {100 * n / total:5.1f}%  {name}" for name, n in by_category.most_common()]
    threads = ", ".join(f"{name} {100 * n / total:.0f}%" for name, n in by_thread.most_common(4))
    return f"where the worker's samples go ({total} samples; threads: {threads}):\n" + "\n".join(lines)


async def wait_up(port: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while await processed(port) < 0:
        if time.monotonic() > deadline:
            raise TimeoutError("the worker's /metrics did not come up")
        await asyncio.sleep(0.2)


def python_loop_ns() -> float:
    """The yardstick of benchmarks/backend_sim.py: the best of three 1M-iteration ``x += i`` loops."""
    best = float("inf")
    for _ in range(3):
        start, x = time.perf_counter(), 0
        for i in range(1_000_000):
            x += i
        best = min(best, time.perf_counter() - start)
    return best * 1e3


