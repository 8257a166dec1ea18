"""API keys held in Kubernetes Secrets, on the real kube-apiserver: the controller reads them with ``get`` on the
Secrets its Role names and publishes their digests, never the keys; a key rotates by overlap.

Pinned:
- an entitlement's ``secretRef`` is published on the specs topic as the SHA-256 of the Secret's value, and the value
  appears nowhere on the topic;
- rotation: the new key listed beside the old one makes both valid; the old one removed leaves the new one; a value
  changed in the Secret is published at the next resync;
- a Secret the Role does not name is not readable (403): its keys are left out with the reason, the others stay;
- the ServiceAccount still cannot list Secrets or get one it is not given.

The cluster is the session's kube-apiserver + etcd with deploy/ applied once (``controllers_cluster``); the
controller runs in process under the ServiceAccount of deploy/base/rbac/controller.yaml, with the session's Kafka.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from controllers_fixtures import NS, create, ent, eventually, fresh_topics, last_per_key, pool, start_controller
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from tokenpools.config import hash_api_key

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

SECRET = "tokenpools-api-keys"  # the name deploy/base/rbac/controller.yaml grants `get` on
RESYNC_S = 5.0  # start_controller's resync: how soon a changed Secret is read


async def _put_secret(api: ApiClient, name: str, data: dict[str, str]) -> None:
    core = client.CoreV1Api(api)
    body = client.V1Secret(metadata=client.V1ObjectMeta(name=name), string_data=data)
    try:
        await core.create_namespaced_secret(NS, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        await core.replace_namespaced_secret(name, NS, body)  # string_data replaces every key


async def _patch_keys(api: ApiClient, name: str, keys: list[dict[str, Any]]) -> None:
    await client.CustomObjectsApi(api).patch_namespaced_custom_object(
        "tokenpools.io", "v1alpha1", NS, "tokenentitlements", name,
        [{"op": "replace", "path": "/spec/apiKeys", "value": keys}])


def _ref(key: str, secret: str = SECRET) -> dict[str, Any]:
    return {"secretRef": {"name": secret, "key": key}}


async def test_secret_keys_are_published_as_digests_and_rotate_by_overlap(
        kube_admin: ApiClient, controllers_cluster: Path, kafka_bootstrap: str) -> None:
    topics = await fresh_topics(kafka_bootstrap)
    tag = uuid.uuid4().hex[:6]
    old, new, renewed = f"sk-old-{tag}", f"sk-new-{tag}", f"sk-renewed-{tag}"
    await _put_secret(kube_admin, SECRET, {f"team-{tag}-1": old, f"team-{tag}-2": new})
    name = f"keys-{tag}"
    await create(kube_admin, pool(f"pool-{tag}"))
    await create(kube_admin, ent(name, f"pool-{tag}", apiKeys=[_ref(f"team-{tag}-1")]))

    async def published(*digests: str) -> bool:
        record = (await last_per_key(kafka_bootstrap, topics.specs.name)).get(f"TokenEntitlement/{name}")
        return record is not None and record["spec"].get("apiKeys") == [{"sha256": d} for d in digests]

    async with start_controller(controllers_cluster, kafka_bootstrap, topics):
        await eventually(lambda: published(hash_api_key(old)), 30, "the old key's digest")
        # both keys during the overlap, then only the new one
        await _patch_keys(kube_admin, name, [_ref(f"team-{tag}-1"), _ref(f"team-{tag}-2")])
        await eventually(lambda: published(hash_api_key(old), hash_api_key(new)), 30, "both digests")
        await _patch_keys(kube_admin, name, [_ref(f"team-{tag}-2")])
        await eventually(lambda: published(hash_api_key(new)), 30, "the new digest alone")
        # a value changed in the Secret itself: no watch, read at the next resync
        await _put_secret(kube_admin, SECRET, {f"team-{tag}-1": old, f"team-{tag}-2": renewed})
        waited = await eventually(lambda: published(hash_api_key(renewed)), 3 * RESYNC_S + 10, "the renewed digest")
        print(f"a changed Secret value was published {waited:.1f} s later (resync {RESYNC_S:g} s)")
        # a Secret the Role does not name: 403, left out with the reason; the entitlement's other key stays
        await _put_secret(kube_admin, f"other-{tag}", {"k": f"sk-other-{tag}"})
        await _patch_keys(kube_admin, name, [_ref(f"team-{tag}-2"), _ref("k", f"other-{tag}")])

        async def refused() -> bool:
            record = (await last_per_key(kafka_bootstrap, topics.specs.name)).get(f"TokenEntitlement/{name}")
            return (record is not None and record["spec"].get("apiKeys") == [{"sha256": hash_api_key(renewed)}]
                    and f"Secret {NS}/other-{tag}: cannot be read (403" in record["reason"])

        await eventually(refused, 30, "the unreadable Secret's key left out, with the reason")
    raw = b"".join(m.value or b"" for m in await _records(kafka_bootstrap, topics.specs.name))
    for key in (old, new, renewed, f"sk-other-{tag}"):
        assert key.encode() not in raw  # no key in clear, ever, on the topic


async def _records(bootstrap: str, topic: str) -> list[Any]:
    from controllers_fixtures import read_to_end

    return await read_to_end(bootstrap, topic)


async def test_the_service_account_gets_only_the_named_secret(kube_admin: ApiClient, controllers_cluster: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    await _put_secret(kube_admin, SECRET, {f"probe-{tag}": "sk-probe"})
    await _put_secret(kube_admin, f"unnamed-{tag}", {"k": "sk-unnamed"})
    async with await config.new_client_from_config(config_file=str(controllers_cluster), persist_config=False) as sa:
        core = client.CoreV1Api(sa)
        assert (await core.read_namespaced_secret(SECRET, NS)).data  # what it does: get the named one
        for what, call in {"get another Secret": core.read_namespaced_secret(f"unnamed-{tag}", NS),
                           "list Secrets": core.list_namespaced_secret(NS),
                           "watch Secrets": core.list_namespaced_secret(NS, watch=True, timeout_seconds=1),
                           "change the named Secret": core.patch_namespaced_secret(SECRET, NS, {"data": {}})}.items():
            with pytest.raises(ApiException) as exc:
                await call
            assert exc.value.status == 403, (what, exc.value.status)
