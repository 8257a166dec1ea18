"""What ``GET /v1/tokenpools/limits`` answers: an entitlement's standing at this proxy, as JSON-ready data (pure).

A tenant sees its own entitlements (the ones its API key maps to) and nothing else; an operator with the admin
credential (``proxy.admin_key_sha256``) sees every entitlement of this proxy. The view holds no key, no digest and
no other tenant's figure, so what a tenant reads cannot leak anyone else's usage.

Per entitlement: its pool and model, class and state, the priority its requests carry and the agents' last debt
and burst, the limits this proxy enforces now (its share of the fleet's) and the fleet-wide limits of the last
update, the requests in flight here, the token bucket's level and depth, and where the limits came from: the
update's version and age, or the static limits of the fallback.
"""

from __future__ import annotations

import math
from typing import Any

from tokenpools.core.classes import EntitlementState
from tokenpools.proxy.admission.pools import PoolRuntime


def entitlement_view(runtime: PoolRuntime, name: str, now_s: float) -> dict[str, Any]:
    spec = runtime.entitlements[name]
    controller = runtime.controller
    state = EntitlementState.EXPIRED if spec.is_expired(now_s) else spec.state
    view: dict[str, Any] = {
        "entitlement": name, "pool": runtime.pool.name, "model": runtime.pool.model,
        "service_class": spec.service_class.value, "state": state.value,
    }
    debt, burst = runtime.signals.get(name, (0.0, 0.0))
    in_force = runtime.in_force
    limits_from = {"source": in_force.source.value, "version": in_force.version,
                   "age_s": round(runtime.limits_age_s(now_s), 3)}
    try:
        limits = controller.limits_of(name)
    except KeyError:  # not admitted here (not Bound): nothing in force
        return {**view, "limits_from": limits_from}
    depth = limits.tokens_per_s * controller.token_bucket_window_s
    fleet = runtime.fleet_limits_of(name)
    return {
        **view,
        "priority": limits.priority, "debt": debt, "burst": burst,
        "limits": {"concurrency": limits.concurrency, "tokens_per_s": limits.tokens_per_s,
                   "kv_bytes": limits.kv_bytes},
        "fleet_limits": None if fleet is None else {"concurrency": fleet.concurrency,
                                                    "tokens_per_s": fleet.tokens_per_s, "kv_bytes": fleet.kv_bytes},
        "in_flight": controller.in_flight_of(name),
        "bucket_tokens": math.floor(min(depth, max(0.0, controller.bucket_tokens_of(name, now_s)))),
        "bucket_depth_tokens": math.floor(depth),
        "limits_from": limits_from,
    }
