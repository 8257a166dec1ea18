"""Between a pool's tick and the effective-limits topic: one readable record per entitlement, for subscribers
outside tokenpools (the proxies read the limits topic instead, ``topics.limits``).

The records are built from the tick's LimitUpdate (so they cannot disagree with what the proxies enforce), the
entitlements' specs (class, baselines) and the window's usage samples (what was measured, fleet-wide).

Published every tick, not only on a change: a record's window and measurements change every tick anyway, so a
change filter would save little and would need state of its own that survives a restart; a record per tick
also tells a reader the limits are current (``window_end_ms``); and the topic is compacted, so its size stays one
record per entitlement whatever the rate. The volume is entitlements per pool per tick, without the
entitlements × proxies shares of a LimitUpdate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from tokenpools.core.capacity import Capacity
from tokenpools.core.spec import EntitlementSpec
from tokenpools.core.windows import UsageSample
from tokenpools.topics.records import EffectiveLimit, LimitUpdate


def effective_limit_key(pool: str, entitlement: str) -> str:
    """The record key, ``<pool>/<entitlement>`` (neither name may contain a ``/``: both are Kubernetes names)."""
    return f"{pool}/{entitlement}"


def effective_limits(update: LimitUpdate, entitlements: Iterable[EntitlementSpec],
                     samples: Mapping[str, UsageSample | None], width_ms: int) -> list[EffectiveLimit]:
    """One record per entitlement of ``update``, in its order. ``entitlements`` must include every one of them
    (the tick's members); ``samples`` maps an entitlement to its closed window's sample (absent or None: nothing
    measured yet). ``update.version`` is the window's end in ms, as the agents set it."""
    if width_ms <= 0:
        raise ValueError(f"`width_ms` must be positive, got {width_ms}")
    specs = {e.name: e for e in entitlements}
    missing = [e.name for e in update.entitlements if e.name not in specs]
    if missing:
        raise ValueError(f"pool {update.pool}: no spec given for entitlements {missing}")
    end_ms = update.version
    start_ms = max(0, end_ms - width_ms)
    return [  # each record validated from data in one call (its nested parts too), not a model call per part
        EffectiveLimit.model_validate({
            "pool": update.pool,
            "entitlement": e.name,
            "version": update.version,
            "window_start_ms": start_ms,
            "window_end_ms": end_ms,
            "service_class": specs[e.name].service_class,
            "priority": e.priority,
            "debt": e.debt,
            "burst": e.burst,
            "contended": update.contended,
            "limit": {"concurrency": e.concurrency, "tokens_per_s": e.tokens_per_s, "kv_bytes": e.kv_bytes},
            "baseline": _amount(specs[e.name].baseline),
            "measured": _usage(samples.get(e.name)),
        })
        for e in update.entitlements
    ]


def departed(before: Iterable[str], published: Iterable[str], after: Iterable[str]) -> list[str]:
    """The entitlements whose records must be tombstoned: those a reader may hold (published before this tick,
    ``before``, or in it, ``published``) that are no longer in the pool's ticks (``after``)."""
    return sorted((set(before) | set(published)) - set(after))


def _amount(capacity: Capacity) -> dict[str, float | int]:
    """An ``Amount``'s fields."""
    return {"concurrency": round(capacity.concurrency), "tokens_per_s": capacity.tokens_per_s,
            "kv_bytes": capacity.kv_bytes}


def _usage(sample: UsageSample | None) -> dict[str, float | int] | None:
    """A ``WindowUsage``'s fields, or None before the first measured window."""
    if sample is None:
        return None
    return {
        "in_flight_at_end": max(0, sample.in_flight_at_end),  # < 0 only for completions of admissions before a restore
        "mean_in_flight": sample.used.concurrency,
        "tokens_per_s": sample.used.tokens_per_s,
        "kv_bytes": sample.used.kv_bytes,
        "demand_tokens_per_s": sample.demand.tokens_per_s,
        "admitted": sample.admitted,
        "refused": sample.refused,
        "completed": sample.completed,
    }
