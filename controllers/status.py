"""Status documents of TokenPool and TokenEntitlement from verdicts (pure).

Conditions follow ``metav1.Condition`` (type, status, reason, message, observedGeneration, lastTransitionTime);
``lastTransitionTime`` is kept from the previous status while a condition's status does not change, so rebuilding
an unchanged status gives an equal document and the controller writes nothing (no write → no watch event → no loop).

TokenEntitlement: ``state`` (Pending, Bound, Degraded, Expired), ``reason``, ``message``, ``observedGeneration`` and
the conditions ``Ready`` (True only when Bound: only Bound admits traffic), ``CapacityAvailable`` (does its baseline
fit the pool at max replicas) and ``SpecValid``.
TokenPool: ``observedGeneration``, the counts of bound and degraded entitlements, what the Bound baselines promise,
the capacity at max replicas and the protected floor, and the conditions ``Ready`` (the spec is valid),
``CapacityAvailable`` (no entitlement is Degraded) and, once the metrics loop has read the pool,
``BackendMetricsFresh``: True while vLLM's own series are fresh, False while they are stale or frozen; its reason
is the ``reading.Cause`` and its message says where the load is read from instead (the proxies' view, or nowhere).
The message has no numbers, so the status changes only when the reading's cause or source does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from tokenpools.controllers.reading import Cause, PoolReading
from tokenpools.controllers.reconcile import PoolSummary, Reason, Verdict
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState

MESSAGE_LIMIT = 1024  # characters of a message kept in status (Kubernetes allows 32768; a status is not a log)
GIB = 2**30


def rfc3339(now_s: float) -> str:
    """Seconds since the epoch as Kubernetes writes times: UTC, whole seconds, ``Z``."""
    return datetime.fromtimestamp(int(now_s), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _short(message: str) -> str:
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 1] + "…"


def condition(kind: str, status: bool | None, reason: Reason | Cause, message: str, generation: int, now: str,
              previous: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """One condition; ``status`` None is "Unknown"."""
    text = "Unknown" if status is None else ("True" if status else "False")
    before = next((c for c in previous if isinstance(c, Mapping) and c.get("type") == kind), None)
    since = before.get("lastTransitionTime") if before is not None and before.get("status") == text else None
    return {"type": kind, "status": text, "reason": reason.value, "message": _short(message),
            "observedGeneration": generation, "lastTransitionTime": since if isinstance(since, str) else now}


def _previous_conditions(previous: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    conditions = (previous or {}).get("conditions")
    return [c for c in conditions if isinstance(c, Mapping)] if isinstance(conditions, list) else []


def entitlement_status(verdict: Verdict, previous: Mapping[str, Any] | None, now_s: float) -> dict[str, Any]:
    now, before, gen = rfc3339(now_s), _previous_conditions(previous), verdict.generation
    state = verdict.state or EntitlementState.PENDING
    fits: bool | None
    if state is EntitlementState.BOUND:
        fits = True
    elif state is EntitlementState.DEGRADED:
        fits = False
    else:
        fits = None  # expired, held in the spec, no pool, invalid: not a capacity question
    ready_message = "admits traffic" if state is EntitlementState.BOUND else f"{state.value}: {verdict.message}"
    return {
        "state": state.value,
        "reason": verdict.reason.value,
        "message": _short(verdict.message),
        "observedGeneration": gen,
        "conditions": [
            condition("Ready", state is EntitlementState.BOUND, verdict.reason, ready_message, gen, now, before),
            condition("CapacityAvailable", fits, verdict.reason, verdict.message, gen, now, before),
            condition("SpecValid", verdict.valid, Reason.VALID if verdict.valid else Reason.INVALID_SPEC,
                      "spec is valid" if verdict.valid else verdict.message, gen, now, before),
        ],
    }


def _resources(c: Capacity) -> dict[str, float | int]:
    return {"tokensPerSecond": round(c.tokens_per_s, 3), "kvCacheGiB": round(c.kv_bytes / GIB, 3),
            "concurrency": round(c.concurrency)}


def pool_status(verdict: Verdict, summary: PoolSummary | None, previous: Mapping[str, Any] | None,
                now_s: float, reading: PoolReading | None = None) -> dict[str, Any]:
    now, before, gen = rfc3339(now_s), _previous_conditions(previous), verdict.generation
    status: dict[str, Any] = {"observedGeneration": gen}
    if summary is not None:
        status.update({
            "boundEntitlements": summary.bound,
            "degradedEntitlements": summary.degraded,
            "promised": _resources(summary.promised),
            "capacityAtMaxReplicas": _resources(summary.capacity_at_max),
            "protectedFloorReplicas": summary.floor_replicas,
        })
    if not verdict.valid:
        capacity = condition("CapacityAvailable", None, Reason.INVALID_SPEC, verdict.message, gen, now, before)
    elif summary is not None and summary.degraded:
        capacity = condition("CapacityAvailable", False, Reason.INSUFFICIENT_CAPACITY,
                             f"{summary.degraded} entitlement(s) Degraded: their baselines do not fit at max replicas",
                             gen, now, before)
    else:
        capacity = condition("CapacityAvailable", True, Reason.BASELINE_FITS,
                             "every Bound baseline fits at max replicas", gen, now, before)
    status["conditions"] = [
        condition("Ready", verdict.valid, verdict.reason, verdict.message, gen, now, before),
        capacity,
    ]
    if reading is not None:
        status["conditions"].append(condition("BackendMetricsFresh", reading.cause is Cause.SERIES_CURRENT,
                                              reading.cause, reading.describe(), gen, now, before))
    return status


def status_for(verdict: Verdict, summary: PoolSummary | None, previous: Mapping[str, Any] | None,
               now_s: float, reading: PoolReading | None = None) -> dict[str, Any]:
    """``reading``: the metrics loop's last reading of the pool (TokenPool only; None: not read yet)."""
    if verdict.kind == "TokenPool":
        return pool_status(verdict, summary, previous, now_s, reading)
    return entitlement_status(verdict, previous, now_s)
