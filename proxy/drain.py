"""Draining the spool, in order, one batch at a time (the half of ``EventPipeline`` that runs after an outage).

The spool holds single events; the drain packs a batch's events of one (topic, key) into ``event_batch`` records
(``topics.batches``, the sender's caps; each key's events in spool order), one delivery future per packed record.

A batch's read position is committed only once every record handed to the producer has a final answer: the
delivered events count as drained, the failed ones go back to the spool's tail (before the commit, so a crash in
between duplicates rather than loses). If not one record could be handed, the batch stays at the head for the
next attempt. If some were handed and then a send failed, the events never handed go to the tail too (packing
per key means the handed ones need not be a prefix of the batch, and the commit must move past them all, or the
next attempt would send them twice).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from tokenpools.proxy.spool import SpoolEntry
from tokenpools.topics.batches import ENVELOPE_BYTES, Watermark, batch_value, pack

if TYPE_CHECKING:
    from tokenpools.proxy.events import EventPipeline

log = logging.getLogger("tokenpools.proxy.events")


class SpoolDraining:
    """Mixed into EventPipeline; uses its producer, spool, counters and failure bookkeeping."""

    async def _drain_once(self: EventPipeline) -> bool:
        """Deliver one batch from the spool. True when it all went through (and the spool may be empty)."""
        assert self._producer is not None
        self._move_queue_to_spool()
        entries = self.spool.read_batch(self._batch_size)
        if not entries:
            self._unreachable = False
            return True
        handed: list[tuple[asyncio.Future[Any], list[SpoolEntry]]] = []
        self._draining = (handed, entries)  # what stop() settles if this is cancelled half-way
        complete = True
        for run in self._runs(entries):
            try:
                value = self._drain_value(run)
                fut = await asyncio.wait_for(self._producer.send(run[0].topic, value, key=run[0].key.encode()),
                                             self._call_timeout_s)
            except Exception as exc:  # noqa: BLE001 - not appended: kept (at the head, or at the tail)
                self._send_error(exc)
                complete = False
                break
            handed.append((fut, run))
        if handed:
            await asyncio.wait([f for f, _ in handed])
        self._draining = None
        failed = self._settle(handed, entries)
        if failed:
            self._failed(f"drain: {failed} of {sum(len(run) for _, run in handed)} failed ({self.last_error})")
            return False
        if complete and self.spool.pending == 0:
            self._unreachable = False
        return complete

    def _drain_value(self: EventPipeline, run: list[SpoolEntry]) -> bytes:
        """A run's Kafka record; on a watermarked topic with the watermark leaving out the run's own events (each
        run is its own delivery, ``proxy.watermarks``): it stays at the oldest event still spooled or in flight."""
        values = [e.value for e in run]
        topic, key = run[0].topic, run[0].key
        if self._marks is None or not self._marks.tracks(topic):
            return batch_value(values)
        mark = self._marks.watermark(topic, key, self._clock.wall_ms(), [e.t_ms for e in run if e.t_ms is not None])
        self._marked_at[(topic, key)] = self._clock.now_s()
        return batch_value(values, Watermark(self._marks.options.proxy_id, mark))

    def _runs(self: EventPipeline, entries: list[SpoolEntry]) -> list[list[SpoolEntry]]:
        """The batch's events per (topic, key), each in spool order, in runs within the pack caps."""
        by_key: dict[tuple[str, str], list[SpoolEntry]] = {}
        for entry in entries:
            if entry.topic:  # a corrupt line (no topic) is skipped: the commit moves past it
                by_key.setdefault((entry.topic, entry.key), []).append(entry)
        runs: list[list[SpoolEntry]] = []
        for (topic, _), group in by_key.items():
            start = 0
            marked = self._marks is not None and self._marks.tracks(topic)
            envelope = self._envelope if marked else ENVELOPE_BYTES
            for run in pack([e.value for e in group], self._pack_events, self._pack_bytes, envelope):
                runs.append(group[start:start + len(run)])
                start += len(run)
        return runs

    def _settle(self: EventPipeline, handed: list[tuple[asyncio.Future[Any], list[SpoolEntry]]],
                entries: list[SpoolEntry]) -> int:
        """Failed (and, after a partial hand-over, never handed) events back to the spool's tail, before the
        commit (a crash in between duplicates, never loses), then move the read position past the batch.
        Returns how many failed."""
        real = [e for e in entries if e.topic]
        if not handed and real:  # nothing left the spool: the batch stays at the head
            return 0
        failed = [e for f, run in handed if f.cancelled() or f.exception() is not None for e in run]
        for f, _ in handed:
            if not f.cancelled() and f.exception() is not None:
                self._check_fatal(f.exception())
                self.last_error = f"drain delivery: {f.exception()!r}"
                break
        done = {id(e) for _, run in handed for e in run}
        for entry in failed + [e for e in real if id(e) not in done]:
            self._to_spool(entry.topic, entry.key, entry.value, entry.t_ms, respool=True)
        self.spool.commit(entries[-1].end_offset, len(real))
        if self._marks is not None:
            lost = {id(e) for e in failed}
            for _, run in handed:
                for entry in run:
                    if id(entry) not in lost:
                        self._marks.done(entry.topic, entry.key, entry.t_ms)
        self.counts.drained += len(done) - len(failed)
        return len(failed)

    def _settle_at_stop(self: EventPipeline) -> None:
        """A spool batch was being delivered when the sender stopped: settle it if every answer is in."""
        if self._draining is None:
            return
        handed, entries = self._draining
        if all(f.done() for f, _ in handed):
            self._settle(handed, entries)
        else:
            log.warning("events: %d spooled records undecided at exit stay in the spool (may be duplicated)",
                        sum(len(run) for f, run in handed if not f.done()))
