"""The proxy's incremental view (``LiveSpecs.apply_change``) equals a whole rebuild from the same catalogue after
any sequence of spec records (docs/tenancy.md): creates, patches, class and state changes, key rotations, moves
between pools, deletions, pool changes (model, capacity, endpoints), and records the catalogue refuses.

Compared after every record: the tenancy (every key's entry, the entitlements and states, the pools), the pools'
runtimes (their pool spec, entitlements and states), the backends, and the ``ProxyConfig`` the proxy reports.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenpools.config import hash_api_key, load_config_documents, load_settings
from tokenpools.proxy.app import build_app
from tokenpools.proxy.inputs.live_specs import config_from_catalogue, tenancy_of
from tokenpools.proxy.main import proxy_config
from tokenpools.proxy.inputs.spec_sources import SpecsFollower
from tokenpools.runtime.specs import Catalogue
from tokenpools.topics.codec import encode
from tokenpools.topics.records import SpecRecord
from tokenpools_dev import builders
from tokenpools_dev.proxy.doubles import offline_options

pytestmark = pytest.mark.component

API_VERSION = "tokenpools.io/v1alpha1"
POOLS = ("pool-0", "pool-1", "pool-2", "pool-3")
ENTITLEMENTS = tuple(f"ent-{i}" for i in range(8))
TENANTS = ("t0", "t1", "t2")
KEYS = tuple(f"sk-{i}" for i in range(6))


def pool_spec(model: str, replicas: int, endpoints: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": model, "backendRef": {"name": "b"},
                            "scaling": {"minReplicas": 1, "maxReplicas": replicas},
                            "perReplica": {"tokensPerSecond": 100, "kvCacheGiB": 1, "concurrency": 4},
                            "kvBytesPerToken": 1000}
    if endpoints:
        spec["endpoints"] = [f"http://127.0.0.1:9/{model}-{replicas}"]
    return spec


def ent_spec(pool: str, tenant: str, cls: str, keys: tuple[str, ...], tps: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"tenantId": tenant, "poolRef": {"name": pool},
                            "qos": {"serviceClass": cls, "sloTargetMs": 1000},
                            "apiKeys": [{"sha256": hash_api_key(k)} for k in keys]}
    if cls != "spot":
        spec["resources"] = {"tokensPerSecond": tps, "kvCacheGiB": 0.01, "concurrency": 1}
    return spec


def start_documents() -> list[dict[str, Any]]:
    docs = [{"apiVersion": API_VERSION, "kind": "TokenPool", "metadata": {"name": p},
             "spec": pool_spec("m0" if i < 2 else "m1", 2, True)} for i, p in enumerate(POOLS[:3])]
    docs += [{"apiVersion": API_VERSION, "kind": "TokenEntitlement", "metadata": {"name": f"ent-{i}"},
              "spec": ent_spec(POOLS[i % 3], TENANTS[i % 2], "guaranteed" if i % 2 else "spot", (KEYS[i % 2],), 50)}
             for i in range(4)]
    return docs


entitlement_records = st.builds(
    lambda name, pool, tenant, cls, keys, tps, state, deleted: builders.spec_record(
        "TokenEntitlement", name, None if deleted else ent_spec(pool, tenant, cls, keys, tps), pool=pool,
        state=state, deleted=deleted),
    st.sampled_from(ENTITLEMENTS), st.sampled_from(POOLS), st.sampled_from(TENANTS),
    st.sampled_from(("guaranteed", "elastic", "spot")),
    st.lists(st.sampled_from(KEYS), min_size=0, max_size=2, unique=True).map(tuple),
    st.sampled_from((10, 80, 300)), st.sampled_from((None, "Bound", "Pending", "Expired")),
    st.sampled_from((False, False, False, True)))
pool_records = st.builds(
    lambda name, model, replicas, endpoints, deleted: builders.spec_record(
        "TokenPool", name, None if deleted else pool_spec(model, replicas, endpoints), deleted=deleted),
    st.sampled_from(POOLS), st.sampled_from(("m0", "m1")), st.sampled_from((1, 2, 4)), st.booleans(),
    st.sampled_from((False, False, False, True)))
spec_records = st.one_of(entitlement_records, entitlement_records, entitlement_records, pool_records)


def full_view(catalogue: Catalogue, base: Any, now_s: float, version: int) -> tuple[Any, Any] | None:
    config, _ = config_from_catalogue(catalogue, base, now_s)
    try:
        return config, tenancy_of(config, version)
    except ValueError:
        return None


async def check(records: list[SpecRecord], batches: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        loaded = load_config_documents(start_documents(), source="test")
        app = build_app(proxy_config(loaded, load_settings({}, []), 0.0), offline_options(Path(tmp)))
        await app.start()
        try:
            proxy = app.proxy
            live = proxy.specs
            assert live is not None
            catalogue = Catalogue.from_loaded(loaded)
            follower = SpecsFollower(catalogue, live, None, "", "test/specs", proxy.clock)
            expected = full_view(catalogue, live.config, proxy.clock.now_s(), 0)
            assert expected is not None
            cuts = iter(batches)
            for i, record in enumerate(records):
                follower.handle(encode(record), "specs", 0, i, f"{record.kind}/{record.name}".encode())
                if next(cuts, 1) == 0:
                    continue  # the batch goes on: put in force with the next record
                follower.put_in_force()
                # the reference: main's whole rebuild, a pool without endpoints keeping those last in force
                rebuilt = full_view(catalogue, expected[0], proxy.clock.now_s(), live.version)
                if rebuilt is not None and live.version == follower._base_version + catalogue.version:
                    expected = rebuilt
                if live.version > 0:  # (before: the file's view, in the file's order, as at start)
                    assert_same(live, proxy, *expected)  # type: ignore[misc]
        finally:
            await app.stop()


def assert_same(live: Any, proxy: Any, config: Any, tenancy: Any) -> None:
    seen = proxy.handlers.tenancy
    assert dict(seen._tenants) == dict(tenancy._tenants)
    assert dict(seen.entitlements) == dict(tenancy.entitlements)
    assert dict(seen.pools) == dict(tenancy.pools) and list(seen.pools) == list(tenancy.pools)
    assert set(proxy.pools) == set(config.pools)
    for name, runtime in proxy.pools.items():
        assert runtime.pool == config.pools[name]
        members = {e.name: e.state for e in config.entitlements.values() if e.pool == name}
        assert {n: s.state for n, s in runtime.entitlements.items()} == members
        assert {n: s.service_class for n, s in runtime.entitlements.items()} == {
            e.name: e.service_class for e in config.entitlements.values() if e.pool == name}
    assert dict(live.endpoints) == dict(config.endpoints)
    assert proxy.handlers.upstream._endpoints == dict(config.endpoints)
    reported = live.config
    assert reported.entitlements == dict(config.entitlements)
    assert list(reported.entitlements) == list(config.entitlements)
    assert {d: tuple(n) if not isinstance(n, str) else (n,) for d, n in reported.key_digests.items()} == {
        d: tuple(n) if not isinstance(n, str) else (n,) for d, n in config.key_digests.items()}
    for name in seen.entitlements:
        assert proxy.handlers.runtime_of[name] is proxy.pools[seen.entitlements[name].pool]


@settings(max_examples=int(os.environ.get("SPECS_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(spec_records, min_size=1, max_size=25), st.lists(st.sampled_from((0, 1, 1)), max_size=25))
def test_incremental_view_equals_a_full_rebuild_after_any_records(records: list[SpecRecord],
                                                                  batches: list[int]) -> None:
    asyncio.run(check(records, batches))
