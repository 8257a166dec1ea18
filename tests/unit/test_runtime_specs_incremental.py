"""The catalogue checks each spec record for what it changes; it must decide exactly as re-validating the whole set.

The reference is the catalogue as it was: every record re-validates every document through ``tokenpools.config``.
Random sequences of valid, invalid and deleting records (colliding API keys, pools named by entitlements, documents
removed and added again) are applied to both, and after each record the decision (the refusal's text included),
the version and every view must agree.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenpools.config import ConfigError, LoadedConfig, load_config_documents, load_config_text
from tokenpools.config.docset import DocumentSet
from tokenpools.core.classes import EntitlementState
from tokenpools.core.spec import EntitlementSpec
from tokenpools.runtime.specs import MAX_PROBLEM_CHARS, Catalogue
from tokenpools.topics.records import SpecRecord
from tokenpools_dev import builders

POOLS = ["p0", "p1", "p2"]
ENTITLEMENTS = ["e0", "e1", "e2", "e3", "e4", "p1"]  # p1: an entitlement may share a pool's name
DIGESTS = ["a" * 64, "b" * 64, "c" * 64, "A" * 64]  # "A"*64 is "a"*64 once validated (digests are lowercased)


class WholeSet:
    """The reference: the catalogue before it became incremental (every record re-validates the whole set)."""

    def __init__(self, loaded: LoadedConfig) -> None:
        self.documents = {(raw["kind"], (raw.get("metadata") or {}).get("name", "")): raw for raw in loaded.raw_documents}
        self.loaded, self.status, self.version = loaded, {}, 0

    def apply(self, record: SpecRecord) -> str | None:
        documents, status = dict(self.documents), dict(self.status)
        key = (record.kind, record.name)
        if record.deleted:
            documents.pop(key, None)
            if record.kind == "TokenEntitlement":
                status.pop(record.name, None)
        else:
            documents[key] = {"apiVersion": "tokenpools.io/v1alpha1", "kind": record.kind,
                              "metadata": {"name": record.name}, "spec": dict(record.spec)}
            if record.kind == "TokenEntitlement":
                if record.state is None:
                    status.pop(record.name, None)
                else:
                    status[record.name] = record.state
        try:
            loaded = load_config_documents(list(documents.values()), source=f"spec {record.kind}/{record.name}")
        except ConfigError as exc:
            return "; ".join(str(p) for p in exc.problems)[:MAX_PROBLEM_CHARS]
        self.documents, self.loaded, self.status = documents, loaded, status
        self.version += 1
        return None

    def entitlements_of(self, pool: str) -> tuple[EntitlementSpec, ...]:
        out = []
        for spec in self.loaded.entitlements_of(pool):
            state = self.status.get(spec.name)
            if state is not None and state != "Bound":
                spec = EntitlementSpec(**{**{f: getattr(spec, f) for f in spec.__dataclass_fields__},
                                          "state": EntitlementState(state)})
            out.append(spec)
        return tuple(out)


HEADER = "apiVersion: tokenpools.io/v1alpha1\n"
POOL_YAML = HEADER + """kind: TokenPool
metadata: {{name: {name}}}
spec:
  model: m
  backendRef: {{name: b}}
  perReplica: {{tokensPerSecond: 100, kvCacheGiB: 1, concurrency: 4}}
  kvBytesPerToken: 1024
"""
INITIAL = {
    "two pools, keys, a namespace and settings": "---\n".join([
        POOL_YAML.format(name="p0"),
        HEADER + "kind: TokenPoolsSettings\nspec: {policy: {alpha_debt: 2.0}}\n",
        HEADER + f"""kind: TokenEntitlement
metadata: {{name: e0, namespace: ns1}}
spec:
  tenantId: t
  poolRef: {{name: p0}}
  qos: {{serviceClass: elastic, sloTargetMs: 500}}
  resources: {{tokensPerSecond: 10, kvCacheGiB: 1, concurrency: 2}}
  apiKeys: [{{sha256: {DIGESTS[0]}}}, {{secretRef: {{name: s1, key: k}}}}]
""",
        POOL_YAML.format(name="p1"),
        HEADER + f"""kind: TokenEntitlement
