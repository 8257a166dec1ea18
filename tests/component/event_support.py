"""Shared helpers of the event-pipeline tests: records, an in-memory producer's view, a pipeline, waiting."""

from __future__ import annotations

import asyncio
from pathlib import Path

from tokenpools.proxy.outbox.events import EventPipeline
from tokenpools.proxy.outbox.spool import Spool
from tokenpools.topics.batches import records_of
from tokenpools.topics.records import RequestDecided
from tokenpools_dev import builders
from tokenpools_dev.proxy.doubles import ProducerHub


def record(i: int) -> RequestDecided:
    return builders.decided(f"r{i}", i, pool="pool-a", entitlement="gold", proxy_id="p", prompt_tokens_est=1,
                            max_tokens=1, cost_tokens=2, kv_bytes=2)


def ids(hub: ProducerHub) -> list[str]:
    """The request ids on the "topic", every element of a packed record in order (topics.batches)."""
    return [r.request_id for _, _, v in hub.records for r in records_of(v)]  # type: ignore[attr-defined]


def unpacked(hub: ProducerHub) -> int:
    """How many Kafka records the events took (fewer than the events when they were packed)."""
    return len(hub.records)


def pipeline(hub: ProducerHub, path: Path, queue_size: int = 10_000, batch_size: int = 50,
             **packing: int) -> EventPipeline:
    return EventPipeline(hub.factory, Spool(path / "p.spool"), queue_size=queue_size, batch_size=batch_size,
                         retry_backoff_s=0.05, flush_interval_s=0.02, **packing)


async def until(predicate: object, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def balanced(p: EventPipeline) -> bool:
    c = p.counts
    return c.queued == c.sent + c.drained + c.dropped + p.undelivered()
