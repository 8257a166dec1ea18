"""Specs in force at a running proxy: a new set of pools, entitlements and keys put in force in one step.

Two sources feed it (``spec_sources``): the compacted specs topic, through the one follower (``runtime.specs``'s
``Catalogue``), when Kafka is on; the --config file, watched, when it is off. Either way what changes is a
``ProxyConfig`` derived from the documents in force (``config_from_catalogue``: states as the controller or capacity
admission give them, key digests, endpoints), and ``LiveSpecs.apply`` puts it in force in one synchronous call on
the event loop: the pools' runtimes take their new specs (``PoolRuntime.replace_specs``), new pools get a runtime,
removed ones stop admitting, the backends' lists change, and the handlers' ``Tenancy`` is swapped in one
assignment. A request decides against the old view or the new one, never half of each. A set the proxy cannot
serve (a key the view cannot route) is refused as a whole and the last good one stays (counted, logged); a pool
with no backend known here is left out, with its entitlements (logged when that set changes).

In flight, nothing is cut: a request admitted before its entitlement (or pool) was removed keeps its ticket and
settles into its ledger; a request waiting for admission is refused at once (403, not Bound) and leaves the line.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from tokenpools.core.binding import bind_entitlements
from tokenpools.core.classes import EntitlementState
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.options import ProxyConfig
from tokenpools.proxy.pools import PoolRuntime
from tokenpools.proxy.tenancy import Tenancy
from tokenpools.runtime.specs import Catalogue

if TYPE_CHECKING:
    from tokenpools.proxy.forward import Upstream
    from tokenpools.proxy.handlers import Handlers
    from tokenpools.proxy.limits_consumer import LimitsApplier
    from tokenpools.proxy.metrics import ProxyMetrics
    from tokenpools.proxy.waiting import Waits
    from tokenpools.runtime.clock import Clock

log = logging.getLogger("tokenpools.proxy")

MakeRuntime = Callable[[PoolSpec, list[EntitlementSpec], float, float], PoolRuntime]


def bind_states(pools: Mapping[str, PoolSpec], entitlements: Mapping[str, EntitlementSpec],
                now_s: float) -> dict[str, EntitlementSpec]:
    """The entitlements with the states capacity admission gives them (``core.binding``, oldest first per pool): one
    its spec or the controller says is Bound but that does not fit is Pending or Degraded here too."""
    out = dict(entitlements)
    for pool_name, pool in pools.items():
        members = [e for e in out.values() if e.pool == pool_name]
        for name, binding in bind_entitlements(pool, members, now_s).items():
            spec = out[name]
            if spec.state is EntitlementState.BOUND and binding.state is not EntitlementState.BOUND:
                log.warning("entitlement %s is %s: %s", name, binding.state.value, binding.reason)
                out[name] = dataclasses.replace(spec, state=binding.state)
    return out


def config_from_catalogue(catalogue: Catalogue, base: ProxyConfig, now_s: float, *,
                          known_endpoints: bool = True) -> tuple[ProxyConfig, tuple[str, ...]]:
    """What the proxy serves under ``catalogue``, and the pools it cannot serve: ``base``'s policy with the
    catalogue's pools, entitlements (states bound) and key digests (digest → every entitlement listing it).

    A pool's backends are its spec's ``endpoints``, else (``known_endpoints``) those ``base`` had for it (the
    proxy's own file: inside Kubernetes a TokenPool need not list them); a pool with neither is not served here,
    nor are its entitlements (their keys get 401 at this proxy), and it is returned so that the caller can say so."""
    pools: dict[str, PoolSpec] = {}
    endpoints: dict[str, tuple[str, ...]] = {}
    unserved: list[str] = []
    for name in catalogue.pools:
        pool = catalogue.pool(name)
        urls = catalogue.endpoints_of(name) or (tuple(base.endpoints.get(name, ())) if known_endpoints else ())
        if pool is None:
            continue
        if not urls:
            unserved.append(name)
            continue
        pools[name], endpoints[name] = pool, urls
    entitlements = {e.name: e for pool in pools for e in catalogue.entitlements_of(pool)}
    holders: dict[str, list[str]] = {}
    for name in entitlements:
        for digest in catalogue.key_digests_of(name):
            holders.setdefault(digest, []).append(name)
    config = dataclasses.replace(
        base, pools=pools, endpoints=endpoints, entitlements=bind_states(pools, entitlements, now_s),
        key_digests={digest: tuple(names) for digest, names in holders.items()})
    return config, tuple(unserved)


def tenancy_of(config: ProxyConfig, version: int) -> Tenancy:
    return Tenancy.build(version, config.pools, config.entitlements, config.key_digests)


class LiveSpecs:
    """Puts a ``ProxyConfig`` in force at the running proxy (module doc). Lives on the event loop."""

    def __init__(self, pools: dict[str, PoolRuntime], handlers: Handlers, upstream: Upstream,
                 make_runtime: MakeRuntime, waits: Waits, metrics: ProxyMetrics, clock: Clock,
                 limits: LimitsApplier | None, config: ProxyConfig) -> None:
        self.pools, self.handlers, self.upstream, self.waits = pools, handlers, upstream, waits
        self.metrics, self.clock, self.limits = metrics, clock, limits
        self._make_runtime = make_runtime
        self.config = config  # the last good one

    @property
    def version(self) -> int:
        return self.handlers.tenancy.version

    def apply(self, config: ProxyConfig, version: int, source: str) -> str | None:
        """Put ``config`` in force as ``version``; None when it is, else why not (the last good set stays)."""
        try:
            tenancy = tenancy_of(config, version)
        except ValueError as exc:
            self.metrics.spec_refused[source] += 1
            log.error("specs v%d from %s refused, v%d kept: %s", version, source, self.version, exc)
            return str(exc)
        now_s, wall_s = self.clock.now_s(), self.clock.wall_ms() / 1000
        pools = self.pools  # the proxy's one dict: the limits applier and the gauges read it too
        retiring: list[tuple[PoolRuntime, list[str]]] = []
        for name, pool in config.pools.items():
            members = [e for e in config.entitlements.values() if e.pool == name]
            runtime = pools.get(name)
            if runtime is None:
                pools[name] = self._make_runtime(pool, members, now_s, wall_s)
            else:
                retiring.append((runtime, runtime.replace_specs(pool, members, now_s, wall_s)))
        for name in [n for n in pools if n not in config.pools]:
            runtime = pools.pop(name)  # stops admitting; its requests in flight still hold it and settle into it
            retiring.append((runtime, runtime.replace_specs(runtime.pool, [], now_s, wall_s)))
        self.upstream.set_endpoints(dict(config.endpoints))
        self.handlers.use(tenancy, pools)
        if self.limits is not None:
            self.limits.refresh_pools()
        for runtime, removed in retiring:
            self.waits.wake(runtime)  # waiters of a removed or no longer Bound entitlement are refused now
            runtime.forget(removed)
        self.config = config
        self.metrics.spec_version = version
        log.info("specs v%d from %s in force: %d pools, %d entitlements, %d keys", version, source,
                 len(config.pools), len(config.entitlements), len(tenancy))
        return None
