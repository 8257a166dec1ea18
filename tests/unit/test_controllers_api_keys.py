"""API keys in Secrets become digests on the specs topic (``controllers.api_keys``), pure: Secrets given as data."""

from __future__ import annotations

from typing import Any

from tokenpools.config import hash_api_key
from tokenpools.controllers.api_keys import referenced, resolve
from tokenpools.controllers.reconcile import ENTITLEMENT, evaluate
from tokenpools_dev.builders import entitlement_doc, pool_doc

NS = "tokenpools"


def _pool() -> dict[str, Any]:
    return pool_doc("p", backend={"name": "b"})


def _ent(name: str, *keys: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    """A spot entitlement of pool p holding ``keys``."""
    return entitlement_doc(name, "p", service_class="spot", apiKeys=list(keys),
                           metadata={"namespace": namespace} if namespace else None)


def _ref(name: str, key: str) -> dict[str, Any]:
    return {"secretRef": {"name": name, "key": key}}


def _keys(evaluation: Any, name: str) -> list[dict[str, str]]:
    return list(evaluation.verdicts[(ENTITLEMENT, name)].spec["apiKeys"])


def test_a_secret_key_is_published_as_its_digest_and_the_key_itself_nowhere() -> None:
    evaluation = evaluate([_pool(), _ent("a", _ref("keys", "a-old"), _ref("keys", "a-new"),
                                         {"sha256": hash_api_key("sk-literal")})], 0.0)
    assert referenced(evaluation, NS) == {(NS, "keys")}
    out = resolve(evaluation, {(NS, "keys"): {"a-old": "sk-old", "a-new": "sk-new"}}, NS)
    assert _keys(out, "a") == [{"sha256": hash_api_key("sk-old")}, {"sha256": hash_api_key("sk-new")},
                               {"sha256": hash_api_key("sk-literal")}]  # rotation: both valid in the overlap
    assert "sk-old" not in repr(out.verdicts) and "sk-new" not in repr(out.verdicts)
    assert _keys(evaluation, "a")[0] == _ref("keys", "a-old")  # the input is not changed


def test_what_cannot_be_resolved_is_left_out_with_the_reason_and_the_rest_stays() -> None:
    evaluation = evaluate([_pool(), _ent("a", _ref("keys", "gone"), _ref("keys", "empty"), _ref("keys", "ok")),
                           _ent("b", _ref("forbidden", "k")), _ent("c", _ref("missing", "k"), namespace="other")], 0.0)
    assert referenced(evaluation, NS) == {(NS, "keys"), (NS, "forbidden"), ("other", "missing")}
    out = resolve(evaluation, {(NS, "keys"): {"ok": "sk-ok", "empty": ""},
                               (NS, "forbidden"): "cannot be read (403 Forbidden)", ("other", "missing"): "not found"},
                  NS)
    assert _keys(out, "a") == [{"sha256": hash_api_key("sk-ok")}]
    message = out.verdicts[(ENTITLEMENT, "a")].message
    assert "Secret tokenpools/keys has no key 'gone'" in message and "no value for 'empty'" in message
    assert _keys(out, "b") == [] and "403 Forbidden" in out.verdicts[(ENTITLEMENT, "b")].message
    assert _keys(out, "c") == [] and "Secret other/missing: not found" in out.verdicts[(ENTITLEMENT, "c")].message


def test_a_key_two_entitlements_would_share_is_left_out_of_both() -> None:
    """(The same reference twice is refused by the loader already; two Secret keys with one value are not.)"""
    evaluation = evaluate([_pool(), _ent("a", _ref("keys", "a-1"), _ref("keys", "a")),
                           _ent("b", _ref("keys", "b-1"))], 0.0)
    out = resolve(evaluation, {(NS, "keys"): {"a-1": "sk-shared", "b-1": "sk-shared", "a": "sk-a"}}, NS)
    assert _keys(out, "a") == [{"sha256": hash_api_key("sk-a")}] and _keys(out, "b") == []
    assert "also b's" in out.verdicts[(ENTITLEMENT, "a")].message


def test_one_tenant_may_share_a_key_across_pools_but_not_inside_one() -> None:
    second = {**_pool(), "metadata": {"name": "q"}}
    a_on_q = _ent("a-q", _ref("keys", "a-2"))
    a_on_q["spec"] = {**a_on_q["spec"], "tenantId": "a", "poolRef": {"name": "q"}}
    a_on_p = _ent("a", _ref("keys", "a-1"))
    evaluation = evaluate([_pool(), second, a_on_p, a_on_q, _ent("b", _ref("keys", "b-1"))], 0.0)
    out = resolve(evaluation, {(NS, "keys"): {"a-1": "sk-a", "a-2": "sk-a", "b-1": "sk-b"}}, NS)
    assert _keys(out, "a") == _keys(out, "a-q") == [{"sha256": hash_api_key("sk-a")}]  # one tenant, two pools
    a_on_q["spec"] = {**a_on_q["spec"], "poolRef": {"name": "p"}}  # now both on p
    evaluation = evaluate([_pool(), second, a_on_p, a_on_q], 0.0)
    out = resolve(evaluation, {(NS, "keys"): {"a-1": "sk-a", "a-2": "sk-a"}}, NS)
    assert _keys(out, "a") == _keys(out, "a-q") == [] and "also a-q's" in out.verdicts[(ENTITLEMENT, "a")].message


def test_an_entitlement_without_secret_refs_is_left_as_it_was() -> None:
    evaluation = evaluate([_pool(), _ent("a", {"sha256": hash_api_key("sk-a")})], 0.0)
    assert resolve(evaluation, {}, NS).verdicts == evaluation.verdicts
