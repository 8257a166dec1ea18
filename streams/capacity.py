"""Pool capacity at a tick, from the backend-metrics samples and the pool spec (pure).

Samples are kept per pool in event time, so the capacity a window is ticked with depends only on the samples
stamped at or before the window's end, never on when the worker happened to read them (a worker that catches
up after a restart computes the same capacity as one that ran through).

- Fresh (the newest sample at or before the window end is at most ``staleness_ms`` old) and ``replicas_ready``
  known: capacity = replicas_ready × per-replica capacity.
- Stale, missing, or ``replicas_ready`` unknown (None or listed in the sample's ``stale`` names): the spec's
  replicas. A stale sample is *unknown*, never zero.
- ``backend_waiting`` is the fresh sample's waiting queue, else None (unknown); unknown never marks contention.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokenpools.core.capacity import Capacity
from tokenpools.core.spec import PoolSpec
from tokenpools.topics.records import BackendMetricsSample


@dataclass(frozen=True, slots=True)
class MetricsPoint:
    """What the tick needs of one backend-metrics sample."""

    t_ms: int
    replicas_ready: int | None
    waiting: float | None


@dataclass(frozen=True, slots=True)
class PoolCapacity:
    capacity: Capacity
    replicas: int
    backend_waiting: float | None  # None: unknown
    fresh: bool


def point_of(sample: BackendMetricsSample) -> MetricsPoint:
    stale = set(sample.stale)
    ready = None if "replicas_ready" in stale else sample.replicas_ready
    waiting = None if "waiting" in stale else sample.waiting
    return MetricsPoint(sample.t_ms, ready, waiting)


def insert(points: tuple[MetricsPoint, ...], point: MetricsPoint) -> tuple[MetricsPoint, ...]:
    """Keep the points ordered by time; a second sample with the same time replaces the first."""
    kept = [p for p in points if p.t_ms != point.t_ms]
    kept.append(point)
    kept.sort(key=lambda p: p.t_ms)
    return tuple(kept)


def latest_at(points: Sequence[MetricsPoint], at_ms: int) -> MetricsPoint | None:
    best = None
    for p in points:
        if p.t_ms > at_ms:
            break
        best = p
    return best


def capacity_at(pool: PoolSpec, points: Sequence[MetricsPoint], at_ms: int, staleness_ms: int) -> PoolCapacity:
    point = latest_at(points, at_ms)
    fresh = point is not None and at_ms - point.t_ms <= staleness_ms
    if not fresh or point is None:
        return PoolCapacity(pool.capacity(), pool.replicas, None, False)
    if point.replicas_ready is None:
        return PoolCapacity(pool.capacity(), pool.replicas, point.waiting, True)
    return PoolCapacity(pool.capacity(point.replicas_ready), point.replicas_ready, point.waiting, True)


def prune(points: tuple[MetricsPoint, ...], through_ms: int) -> tuple[MetricsPoint, ...]:
    """Drop what no window ending after ``through_ms`` can use: all but the newest point at or before it."""
    older = [p for p in points if p.t_ms <= through_ms]
    if len(older) <= 1:
        return points
    return (older[-1],) + tuple(p for p in points if p.t_ms > through_ms)
