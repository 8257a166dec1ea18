"""TokenPool/TokenEntitlement custom resources: list, watch (kubernetes-asyncio), reconcile, write status back.

One task per kind lists the namespace, then watches from the list's resourceVersion (server-side timeout, resumed
from the last seen version; a 410 Gone relists). Every change marks the cache dirty; the reconcile runs after a
short debounce, so a burst of edits is one evaluation. Status goes through the ``/status`` subresource (JSON Patch
``add /status``) only when the rebuilt document differs from the object's, which makes our own status writes
(they come back as MODIFIED events) end in no further write. An Event is recorded on every entitlement state change.
Every status write first checks that this replica still leads (``acting``, see ``leader``). A TokenPool's status
also carries the metrics loop's last reading of it (``readings``); the metrics loop ``poke``s the watcher when a
reading changed, so the condition follows within the debounce rather than at the next resync.

A status write that fails for one object (it was deleted meanwhile, or the server refuses the document) is
logged and skipped; a failure of the API server itself ends the loop with a retryable error (the supervisor
restarts it, which relists).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import aiohttp
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from tokenpools.controllers.entitlements_loop import Reconciler
from tokenpools.controllers.kube import GROUP, PLURALS, REQUEST_TIMEOUT_S, VERSION, EventRecorder, classify, is_status
from tokenpools.controllers.leader import Acting, ensure_acting
from tokenpools.controllers.reading import PoolReading
from tokenpools.controllers.reconcile import ENTITLEMENT, POOL, Evaluation, Key, Verdict, key_of
from tokenpools.controllers.status import rfc3339, status_for
from tokenpools.errors import PermanentError, RetryableError, TokenPoolsError
from tokenpools.runtime.backoff import ThrottledLog
from tokenpools.runtime.clock import Clock, SystemClock, wall_s

log = logging.getLogger("tokenpools.controllers.entitlements")
API_VERSION = f"{GROUP}/{VERSION}"


@dataclass(frozen=True, slots=True)
class WatchOptions:
    namespace: str
    resync_s: float  # controllers.resync_s
    debounce_s: float = 0.2
    watch_timeout_s: int = 240  # the server ends a watch after this; we resume from the last resourceVersion
    write_status: bool = True  # False with --dry-run: read and publish, never write


class CrdWatcher:
    def __init__(self, api: ApiClient, reconciler: Reconciler, options: WatchOptions, events: EventRecorder | None,
                 clock: Clock | None = None, throttled: ThrottledLog | None = None, acting: Acting | None = None,
                 readings: Callable[[str], PoolReading | None] | None = None) -> None:
        self.objects_api = client.CustomObjectsApi(api)
        self.readings = readings or (lambda pool: None)  # pool → the metrics loop's last reading of it
        self.acting = acting  # None: no leader election (one replica)
        self.reconciler, self.options, self.events = reconciler, options, events
        self.clock = clock or SystemClock()
        self.throttled = throttled or ThrottledLog(log, clock=self.clock)
        self.objects: dict[Key, dict[str, Any]] = {}
        self.status_writes = 0
        self._dirty = asyncio.Event()
        self._failure: BaseException | None = None
        self._listed: set[str] = set()

    def poke(self) -> None:
        """Reconcile soon (after the debounce): something the status shows changed outside the watched objects."""
        self._dirty.set()

    async def _list(self, kind: str) -> str:
        try:
            listed = await self.objects_api.list_namespaced_custom_object(
                GROUP, VERSION, self.options.namespace, PLURALS[kind], _request_timeout=REQUEST_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 — classified
            raise classify(exc, f"listing {PLURALS[kind]}.{GROUP} in {self.options.namespace}") from None
        for key in [k for k in self.objects if k[0] == kind]:
            del self.objects[key]
        for item in listed.get("items", []):
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", API_VERSION)
            self.objects[key_of(item)] = item
        self._listed.add(kind)
        self._dirty.set()
        return str(listed.get("metadata", {}).get("resourceVersion", ""))

    async def _watch(self, kind: str, resource_version: str) -> None:
        plural = PLURALS[kind]
        while True:
            try:
                async with watch.Watch() as w:
                    stream = w.stream(self.objects_api.list_namespaced_custom_object, GROUP, VERSION,
                                      self.options.namespace, plural, resource_version=resource_version,
                                      timeout_seconds=self.options.watch_timeout_s, allow_watch_bookmarks=True,
                                      _request_timeout=aiohttp.ClientTimeout(sock_read=self.options.watch_timeout_s + 30))
                    async for event in stream:
                        obj = event.get("raw_object") or {}
                        kind_of = event.get("type")
                        if kind_of == "DELETED":
                            self.objects.pop(key_of({**obj, "kind": kind}), None)
                        elif kind_of in ("ADDED", "MODIFIED"):
                            obj.setdefault("kind", kind)
                            self.objects[key_of(obj)] = obj
                        resource_version = w.resource_version or resource_version
                        if kind_of != "BOOKMARK":
                            self._dirty.set()
            except asyncio.TimeoutError:  # nothing, not even the server's own timeout: the connection is dead
                raise RetryableError(f"watching {plural}.{GROUP}: no answer from the API server", 1.0) from None
            except ApiException as exc:
                if exc.status != 410:
                    raise classify(exc, f"watching {plural}.{GROUP}") from None
                resource_version = await self._list(kind)  # too old: start over from a fresh list

    async def _guard(self, kind: str) -> None:
        try:
            await self._watch(kind, await self._list(kind))
        except Exception as exc:  # noqa: BLE001 — handed to run(), which raises it to the supervisor
            self._failure = exc
            self._dirty.set()

    async def run(self) -> None:
        self._failure, self._listed = None, set()
        tasks = [asyncio.create_task(self._guard(kind), name=f"watch-{kind}") for kind in PLURALS]
        try:
            while True:
                try:
                    await asyncio.wait_for(self._dirty.wait(), self.reconciler.wait_s(self.options.resync_s))
                    await asyncio.sleep(self.options.debounce_s)
                except TimeoutError:
                    pass
                if self._failure is not None:
                    raise self._failure
                self._dirty.clear()
                if self._listed != set(PLURALS):  # both kinds first: no entitlement without its pool, not even briefly
                    continue
                await self.reconcile()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def reconcile(self) -> Evaluation:
        evaluation = self.reconciler.evaluate(list(self.objects.values()))
        if self.options.write_status:
            for key, verdict in evaluation.verdicts.items():
                await self._write_status(key, verdict, evaluation)
        await self.reconciler.publish(evaluation)
        return evaluation

    async def _write_status(self, key: Key, verdict: Verdict, evaluation: Evaluation) -> None:
        obj = self.objects.get(key)
        if obj is None:
            return
        now_s = wall_s(self.clock)
        previous = obj.get("status") if isinstance(obj.get("status"), dict) else None
        reading = self.readings(key[1]) if key[0] == POOL else None
        status = status_for(verdict, evaluation.summaries.get(key[1]), previous, now_s, reading)
        if status == previous:
            return
        meta = obj.get("metadata") or {}
        ensure_acting(self.acting, f"writing the status of {key[0]} {key[1]}")
        try:
            await self.objects_api.patch_namespaced_custom_object_status(
                GROUP, VERSION, meta.get("namespace") or self.options.namespace, PLURALS[key[0]], key[1],
                [{"op": "add", "path": "/status", "value": status}], _request_timeout=REQUEST_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 — classified
            error = classify(exc, f"writing the status of {key[0]} {key[1]}")
            if is_status(exc, 404, 409) or isinstance(error, PermanentError):
                self.throttled.warning(f"status/{key}", "%s", error)
                return
            raise error from None
        self.status_writes += 1
        obj["status"] = status  # the watch brings the same document back; until then this is what is there
        before = (previous or {}).get("state")
        if key[0] == ENTITLEMENT and before != status["state"] and self.events is not None:
            involved = {"apiVersion": API_VERSION, "kind": key[0], "name": key[1],
                        "namespace": meta.get("namespace") or self.options.namespace, "uid": meta.get("uid", "")}
            warning = status["state"] in ("Degraded", "Expired") or not verdict.valid
            try:
                await self.events.record(involved, status["state"], f"{verdict.reason.value}: {verdict.message}",
                                         rfc3339(now_s), warning=warning)
            except TokenPoolsError as exc:  # the status is written; a missing Event is only logged
                self.throttled.warning("event", "%s", exc)
