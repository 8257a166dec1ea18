"""Specs in force at a running proxy: a new set of pools, entitlements and keys put in force in one step.

Two sources feed it (``spec_sources``): the compacted specs topic, through the one follower (``runtime.specs``'s
``Catalogue``), when Kafka is on; the --config file, watched, when it is off.

- The file (and the topic's first batch): a whole ``ProxyConfig`` derived from the documents in force
  (``config_from_catalogue``: states as the controller or capacity admission give them, key digests, endpoints) is
  put in force by ``LiveSpecs.apply``: every pool's runtime takes its new specs (``PoolRuntime.replace_specs``) and
  the handlers' ``Tenancy`` is built whole. A file edit can change anything; it costs the whole set.
- The topic afterwards: ``LiveSpecs.apply_change`` puts in force what the batch changed (``Catalogue.take_changes``):
  only the changed pools are bound again (``bind_pool``) and their runtimes given their members; only the keys of
  the changed entitlements (and of all entitlements of a pool whose own document changed) get new entries, in a
  ``Tenancy.evolve`` that copies the touched entries only. One record costs its pool (a few hundred entitlements)
  and its keys, not the 20,000 of the set. A capacity decision that a clock alone changes (an expiry) is made
  again when its pool next changes, as the whole rebuild made it at the next record.

Either way the step is one synchronous call on the event loop: new pools get a runtime, removed ones stop
admitting, the backends' lists change, and the new ``Tenancy`` is swapped in one assignment. The old view is never
mutated (its maps are persistent), so a request decides against the old view or the new one, never half of each. A
set the proxy cannot serve (a key the view cannot route) is refused as a whole and the last good one stays
(counted, logged; on the topic, the refused change is retried with the next batch); a pool with no backend known
here is left out, with its entitlements (logged when that set changes).

In flight, nothing is cut: a request admitted before its entitlement (or pool) was removed keeps its ticket and
settles into its ledger; a request waiting for admission is refused at once (403, not Bound) and leaves the line.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from tokenpools.core.binding import bind_entitlements
from tokenpools.core.classes import EntitlementState
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.options import ProxyConfig
from tokenpools.proxy.admission.pools import PoolRuntime
from tokenpools.proxy.access.tenancy import Tenancy
from tokenpools.runtime.specs import Catalogue, Change

if TYPE_CHECKING:
    from tokenpools.proxy.backends.forward import Upstream
    from tokenpools.proxy.admission.handlers import Handlers
    from tokenpools.proxy.inputs.limits_consumer import LimitsApplier
    from tokenpools.proxy.observability.metrics import ProxyMetrics
    from tokenpools.proxy.admission.waiting import Waits
    from tokenpools.runtime.clock import Clock

log = logging.getLogger("tokenpools.proxy")

MakeRuntime = Callable[[PoolSpec, list[EntitlementSpec], float, float], PoolRuntime]


def bind_pool(pool: PoolSpec, members: Iterable[EntitlementSpec], now_s: float) -> list[EntitlementSpec]:
    """One pool's entitlements with the states capacity admission gives them (``core.binding``, oldest first): one
    its spec or the controller says is Bound but that does not fit is Pending or Degraded here too."""
    members = list(members)
    bindings = bind_entitlements(pool, members, now_s)
    out = []
    for spec in members:
        binding = bindings.get(spec.name)
        if binding is not None and spec.state is EntitlementState.BOUND and binding.state is not EntitlementState.BOUND:
            log.warning("entitlement %s is %s: %s", spec.name, binding.state.value, binding.reason)
            spec = dataclasses.replace(spec, state=binding.state)
        out.append(spec)
    return out


def bind_states(pools: Mapping[str, PoolSpec], entitlements: Mapping[str, EntitlementSpec],
                now_s: float) -> dict[str, EntitlementSpec]:
    """Every pool's entitlements bound (``bind_pool``); the others as they are, in their order."""
    out = dict(entitlements)
    by_pool: dict[str, list[EntitlementSpec]] = {}
    for spec in entitlements.values():
        by_pool.setdefault(spec.pool, []).append(spec)
    for pool_name, pool in pools.items():
        for spec in bind_pool(pool, by_pool.get(pool_name, ()), now_s):
            out[spec.name] = spec
    return out


def served_pools(catalogue: Catalogue, endpoints: Mapping[str, tuple[str, ...]], *, known_endpoints: bool = True
                 ) -> tuple[dict[str, PoolSpec], dict[str, tuple[str, ...]], tuple[str, ...]]:
    """The catalogue's pools this proxy serves (document order), their backends, and those it cannot serve: a pool's
    backends are its spec's ``endpoints``, else (``known_endpoints``) those in ``endpoints`` (the proxy's own)."""
    pools: dict[str, PoolSpec] = {}
    urls_of: dict[str, tuple[str, ...]] = {}
    unserved: list[str] = []
    for name in catalogue.pools:
        pool = catalogue.pool(name)
        urls = catalogue.endpoints_of(name) or (tuple(endpoints.get(name, ())) if known_endpoints else ())
        if pool is None:
            continue
        if not urls:
            unserved.append(name)
            continue
        pools[name], urls_of[name] = pool, urls
    return pools, urls_of, tuple(unserved)