metadata: {{name: e1}}
spec:
  tenantId: t
  poolRef: {{name: p1}}
  qos: {{serviceClass: spot, sloTargetMs: 900}}
  apiKeys: [{{sha256: {DIGESTS[1]}}}, {{secretRef: {{name: s2, key: k}}}}]
""",
    ]),
    "one pool": POOL_YAML.format(name="p0"),
    "one pool, one entitlement": POOL_YAML.format(name="p1") + "---\n" + HEADER + """kind: TokenEntitlement
metadata: {name: e2}
spec: {tenantId: t, poolRef: {name: p1}, qos: {serviceClass: preemptible, sloTargetMs: 100}}
""",
}

RESOURCES = {"tokensPerSecond": 10, "kvCacheGiB": 1, "concurrency": 2}
valid_keys = st.sampled_from([*({"sha256": d} for d in DIGESTS), {"secretRef": {"name": "s1", "key": "k"}},
                              {"secretRef": {"name": "s2", "key": "k"}}])
broken_keys = st.sampled_from([{"sha256": DIGESTS[2], "secretRef": {"name": "s1", "key": "k"}}, {},
                               {"sha256": "not-a-digest"}])


TENANT_BUDGETS = ({"name": "shared", "period": "day", "amount": 100, "scope": "tenant"},
                  {"name": "shared", "period": "day", "amount": 200, "scope": "tenant"},
                  {"name": "shared", "period": "week", "amount": 100})


@st.composite
def entitlement_specs(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly valid on their own (the set may still refuse them: a missing pool, a key held elsewhere)."""
    service_class = draw(st.sampled_from(["spot", "preemptible", "elastic", "guaranteed", "dedicated"]))
    spec: dict[str, Any] = {"tenantId": "t", "poolRef": {"name": draw(st.sampled_from(POOLS))},
                            "qos": {"serviceClass": service_class, "sloTargetMs": 500},
                            "apiKeys": draw(st.lists(valid_keys, max_size=2))}
    budget = draw(st.sampled_from([None, None, *TENANT_BUDGETS]))  # a tenant budget declared alike, or not
    if budget is not None:
        spec["budgets"] = [budget]
    if service_class in ("elastic", "guaranteed", "dedicated"):
        spec["resources"] = RESOURCES
    fault = draw(st.sampled_from(["none"] * 8 + ["pool", "class", "slo", "resources", "ceiling", "key", "typo",
                                                 "state"]))
    if fault == "pool":
        spec["poolRef"] = {"name": "nowhere"}
    elif fault == "class":
        spec["qos"] = {**spec["qos"], "serviceClass": "gold"}
    elif fault == "slo":
        spec["qos"] = {**spec["qos"], "sloTargetMs": 0}
    elif fault == "resources":
        spec["resources"] = {**RESOURCES, "concurrency": 0}
    elif fault == "ceiling":  # too low for a baseline, or any for guaranteed; fine for spot
        spec["burstCeiling"] = {**RESOURCES, "tokensPerSecond": 5}
    elif fault == "key":
        spec["apiKeys"] = [*spec["apiKeys"], draw(broken_keys)]
    elif fault == "typo":
        spec["tenantID"] = "t"
    elif fault == "state":  # valid: the spec may carry a state of its own
        spec["state"] = "Pending"
    return spec


@st.composite
def pool_specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": "m", "backendRef": {"name": "b"},
                            "perReplica": {"tokensPerSecond": 100, "kvCacheGiB": 1, "concurrency": 4},
                            "kvBytesPerToken": draw(st.sampled_from([1024, 2048]))}
    fault = draw(st.sampled_from(["none"] * 10 + ["scaling", "missing", "both", "endpoints", "typo"]))
    if fault == "scaling":
        spec["scaling"] = {"minReplicas": 2, "maxReplicas": 1}
    elif fault == "missing":
        del spec["perReplica"]
    elif fault == "both":
        spec["kvGeometry"] = {"layers": 1, "kvHeads": 1, "headDim": 64, "bytesPerElement": 2}
    elif fault == "endpoints":
        spec["endpoints"] = ["http://a:1", "http://a:1/"]
    elif fault == "typo":
        spec["modle"] = "m"
    return spec


def _record(kind: str, name: str, spec: dict[str, Any], state: str | None = None, deleted: bool = False) -> SpecRecord:
    return builders.spec_record(kind, name, spec, pool="", state=state, deleted=deleted, t_ms=0)  # type: ignore[arg-type]


