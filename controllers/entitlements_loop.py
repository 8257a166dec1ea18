"""entitlements: pools and entitlements → verdicts → inventory, (with Kubernetes) status, and the specs topic.

Two sources feed the same ``Reconciler``:

- ``crd_watch.CrdWatcher``: TokenPool/TokenEntitlement custom resources, listed and watched, status written back;
- ``FileSource`` (``--no-kubernetes``): the YAML config file, polled for changes (mtime and size). A file that
  no longer validates is refused whole — the loader names every problem, once per interval — and the previous
  documents stay in force, as a config file's author expects. There is no status to write: state changes are logged.

Either way the verdicts are re-evaluated at least every ``resync_s`` and at the next ``expiresAt``, so an
entitlement turns Expired on time without any edit.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenpools.config import ConfigError, load_config
from tokenpools.controllers.inventory import Inventory
from tokenpools.controllers.reconcile import ENTITLEMENT, POOL, Evaluation, evaluate, next_change_s
from tokenpools.controllers.secrets import KeyResolver
from tokenpools.controllers.specs import SpecPublisher, pool_entries, states_of
from tokenpools.core.classes import EntitlementState
from tokenpools.runtime.backoff import ThrottledLog
from tokenpools.runtime.clock import Clock, SystemClock, wall_s

log = logging.getLogger("tokenpools.controllers.entitlements")


class Reconciler:
    """One evaluation: verdicts and the inventory (what the other loops act on), then the specs topic.

    ``evaluate`` and ``publish`` are separate so that the Kubernetes source writes status in between: a broker
    outage then delays the agents, not what ``kubectl get`` shows.
    """

    def __init__(self, inventory: Inventory, specs: SpecPublisher, default_namespace: str,
                 clock: Clock | None = None, keys: KeyResolver | None = None,
                 observed: Callable[[Mapping[tuple[str, str], EntitlementState]], None] | None = None) -> None:
        self.inventory, self.specs, self.default_namespace = inventory, specs, default_namespace
        self.observed = observed  # (pool, entitlement) → state after each evaluation: the controller's metrics
        self.keys = keys or KeyResolver(None, default_namespace)  # secretRef → digests (controllers.secrets)
        self.clock = clock or SystemClock()
        self.states: dict[str, str] = {}
        self.last: Evaluation | None = None

    def evaluate(self, objects: Sequence[Mapping[str, Any]]) -> Evaluation:
        evaluation = evaluate(objects, wall_s(self.clock))
        self.inventory.replace(pool_entries(evaluation, self.default_namespace))
        states = dict(states_of(evaluation))
        for name, state in states.items():
            if self.states.get(name) != state:
                verdict = evaluation.verdicts[(ENTITLEMENT, name)]
                log.info("entitlement %s: %s (%s: %s)", name, state, verdict.reason.value, verdict.message)
        for key, verdict in evaluation.verdicts.items():
            if key[0] == POOL and not verdict.valid:
                log.warning("pool %s is invalid: %s", key[1], verdict.message)
        self.states, self.last = states, evaluation
        if self.observed is not None:
            self.observed({(v.pool, key[1]): v.state for key, v in evaluation.verdicts.items()
                           if key[0] == ENTITLEMENT and v.state is not None})
        return evaluation

    async def publish(self, evaluation: Evaluation) -> int:
        """The specs topic, with every API key held in a Secret published as its digest (``api_keys``)."""
        return await self.specs.sync(await self.keys.resolve(evaluation))

    async def reconcile(self, objects: Sequence[Mapping[str, Any]]) -> Evaluation:
        evaluation = self.evaluate(objects)
        await self.publish(evaluation)
        return evaluation

    def wait_s(self, resync_s: float) -> float:
        """Seconds until the next evaluation is due (resync, or sooner for an expiry)."""
        now_s = wall_s(self.clock)
        due = next_change_s(self.last, now_s) if self.last is not None else None
        return max(0.05, min(resync_s, (due - now_s + 0.01) if due is not None else resync_s))


def _signature(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class FileSource:
    def __init__(self, path: Path, reconciler: Reconciler, poll_s: float = 2.0, resync_s: float = 30.0,
                 throttled: ThrottledLog | None = None) -> None:
        self.path, self.reconciler, self.poll_s, self.resync_s = path, reconciler, poll_s, resync_s
        self.throttled = throttled or ThrottledLog(log, clock=reconciler.clock)
        self.objects: list[dict[str, Any]] = []
        self.loads = 0  # successful (re)loads
        self.refused = 0  # changed files that did not validate

    def load(self) -> bool:
        """(Re)read the file; True when its documents replaced the previous ones."""
        try:
            loaded = load_config(self.path)
        except ConfigError as exc:
            self.refused += 1
            self.throttled.warning("refused", "%s refused, previous documents kept:\n  %s", self.path,
                                   "\n  ".join(str(p) for p in exc.problems))
            return False
        objects = [dict(d) for d in loaded.raw_documents if d.get("kind") in (POOL, ENTITLEMENT)]
        log.log(logging.INFO if objects != self.objects else logging.DEBUG, "%s loaded: %d documents", self.path, len(objects))
        self.objects = objects
        self.loads += 1
        return True

    async def run(self) -> None:
        seen = _signature(self.path)
        self.load()
        await self.reconciler.reconcile(self.objects)
        clock = self.reconciler.clock
        due = clock.now_s() + self.reconciler.wait_s(self.resync_s)
        while True:
            await asyncio.sleep(max(0.0, min(self.poll_s, due - clock.now_s())))
            now_sig = _signature(self.path)
            changed = False
            if now_sig is None:
                self.throttled.warning("missing", "%s cannot be read; previous documents kept", self.path)
            elif now_sig != seen:
                seen = now_sig
                changed = self.load()
            if changed or clock.now_s() >= due:
                await self.reconciler.reconcile(self.objects)
                due = clock.now_s() + self.reconciler.wait_s(self.resync_s)
