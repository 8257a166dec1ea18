"""The one Kafka client factory (runtime.kafka): every security setting reaches every client type it makes.

Each client is really built — aiokafka's producer, consumer and admin client, and the producer and consumer Faust
builds from the app's broker settings — and the test looks at the connection settings inside it. The TLS context
each one holds is then put through an in-memory TLS handshake (no socket) with a broker-side context made from
certificates created here with ``openssl``: that proves the CA file, the client certificate and its encrypted key,
and the hostname check are in the context the client will use, not just somewhere in the settings.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import pkgutil
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tokenpools
from tokenpools.config import KafkaSettings, load_settings
from tokenpools.errors import ConfigError
from tokenpools.runtime.kafka import OWNED_OPTIONS, KafkaClients

BROKERS = "broker-1:9093,broker-2:9094"
KEY_PASSWORD = "k3y-pass"


@dataclass(frozen=True)
class Pki:
    ca: Path
    client_cert: Path
    client_key: Path  # encrypted with KEY_PASSWORD
    server_cert: Path  # CN broker, SAN localhost: the broker side of the handshakes
    server_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=tokenpools-test-ca", cwd=d)
    (d / "san.ext").write_text("subjectAltName=DNS:localhost\n")
    for name, subject, extra in (("client", "/CN=tokenpools-client", ()), ("server", "/CN=broker",
                                                                          ("-extfile", "san.ext"))):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subject, cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", *extra, cwd=d)
    _openssl("pkey", "-in", "client.key", "-aes256", "-passout", f"pass:{KEY_PASSWORD}", "-out", "client-enc.key",
             cwd=d)
    return Pki(d / "ca.pem", d / "client.pem", d / "client-enc.key", d / "server.pem", d / "server.key")


def sasl_ssl(pki: Pki) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=BROKERS, client_id="tp", security_protocol="SASL_SSL",
                         sasl_mechanism="SCRAM-SHA-512", sasl_username="svc", sasl_password="s3cret",
                         ssl_cafile=pki.ca)


def ssl_client_cert(pki: Pki) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=BROKERS, client_id="tp", security_protocol="SSL", ssl_cafile=pki.ca,
                         ssl_certfile=pki.client_cert, ssl_keyfile=pki.client_key, ssl_key_password=KEY_PASSWORD,
                         ssl_check_hostname=False)


def broker_side(pki: Pki, require_client_cert: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    if require_client_cert:
        context.load_verify_locations(pki.ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def handshake(client: ssl.SSLContext, broker: ssl.SSLContext, hostname: str = "localhost") -> dict[str, Any]:
    """A TLS handshake between the two contexts through memory buffers; the certificate the broker side saw."""
    c_in, c_out, b_in, b_out = (ssl.MemoryBIO() for _ in range(4))
    ends = [client.wrap_bio(c_in, c_out, server_hostname=hostname), broker.wrap_bio(b_in, b_out, server_side=True)]
    pending = list(ends)
    for _ in range(10):
        for end in list(pending):
            try:
                end.do_handshake()
                pending.remove(end)
            except ssl.SSLWantReadError:
                pass
        b_in.write(c_out.read())
        c_in.write(b_out.read())
        if not pending:
            return ends[1].getpeercert() or {}
    raise AssertionError("the handshake did not finish")


def common_name(cert: dict[str, Any]) -> str:
    return dict(item[0] for item in cert["subject"])["commonName"]


@contextlib.asynccontextmanager
async def every_client(kafka: KafkaClients) -> AsyncIterator[dict[str, Any]]:
    """The connection settings (aiokafka's client object) inside every client type the factory makes."""
    import faust

    producer = kafka.producer("proxy-p1", acks="all", enable_idempotence=True)
    from_factory = kafka.producer_factory("controller", acks="all")()
    consumer = kafka.consumer("scaler", group_id=None, auto_offset_reset="latest")
    admin = kafka.admin("agents-admin", request_timeout_ms=5000)
    app = faust.App("runtime-kafka-test", **kafka.faust_broker("agents"), store="memory://", web_enabled=False,
                    autodiscover=False)
    faust_producer = app.producer._new_producer()
    consumer_thread = app.consumer._thread
    faust_consumer = consumer_thread._create_worker_consumer(app.transport)
    try:
        yield {"producer": producer.client, "producer factory": from_factory.client, "consumer": consumer._client,
               "admin": admin._client, "faust producer": faust_producer.client,
               "faust consumer": faust_consumer._client}
    finally:
        for client in (producer, from_factory, faust_producer):
            await client.stop()
        for client in (consumer, faust_consumer):
            await client.stop()
        await admin.close()
        consumer_thread.thread_loop.close()  # Faust's consumer thread made a loop for itself; it never ran


def hosts(client: Any) -> list[tuple[str, int]]:
    return sorted((host, port) for host, port, _ in client.hosts)  # aiokafka shuffles them


async def test_sasl_ssl_with_scram_and_a_ca_file_reaches_every_client(pki: Pki) -> None:
    kafka = KafkaClients(sasl_ssl(pki))
    async with every_client(kafka) as clients:
        for kind, client in clients.items():
            assert hosts(client) == [("broker-1", 9093), ("broker-2", 9094)], kind
            assert client._client_id.startswith("tp-"), kind
            assert client._security_protocol == "SASL_SSL", kind
            assert (client._sasl_mechanism, client._sasl_plain_username, client._sasl_plain_password) == (
                "SCRAM-SHA-512", "svc", "s3cret"), kind
            context = client._ssl_context
            assert isinstance(context, ssl.SSLContext) and context.verify_mode == ssl.CERT_REQUIRED, kind
            assert context.check_hostname, kind
            handshake(context, broker_side(pki, require_client_cert=False))  # the broker's CA is trusted
            with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
                handshake(context, broker_side(pki, require_client_cert=False), hostname="elsewhere")
    assert clients["producer"]._client_id == "tp-proxy-p1" and clients["faust consumer"]._client_id == "tp-agents"


async def test_ssl_with_a_client_certificate_reaches_every_client(pki: Pki) -> None:
    kafka = KafkaClients(ssl_client_cert(pki))
    async with every_client(kafka) as clients:
        for kind, client in clients.items():
            assert hosts(client) == [("broker-1", 9093), ("broker-2", 9094)], kind
            assert client._security_protocol == "SSL", kind
            context = client._ssl_context
            assert isinstance(context, ssl.SSLContext) and context.verify_mode == ssl.CERT_REQUIRED, kind
            seen = handshake(context, broker_side(pki, require_client_cert=True))
            assert common_name(seen) == "tokenpools-client", kind  # the certificate, its key and its password
            assert not context.check_hostname, kind  # ssl_check_hostname=false
            handshake(context, broker_side(pki, require_client_cert=True), hostname="elsewhere")


async def test_without_a_ca_file_the_system_cas_are_trusted_not_the_test_ca(pki: Pki) -> None:
    kafka = KafkaClients(KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="u",
                                       sasl_password="p"))
    async with every_client(kafka) as clients:
        for kind, client in clients.items():
            with pytest.raises(ssl.SSLCertVerificationError):
                handshake(client._ssl_context, broker_side(pki, require_client_cert=False))


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_sasl_plaintext_reaches_every_client_without_tls(mechanism: str) -> None:
    kafka = KafkaClients(KafkaSettings(security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                                       sasl_username="svc", sasl_password="pw"))
    async with every_client(kafka) as clients:
        for kind, client in clients.items():
            assert client._security_protocol == "SASL_PLAINTEXT", kind
            assert (client._sasl_mechanism, client._sasl_plain_username, client._sasl_plain_password) == (
                mechanism, "svc", "pw"), kind
            assert client._ssl_context is None, kind


