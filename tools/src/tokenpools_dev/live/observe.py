"""What a live run watches besides its own requests: the control plane's topics and the backends' Prometheus series.

- ``TopicRecorder`` collects what topics of the running stack received during a pass (group-less, every declared
  partition): limit updates (the agents' priority, debt and limits per tick), scale commands, and the proxies' own
  request/completion events (exact admitted concurrency across replicas). It notes the end offsets when the pass
  starts and reads up to the end offsets when it stops, *after* the load: decoding thousands of events while the
  load generator runs would take the CPU (and the event loop) from the client whose latencies are measured;
- ``query_range`` and ``pool_samples`` read the simulators' ``vllm:num_requests_running``/``waiting`` and ``up``
  from Prometheus — the backend's own view of its queue, not the client's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenpools.topics.batches import decode_events
from tokenpools.topics.declarations import TopicSpec
from tokenpools.topics.records import Record


@dataclass(slots=True)
class TopicRecorder:
    """Collects the records of ``topics`` produced between ``start`` and ``stop``; ``stop`` reads and decodes them."""

    bootstrap: str
    topics: Sequence[tuple[TopicSpec, type[Record]]]
    records: dict[str, list[Any]] = field(default_factory=dict)
    undecodable: int = 0
    read_timeout_s: float = 60.0
    _consumer: Any = None
    _parts: list[Any] = field(default_factory=list)

    async def start(self) -> None:
        """Note where every partition ends now; nothing is fetched until :meth:`stop`."""
        from aiokafka import TopicPartition

        from tokenpools_dev.kafka import local_kafka

        for spec, _ in self.topics:
            self.records.setdefault(spec.name, [])
        consumer = local_kafka(self.bootstrap).consumer("observer", group_id=None, enable_auto_commit=False)
        await consumer.start()
        try:
            self._parts = [TopicPartition(spec.name, p) for spec, _ in self.topics for p in range(spec.partitions)]
            consumer.assign(self._parts)
            consumer.pause(*self._parts)  # no background fetching while the load runs
            await asyncio.wait_for(consumer.seek_to_end(*self._parts), 30.0)
            for tp in self._parts:  # resolve the positions now, so nothing produced after start() is missed
                await asyncio.wait_for(consumer.position(tp), 30.0)
        except BaseException:
            with contextlib.suppress(Exception):
                await consumer.stop()
            raise
        self._consumer = consumer

    async def stop(self, settle_s: float = 0.5) -> None:
        """After ``settle_s`` (what was produced just before is still in flight), read up to the end offsets."""
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        try:
            await asyncio.sleep(settle_s)
            end = await consumer.end_offsets(self._parts)
            consumer.resume(*self._parts)
            async with asyncio.timeout(self.read_timeout_s):
                while [tp for tp in self._parts if await consumer.position(tp) < end[tp]]:
                    for tp, messages in (await consumer.getmany(timeout_ms=200)).items():
                        self._decode(tp.topic, [m.value for m in messages if m.offset < end[tp]])
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()

    def _decode(self, topic: str, values: list[bytes | None]) -> None:
        kind = next(k for spec, k in self.topics if spec.name == topic)
        for value in values:
            if value is None:
                continue
            decoded = decode_events(value, (kind,))  # a record or an event_batch
            self.records[topic] += [r for _, r in decoded.records]
            self.undecodable += len(decoded.bad)


def query_range(prometheus_url: str, query: str, start_s: float, end_s: float, step_s: float) -> list[tuple[float, float]]:
    """One series (summed) as (epoch s, value); [] if the query has no data."""
    params = urllib.parse.urlencode({"query": query, "start": f"{start_s:.3f}", "end": f"{end_s:.3f}",
                                     "step": f"{max(step_s, 0.001):.3f}"})
    with urllib.request.urlopen(f"{prometheus_url}/api/v1/query_range?{params}", timeout=30) as r:
        data = json.loads(r.read())["data"]["result"]
    if not data:
        return []
    return [(float(t), float(v)) for t, v in data[0]["values"] if not math.isnan(float(v))]


def pool_samples(prometheus_url: str, job: str, slots_per_replica: int, origin_s: float, end_s: float,
                 step_s: float, time_scale: float) -> list[tuple[float, int, int, int]]:
    """(experiment s, running, waiting, total slots) from the pool's simulators, one row per ``step_s`` of wall time.

    A missing sample (a replica being scraped for the first time, a failed one) counts as 0 for running and waiting;
    total slots are the replicas up × ``slots_per_replica``.
    """
    selector = f'{{job="{job}"}}'
    series = {name: dict(query_range(prometheus_url, query, origin_s, end_s, step_s)) for name, query in (
        ("running", f"sum(vllm:num_requests_running{selector})"),
        ("waiting", f"sum(vllm:num_requests_waiting{selector})"),
        ("up", f"sum(up{selector})"))}
    times = sorted(set().union(*series.values()))
    return [((t - origin_s) / time_scale, int(series["running"].get(t, 0)), int(series["waiting"].get(t, 0)),
             int(series["up"].get(t, 0)) * slots_per_replica) for t in times]