def config_from_catalogue(catalogue: Catalogue, base: ProxyConfig, now_s: float, *,
                          known_endpoints: bool = True) -> tuple[ProxyConfig, tuple[str, ...]]:
    """What the proxy serves under ``catalogue``, and the pools it cannot serve: ``base``'s policy with the
    catalogue's pools, entitlements (states bound) and key digests (digest → every entitlement listing it).

    A pool's backends are its spec's ``endpoints``, else (``known_endpoints``) those ``base`` had for it (the
    proxy's own file: inside Kubernetes a TokenPool need not list them); a pool with neither is not served here,
    nor are its entitlements (their keys get 401 at this proxy), and it is returned so that the caller can say so."""
    pools, endpoints, unserved = served_pools(catalogue, base.endpoints, known_endpoints=known_endpoints)
    entitlements = {e.name: e for pool in pools for e in catalogue.entitlements_of(pool)}
    holders: dict[str, list[str]] = {}
    for name in entitlements:
        for digest in catalogue.key_digests_of(name):
            holders.setdefault(digest, []).append(name)
    config = dataclasses.replace(
        base, pools=pools, endpoints=endpoints, entitlements=bind_states(pools, entitlements, now_s),
        key_digests={digest: tuple(names) for digest, names in holders.items()})
    return config, unserved


def tenancy_of(config: ProxyConfig, version: int) -> Tenancy:
    return Tenancy.build(version, config.pools, config.entitlements, config.key_digests)


