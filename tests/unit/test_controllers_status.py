"""Custom resources → verdicts (tokenpools.controllers.reconcile) → status documents (tokenpools.controllers.status)."""

from __future__ import annotations

import copy
from typing import Any

from tokenpools.controllers.reconcile import ENTITLEMENT, POOL, Reason, evaluate, next_change_s
from tokenpools.controllers.status import entitlement_status, pool_status, rfc3339, status_for
from tokenpools.core.classes import EntitlementState
from tokenpools_dev.builders import entitlement_doc, pool_doc

NOW = 1_800_000_000.0
DIGEST = "ab" * 32


def pool(name: str = "pool", max_replicas: int = 1, slots: int = 16, **spec: Any) -> dict[str, Any]:
    """A pool as the API server returns it (``builders.pool_doc`` with its metadata)."""
    return pool_doc(name, slots=slots, max_replicas=max_replicas, kv_bytes_per_token=147456,
                    metadata={"namespace": "ns", "generation": 3, "creationTimestamp": "2026-01-01T00:00:00Z"}, **spec)


def ent(name: str, slots: int = 6, cls: str = "guaranteed", pool_name: str = "pool", created: str = "2026-01-02T00:00:00Z",
        **spec: Any) -> dict[str, Any]:
    """An entitlement as the API server returns it (``builders.entitlement_doc`` with its metadata)."""
    return entitlement_doc(name, pool_name, slots=slots, service_class=cls,
                           metadata={"namespace": "ns", "generation": 2, "creationTimestamp": created, "uid": "u",
                                     "resourceVersion": "9", "managedFields": [{}]}, **spec)


def states(objects: list[dict[str, Any]], now_s: float = NOW) -> dict[str, tuple[str, Reason]]:
    ev = evaluate(objects, now_s)
    return {k[1]: (v.state.value if v.state else "-", v.reason) for k, v in ev.verdicts.items() if k[0] == ENTITLEMENT}


def test_binds_while_baselines_fit_then_degrades_oldest_first() -> None:
    objs = [pool(), ent("c", created="2026-01-03T00:00:00Z"), ent("a", created="2026-01-01T00:00:00Z"),
            ent("b", created="2026-01-02T00:00:00Z"), ent("s", cls="spot")]
    assert states(objs) == {"a": ("Bound", Reason.BASELINE_FITS), "b": ("Bound", Reason.BASELINE_FITS),
                            "c": ("Degraded", Reason.INSUFFICIENT_CAPACITY), "s": ("Bound", Reason.NO_BASELINE)}


def test_more_replicas_at_max_bind_what_one_could_not() -> None:
    objs = [pool(max_replicas=2), ent("a"), ent("b"), ent("c")]
    ev = evaluate(objs, NOW)
    assert {v for k, (v, _) in states(objs).items()} == {"Bound"}
    summary = ev.summaries["pool"]
    assert (summary.bound, summary.degraded, summary.floor_replicas) == (3, 0, 2)  # 18 slots need 2 of 16


def test_expired_and_state_in_spec() -> None:
    objs = [pool(), ent("old", expiresAt="2020-01-01T00:00:00Z"), ent("held", state="Pending"),
            ent("soon", expiresAt="2030-01-01T00:00:00+00:00")]
    assert states(objs) == {"old": ("Expired", Reason.EXPIRED), "held": ("Pending", Reason.STATE_SET_IN_SPEC),
                            "soon": ("Bound", Reason.BASELINE_FITS)}
    assert next_change_s(evaluate(objs, NOW), NOW) == 1_893_456_000.0  # 2030-01-01: re-evaluate then


def test_an_entitlement_without_its_pool_is_pending_and_not_published() -> None:
    ev = evaluate([pool(), ent("lost", pool_name="nope"), ent("ok")], NOW)
    lost = ev.verdicts[(ENTITLEMENT, "lost")]
    assert (lost.state, lost.reason, lost.spec) == (EntitlementState.PENDING, Reason.POOL_NOT_FOUND, None)
    assert ev.verdicts[(ENTITLEMENT, "ok")].state is EntitlementState.BOUND
    only = evaluate([ent("alone")], NOW)
    assert only.verdicts[(ENTITLEMENT, "alone")].reason is Reason.POOL_NOT_FOUND and only.loaded is None


def test_an_invalid_object_is_reported_and_the_others_still_bind() -> None:
    bad_pool = pool("broken", kvGeometry={"layers": 1, "kvHeads": 1, "headDim": 1, "bytesPerElement": 2})  # both given
    dup = ent("dup", apiKeys=[{"sha256": DIGEST}], created="2026-01-05T00:00:00Z")
    objs = [pool(), bad_pool, ent("first", apiKeys=[{"sha256": DIGEST}]), dup, ent("orphan", pool_name="broken"),
            ent("typo", qos={"serviceClass": "guaranteed", "sloTargetMs": 1000, "sloTarget": 5})]
    ev = evaluate(objs, NOW)
    v = ev.verdicts
    assert v[(POOL, "broken")].reason is Reason.INVALID_SPEC and "kvGeometry or kvBytesPerToken" in v[(POOL, "broken")].message
    assert v[(ENTITLEMENT, "dup")].reason is Reason.INVALID_SPEC and "already used by" in v[(ENTITLEMENT, "dup")].message
    assert v[(ENTITLEMENT, "typo")].reason is Reason.INVALID_SPEC and "sloTarget" in v[(ENTITLEMENT, "typo")].message
    assert v[(ENTITLEMENT, "orphan")].reason is Reason.POOL_NOT_FOUND
    assert v[(ENTITLEMENT, "first")].state is EntitlementState.BOUND
    assert v[(POOL, "pool")].valid and v[(POOL, "pool")].spec is not None
    assert {k for k, x in v.items() if x.spec is not None} == {(POOL, "pool"), (ENTITLEMENT, "first")}