async def test_plaintext_clients_have_no_security_and_faust_no_credentials() -> None:
    kafka = KafkaClients(KafkaSettings())
    assert kafka.faust_broker("agents")["broker_credentials"] is None
    async with every_client(kafka) as clients:
        for kind, client in clients.items():
            assert (client._security_protocol, client._ssl_context) == ("PLAINTEXT", None), kind


def test_the_topics_are_named_and_partitioned_by_the_kafka_settings() -> None:
    topics = KafkaClients(KafkaSettings(topic_prefix="acme.", topic_partitions=12)).topics()
    assert {t.name: t.partitions for t in topics.all() if t.scaled} == {
        f"acme.{n}": 12 for n in ("requests", "completions", "backend-metrics", "limits", "scale", "effective-limits",
                                  "counts", "usage-windows", "budgets", "usage")}
    assert {t.name: t.partitions for t in topics.all() if not t.scaled} == {
        "acme.specs": 1, "acme.heartbeats": 1, "acme.dead-letters": 1, "acme.budget-alerts": 1}
    assert {t.partitions for t in KafkaClients(KafkaSettings()).topics().all() if t.scaled} == {32}


def test_a_caller_cannot_override_the_connection_or_its_security() -> None:
    kafka = KafkaClients(KafkaSettings())
    for option in sorted(OWNED_OPTIONS):
        with pytest.raises(ValueError, match=option):
            kafka.producer_factory("x", **{option: None})
        with pytest.raises(ValueError, match=option):
            kafka.consumer_factory("x", **{option: None})


