"""What a live run watches besides its own requests: the control plane's topics and the backends' Prometheus series.

- ``TopicRecorder`` reads topics of the running stack from their end (group-less, every declared partition) for the
  duration of a pass: limit updates (the agents' priority, debt and limits per tick), scale commands, and the
  proxies' own request/completion events (exact admitted concurrency across replicas);
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

from tokenpools.topics.codec import DecodeError, decode
from tokenpools.topics.declarations import TopicSpec
from tokenpools.topics.records import Record


@dataclass(slots=True)
class TopicRecorder:
    """Collects the records of ``topics`` produced while it runs (``start`` … ``stop``)."""

    bootstrap: str
    topics: Sequence[tuple[TopicSpec, type[Record]]]
    records: dict[str, list[Any]] = field(default_factory=dict)
    undecodable: int = 0
    _task: asyncio.Task[None] | None = None
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self._ready.wait(), 30.0)

    async def stop(self, settle_s: float = 0.5) -> None:
        await asyncio.sleep(settle_s)  # what was produced just before stop() is still read
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        from aiokafka import AIOKafkaConsumer, TopicPartition

        kinds = {spec.name: kind for spec, kind in self.topics}
        for name in kinds:
            self.records.setdefault(name, [])
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False)
        await consumer.start()
        try:
            parts = [TopicPartition(spec.name, p) for spec, _ in self.topics for p in range(spec.partitions)]
            consumer.assign(parts)
            await consumer.seek_to_end(*parts)
            for tp in parts:  # resolve the positions now, so nothing produced after start() is missed
                await consumer.position(tp)
            self._ready.set()
            while True:
                batch = await consumer.getmany(timeout_ms=200)
                for tp, messages in batch.items():
                    for m in messages:
                        if m.value is None:
                            continue
                        try:
                            self.records[tp.topic].append(decode(kinds[tp.topic], m.value))
                        except DecodeError:
                            self.undecodable += 1
        finally:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await consumer.stop()


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