class LiveSpecs:
    """Puts specs in force at the running proxy (module doc): a whole ``ProxyConfig`` (``apply``), or what a batch of
    catalogue records changed (``apply_change``). Lives on the event loop."""

    def __init__(self, pools: dict[str, PoolRuntime], handlers: Handlers, upstream: Upstream,
                 make_runtime: MakeRuntime, waits: Waits, metrics: ProxyMetrics, clock: Clock,
                 limits: LimitsApplier | None, config: ProxyConfig) -> None:
        self.pools, self.handlers, self.upstream, self.waits = pools, handlers, upstream, waits
        self.metrics, self.clock, self.limits = metrics, clock, limits
        self._make_runtime = make_runtime
        self._remember(config)

    @property
    def version(self) -> int:
        return self.handlers.tenancy.version

    @property
    def endpoints(self) -> Mapping[str, tuple[str, ...]]:
        """The backends of the pools in force (read-only)."""
        return MappingProxyType(self._endpoints)

    @property
    def config(self) -> ProxyConfig:
        """The last good specs as one ``ProxyConfig`` (made when read after a change: it costs every entitlement)."""
        if self._config is None:
            entitlements = self.handlers.tenancy.entitlements
            order = {p: i for i, p in enumerate(self._pools)}
            self._config = dataclasses.replace(
                self._base, pools=dict(self._pools), endpoints=dict(self._endpoints),
                entitlements={n: entitlements[n] for p in self._pools for n in self._members.get(p, ())},
                key_digests={d: tuple(sorted(names, key=lambda n: order[entitlements[n].pool]))
                             for d, names in self._holders.items()})
        return self._config

    def _remember(self, config: ProxyConfig) -> None:
        """The incremental state of ``config`` (put in force whole): served pools, members, keys."""
        self._config: ProxyConfig | None = config
        self._base = config
        self._pools, self._endpoints = dict(config.pools), dict(config.endpoints)
        self._members: dict[str, tuple[str, ...]] = {}
        for name, spec in config.entitlements.items():
            if spec.pool in config.pools:
                self._members[spec.pool] = (*self._members.get(spec.pool, ()), name)
        self._holders: dict[str, set[str]] = {}
        self._digests_of: dict[str, tuple[str, ...]] = {}
        for digest, names in config.key_digests.items():
            named = (names,) if isinstance(names, str) else names
            self._holders[digest] = set(named)
            for name in named:
                self._digests_of[name] = (*self._digests_of.get(name, ()), digest)
        self._pending = Change(set(), set(), set())  # a refused change, retried with the next

    def apply(self, config: ProxyConfig, version: int, source: str) -> str | None:
        """Put ``config`` in force as ``version``, whole; None when it is, else why not (the last good set stays)."""
        try:
            tenancy = tenancy_of(config, version)
        except ValueError as exc:
            return self._refuse(version, source, exc)
        now_s, wall_s = self.clock.now_s(), self.clock.wall_ms() / 1000
        members: dict[str, list[EntitlementSpec]] = {name: [] for name in config.pools}
        for spec in config.entitlements.values():
            if spec.pool in members:
                members[spec.pool].append(spec)
        gone = [n for n in self.pools if n not in config.pools]
        self._put_in_force(tenancy, config.pools, members, gone, config.endpoints, now_s, wall_s)
        self._remember(config)
        self.metrics.spec_version = version
        log.info("specs v%d from %s in force: %d pools, %d entitlements, %d keys", version, source,
                 len(config.pools), len(config.entitlements), len(tenancy))
        return None

    def apply_change(self, catalogue: Catalogue, change: Change, version: int, source: str) -> str | None:
        """Put in force as ``version`` what ``change`` changed in ``catalogue``: only the changed pools are bound
        and their runtimes given new specs, only the keys of the changed entitlements (and of a changed pool's
        entitlements) get new entries; the new ``Tenancy`` shares everything else with the old one. None when in
        force, else why not: the last good view stays and the change is retried with the next one."""
        change = self._pending.merge(change)
        now_s, wall_s = self.clock.now_s(), self.clock.wall_ms() / 1000
        pools, endpoints, _ = served_pools(catalogue, self._endpoints)
        old = self.handlers.tenancy.entitlements
        reshaped = {n for n in set(pools) | set(self._pools)
                    if n in change.pool_documents or pools.get(n) != self._pools.get(n)
                    or endpoints.get(n) != self._endpoints.get(n)}
        changed = change.pools | reshaped
        members = {p: bind_pool(pools[p], catalogue.entitlements_of(p), now_s) for p in changed if p in pools}
        updates: dict[str, EntitlementSpec | None] = {n: None for p in changed for n in self._members.get(p, ())}
        for bound in members.values():
            updates.update((e.name, e) for e in bound)
        updates = {n: e for n, e in updates.items() if old.get(n) != e}
        affected = set(change.entitlements)
        for p in reshaped:
            affected.update(self._members.get(p, ()))
            affected.update(e.name for e in members.get(p, ()))

        def now_of(name: str) -> EntitlementSpec | None:
            return updates[name] if name in updates else old.get(name)

        digests_of = {n: catalogue.key_digests_of(n) if now_of(n) is not None else () for n in affected}
        touched = {d for n in affected for d in (*self._digests_of.get(n, ()), *digests_of[n])}
        holders = {d: tuple((self._holders.get(d, set()) - affected) | {n for n in affected if d in digests_of[n]})
                   for d in touched}
        position = {p: i for i, p in enumerate(pools)}
        try:
            tenancy = self.handlers.tenancy.evolve(version, pools, updates, holders,
                                                   lambda n: position[now_of(n).pool])  # type: ignore[union-attr]
        except ValueError as exc:
            self._pending = change
            return self._refuse(version, source, exc)
        gone = [p for p in changed if p not in pools and p in self.pools]
        self._put_in_force(tenancy, {p: pools[p] for p in members}, members, gone,
                           endpoints if endpoints != self._endpoints else None, now_s, wall_s)
        self._pools, self._endpoints, self._config = pools, endpoints, None
        self._pending = Change(set(), set(), set())
        for p in changed:
            if p in members:
                self._members[p] = tuple(e.name for e in members[p])
            else:
                self._members.pop(p, None)
        for n, digests in digests_of.items():
            if digests:
                self._digests_of[n] = digests
            else:
                self._digests_of.pop(n, None)
        for d, names in holders.items():
            if names:
                self._holders[d] = set(names)
            else:
                self._holders.pop(d, None)
        self.metrics.spec_version = version
        log.info("specs v%d from %s in force: %d pools changed, %d entitlements, %d keys", version, source,
                 len(changed), len(updates), len(holders))
        return None

    def _refuse(self, version: int, source: str, exc: ValueError) -> str:
        self.metrics.spec_refused[source] += 1
        log.error("specs v%d from %s refused, v%d kept: %s", version, source, self.version, exc)
        return str(exc)

    def _put_in_force(self, tenancy: Tenancy, pools: Mapping[str, PoolSpec],
                      members: Mapping[str, list[EntitlementSpec]], gone: Iterable[str],
                      endpoints: Mapping[str, tuple[str, ...]] | None, now_s: float, wall_s: float) -> None:
        """One synchronous step: the runtimes of ``pools`` take their members, those of ``gone`` stop admitting, the
        backends (None: unchanged) and the handlers' view change, then the waiters of what was removed are refused."""
        runtimes = self.pools  # the proxy's one dict: the limits applier and the gauges read it too
        retiring: list[tuple[PoolRuntime, list[str]]] = []
        added = False
        for name, pool in pools.items():
            runtime = runtimes.get(name)
            if runtime is None:
                runtimes[name] = self._make_runtime(pool, list(members[name]), now_s, wall_s)
                added = True
            else:
                retiring.append((runtime, runtime.replace_specs(pool, list(members[name]), now_s, wall_s)))
        gone = list(gone)
        for name in gone:
            runtime = runtimes.pop(name)  # stops admitting; its requests in flight still hold it and settle into it
            retiring.append((runtime, runtime.replace_specs(runtime.pool, [], now_s, wall_s)))
        if endpoints is not None:
            self.upstream.set_endpoints(dict(endpoints))
        self.handlers.use(tenancy, runtimes)
        if self.limits is not None and (added or gone):
            self.limits.refresh_pools()
        for runtime, removed in retiring:
            self.waits.wake(runtime)  # waiters of a removed or no longer Bound entitlement are refused now
            runtime.forget(removed)