def _settings_problem(kafka: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        load_settings({"kafka": kafka})
    return str(info.value)


@pytest.mark.parametrize("kafka, message", [
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512"},
     "kafka: security_protocol SASL_SSL needs sasl_mechanism, sasl_username and sasl_password; missing: "
     "sasl_username, sasl_password"),
    ({"security_protocol": "SASL_PLAINTEXT", "sasl_username": "u", "sasl_password": "p"},
     "kafka: security_protocol SASL_PLAINTEXT needs sasl_mechanism, sasl_username and sasl_password; missing: "
     "sasl_mechanism"),
    ({"security_protocol": "SSL", "sasl_mechanism": "PLAIN"},
     "kafka: sasl_mechanism is set but security_protocol is SSL, which does not use SASL (use SASL_PLAINTEXT or "
     "SASL_SSL)"),
    ({"security_protocol": "SASL_SSL", "sasl_mechanism": "MD5", "sasl_username": "u", "sasl_password": "p"},
     "kafka.sasl_mechanism: must be one of 'PLAIN', 'SCRAM-SHA-256' or 'SCRAM-SHA-512', got 'MD5'"),
    ({"security_protocol": "SSL", "ssl_cafile": "/nonexistent/ca.pem"},
     "kafka.ssl_cafile: no such file: '/nonexistent/ca.pem'"),
])
def test_misconfigured_security_fails_at_settings_validation(kafka: dict[str, Any], message: str) -> None:
    assert message in _settings_problem(kafka)


def test_tls_files_are_checked_at_settings_validation(pki: Pki) -> None:
    assert "kafka: ssl_cafile is set but security_protocol is PLAINTEXT, which does not use TLS (use SSL or " \
           "SASL_SSL)" in _settings_problem({"ssl_cafile": str(pki.ca)})
    assert "kafka: ssl_certfile and ssl_keyfile go together: a client certificate needs its private key" in \
        _settings_problem({"security_protocol": "SSL", "ssl_certfile": str(pki.client_cert)})
    assert "kafka: ssl_key_password is set but there is no ssl_keyfile" in \
        _settings_problem({"security_protocol": "SSL", "ssl_key_password": "x"})
    assert "kafka.ssl_keyfile: no such file" in _settings_problem(
        {"security_protocol": "SSL", "ssl_certfile": str(pki.client_cert), "ssl_keyfile": str(pki.ca) + ".gone"})


def test_tls_files_that_do_not_load_stop_the_process_at_start_up(pki: Pki, tmp_path: Path) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="cannot load the TLS files"):
        KafkaClients(KafkaSettings(security_protocol="SSL", ssl_cafile=garbage))
    wrong_password = ssl_client_cert(pki).model_copy(update={"ssl_key_password": None})
    with pytest.raises(ConfigError, match="ssl_keyfile="):
        KafkaClients(KafkaSettings.model_validate(wrong_password.model_dump() | {"ssl_key_password": "wrong"}))


# ---- nobody else builds a Kafka client --------------------------------------------------------------------------

KAFKA_CLIENTS = {"AIOKafkaProducer", "AIOKafkaConsumer", "AIOKafkaAdminClient",
                 "KafkaAdminClient", "KafkaProducer", "KafkaConsumer"}  # aiokafka's, and kafka-python's
# The one exception, with its reason: kafka-python's admin client is the only Python client with the ACL API, used by
# the dev tools to grant a secured test broker's ACLs; its settings are the admin's KafkaSettings, mapped there.
ALLOWED = {"tokenpools_dev.devstack.kafka_security"}
SECURITY_KEYWORDS = {"security_protocol", "ssl_context", "sasl_mechanism", "sasl_plain_username",
                     "sasl_plain_password", "broker_credentials"}
FACTORY = "tokenpools.runtime.kafka"


COMPONENTS = ("topics", "proxy", "streams", "controllers", "replay")  # folders package-dir maps into tokenpools.*


