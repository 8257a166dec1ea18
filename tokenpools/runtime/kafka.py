"""The only place that constructs Kafka clients: producers, consumers, admin clients and the Faust app's broker
settings, all from the ``kafka`` settings group.

A component asks ``KafkaClients`` for a client and adds only what is its own business — a client-id suffix, acks,
a group, offsets, timeouts. The connection and its security (bootstrap servers, ``security_protocol``, the SASL
mechanism and credentials, the TLS context with its CA, client certificate and hostname check) come from the
settings and cannot be overridden per call, so every client of every component reaches a secured cluster the same
way. The TLS context is built once, when ``KafkaClients`` is made (start-up), so an unreadable certificate or key
stops the process before it serves anything. aiokafka and Faust are imported only when a client is built.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from tokenpools.config import KafkaSettings
from tokenpools.errors import ConfigError, ConfigProblem, RetryableError
from tokenpools.runtime.tls import client_context
from tokenpools.topics.declarations import Topics, topics_for

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient

# what the settings decide for every client; a per-call override of one of these is a programming error
OWNED_OPTIONS = frozenset({
    "bootstrap_servers", "client_id", "security_protocol", "ssl_context", "sasl_mechanism", "sasl_plain_username",
    "sasl_plain_password", "sasl_kerberos_service_name", "sasl_kerberos_domain_name", "sasl_oauth_token_provider",
})


def ssl_context(settings: KafkaSettings) -> ssl.SSLContext | None:
    """The TLS context of SSL and SASL_SSL (None otherwise), ``runtime.tls.client_context`` of the ``kafka`` group's
    files and hostname check. Raises ConfigError when a file cannot be loaded."""
    if not settings.security_protocol.endswith("SSL"):
        return None
    password = settings.ssl_key_password.get_secret_value() if settings.ssl_key_password is not None else None
    return client_context(group="kafka", prefix="ssl_", cafile=settings.ssl_cafile, certfile=settings.ssl_certfile,
                          keyfile=settings.ssl_keyfile, key_password=password,
                          check_hostname=settings.ssl_check_hostname)


class Access(StrEnum):
    """What one connection to the cluster says about this process's settings (``KafkaClients.check_access``)."""

    OK = "ok"  # connected and authenticated
    UNREACHABLE = "unreachable"  # no broker answered (an outage: the components ride it out)
    AUTHENTICATION_FAILED = "authentication_failed"  # wrong user, password or mechanism
    TLS_FAILED = "tls_failed"  # the broker's certificate did not verify, or it refused ours, or it speaks no TLS


