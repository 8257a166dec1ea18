"""Draining the spool, in order, one batch at a time (the half of ``EventPipeline`` that runs after an outage).

A batch's read position is committed only once every record handed to the producer has a final answer: the
delivered ones count as drained, the failed ones go back to the spool's tail (before the commit, so a crash in
between duplicates rather than loses), and records never handed stay at the head for the next attempt.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from tokenpools.proxy.spool import SpoolEntry

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
            self.degraded = False
            return True
        handed: list[tuple[asyncio.Future[Any], SpoolEntry]] = []
        ends: list[int] = []
        self._draining = (handed, ends)  # what stop() settles if this is cancelled half-way
        complete = True
        for entry in entries:
            if entry.topic:
                try:
                    fut = await asyncio.wait_for(self._producer.send(entry.topic, entry.value, key=entry.key.encode()),
                                                 self._call_timeout_s)
                except Exception as exc:  # noqa: BLE001 - not appended: stays at the head of the spool
                    self._send_error(exc)
                    complete = False
                    break
                handed.append((fut, entry))
            ends.append(entry.end_offset)
        if handed:
            await asyncio.wait([f for f, _ in handed])
        self._draining = None
        failed = self._settle(handed, ends[-1] if ends else None)
        if failed:
            self._failed(f"drain: {failed} of {len(handed)} failed ({self.last_error})")
            return False
        if complete and self.spool.pending == 0:
            self.degraded = False
        return complete

    def _settle(self: EventPipeline, handed: list[tuple[asyncio.Future[Any], SpoolEntry]], end: int | None) -> int:
        """Failed records back to the spool's tail (before the commit: a crash in between duplicates, never
        loses), then move the read position past the batch. Returns how many failed."""
        failed = [e for f, e in handed if f.cancelled() or f.exception() is not None]
        for f, _ in handed:
            if not f.cancelled() and f.exception() is not None:
                self._check_fatal(f.exception())
                self.last_error = f"drain delivery: {f.exception()!r}"
                break
        for entry in failed:
            self._to_spool(entry.topic, entry.key, entry.value, respool=True)
        if end is not None:
            self.spool.commit(end, len(handed))
        self.counts.drained += len(handed) - len(failed)
        return len(failed)


    def _settle_at_stop(self: EventPipeline) -> None:
        """A spool batch was being delivered when the sender stopped: settle it if every answer is in."""
        if self._draining is None:
            return
        handed, ends = self._draining
        if all(f.done() for f, _ in handed):
            self._settle(handed, ends[-1] if ends else None)
        else:
            log.warning("events: %d spooled records undecided at exit stay in the spool (may be duplicated)",
                        sum(1 for f, _ in handed if not f.done()))
