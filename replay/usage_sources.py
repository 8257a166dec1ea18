"""Where ``tokenpools usage`` reads usage rows (``replay.usage.ROWS``) from: a recorded log, or the ``usage`` topic.

A log (the layout of ``replay.trace``) gives two sources: its completion events (``request_completed``, with the
``spec`` table for tenants and models) and, when the recorder was given the ``usage`` topic, the ledger's records
(the ``usage`` table, every version of every key). The topic is read from the beginning of every partition to the
end offsets it had when reading started (it is compacted: the newest record of each key is there), with the
runtime's Kafka clients, so the ``kafka`` settings' bootstrap servers and security apply.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import polars as pl

from tokenpools.errors import PermanentError
from tokenpools.replay import trace, usage
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.topics.batches import decode_events
from tokenpools.topics.records import UsageRecord

log = logging.getLogger(__name__)
USAGE_TABLE = "usage"


def log_events(root: Path, time_zone: str = usage.UTC, names: usage.Names = usage.Names()) -> pl.DataFrame:
    """The usage rows of a log's completion events (one per distinct completion), on the days of ``time_zone``;
    ``names``: tenants and models for what the log's spec rows do not name."""
    root = trace.log_dir(root)
    return usage.from_completions(trace.read_table(root, trace.COMPLETIONS), trace.read_table(root, "spec"),
                                  time_zone, names)


def stand_in_warning(root: Path, names: usage.Names = usage.Names()) -> str | None:
    """One line saying which columns of ``log_events(root)`` hold a stand-in (the entitlement for the tenant, the
    pool for the model: the log's spec rows do not name them), or None when every event's are known."""
    completions = trace.read_table(trace.log_dir(root), trace.COMPLETIONS)
    tenants, models = usage.stand_ins(completions, trace.read_table(root, "spec"), names)
    if not tenants and not models:
        return None
    parts = ([f"the tenant column shows the entitlement for {tenants}"] if tenants else []) + (
        [f"the model column shows the pool for {models}"] if models else [])
    hint = ", nor does --config" if names.tenants or names.models else "; --config FILE can name them"
    return (f"warning: {' and '.join(parts)} of {completions['request_id'].n_unique()} completion events: the "
            f"log's spec rows name no tenantId or model for them (a log recorded without the specs topic, or specs "
            f"without those fields{hint})")


def log_ledger_events(root: Path, retention_days: int) -> tuple[pl.DataFrame, int]:
    """The usage rows of the log's completion events the agents' ledger counts (``usage.within_retention``), and
    how many events it counts nowhere (beyond ``retention_days``): the events side of a reconciliation."""
    root = trace.log_dir(root)
    completions = trace.read_table(root, trace.COMPLETIONS)
    once = usage.counted_once(completions)  # first each completion once, then late or not: the ledger sights a
    kept = usage.within_retention(once, retention_days)  # late completion's identity too
    return usage.from_completions(kept, trace.read_table(root, "spec")), once.height - kept.height


def log_ledger(root: Path) -> pl.DataFrame:
    """The usage rows of a log's ``usage`` table (the newest version of each key); an error if it has none."""
    root = trace.log_dir(root)
    if not trace.table_files(root, USAGE_TABLE):
        raise PermanentError(f"{root}: the log has no {USAGE_TABLE} records (record the topic with "
                             f"`tokenpools record --topics ...,usage`)")
    return usage.from_records(trace.read_table(root, USAGE_TABLE))


def records_rows(records: list[UsageRecord]) -> pl.DataFrame:
    """Usage records (e.g. read from the topic) as usage rows: the newest version of each key."""
    return usage.from_records(trace.frame(USAGE_TABLE, [trace.record_row(r) for r in records]))


async def read_topic(kafka: KafkaClients, timeout_s: float) -> list[UsageRecord]:
    """Every record of the ``usage`` topic up to its end offsets at the start (records that do not decode and
    tombstones are skipped, and counted in a warning). Raises PermanentError when the topic does not exist or
    its end is not reached within ``timeout_s``."""
    from aiokafka import TopicPartition

    topic = kafka.topics().usage.name
    consumer = kafka.consumer("usage", enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            await consumer._client.force_metadata_update()  # aiokafka's consumer does not refresh its own view
            partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise PermanentError(f"topic {topic} does not exist (kafka.topic_prefix {kafka.topic_prefix!r})")
        assignment = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(assignment)
        await consumer.seek_to_beginning(*assignment)
        ends = await consumer.end_offsets(assignment)
        try:
            return await asyncio.wait_for(_read_to(consumer, ends), timeout_s)
        except TimeoutError:
            raise PermanentError(f"topic {topic}: its end was not reached within {timeout_s:g} s") from None
    finally:
        await consumer.stop()


async def _read_to(consumer, ends) -> list[UsageRecord]:
    records: list[UsageRecord] = []
    skipped = 0
    remaining = {tp for tp, end in ends.items() if end > 0}
    while remaining:
        batches = await consumer.getmany(*remaining, timeout_ms=500, max_records=5000)
        for tp, messages in batches.items():
            for message in messages:
                if message.offset >= ends[tp]:
                    break
                if message.value is None:  # a tombstone
                    skipped += 1
                    continue
                decoded = decode_events(message.value, (UsageRecord,))
                skipped += len(decoded.bad)
                records.extend(r for _, r in decoded.records if isinstance(r, UsageRecord))
        for tp in list(remaining):
            if await consumer.position(tp) >= ends[tp]:
                remaining.discard(tp)
    if skipped:
        log.warning("usage topic: %d records skipped (tombstones or records that do not decode)", skipped)
    return records