entitlement_puts = st.builds(lambda n, s, state: _record("TokenEntitlement", n, s, state),
                             st.sampled_from([*ENTITLEMENTS, *ENTITLEMENTS, "Bad_Name"]), entitlement_specs(),
                             st.sampled_from([None, None, None, "Pending", "Bound", "Degraded", "Expired"]))
records = st.one_of(
    entitlement_puts, entitlement_puts, entitlement_puts,
    st.builds(lambda n, s: _record("TokenPool", n, s), st.sampled_from([*POOLS, "Bad_Name"]), pool_specs()),
    st.builds(lambda n: _record("TokenEntitlement", n, {}, deleted=True), st.sampled_from(ENTITLEMENTS)),
    st.builds(lambda n: _record("TokenPool", n, {}, deleted=True), st.sampled_from(POOLS)),
)


def assert_same(catalogue: Catalogue, reference: WholeSet) -> None:
    assert catalogue.version == reference.version
    assert catalogue.pools == tuple(reference.loaded.pools)
    for pool in [*POOLS, "nowhere"]:
        assert catalogue.pool(pool) == reference.loaded.pools.get(pool)
        assert catalogue.entitlements_of(pool) == reference.entitlements_of(pool)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(initial=st.sampled_from(sorted(INITIAL)), sequence=st.lists(records, max_size=40))
def test_records_applied_one_at_a_time_decide_as_the_whole_set_would(initial: str, sequence: list[SpecRecord]) -> None:
    loaded = load_config_text(INITIAL[initial])
    catalogue, reference = Catalogue.from_loaded(loaded), WholeSet(loaded)
    assert_same(catalogue, reference)
    for record in sequence:
        assert catalogue.apply(record) == reference.apply(record), record
        assert_same(catalogue, reference)


def _entitlement(name: str, pool: str, *keys: str) -> SpecRecord:
    return _record("TokenEntitlement", name, {"tenantId": "t", "poolRef": {"name": pool},
                                              "qos": {"serviceClass": "spot", "sloTargetMs": 100},
                                              "apiKeys": [{"sha256": k} for k in keys]})


def _pool(name: str) -> SpecRecord:
    return _record("TokenPool", name, {"model": "m", "backendRef": {"name": "b"}, "kvBytesPerToken": 1024,
                                       "perReplica": {"tokensPerSecond": 100, "kvCacheGiB": 1, "concurrency": 4}})


def _both(initial: str = INITIAL["one pool"]) -> tuple[Catalogue, WholeSet]:
    loaded = load_config_text(initial)
    return Catalogue.from_loaded(loaded), WholeSet(loaded)


def test_a_key_taken_by_an_earlier_entitlement_is_reported_on_the_later_one_wherever_the_change_is() -> None:
    catalogue, reference = _both()
    for record in (_entitlement("first", "p0", DIGESTS[0]), _entitlement("second", "p0", DIGESTS[1])):
        assert catalogue.apply(record) is None and reference.apply(record) is None
    # the earlier document takes the later one's key: the later one (document 3) gets the problem
    taking = _entitlement("first", "p0", DIGESTS[1])
    problem = catalogue.apply(taking)
    assert problem == reference.apply(taking)
    assert problem == ("spec TokenEntitlement/first: document 3 (TokenEntitlement second): spec.apiKeys[0].sha256: "
                       "the same API key is already used by TokenEntitlement 'first' (document 2) in the same pool 'p0' "
                       "(a key names one entitlement per pool)")
    late = _entitlement("third", "p0", DIGESTS[0], DIGESTS[0])  # a new one goes last; and lists its key twice
    assert catalogue.apply(late) == reference.apply(late)
    assert_same(catalogue, reference)


def _sharing(name: str, amount: int, tenant: str = "t") -> SpecRecord:
    return _record("TokenEntitlement", name, {"tenantId": tenant, "poolRef": {"name": "p0"},
                                              "qos": {"serviceClass": "spot", "sloTargetMs": 100},
                                              "budgets": [{"name": "shared", "period": "day", "amount": amount,
                                                           "scope": "tenant"}]})