def _product_modules() -> dict[str, Path]:
    """Every module of the installed package, wherever package-dir put it (an editable install finds the mapped
    folders only by name, so the components are named; everything under tokenpools/ is found by walking)."""
    modules = {"tokenpools": Path(tokenpools.__file__)}
    packages = {info.name for info in pkgutil.iter_modules(tokenpools.__path__, "tokenpools.")}
    for name in sorted(packages | {f"tokenpools.{c}" for c in COMPONENTS}):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin, name
        if spec.origin.endswith(".py"):  # not the accelerator's shared library (tokenpools._accel__mypyc)
            modules[name] = Path(spec.origin)
        for info in pkgutil.walk_packages(spec.submodule_search_locations or [], f"{name}."):
            found = importlib.util.find_spec(info.name)
            if found is not None and found.origin and found.origin.endswith(".py"):
                modules[info.name] = Path(found.origin)
    import tokenpools_dev  # the dev tooling builds its clients through the same factory

    root = Path(tokenpools_dev.__file__).parent
    modules |= {"tokenpools_dev." + ".".join(path.relative_to(root).with_suffix("").parts): path
                for path in root.rglob("*.py")}
    return modules


def _called(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _client_names(tree: ast.AST) -> set[str]:
    """What a client class is called by in one module: its own name (also as ``aiokafka.AIOKafkaProducer``) and
    any alias an import gives it (``from aiokafka import AIOKafkaProducer as Producer``)."""
    names = set(KAFKA_CLIENTS)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= {a.asname for a in node.names if a.asname and a.name.rsplit(".", 1)[-1] in KAFKA_CLIENTS}
    return names


def _kafka_client_calls(tree: ast.AST) -> list[str]:
    """Every call that constructs an aiokafka client (a name in an annotation or an import is not one)."""
    names = _client_names(tree)
    return [f"{name}() at line {node.lineno}" for node in ast.walk(tree)
            if isinstance(node, ast.Call) and (name := _called(node)) in names]


def _constructs_kafka_clients(source: str) -> list[str]:
    """Client constructions, and security arguments given to any call."""
    tree = ast.parse(source)
    return _kafka_client_calls(tree) + [f"{kw.arg}= at line {node.lineno}" for node in ast.walk(tree)
                                        if isinstance(node, ast.Call)
                                        for kw in node.keywords if kw.arg in SECURITY_KEYWORDS]


def test_no_module_outside_the_runtime_constructs_a_kafka_client() -> None:
    modules = _product_modules()
    assert {"tokenpools.proxy.app", "tokenpools.streams.app", "tokenpools.controllers.app",
            "tokenpools.replay.recorder", FACTORY} <= modules.keys()
    offenders = {name: found for name, path in modules.items() if name != FACTORY and name not in ALLOWED
                 and (found := _constructs_kafka_clients(path.read_text(encoding="utf-8")))}
    assert offenders == {}
    assert all(_constructs_kafka_clients(modules[name].read_text(encoding="utf-8")) for name in ALLOWED)  # still needed
    assert "tokenpools_dev.streams.harness" in modules
    assert _constructs_kafka_clients(modules[FACTORY].read_text(encoding="utf-8"))  # the check does see them


TESTS = Path(__file__).resolve().parents[1]


def test_no_test_constructs_a_raw_kafka_client() -> None:
    """Test clients come from the factory too (``tokenpools_dev.kafka.local_kafka``), so a secured test broker
    reaches every one of them. Security arguments are not looked for here: tests give them to ``KafkaSettings`` on
    purpose, and the factory refuses them as a client's overrides."""
    files = sorted(TESTS.rglob("*.py"))
    assert {TESTS / "integration" / "proxy_fixtures.py", TESTS / "integration" / "test_kafka_broker.py",
            Path(__file__).resolve()} <= set(files)
    offenders = {str(path.relative_to(TESTS)): found for path in files
                 if (found := _kafka_client_calls(ast.parse(path.read_text(encoding="utf-8"))))}
    assert offenders == {}


def test_the_scan_finds_a_client_by_its_name_through_its_module_or_under_an_alias() -> None:
    source = (
        "import aiokafka\n"
        "from aiokafka import AIOKafkaConsumer as Reader\n"
        "from aiokafka.admin import AIOKafkaAdminClient\n"
        "def f(admin: AIOKafkaAdminClient, reader: Reader) -> None:\n"
        "    Reader('topic', group_id=None)\n"
        "    aiokafka.AIOKafkaProducer(acks='all')\n"
        "    AIOKafkaAdminClient()\n"
    )
    assert sorted(_kafka_client_calls(ast.parse(source))) == [
        "AIOKafkaAdminClient() at line 7", "AIOKafkaProducer() at line 6", "Reader() at line 5"]
    assert _kafka_client_calls(ast.parse(source.split("def f")[0])) == []  # imports alone construct nothing