def test_published_spec_is_the_camel_case_form_and_round_trips() -> None:
    from tokenpools.config import load_config_documents

    ev = evaluate([pool(), ent("a", expiresAt="2030-01-01T00:00:00Z")], NOW)
    spec = ev.verdicts[(ENTITLEMENT, "a")].spec
    assert spec is not None and spec["qos"] == {"serviceClass": "guaranteed", "sloTargetMs": 1000.0}
    assert "state" not in spec and spec["expiresAt"].startswith("2030-01-01")
    docs = [{"apiVersion": "tokenpools.io/v1alpha1", "kind": v.kind, "metadata": {"name": v.name}, "spec": v.spec}
            for v in ev.verdicts.values()]
    assert load_config_documents(docs).entitlements["a"] == ev.loaded.entitlements["a"]  # type: ignore[union-attr]


def test_entitlement_status_has_state_conditions_and_observed_generation() -> None:
    ev = evaluate([pool(), ent("a"), ent("b"), ent("c")], NOW)
    bound = entitlement_status(ev.verdicts[(ENTITLEMENT, "a")], None, NOW)
    assert (bound["state"], bound["reason"], bound["observedGeneration"]) == ("Bound", "BaselineFits", 2)
    conditions = {c["type"]: c for c in bound["conditions"]}
    assert conditions["Ready"]["status"] == "True" and conditions["CapacityAvailable"]["status"] == "True"
    assert conditions["SpecValid"]["status"] == "True"
    assert all(c["lastTransitionTime"] == rfc3339(NOW) and c["observedGeneration"] == 2 for c in conditions.values())
    degraded = entitlement_status(ev.verdicts[(ENTITLEMENT, "c")], None, NOW)
    cond = {c["type"]: c for c in degraded["conditions"]}
    assert degraded["state"] == "Degraded" and cond["Ready"]["status"] == "False"
    assert cond["CapacityAvailable"] | {"lastTransitionTime": ""} == {
        "type": "CapacityAvailable", "status": "False", "reason": "InsufficientCapacity",
        "message": ev.verdicts[(ENTITLEMENT, "c")].message, "observedGeneration": 2, "lastTransitionTime": ""}
    assert degraded["message"].startswith("baseline does not fit: 540 tokens/s, 3.00 GiB KV, 18 sequences promised >")


def test_rebuilding_an_unchanged_status_gives_an_equal_document() -> None:
    """No change → no write → no watch event → no loop; transition times survive a rebuild."""
    ev = evaluate([pool(), ent("a")], NOW)
    first = entitlement_status(ev.verdicts[(ENTITLEMENT, "a")], None, NOW)
    assert entitlement_status(ev.verdicts[(ENTITLEMENT, "a")], copy.deepcopy(first), NOW + 600) == first
    later = evaluate([pool(), ent("x", slots=16, created="2025-01-01T00:00:00Z"), ent("a")], NOW + 900)
    changed = entitlement_status(later.verdicts[(ENTITLEMENT, "a")], first, NOW + 900)
    times = {c["type"]: c["lastTransitionTime"] for c in changed["conditions"]}
    assert times == {"Ready": rfc3339(NOW + 900), "CapacityAvailable": rfc3339(NOW + 900), "SpecValid": rfc3339(NOW)}


def test_invalid_entitlement_status_says_why() -> None:
    ev = evaluate([pool(), ent("a", apiKeys=[{"sha256": DIGEST}]), ent("b", apiKeys=[{"sha256": DIGEST}])], NOW)
    status = entitlement_status(ev.verdicts[(ENTITLEMENT, "b")], None, NOW)
    cond = {c["type"]: c for c in status["conditions"]}
    assert status["state"] == "Pending" and status["reason"] == "InvalidSpec"
    assert cond["SpecValid"]["status"] == "False" and "apiKeys[0].sha256" in cond["SpecValid"]["message"]
    assert cond["CapacityAvailable"]["status"] == "Unknown"


def test_pool_status_summarises_its_entitlements() -> None:
    ev = evaluate([pool(max_replicas=2), ent("a", slots=16), ent("b", slots=16), ent("c"), ent("s", cls="spot")], NOW)
    status = pool_status(ev.verdicts[(POOL, "pool")], ev.summaries["pool"], None, NOW)
    assert status["boundEntitlements"] == 3 and status["degradedEntitlements"] == 1
    assert status["protectedFloorReplicas"] == 2 and status["observedGeneration"] == 3
    assert status["promised"] == {"tokensPerSecond": 960, "kvCacheGiB": 2, "concurrency": 32}
    assert status["capacityAtMaxReplicas"] == {"tokensPerSecond": 960, "kvCacheGiB": 16, "concurrency": 32}
    cond = {c["type"]: c for c in status["conditions"]}
    assert cond["Ready"]["status"] == "True" and cond["CapacityAvailable"]["status"] == "False"
    bad = evaluate([pool(scaling={"minReplicas": 3, "maxReplicas": 1})], NOW)
    bad_status = status_for(bad.verdicts[(POOL, "pool")], None, None, NOW)
    assert {c["type"]: c["status"] for c in bad_status["conditions"]} == {"Ready": "False", "CapacityAvailable": "Unknown"}
    assert "maxReplicas" in bad_status["conditions"][0]["message"]
