"""Leader election's shell: the Lease through the API server (``LeaseStore``), the renew loop (``LeaderElector``),
and ``lead``, which runs the writing loops only while this replica leads. The decisions are ``lease``'s.

- ``LeaseStore``: get, create, and update (PUT) with the resourceVersion read, so the server refuses a write
  based on a stale read with 409 Conflict. The elector has an API client of its own: a watch or a slow call of
  the loops never holds up a renewal.
- ``LeaderElector.run``: read → decide → write, every ``retry_period_s`` (a standby wakes exactly when the
  holder's lease would expire). A failed call (no answer, 5xx, 403) is retried at the next period and warned about
  once per interval; the deadline runs meanwhile. Only a permanent error (the Lease's namespace does not exist,
  the server refuses the object) ends it.
- ``lead``: while ``LeaderElector.leading()``, a term runs (the controller's loops, built fresh, as after a
  restart); it is cancelled, and awaited, the moment leadership ends: a LOST read or conflict, or the renew
  deadline passing without a renewal — a timer of its own, so a renewal stuck in a call cannot keep the loops
  acting. Every write of the loops also checks ``leading()`` first (``ensure_acting``): a process paused past its
  deadline (SIGSTOP, a long GC) does not write on waking before it is cancelled. On the way out it releases the
  Lease (holder cleared) after the term has stopped, so a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes_asyncio import client
from kubernetes_asyncio.client.api_client import ApiClient

from tokenpools.controllers.kube import classify, is_status
from tokenpools.controllers.lease import (
    Candidate,
    Decision,
    LeaseOutcome,
    LeaseRecord,
    LeaseTiming,
    WriteResult,
    decide,
    lapse,
    observe,
    release,
    written,
)
from tokenpools.controllers.metrics import ControllerMetrics
from tokenpools.errors import PermanentError, RetryableError, TokenPoolsError
from tokenpools.runtime.backoff import ThrottledLog
from tokenpools.runtime.clock import Clock, wall_s

log = logging.getLogger("tokenpools.controllers.leader")
T = TypeVar("T")
Acting = Callable[[], bool]


class NotLeading(RetryableError):
    """A write of a loop refused because this replica no longer leads (its loops are being cancelled)."""


def ensure_acting(acting: Acting | None, what: str) -> None:
    """Raise ``NotLeading`` unless this replica may write now (``acting`` None: no leader election, always)."""
    if acting is not None and not acting():
        raise NotLeading(f"not the leader any more: {what} not done", 1.0)


def _micro_time(epoch_s: float | None) -> str | None:
    """A MicroTime as the API server writes it (RFC 3339, six fractional digits, UTC)."""
    if epoch_s is None:
        return None
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _epoch_s(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


class LeaseStore:
    """One Lease object (coordination.k8s.io/v1) read and written with optimistic concurrency."""

    def __init__(self, api: ApiClient, namespace: str, name: str) -> None:
        self._leases = client.CoordinationV1Api(api)
        self.namespace, self.name = namespace, name

    def __str__(self) -> str:
        return f"Lease {self.namespace}/{self.name}"

    async def read(self, timeout_s: float) -> tuple[LeaseRecord | None, str]:
        """The record and its resourceVersion; (None, "") when there is no such Lease."""
        try:
            lease = await self._leases.read_namespaced_lease(self.name, self.namespace, _request_timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 — classified
            if is_status(exc, 404):
                return None, ""
            raise classify(exc, f"reading {self}") from None
        spec = lease.spec or client.V1LeaseSpec()
        record = LeaseRecord(spec.holder_identity or None, int(spec.lease_duration_seconds or 0),
                             _epoch_s(spec.acquire_time), _epoch_s(spec.renew_time), int(spec.lease_transitions or 0))
        return record, str(lease.metadata.resource_version)

    def _body(self, record: LeaseRecord, version: str) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace,
                                    "labels": {"app.kubernetes.io/name": "tokenpools-controller",
                                               "app.kubernetes.io/part-of": "tokenpools"}}
        if version:
            metadata["resourceVersion"] = version  # the precondition: 409 if anyone wrote since our read
        spec = {"holderIdentity": record.holder, "leaseDurationSeconds": record.duration_s,
                "acquireTime": _micro_time(record.acquire_wall_s), "renewTime": _micro_time(record.renew_wall_s),
                "leaseTransitions": record.transitions}
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
                "spec": {k: v for k, v in spec.items() if v is not None}}

    async def write(self, record: LeaseRecord, version: str, timeout_s: float) -> tuple[WriteResult, str]:
        """Create (``version`` "") or update from ``version``: WRITTEN with the new version, CONFLICT when someone
        else wrote (or created, or deleted) it first, FAILED when the call failed in a way a retry may fix."""
        body = self._body(record, version)
        try:
            if version:
                lease = await self._leases.replace_namespaced_lease(self.name, self.namespace, body,  # type: ignore[arg-type]
                                                                    _request_timeout=timeout_s)
            else:
                lease = await self._leases.create_namespaced_lease(self.namespace, body,  # type: ignore[arg-type]
                                                                   _request_timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001 — classified
            if is_status(exc, 409) or (version and is_status(exc, 404)):
                return WriteResult.CONFLICT, ""
            error = classify(exc, f"writing {self}")
            if isinstance(error, RetryableError):
                log.debug("%s", error)
                return WriteResult.FAILED, ""
            raise error from None
        return WriteResult.WRITTEN, str(lease.metadata.resource_version)


class LeaderElector:
    """Keeps (or waits for) the Lease; ``leading()`` says whether this replica may act now."""

    def __init__(self, store: LeaseStore, identity: str, timing: LeaseTiming, clock: Clock,
                 metrics: ControllerMetrics | None = None, throttled: ThrottledLog | None = None) -> None:
        self.store, self.clock, self.metrics = store, clock, metrics
        self.candidate = Candidate(identity, timing)
        self.throttled = throttled or ThrottledLog(log, clock=clock)
        self.changed = asyncio.Event()  # set on every change of leadership
        self.last_outcome: LeaseOutcome | None = None
        self._reported_leading = False
        self._holder_logged: str | None = None
        self.failures = 0  # reads and writes that failed (retried at the next period)

    @property
    def identity(self) -> str:
        return self.candidate.identity

    @property
    def timing(self) -> LeaseTiming:
        return self.candidate.timing

    @property
    def holder(self) -> str | None:
        """The holder as last read (None: none, or not read yet)."""
        seen = self.candidate.seen
        return None if seen is None or seen.record is None else seen.record.holder

    def leading(self) -> bool:
        return self.candidate.leading(self.clock.now_s())

    def leading_for_s(self) -> float:
        """Seconds left before the deadline (0 when not leading)."""
        until = self.candidate.leading_until_s
        return 0.0 if until is None else max(0.0, until - self.clock.now_s())

    def _request_timeout_s(self) -> float:
        return self.timing.renew_deadline_s / 2

    def _take(self, candidate: Candidate, outcome: LeaseOutcome | None) -> None:
        """Adopt the new state; log, count and signal a change of leadership (a lapse is seen here, at the next
        attempt; ``lead`` has its own timer for it)."""
        self.candidate = candidate
        if outcome is not None:
            self.last_outcome = outcome
        leading = candidate.leading(self.clock.now_s())
        if leading == self._reported_leading:
            return
        self._reported_leading = leading
        if leading:
            cause = outcome or LeaseOutcome.ACQUIRED
            log.info("leading (%s): %s held as %s", cause.value, self.store, self.identity)
        elif outcome is LeaseOutcome.RELEASED:
            cause = outcome
            log.info("stopped leading: %s released on shutdown", self.store)
        else:
            cause = LeaseOutcome.LOST
            log.warning("no longer leading: %s, held by %s; standing by", self.store, self.holder or "nobody")
        if self.metrics is not None:
            self.metrics.count_transition(cause)
        self.changed.set()

    async def attempt(self) -> float:
        """One read → decide → write; when to attempt again (monotonic)."""
        self._take(lapse(self.candidate, self.clock.now_s()), None)
        try:
            record, version = await self.store.read(self._request_timeout_s())
        except RetryableError as exc:
            self.failures += 1
            self.throttled.warning("read", "%s; retrying in %.1f s", exc, self.timing.retry_period_s)
            return self.clock.now_s() + self.timing.retry_period_s
        now_s = self.clock.now_s()
        candidate, decision = decide(observe(lapse(self.candidate, now_s), record, version, now_s), now_s,
                                     wall_s(self.clock))
        self._take(candidate, decision.outcome)
        if decision.outcome is LeaseOutcome.HELD_BY_OTHER and self.holder != self._holder_logged:
            self._holder_logged = self.holder
            log.info("standing by: %s is held by %s", self.store, self.holder)
        if decision.write is None:
            return decision.next_s
        await self._write(decision, decision.write, version)
        return decision.next_s

    async def _write(self, decision: Decision, record: LeaseRecord, version: str) -> LeaseOutcome | None:
        sent_s = self.clock.now_s()
        result, new_version = await self.store.write(record, version, self._request_timeout_s())
        if result is WriteResult.FAILED:
            self.failures += 1
            self.throttled.warning("write", "%s: %s failed; the deadline runs on", self.store, decision.outcome.value)
        candidate, outcome = written(self.candidate, decision, result, new_version, sent_s, self.clock.now_s())
        self._take(candidate, outcome)
        return outcome

    async def run(self) -> None:
        """Attempt every period until cancelled; a permanent error ends it (and the process)."""
        while True:
            next_s = await self.attempt()
            await asyncio.sleep(max(0.0, next_s - self.clock.now_s()))

    async def release(self) -> bool:
        """Hand the Lease over when ours (after a fresh read); whether it was released. Never raises: the worst case
        is that a standby waits out the duration."""
        self._take(dataclasses.replace(self.candidate, leading_until_s=None), LeaseOutcome.RELEASED)
        try:
            record, version = await self.store.read(self._request_timeout_s())
            candidate = observe(self.candidate, record, version, self.clock.now_s())
            self.candidate = candidate
            decision = release(candidate, wall_s(self.clock))
            if decision is None or decision.write is None:
                return False
            return await self._write(decision, decision.write, version) is LeaseOutcome.RELEASED
        except TokenPoolsError as exc:
            log.warning("could not release %s (a standby takes over when it expires): %s", self.store, exc)
            return False


async def _wait_first(*aws: asyncio.Future[Any], timeout_s: float | None = None) -> None:
    await asyncio.wait(aws, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)


async def _changed(elector: LeaderElector) -> None:
    await elector.changed.wait()


async def lead(elector: LeaderElector, term: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``term()`` whenever this replica leads, cancel it as soon as it does not; the term's own result when it
    ends by itself. The Lease is released on the way out, however that is."""
    electing = asyncio.create_task(elector.run(), name="lease")
    try:
        while True:
            while not elector.leading():  # stand by
                elector.changed.clear()
                if elector.leading():
                    break
                waiter = asyncio.create_task(_changed(elector))
                try:
                    await _wait_first(waiter, electing)
                finally:
                    waiter.cancel()
                if electing.done():
                    electing.result()  # its error ends the process
                    raise PermanentError("the leader election stopped")
            acting = asyncio.create_task(term(), name="leader-term")
            try:
                while True:
                    elector.changed.clear()
                    if acting.done() or electing.done() or not elector.leading():
                        break
                    waiter = asyncio.create_task(_changed(elector))
                    try:  # wakes on a change, the term's end, or at the deadline
                        await _wait_first(acting, waiter, electing, timeout_s=elector.leading_for_s())
                    finally:
                        waiter.cancel()
            finally:
                if not acting.done():
                    acting.cancel()
                    if elector.leading():
                        log.info("stopping the loops")
                    else:
                        log.warning("stopping the loops that write: this replica no longer leads")
                await asyncio.wait([acting])
            if not acting.cancelled():
                return acting.result()
            if electing.done():
                electing.result()
                raise PermanentError("the leader election stopped")
    finally:
        electing.cancel()
        await asyncio.wait([electing])
        await elector.release()