class KafkaClients:
    """Every Kafka client of one process, built from its ``kafka`` settings (see the module docstring)."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._ssl_context = ssl_context(settings)

    @property
    def bootstrap_servers(self) -> str:
        return self.settings.bootstrap_servers

    @property
    def topic_prefix(self) -> str:
        return self.settings.topic_prefix

    def topics(self) -> Topics:
        """The deployment's topics: ``kafka.topic_prefix`` names them, pool-keyed ones have ``kafka.topic_partitions``."""
        return topics_for(self.settings.topic_prefix, self.settings.topic_partitions)

    def client_id(self, suffix: str) -> str:
        """``<kafka.client_id>-<suffix>``: brokers' logs and quotas tell the components apart by it."""
        return f"{self.settings.client_id}-{suffix}" if suffix else self.settings.client_id

    def security(self) -> dict[str, Any]:
        """aiokafka's security arguments (the same for producers, consumers and admin clients)."""
        s = self.settings
        options: dict[str, Any] = {"security_protocol": s.security_protocol}
        if self._ssl_context is not None:
            options["ssl_context"] = self._ssl_context
        if s.security_protocol.startswith("SASL_"):
            assert s.sasl_mechanism and s.sasl_username and s.sasl_password is not None  # KafkaSettings checked it
            options.update(sasl_mechanism=s.sasl_mechanism, sasl_plain_username=s.sasl_username,
                           sasl_plain_password=s.sasl_password.get_secret_value())
        return options

    def _options(self, suffix: str, overrides: dict[str, Any]) -> dict[str, Any]:
        owned = sorted(OWNED_OPTIONS & overrides.keys())
        if owned:
            raise ValueError(f"{', '.join(owned)} come from the kafka settings, not from the caller")
        return {"bootstrap_servers": self.settings.bootstrap_servers, "client_id": self.client_id(suffix),
                **self.security(), **overrides}

    def producer(self, suffix: str, **overrides: Any) -> AIOKafkaProducer:
        """A new (not started) producer; ``overrides`` are aiokafka producer arguments such as ``acks``."""
        from aiokafka import AIOKafkaProducer

        return AIOKafkaProducer(**self._options(suffix, overrides))

    def consumer(self, suffix: str, **overrides: Any) -> AIOKafkaConsumer:
        """A new (not started) consumer with no topics; ``overrides`` such as ``group_id``, ``auto_offset_reset``."""
        from aiokafka import AIOKafkaConsumer

        return AIOKafkaConsumer(**self._options(suffix, overrides))

    def admin(self, suffix: str, **overrides: Any) -> AIOKafkaAdminClient:
        """A new (not started) admin client; ``overrides`` such as ``request_timeout_ms``."""
        from aiokafka.admin import AIOKafkaAdminClient

        return AIOKafkaAdminClient(**self._options(suffix, overrides))

    def producer_factory(self, suffix: str, **overrides: Any) -> Callable[[], AIOKafkaProducer]:
        """What a loop that replaces a failed producer holds: each call makes a new one."""
        self._options(suffix, overrides)  # a bad override fails here, at wiring time, not at the first reconnect
        return lambda: self.producer(suffix, **overrides)

    def consumer_factory(self, suffix: str, **overrides: Any) -> Callable[[], AIOKafkaConsumer]:
        self._options(suffix, overrides)
        return lambda: self.consumer(suffix, **overrides)

    async def check_access(self, timeout_s: float = 10.0) -> tuple[Access, str]:
        """Open one connection to the first bootstrap server that answers, with this process's security, and say
        what happened. A client's own start-up reports a refused login as "unable to bootstrap", like an outage;
        this tells them apart, so a component stops at start-up with the real reason instead of retrying a
        password that will never work."""
        import asyncio

        from aiokafka.conn import create_conn
        from aiokafka.errors import KafkaError, SaslAuthenticationFailed, UnsupportedSaslMechanismError

        reasons = []
        for server in self.settings.bootstrap_servers.split(","):
            host, _, port = server.rpartition(":")
            try:
                conn = await asyncio.wait_for(create_conn(
                    host, int(port), client_id=self.client_id("access-check"),
                    request_timeout_ms=int(timeout_s * 1000), **self.security()), timeout_s)
            except (SaslAuthenticationFailed, UnsupportedSaslMechanismError) as exc:
                return Access.AUTHENTICATION_FAILED, f"{server}: {exc}"
            except ssl.SSLError as exc:
                return Access.TLS_FAILED, f"{server}: {exc.reason or exc}"
            except (KafkaError, OSError, asyncio.TimeoutError) as exc:
                reasons.append(f"{server}: {exc!r}")
                continue
            conn.close()
            return Access.OK, server
        return Access.UNREACHABLE, "; ".join(reasons)

    async def require_access(self, component: str, timeout_s: float = 10.0) -> Access:
        """``check_access``, raising ``ConfigError`` for credentials or TLS settings that cannot work; an
        unreachable cluster is returned, for the component to ride out as it does any outage."""
        access, detail = await self.check_access(timeout_s)
        if access in (Access.AUTHENTICATION_FAILED, Access.TLS_FAILED):
            what = ("the broker refused the login (kafka.sasl_username / sasl_password / sasl_mechanism)"
                    if access is Access.AUTHENTICATION_FAILED else
                    "TLS to the broker failed (kafka.ssl_cafile / ssl_certfile / ssl_keyfile / security_protocol)")
            raise ConfigError([ConfigProblem("kafka settings", f"{component}: {what}: {detail}", path="kafka")])
        return access

    async def require_reachable(self, component: str, timeout_s: float = 10.0) -> None:
        """``require_access``, and an unreachable cluster is an error too: for a command that reads or records
        once and has no outage to ride out (``record``, ``usage``, ``top``), rather than a client's traceback."""
        if await self.require_access(component, timeout_s) is Access.UNREACHABLE:
            raise RetryableError(f"no Kafka broker answered at {self.bootstrap_servers} (kafka.bootstrap_servers)")

    def faust_broker(self, suffix: str) -> dict[str, Any]:
        """The Faust app's broker settings: ``broker``, ``broker_client_id`` and ``broker_credentials`` (keyword
        arguments of ``faust.App``); Faust hands the credentials to every client it makes."""
        return {"broker": [f"kafka://{server}" for server in self.settings.bootstrap_servers.split(",")],
                "broker_client_id": self.client_id(suffix), "broker_credentials": self.faust_credentials()}

    def faust_credentials(self) -> Any:
        """Faust's credentials object for the security settings (None for PLAINTEXT)."""
        s = self.settings
        if s.security_protocol == "PLAINTEXT":
            return None
        import faust

        if s.security_protocol == "SSL":
            return faust.SSLCredentials(self._ssl_context)
        assert s.sasl_password is not None  # KafkaSettings checked it
        # with an SSL context Faust's SASLCredentials is SASL_SSL, without one SASL_PLAINTEXT
        return faust.SASLCredentials(username=s.sasl_username, password=s.sasl_password.get_secret_value(),
                                     ssl_context=self._ssl_context, mechanism=s.sasl_mechanism)
