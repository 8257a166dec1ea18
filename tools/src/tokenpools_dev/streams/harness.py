"""Kafka-side helpers for the stream agents' integration tests and ``benchmarks/pipeline.py``.

Producing a scripted stream (as history, or live at the pace of its event times), collecting what the agents
publish, and running the worker as a subprocess (``python -m tokenpools agents``) that a test may SIGKILL.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tokenpools.runtime.kafka import KafkaClients
from tokenpools.topics.batches import batch_value
from tokenpools.topics.codec import decode, encode
from tokenpools.topics.declarations import Topics
from tokenpools.topics.records import (
    BackendMetricsSample,
    LimitUpdate,
    Record,
    RequestCompleted,
    RequestDecided,
    SpecRecord,
)
from tokenpools_dev.streams.scripted import batched

Scripted = tuple[Record, int]


def topic_of(topics: Topics, record: Record) -> str:
    if isinstance(record, RequestDecided):
        return topics.requests.name
    if isinstance(record, RequestCompleted):
        return topics.completions.name
    if isinstance(record, BackendMetricsSample):
        return topics.backend_metrics.name
    raise TypeError(f"not an event record: {type(record).__name__}")


async def produce(bootstrap: str, topics: Sequence[Topics], events: Sequence[Scripted], *, live: bool = False,
                  lead_ms: int = 250, linger_ms: int = 5, pack_events: int = 1, pack_span_ms: int = 50,
                  kafka: KafkaClients | None = None, key_of: Callable[[Record, Topics], str] | None = None) -> int:
    """Produce every event (to each of ``topics``) keyed by pool (or as ``key_of`` says for each of ``topics``: a
    sharded pool's shard keys; then unpacked: ``pack_events`` 1), with its scripted Kafka timestamp.

    ``live``: wait until ``lead_ms`` before each event's time and stamp the record with the send time, as a
    proxy's producer does; sending a little early keeps a slow moment of this process from making an event late,
    and if one is late anyway, its record timestamp says so to every worker alike: the copies sent to each of
    ``topics`` carry the same stamp, so a run is late exactly where another is. ``pack_events`` > 1: events of one
    (topic, pool) are packed into ``event_batch`` records the way a proxy packs them (``scripted.batched``: at most
    ``pack_events`` within ``pack_span_ms``, sent at the newest one's time). ``kafka``: the clients to produce with
    (a secured broker's user); default plaintext to ``bootstrap``. Returns the number of Kafka records.
    """
    from tokenpools_dev.kafka import local_kafka

    if key_of is not None and pack_events > 1:
        raise ValueError("`key_of` keys each event alone: pack_events must be 1")
    units = batched(events, pack_events, pack_span_ms) if pack_events > 1 else [([r], ts) for r, ts in events]
    producer = (kafka or local_kafka(bootstrap)).producer("harness", enable_idempotence=True, acks="all", linger_ms=linger_ms,
                                               max_batch_size=1 << 20)
    await producer.start()
    futures = []
    try:
        for records, ts in units:
            if live:
                delay = (ts - lead_ms) / 1000 - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            value = batch_value([encode(r) for r in records])
            key = records[0].pool.encode()  # type: ignore[attr-defined]
            stamp = round(time.time() * 1000) if live else ts
            for t in topics:
                if key_of is not None:
                    key = key_of(records[0], t).encode()
                futures.append(await producer.send(topic_of(t, records[0]), value, key=key, timestamp_ms=stamp))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return len(futures)


class Collector:
    """Reads a topic from the beginning without a group and keeps every decoded record with its arrival time, key
    and headers; a tombstone (a compacted topic's null value) is kept as None."""

    def __init__(self, bootstrap: str, topic: str, record_type: type[Record] = LimitUpdate,
                 partitions: int | None = None, decoder: Callable[[bytes], Any] | None = None,
                 kafka: KafkaClients | None = None) -> None:
        """``partitions``: read these many (a topic whose keys spread over them); None: those the consumer's
        metadata knows at start, often only partition 0 (enough for a pool-keyed topic of one pool).
        ``decoder``: for a topic whose records are not JSON records (the counts topic: ``decode_counts``).
        ``kafka``: the clients to read with (a secured broker's user); default plaintext to ``bootstrap``."""
        self.bootstrap = bootstrap
        self.kafka = kafka
        self.topic = topic
        self.record_type = record_type
        self.decoder = decoder or (lambda value: decode(record_type, value))
        self.partitions = partitions
        self.records: list[Any] = []
        self.keys: list[bytes | None] = []
        self.headers: list[dict[str, bytes]] = []
        self.arrived_s: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._consumer: Any = None

    async def start(self) -> Collector:
        from aiokafka import TopicPartition

        from tokenpools_dev.kafka import local_kafka

        self._consumer = (self.kafka or local_kafka(self.bootstrap)).consumer("collector", enable_auto_commit=False,
                                                              fetch_max_wait_ms=50)
        await self._consumer.start()
        partitions = (range(self.partitions) if self.partitions is not None
                      else self._consumer.partitions_for_topic(self.topic) or {0})
        assignment = [TopicPartition(self.topic, p) for p in sorted(partitions)]
        self._consumer.assign(assignment)
        await self._consumer.seek_to_beginning(*assignment)
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            batches = await self._consumer.getmany(timeout_ms=100)
            now = time.time()
            for messages in batches.values():
                for m in messages:
                    self.records.append(None if m.value is None else self.decoder(m.value))
                    self.keys.append(m.key)
                    self.headers.append(dict(m.headers or ()))
                    self.arrived_s.append(now)

    async def wait_for(self, predicate: Any, timeout_s: float) -> list[Any]:
        deadline = time.monotonic() + timeout_s
        while not predicate(self.records):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.topic}: condition not met in {timeout_s:.0f} s; have {len(self.records)}")
            await asyncio.sleep(0.05)
        return list(self.records)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._consumer is not None:
            await self._consumer.stop()


async def group_members(bootstrap: str, group: str) -> tuple[str, int]:
    """The consumer group's state (``Stable``, ``PreparingRebalance``, ``Empty``, ...) and its number of members;
    ("", 0) while the broker knows no such group yet (no coordinator for it)."""
    from aiokafka.errors import GroupCoordinatorNotAvailableError

    from tokenpools_dev.kafka import local_kafka

    admin = local_kafka(bootstrap).admin("test-admin")
    await admin.start()
    try:
        (response,) = await admin.describe_consumer_groups([group])
    except GroupCoordinatorNotAvailableError:
        return "", 0
    finally:
        await admin.close()
    described = response.groups[0]  # (error_code, group_id, state, protocol_type, protocol, members, ...)
    return described[2], len(described[5])


async def wait_for_group(bootstrap: str, group: str, members: int, timeout_s: float) -> None:
    """Until ``group`` is Stable with ``members`` members (the workers joined and the assignment is made)."""
    deadline = time.monotonic() + timeout_s
    seen: tuple[str, int] = ("", 0)
    while time.monotonic() < deadline:
        seen = await group_members(bootstrap, group)
        if seen == ("Stable", members):
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"group {group}: not Stable with {members} members in {timeout_s:.0f} s; last {seen}")


async def publish_specs(bootstrap: str, topic: str, config_yaml: str, t_ms: int) -> None:
    """The config's pools and entitlements on the specs topic as the controller publishes them (pools first, a
    minute before ``t_ms``): the agents see the specs they were started with, a recorded log knows each
    entitlement's tenant and model."""
    import yaml

    from tokenpools_dev.kafka import local_kafka

    docs = [d for d in yaml.safe_load_all(config_yaml) if d]
    records = [SpecRecord(kind=d["kind"], name=d["metadata"]["name"],
                          pool=d["metadata"]["name"] if d["kind"] == "TokenPool" else d["spec"]["poolRef"]["name"],
                          generation=1, spec=d["spec"], state="Bound" if d["kind"] == "TokenEntitlement" else None,
                          t_ms=t_ms - 60_000)
               for kind in ("TokenPool", "TokenEntitlement") for d in docs if d["kind"] == kind]
    producer = local_kafka(bootstrap).producer("test-producer", acks="all")
    await producer.start()
    try:
        for record in records:
            await producer.send_and_wait(topic, encode(record), key=f"{record.kind}/{record.name}".encode())
    finally:
        await producer.stop()


def worker_overrides(bootstrap: str, topics: Topics, group: str, partitions: int) -> list[str]:
    """The ``--set`` items of a test worker: a 1-s tick, a short grace, ``topics``' prefix and ``group`` as its app."""
    return ["streams.tick_s=1", "streams.grace_s=0.3", f"kafka.bootstrap_servers={bootstrap}",
            f"kafka.topic_partitions={partitions}", f"kafka.topic_prefix={topics.requests.name.removesuffix('requests')}",
            f"streams.app_id={group}"]


def start_worker(config: Path, overrides: Sequence[str], log_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``python -m tokenpools agents --config FILE --set ...`` in its own session (so a kill reaches only it)."""
    command = [sys.executable, "-m", "tokenpools", "agents", "--config", str(config), "--fast-join",
               "--http-port", "-1", *extra]
    for item in overrides:
        command += ["--set", item]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENPOOLS_")}
    log = open(log_path, "ab")  # noqa: SIM115 - the child holds it; closed when the test ends
    try:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    finally:
        log.close()


def kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL, like a crash: nothing is flushed."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait(10)


def stop(process: subprocess.Popen[bytes], timeout_s: float = 20.0) -> int:
    """SIGTERM, then SIGKILL after ``timeout_s``; the exit code."""
    if process.poll() is None:
        process.terminate()
        try:
            return process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            kill(process)
    return process.returncode
