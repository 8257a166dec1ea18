"""Every topic as data: name, key, record types, partitions, compaction and retention."""

from __future__ import annotations

from dataclasses import dataclass

from tokenpools.topics.records import (
    BackendMetricsSample,
    BudgetAlert,
    BudgetStatus,
    DeadLetter,
    EffectiveLimit,
    LimitUpdate,
    ProxyHeartbeat,
    Record,
    RequestCompleted,
    RequestDecided,
    ScaleCommand,
    SpecRecord,
    UsageRecord,
    WindowSummary,
)

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
EVENT_RETENTION_MS = 7 * DAY_MS
"""How long the proxies' events (``requests``, ``completions``) and the dead letters stay on their topics: the last
week, which a recorder that was down may catch up on and ``tokenpools tune`` replays (deploy/README.md, section
Recording)."""
DEFAULT_PARTITIONS = 32
"""Partitions of each pool-keyed topic unless the deployment says otherwise (the ``kafka.topic_partitions`` setting,
whose default this is): the most agent workers that can share the pools, and what a pool hashes over."""


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    key: str  # what the record key is, for humans and for partitioning
    records: tuple[type[Record], ...]  # empty: a binary record of its own (``counts``: ``topics.counts``)
    partitions: int
    compacted: bool
    retention_ms: int | None  # None: keep forever (compacted topics)
    scaled: bool = False  # partitions are the deployment's (``kafka.topic_partitions``); else a fixed count

    def config(self) -> dict[str, str]:
        """Broker-side topic configuration."""
        if self.compacted:
            return {"cleanup.policy": "compact", "min.compaction.lag.ms": "0", "segment.ms": str(HOUR_MS)}
        assert self.retention_ms is not None
        return {"cleanup.policy": "delete", "retention.ms": str(self.retention_ms)}


@dataclass(frozen=True, slots=True)
class Topics:
    """All topics of one deployment, named from a common prefix."""

    requests: TopicSpec
    completions: TopicSpec
    backend_metrics: TopicSpec
    specs: TopicSpec
    limits: TopicSpec
    scale: TopicSpec
    heartbeats: TopicSpec
    dead_letters: TopicSpec
    effective_limits: TopicSpec
    counts: TopicSpec
    usage_windows: TopicSpec
    budgets: TopicSpec
    usage: TopicSpec
    budget_alerts: TopicSpec

    def all(self) -> tuple[TopicSpec, ...]:
        return (
            self.requests,
            self.completions,
            self.backend_metrics,
            self.specs,
            self.limits,
            self.scale,
            self.heartbeats,
            self.dead_letters,
            self.effective_limits,
            self.counts,
            self.usage_windows,
            self.budgets,
            self.usage,
            self.budget_alerts,
        )

    def by_name(self, name: str) -> TopicSpec:
        for topic in self.all():
            if topic.name == name:
                return topic
        raise KeyError(f"no topic named {name!r}; known: {[t.name for t in self.all()]}")


def topics_for(prefix: str = "tokenpools.", partitions: int = DEFAULT_PARTITIONS) -> Topics:
    """Topic declarations. Pool-keyed topics share ``partitions`` (the deployment's ``kafka.topic_partitions``;
    ``KafkaClients.topics()`` passes it) so one pool's events, limits and scale commands land on the same partition
    number and pools scale out across partitions; the other topics have one (``scaled`` tells them apart). The
    effective-limits topic, for readers outside tokenpools, is keyed per entitlement and has as many partitions (a
    reader of one pool reads them all; order holds per key). The counts topic carries the fleet's counts about ten
    times a second per pool: a proxy reads it from the newest record on, so it keeps an hour. The usage-windows topic
    is the agents' own: the window summaries of sharded pools' shards (stage 1) for each pool's decision (stage 2),
    keyed by pool and co-partitioned with the event topics (a pool's decision is on its pool key's partition, with
    its backend metrics); a summary is read within a tick or two of being written, so it keeps a day. The budgets,
    usage and budget-alerts topics are the ledger's (docs/budgets.md), compacted and keyed per account, so a reader
    starting from the beginning has every current account, every day's usage and every alert once.
    """
    if partitions < 1:
        raise ValueError(f"`partitions` must be >= 1, got {partitions}")
    return Topics(
        requests=TopicSpec(f"{prefix}requests", "pool", (RequestDecided,), partitions, False, EVENT_RETENTION_MS,
                           True),
        completions=TopicSpec(f"{prefix}completions", "pool", (RequestCompleted,), partitions, False, EVENT_RETENTION_MS,
                              True),
        backend_metrics=TopicSpec(f"{prefix}backend-metrics", "pool", (BackendMetricsSample,), partitions, False, DAY_MS,
                                  True),
        specs=TopicSpec(f"{prefix}specs", "<kind>/<name>", (SpecRecord,), 1, True, None),
        limits=TopicSpec(f"{prefix}limits", "pool", (LimitUpdate,), partitions, True, None, True),
        scale=TopicSpec(f"{prefix}scale", "pool", (ScaleCommand,), partitions, False, DAY_MS, True),
        heartbeats=TopicSpec(f"{prefix}heartbeats", "proxy_id", (ProxyHeartbeat,), 1, True, None),
        dead_letters=TopicSpec(f"{prefix}dead-letters", "source topic", (DeadLetter,), 1, False, EVENT_RETENTION_MS),
        effective_limits=TopicSpec(f"{prefix}effective-limits", "<pool>/<entitlement>", (EffectiveLimit,), partitions,
                                   True, None, True),
        counts=TopicSpec(f"{prefix}counts", "pool", (), partitions, False, HOUR_MS, True),
        usage_windows=TopicSpec(f"{prefix}usage-windows", "pool", (WindowSummary,), partitions, False, DAY_MS, True),
        budgets=TopicSpec(f"{prefix}budgets", "<pool>/<entitlement>/<budget>/<scope>[/<tenant>]", (BudgetStatus,),
                          partitions, True, None, True),
        usage=TopicSpec(f"{prefix}usage", "<tenant>/<entitlement>/<model>/<day>", (UsageRecord,), partitions, True,
                        None, True),
        budget_alerts=TopicSpec(f"{prefix}budget-alerts", "<pool>/<entitlement>/<budget>/<period start>/<threshold>",
                                (BudgetAlert,), 1, True, None),
    )
