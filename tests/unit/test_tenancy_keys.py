"""One key, one tenant, several models: the validator's rule (whole file and record by record alike), the proxy's
pure tenancy view, and the catalogue's refusal of a stale record."""

from __future__ import annotations

import pytest

from tokenpools.config import ConfigError, hash_api_key, load_config_text
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import PoolSpec
from tokenpools.proxy.access.tenancy import Tenancy
from tokenpools.runtime.specs import Catalogue
from tokenpools.topics.records import SpecRecord
from tokenpools_dev import builders
from tokenpools_dev.builders import entitlement_spec

KEY = hash_api_key("sk-shared")


def pool(name: str, model: str) -> str:
    return (f"apiVersion: tokenpools.io/v1alpha1\nkind: TokenPool\nmetadata: {{name: {name}}}\nspec:\n"
            f"  model: {model}\n  backendRef: {{name: b}}\n  kvBytesPerToken: 1024\n"
            f"  perReplica: {{tokensPerSecond: 100, kvCacheGiB: 1, concurrency: 4}}\n")


def ent(name: str, pool_name: str, tenant: str, key: str = KEY) -> str:
    return (f"apiVersion: tokenpools.io/v1alpha1\nkind: TokenEntitlement\nmetadata: {{name: {name}}}\nspec:\n"
            f"  tenantId: {tenant}\n  poolRef: {{name: {pool_name}}}\n  qos: {{serviceClass: spot, sloTargetMs: 100}}\n"
            f"  apiKeys: [{{sha256: {key}}}]\n")


def spec_record(name: str, pool_name: str, tenant: str, generation: int = 0, key: str = KEY) -> SpecRecord:
    return builders.spec_record("TokenEntitlement", name, {"tenantId": tenant, "poolRef": {"name": pool_name},
                                                       "qos": {"serviceClass": "spot", "sloTargetMs": 100},
                                                       "apiKeys": [{"sha256": key}]}, pool=pool_name, generation=generation)


TWO_POOLS = pool("p", "m1") + "---\n" + pool("q", "m2")


def test_a_key_may_serve_one_tenant_on_several_pools() -> None:
    loaded = load_config_text(TWO_POOLS + "---\n" + ent("a-p", "p", "a") + "---\n" + ent("a-q", "q", "a"))
    assert loaded.entitlements_by_key_hash == {KEY: ("a-p", "a-q")}
    assert loaded.entitlement_by_key_hash == {KEY: "a-p"}


@pytest.mark.parametrize(("second", "why"), [
    (ent("a-p2", "p", "a"), "in the same pool 'p' (a key names one entitlement per pool)"),
    (ent("b-q", "q", "b"), "of tenant 'a' (a key names one tenant)"),
])
def test_a_key_in_two_entitlements_of_one_pool_or_of_two_tenants_is_refused(second: str, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_text(TWO_POOLS + "---\n" + ent("a-p", "p", "a") + "---\n" + second, "x.yaml")
    (problem,) = caught.value.problems
    assert str(problem).endswith(f"the same API key is already used by TokenEntitlement 'a-p' (document 3) {why}")
    # record by record, the catalogue refuses the same change with the same words
    catalogue = Catalogue.from_loaded(load_config_text(TWO_POOLS + "---\n" + ent("a-p", "p", "a")))
    name, pool_name, tenant = ("a-p2", "p", "a") if "a-p2" in second else ("b-q", "q", "b")
    refused = catalogue.apply(spec_record(name, pool_name, tenant))
    assert refused is not None and why in refused
    assert catalogue.apply(spec_record("a-q", "q", "a")) is None
    assert catalogue.key_digests_of("a-q") == (KEY,) and catalogue.version == 1


def test_the_catalogue_refuses_a_record_older_than_the_generation_in_force() -> None:
    catalogue = Catalogue.from_loaded(load_config_text(TWO_POOLS))
    assert catalogue.apply(spec_record("e", "p", "a", generation=3)) is None
    stale = catalogue.apply(spec_record("e", "q", "a", generation=2))
    assert stale is not None and "generation 2 is older than generation 3" in stale
    assert catalogue.entitlements_of("p")[0].name == "e" and catalogue.version == 1
    assert catalogue.apply(spec_record("e", "q", "a", generation=3)) is None  # the same generation: a status change
    removal = builders.spec_record("TokenEntitlement", "e", pool="", deleted=True)
    assert catalogue.apply(removal) is None
    assert catalogue.apply(spec_record("e", "p", "a", generation=1)) is None  # re-created: starts again at 1


POOLS = {"p": PoolSpec("p", "m1", Capacity(100, 1e9, 4)), "q": PoolSpec("q", "m2", Capacity(100, 1e9, 4)),
         "r": PoolSpec("r", "m1", Capacity(100, 1e9, 4))}


def test_the_view_maps_a_key_to_its_tenant_and_a_model_to_its_entitlement() -> None:
    ents = {e.name: e for e in (entitlement_spec(name, ServiceClass.SPOT, pool=pool_name, slo_ms=100, tenant=tenant)
                                for name, pool_name, tenant in (("a-p", "p", "a"), ("a-q", "q", "a"), ("b-r", "r", "b")))}
    other = hash_api_key("sk-b")
    view = Tenancy.build(7, POOLS, ents, {KEY: ("a-q", "a-p"), other: "b-r"})
    tenant = view.lookup("Bearer sk-shared")
    assert tenant is not None and tenant.entitlements == ("a-p", "a-q") and tenant.models == ("m1", "m2")
    assert view.entitlement_for(tenant, "m1") == "a-p" and view.entitlement_for(tenant, "m2") == "a-q"
    b = view.lookup("bearer sk-b")
    assert b is not None and view.entitlement_for(b, "m1") == "b-r" and view.entitlement_for(b, "m2") is None
    assert view.lookup("Bearer sk-nobody") is None and view.lookup(None) is None and view.lookup("Basic x") is None
    assert view.version == 7 and len(view) == 2


@pytest.mark.parametrize(("holders", "message"), [
    ({KEY: ("a-p", "a-p2")}, "of one pool 'p'"),
    ({KEY: ("a-p", "b-r")}, "of tenants a, b"),
    ({KEY: ("ghost",)}, "unknown entitlement 'ghost'"),
    ({KEY.upper(): ("a-p",)}, "lowercase sha256 hex"),
])
def test_the_view_refuses_what_the_validator_refuses(holders: dict[str, tuple[str, ...]], message: str) -> None:
    ents = {e.name: e for e in (entitlement_spec(name, ServiceClass.SPOT, pool=pool_name, slo_ms=100, tenant=tenant)
                                for name, pool_name, tenant in (("a-p", "p", "a"), ("a-p2", "p", "a"), ("b-r", "r", "b")))}
    with pytest.raises(ValueError, match=message):
        Tenancy.build(1, POOLS, ents, holders)