def test_a_tenant_budget_declared_differently_is_reported_on_the_later_entitlement_wherever_the_change_is() -> None:
    catalogue, reference = _both()
    for record in (_sharing("first", 100), _sharing("second", 100), _sharing("other", 5, tenant="u")):
        assert catalogue.apply(record) is None and reference.apply(record) is None
    changing = _sharing("first", 200)  # the earlier one changes the amount: the later one (document 3) is reported
    problem = catalogue.apply(changing)
    assert problem == reference.apply(changing)
    assert problem == ("spec TokenEntitlement/first: document 3 (TokenEntitlement second): spec.budgets[0]: tenant "
                       "budget 'shared' of tenant 't' is declared differently by TokenEntitlement 'first' (document 2, "
                       "spec.budgets[0]): they differ in amount; every entitlement sharing a tenant budget declares it alike")
    late = _sharing("third", 300)
    assert catalogue.apply(late) == reference.apply(late) is not None
    assert_same(catalogue, reference)


def test_a_pool_named_by_entitlements_cannot_leave_and_the_refusal_stays_short() -> None:
    catalogue, reference = _both("---\n".join([POOL_YAML.format(name="p0"), POOL_YAML.format(name="other"), *(
        HEADER + f"kind: TokenEntitlement\nmetadata: {{name: tenant-{i:03d}}}\nspec: {{tenantId: t, poolRef: {{name: p0}}, "
        "qos: {serviceClass: spot, sloTargetMs: 100}}\n" for i in range(300))]))
    leaving = _record("TokenPool", "p0", {}, deleted=True)
    problem = catalogue.apply(leaving)
    assert problem == reference.apply(leaving) and problem is not None
    assert len(problem) == MAX_PROBLEM_CHARS and problem.startswith(
        "spec TokenPool/p0: document 2 (TokenEntitlement tenant-000): spec.poolRef.name: no TokenPool named 'p0' "
        "in this file (pools: other)")
    assert_same(catalogue, reference)


@pytest.mark.parametrize("initial, leaving, expected", [
    ("one pool", "p0", "spec TokenPool/p0: no documents: expected at least one TokenPool "
                       "(apiVersion tokenpools.io/v1alpha1)"),
    ("one pool, one entitlement", "p1", "spec TokenPool/p1: no TokenPool document: entitlements need a pool to bind to"),
])
def test_the_last_pool_cannot_leave(initial: str, leaving: str, expected: str) -> None:
    catalogue, reference = _both(INITIAL[initial])
    record = _record("TokenPool", leaving, {}, deleted=True)
    assert catalogue.apply(record) == reference.apply(record) == expected
    assert catalogue.pools == (leaving,) and catalogue.version == 0


def test_an_entitlement_moved_to_another_pool_keeps_its_age() -> None:
    catalogue, reference = _both(INITIAL["two pools, keys, a namespace and settings"])
    for record in (_entitlement("e5", "p0"), _entitlement("e1", "p0"), _entitlement("e0", "p1")):
        assert catalogue.apply(record) is None and reference.apply(record) is None
        assert_same(catalogue, reference)
    assert [e.name for e in catalogue.entitlements_of("p0")] == ["e1", "e5"]  # e1 was written before e5


def test_the_views_are_kept_until_a_record_changes_them() -> None:
    catalogue, _ = _both(INITIAL["two pools, keys, a namespace and settings"])
    p0, p1, pools = catalogue.entitlements_of("p0"), catalogue.entitlements_of("p1"), catalogue.pools
    assert catalogue.entitlements_of("p0") is p0 and catalogue.pools is pools
    assert catalogue.apply(_entitlement("e5", "p1")) is None
    assert catalogue.entitlements_of("p0") is p0 and catalogue.pools is pools  # untouched
    assert [e.name for e in catalogue.entitlements_of("p1")] == ["e1", "e5"] and p1 != catalogue.entitlements_of("p1")
    assert catalogue.apply(_pool("p2")) is None and catalogue.pools == ("p0", "p1", "p2")


def test_a_document_set_changes_only_pools_and_entitlements() -> None:
    documents = DocumentSet.from_loaded(load_config_text(INITIAL["one pool"]))
    with pytest.raises(ValueError, match="TokenPoolsSettings"):
        documents.put("TokenPoolsSettings", "s", {}, "test")
    assert documents.remove("TokenEntitlement", "absent", "test") is None and len(documents) == 1
