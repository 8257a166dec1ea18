"""Every component on a secured broker with least-privilege ACLs, and what the broker refuses.

One broker for the module, started by the project's own tooling (``KafkaBroker(security=...)``): SASL_SSL with
SCRAM-SHA-512 on its client port, SSL with required client certificates on a second one, a CA made here, a user
per component and the ACLs of ``tokenpools.topics.acls`` — the same rules deploy/secured/create-acls.sh is rendered
from. The topics are created by the admin, as the deploy Job does.

- each component does its job with only its own ACLs: the proxy publishes events and applies a limit update, the
  agents turn events into limit updates (Faust creating its own changelog), the controller publishes the specs,
  the recorder records;
- a proxy principal that writes the limits topic is refused by the broker, and a recorder cannot write at all;
- a client with no credentials (plaintext, or TLS without a certificate) gets nothing;
- a wrong password stops a component at start-up with the reason, within seconds, instead of retrying.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.errors import ClusterAuthorizationFailedError, TopicAuthorizationFailedError
from backend_fixtures import inference_sim_binary  # noqa: F401  (fixture import)
from openai import AsyncOpenAI
from proxy_fixtures import KEYS, config_text, start_proxy, start_sim  # noqa: F401

from tokenpools.config import KafkaSettings
from tokenpools.runtime.kafka import Access, KafkaClients
from tokenpools.streams.admin import ensure_topics
from tokenpools.topics.acls import AclRule, Pattern, Principals, Resource, Role, rules
from tokenpools.topics.codec import decode, encode
from tokenpools.topics.declarations import Topics, topics_for
from tokenpools.topics.records import BackendMetricsSample, LimitUpdate, SpecRecord
from tokenpools_dev import builders
from tokenpools_dev.devstack.inference_sim import InferenceSim
from tokenpools_dev.devstack.kafka import KafkaBroker
from tokenpools_dev.devstack.kafka_security import BrokerSecurity
from tokenpools_dev.proxy.doubles import limit_update, unpack
from tokenpools_dev.streams import harness
from tokenpools_dev.streams import scripted

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PREFIX = "sec."
PARTITIONS = 2
PRINCIPALS = Principals(agents_app_id="sec-agents")
NOBODY = "nobody"  # authenticates, has no ACL
REPO = Path(__file__).resolve().parents[2]


class Secured:
    def __init__(self, broker: KafkaBroker, security: BrokerSecurity, topics: Topics) -> None:
        self.broker, self.security, self.topics = broker, security, topics

    def clients(self, role: Role | str) -> KafkaClients:
        user = PRINCIPALS.user(role) if isinstance(role, Role) else role
        return KafkaClients(self.security.settings(user).model_copy(update={"topic_prefix": PREFIX,
                                                                            "topic_partitions": PARTITIONS}))

    def set_items(self, role: Role) -> list[str]:
        return [*self.security.set_items(PRINCIPALS.user(role)), f"kafka.topic_prefix={PREFIX}",
                f"kafka.topic_partitions={PARTITIONS}"]

    def admin(self) -> KafkaClients:
        return self.broker.admin_clients()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    directory = tmp_path_factory.mktemp("secured-kafka")
    security = BrokerSecurity.create(directory / "pki", [*(PRINCIPALS.user(r) for r in Role), NOBODY])
    topics = topics_for(PREFIX, PARTITIONS)
    with KafkaBroker(security=security, workdir=directory / "kafka") as broker:
        asyncio.run(ensure_topics(broker.admin_clients(), topics, client="admin"))
        granted = rules(topics, PREFIX, PRINCIPALS)
        security.grant(granted)
        ready = Secured(broker, security, topics)
        asyncio.run(_until_the_broker_applies(ready, granted))
        yield ready


async def _until_the_broker_applies(secured: Secured, granted: list[AclRule], timeout_s: float = 30.0) -> None:
    """Until every role sees (may describe) the topics its granted rules name. ``create_acls`` answers once the
    controller has committed the ACLs; the broker's authorizer applies them from the metadata log a moment later, so
    the module's first test, writing at once, could be refused what it was just granted (CI, under load: it passed
    on a rerun). The broker shows a principal only the topics it may describe: a condition, not a sleep."""
    names = [t.name for t in secured.topics.all()]
    deadline = time.monotonic() + timeout_s
    for role in Role:
        mine = [r for r in granted if r.role is role and r.resource is Resource.TOPIC]
        expected = {n for n in names if any(n == r.name if r.pattern is Pattern.LITERAL else n.startswith(r.name)
                                            for r in mine)}
        if not expected:
            continue
        admin = secured.clients(role).admin("test-acls")
        try:
            await admin.start()
            while not expected <= set(seen := await admin.list_topics()):
                assert time.monotonic() < deadline, f"{role}: not applied in {timeout_s:.0f} s: {expected - set(seen)}"
                await asyncio.sleep(0.05)
        finally:
            await admin.close()


async def _read(kafka: KafkaClients, topic: str, until: Callable[[list[bytes]], bool], timeout_s: float = 60.0,
                partitions: int = PARTITIONS) -> list[bytes]:
    """Values of ``topic`` from the beginning, until ``until`` holds (as the given user)."""
    from aiokafka import TopicPartition

    consumer = kafka.consumer("test-reader", enable_auto_commit=False, fetch_max_wait_ms=50)
    values: list[bytes] = []
    try:
        await consumer.start()
        assignment = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(assignment)
        await consumer.seek_to_beginning(*assignment)
        deadline = time.monotonic() + timeout_s
        while not until(values):
            assert time.monotonic() < deadline, f"{topic}: not seen in {timeout_s:.0f} s ({len(values)} values)"
            for messages in (await consumer.getmany(timeout_ms=200)).values():
                values += [m.value for m in messages if m.value is not None]
    finally:
        await consumer.stop()
    return values


def _events(values: list[bytes]) -> list[dict[str, Any]]:
    return unpack([orjson.loads(v) for v in values])


async def _send(kafka: KafkaClients, topic: str, value: bytes, key: bytes = b"k") -> None:
    producer = kafka.producer("test-writer", acks="all", enable_idempotence=True, request_timeout_ms=10_000)
    try:
        await producer.start()
        await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


# ---- what the broker refuses --------------------------------------------------------------------------------
async def test_a_proxy_cannot_write_limits_and_the_recorder_cannot_write_at_all(secured: Secured) -> None:
    update = encode(limit_update("sim-pool", 1, int(time.time() * 1000), {"gold": (1, 1.0, 1.0, 1.0)}, 4))
    with pytest.raises(TopicAuthorizationFailedError):
        await _send(secured.clients(Role.PROXY), secured.topics.limits.name, update, b"sim-pool")
    for topic in (secured.topics.requests.name, secured.topics.specs.name):  # not even a producer id: no write
        with pytest.raises(ClusterAuthorizationFailedError):                  # right anywhere
            await _send(secured.clients(Role.RECORDER), topic, b"{}")
    await _send(secured.clients(Role.AGENTS), secured.topics.limits.name, update, b"sim-pool")  # whose it is


async def test_the_proxy_principal_is_the_same_by_password_or_by_certificate(secured: Secured) -> None:
    by_certificate = KafkaClients(secured.security.ssl_settings(PRINCIPALS.proxy))
    assert (await by_certificate.check_access(5.0))[0] is Access.OK
    with pytest.raises(TopicAuthorizationFailedError):
        await _send(by_certificate, secured.topics.limits.name, b"{}", b"sim-pool")
    await _send(by_certificate, secured.topics.heartbeats.name, b"{}", b"p")


async def test_a_client_without_credentials_gets_nothing(secured: Secured) -> None:
    plaintext = KafkaClients(KafkaSettings(bootstrap_servers=secured.broker.bootstrap))
    assert (await plaintext.check_access(5.0))[0] is Access.UNREACHABLE
    no_certificate = KafkaClients(KafkaSettings(bootstrap_servers=secured.security.ssl_bootstrap,
                                                security_protocol="SSL", ssl_cafile=secured.security.ca.cafile))
    assert (await no_certificate.check_access(5.0))[0] is not Access.OK
    untrusted = KafkaClients(secured.security.settings(PRINCIPALS.proxy).model_copy(update={"ssl_cafile": None}))
    assert (await untrusted.check_access(5.0))[0] is Access.TLS_FAILED  # the system's CAs do not know ours
    nobody = secured.clients(NOBODY)
    assert (await nobody.check_access(5.0))[0] is Access.OK  # authenticated ...
    admin = nobody.admin("test-nobody")
    try:  # ... and shown nothing: the metadata hides every topic it may not describe
        await admin.start()
        assert not {t.name for t in secured.topics.all()} & set(await admin.list_topics())
    finally:
        await admin.close()
    with pytest.raises(ClusterAuthorizationFailedError):  # no write right anywhere: not even a producer id
        await _send(nobody, secured.topics.requests.name, b"{}", b"sim-pool")


@pytest.mark.parametrize("command", ["agents", "proxy"])
def test_a_wrong_password_stops_a_component_at_start_up_with_the_reason(
        secured: Secured, tmp_path: Path, command: str) -> None:
    config = tmp_path / "pool.yaml"
    config.write_text(scripted.CONFIG_YAML if command == "agents" else config_text(["http://127.0.0.1:1"]))
    role = Role.AGENTS if command == "agents" else Role.PROXY
    items = [i if not i.startswith("kafka.sasl_password=") else "kafka.sasl_password=not-the-password"
             for i in secured.set_items(role)]
    argv = [sys.executable, "-m", "tokenpools", command, "--config", str(config)]
    argv += ["--http-port", "-1"] if command == "agents" else ["--port", "0"]
    for item in items:
        argv += ["--set", item]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "the broker refused the login" in done.stderr and "SaslAuthenticationFailed" in done.stderr
    assert time.monotonic() - started < 30


# ---- each component with only its own ACLs --------------------------------------------------------------------
async def test_the_proxy_publishes_its_events_and_applies_limit_updates(
        secured: Secured, start_sim: Callable[..., InferenceSim], tmp_path: Path) -> None:
    sim = start_sim(model="fake-model")
    items = (*secured.set_items(Role.PROXY), "policy.queue_slo_fraction=0")
    async with start_proxy([sim.base_url], secured.broker.bootstrap, secured.topics, tmp_path, items) as proxy:
        client = AsyncOpenAI(base_url=proxy.base_url, api_key=KEYS["gold"], max_retries=0)
        try:
            await client.chat.completions.create(model="fake-model", max_tokens=4,
                                                 messages=[{"role": "user", "content": "hi"}])
        finally:
            await client.close()
        decided = await _read(secured.admin(), secured.topics.requests.name,
                              lambda values: any(e.get("entitlement") == "gold" for e in _events(values)))
        assert [e["outcome"] for e in _events(decided)] == ["admitted"]
        update = limit_update("sim-pool", 7, int(time.time() * 1000), {"gold": (2, 1e6, 1e12, 900.0)}, 8)
        await _send(secured.clients(Role.AGENTS), secured.topics.limits.name, encode(update), b"sim-pool")
        await proxy.wait_version("sim-pool", 7)
        await proxy.drained()  # every event delivered: none was refused and spooled


async def test_the_agents_turn_events_into_limit_updates(secured: Secured, tmp_path: Path) -> None:
    config = tmp_path / "pool.yaml"
    config.write_text(scripted.CONFIG_YAML)
    worker = harness.start_worker(config, [*secured.set_items(Role.AGENTS), f"streams.app_id={PRINCIPALS.agents_app_id}",
                                     "streams.tick_s=1", "streams.grace_s=0.3"], tmp_path / "agents.log")
    try:
        base_ms = (int(time.time()) + 2) * 1000
        events = scripted.scripted_events(base_ms, 1000, scripted.two_class_phases(4))
        metrics = [e for e in events if isinstance(e[0], BackendMetricsSample)]  # the controller's to write
        await asyncio.gather(
            harness.produce(secured.broker.bootstrap, [secured.topics], [e for e in events if e not in metrics], live=True,
                      kafka=secured.clients(Role.PROXY)),
            harness.produce(secured.broker.bootstrap, [secured.topics], metrics, live=True,
                      kafka=secured.clients(Role.CONTROLLER)))
        def ours(values: list[bytes]) -> list[LimitUpdate]:  # (the module's other tests wrote sim-pool's)
            return [u for u in (decode(LimitUpdate, v) for v in values) if u.pool == scripted.POOL]

        updates = ours(await _read(secured.admin(), secured.topics.limits.name, lambda values: len(ours(values)) >= 2,
                                   timeout_s=90.0))
        assert [u.version for u in updates] == sorted({u.version for u in updates})  # one per window, in order
        log = (tmp_path / "agents.log").read_text()
        assert worker.poll() is None, log[-3000:]
        assert "TopicAuthorizationFailed" not in log  # every topic it reads, its rules let it read
    finally:
        harness.stop(worker)


async def test_the_controller_publishes_the_specs(secured: Secured, tmp_path: Path) -> None:
    config = tmp_path / "pool.yaml"
    config.write_text(scripted.CONFIG_YAML)
    argv = [sys.executable, "-m", "tokenpools", "controller", "--no-kubernetes", "--config", str(config),
            "--http-port", "0"]
    for item in [*secured.set_items(Role.CONTROLLER), "prometheus.url=http://127.0.0.1:9"]:
        argv += ["--set", item]
    log = tmp_path / "controller.log"
    with log.open("wb") as out:
        controller = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        specs = await _read(secured.admin(), secured.topics.specs.name, lambda values: len(values) >= 3,
                            timeout_s=60.0, partitions=1)
        assert {decode(SpecRecord, v).kind for v in specs} >= {"TokenPool", "TokenEntitlement"}
        assert controller.poll() is None, log.read_text()[-3000:]
    finally:
        harness.stop(controller)


def test_the_recorder_records_with_read_only_rights(secured: Secured, tmp_path: Path) -> None:
    asyncio.run(_send(secured.clients(Role.CONTROLLER), secured.topics.specs.name,
                      encode(builders.spec_record("TokenPool", "rec", t_ms=int(time.time() * 1000))),
                      b"TokenPool/rec"))
    argv = [sys.executable, "-m", "tokenpools", "record", "--out", str(tmp_path / "log"), "--idle-exit-s", "3",
            "--group-id", PRINCIPALS.recorder_group, "--topics", "specs", "--no-progress"]
    for item in secured.set_items(Role.RECORDER):
        argv += ["--set", item]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    recorded = re.search(r"recorded (\d+) records", done.stderr)
    assert recorded is not None and int(recorded[1]) >= 1, done.stderr[-1000:]
