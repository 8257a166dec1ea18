"""Session fixtures for the integration tier: one real Kafka broker, one kube-apiserver and one real vLLM per test
session.

The broker is the project's own (:class:`tokenpools_dev.devstack.kafka.KafkaBroker`, jars installed by
``scripts/install-kafka.sh``); the apiserver and etcd too (:class:`tokenpools_dev.devstack.kube.KubeAPIServer`,
``scripts/install-etcd.sh`` and ``scripts/install-kube-apiserver.sh``), started only by a test that asks for it.
A missing install FAILS the tests with the command to run: a skipped integration test would let CI pass without
ever talking to Kafka or Kubernetes.

Real vLLM (:class:`tokenpools_dev.devstack.vllm.VLLMServer`, ``scripts/install-vllm.sh``, docs/vllm.md) is the
exception: its install is ~3.5 GB and a start costs about a minute, so a machine without it SKIPS its tests, with
the command to run; ``make services`` (and so ``.ci/run``) installs it, and a session starts it once.

The controller tests share ``controllers_cluster`` (deploy/ applied once, the controller ServiceAccount's
kubeconfig) and ``kube_admin`` (an admin client on an emptied namespace).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from controllers_fixtures import DEPLOY, NS, SA, admin_client, apply, delete_all, wait_established
from kubernetes_asyncio.client.api_client import ApiClient
from vllm_fixtures import ENGINE_NICE, installed, started

from tokenpools_dev.devstack.kafka import KafkaBroker, KafkaBrokerError
from tokenpools_dev.devstack.kube import KubeAPIServer
from tokenpools_dev.devstack.vllm import VLLMServer

KAFKA_ENV = "TOKENPOOLS_TEST_KAFKA"  # not TOKENPOOLS_KAFKA: that is the settings group `kafka`
"""``host:port`` of an already running broker (e.g. ``scripts/kafka.sh start``) for :func:`kafka_bootstrap`."""


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A broker this session started and may take away and bring back (kill/restart, pause/resume).

    Always the project's own process, even when ``TOKENPOOLS_TEST_KAFKA`` is set: a fault test cannot
    kill someone else's broker. Its workdir (``broker.log``, ``data/``) is kept under pytest's
    basetemp for post-mortems. A test that kills or pauses it must leave it running.
    """
    broker = KafkaBroker(workdir=tmp_path_factory.mktemp("kafka"))
    failure = _start(broker)
    if failure:
        pytest.fail(failure, pytrace=False)  # outside `except`: the message alone, no chained traceback
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> str:
    """``bootstrap_servers`` for clients: ``$TOKENPOOLS_TEST_KAFKA`` if set, else :func:`kafka_broker`'s."""
    external = os.environ.get(KAFKA_ENV, "").strip()
    if external:
        return external
    broker: KafkaBroker = request.getfixturevalue("kafka_broker")
    return broker.bootstrap


def _start(broker: KafkaBroker) -> str:
    """Start the broker; the error message (install hint, or the log tail) if it cannot."""
    try:
        broker.start()
    except KafkaBrokerError as e:
        return str(e)
    return ""


@pytest.fixture(scope="session")
def kube_apiserver() -> Iterator[KubeAPIServer]:
    """One apiserver for the whole session: start-up costs seconds, each test uses its own namespace or objects."""
    with KubeAPIServer() as server:
        print(f"kube-apiserver ready at {server.server_url} in {server.startup_seconds:.1f}s")
        yield server


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """One real ``vllm serve`` (the tiny model, ``--scheduling-policy priority``, its engine reniced) for the whole
    session.

    Skipped, saying why, when scripts/install-vllm.sh has not run; a start that fails FAILS (with vLLM's log tail).
    Its log is kept under pytest's basetemp. Tests must leave it idle (no request of theirs still running).
    """
    with started(VLLMServer(installed(), workdir=tmp_path_factory.mktemp("vllm"), engine_nice=ENGINE_NICE)) as server:
        yield server


@pytest.fixture(scope="session")
def controllers_cluster(kube_apiserver: KubeAPIServer) -> Path:
    """deploy/ applied once per session; a kubeconfig holding the controller ServiceAccount's token."""
    async def setup() -> Path:
        async with await admin_client(kube_apiserver) as api:
            await apply(api, DEPLOY / "base/namespace.yaml", DEPLOY / "base/crds/tokenpools.io_tokenpools.yaml",
                        DEPLOY / "base/crds/tokenpools.io_tokenentitlements.yaml",
                        DEPLOY / "base/rbac/controller.yaml")
            for crd in ("tokenpools.tokenpools.io", "tokenentitlements.tokenpools.io"):
                await wait_established(api, crd)
        return await kube_apiserver.write_service_account_kubeconfig(NS, SA)

    t0 = time.monotonic()
    path = asyncio.run(setup())
    print(f"deploy/ applied and SA token minted in {time.monotonic() - t0:.1f}s")
    return path


@pytest.fixture
async def kube_admin(kube_apiserver: KubeAPIServer, controllers_cluster: Path) -> AsyncIterator[ApiClient]:
    """An admin client on the controller's namespace, emptied of pools and entitlements before and after."""
    async with await admin_client(kube_apiserver) as api:
        await delete_all(api)
        yield api
        await delete_all(api)
