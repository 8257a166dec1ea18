"""A secured single-node broker: SASL_SSL with SCRAM-SHA-512 users, an SSL listener for client certificates, and
Kafka's ACL authorizer — what a production cluster a platform team runs looks like to tokenpools' clients.

``BrokerSecurity.create(directory, users)`` makes a CA (``tokenpools_dev.tls``), the broker's certificate, one client
certificate per user (CN = the user name, which the SSL listener maps to ``User:<name>``), and a password per
user. ``KafkaBroker(security=...)`` then runs with:

- the client port speaking SASL_SSL (SCRAM-SHA-512; the users are created when the storage is formatted, so they
  exist before the first client connects), and ``ssl_port`` speaking SSL with ``ssl.client.auth=required``;
- the StandardAuthorizer, no access without an ACL, and ``admin`` as the only super user besides the controller
  listener's internal principal (``User:ANONYMOUS``: the combined node's own controller traffic, plaintext on
  loopback, which no client is given);
- ``settings(user)``/``ssl_settings(user)``: the ``kafka`` settings a component of that user runs with.

``grant(rules)`` applies ``tokenpools.topics.acls`` rules through kafka-python's admin client, the one Python client
with the ACL API (aiokafka has none); it is built from the admin's ``KafkaSettings`` here and nowhere else.
"""

from __future__ import annotations

import secrets
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tokenpools.config import KafkaSettings
from tokenpools.topics.acls import AclRule, Operation, Pattern, Resource
from tokenpools_dev.tls import CertificateAuthority, Issued

MECHANISM = "SCRAM-SHA-512"
ADMIN = "admin"


@dataclass(slots=True)
class BrokerSecurity:
    directory: Path
    ca: CertificateAuthority
    broker: Issued
    passwords: dict[str, str]  # user → password (the admin's too)
    certificates: dict[str, Issued]  # user → client certificate (CN = user)
    bootstrap: str = ""  # the SASL_SSL listener; set by the KafkaBroker that runs with this
    ssl_bootstrap: str = ""  # the SSL (client certificate) listener; likewise

    @classmethod
    def create(cls, directory: Path, users: Iterable[str]) -> BrokerSecurity:
        ca = CertificateAuthority.create(directory)
        names = [ADMIN, *(u for u in users if u != ADMIN)]
        return cls(directory, ca, ca.issue("broker", ["localhost", "127.0.0.1"]),
                   {u: secrets.token_urlsafe(16) for u in names}, {u: ca.issue(u, ["localhost"]) for u in names})

    # ---- the broker's side -------------------------------------------------------------------------------
    def broker_properties(self, *, port: int, ssl_port: int, controller_port: int) -> dict[str, str]:
        """What replaces the plaintext listeners of ``kafka_config.broker_properties``."""
        controller = f"127.0.0.1:{controller_port}"
        listeners = f"SASL_SSL://127.0.0.1:{port},SSL://127.0.0.1:{ssl_port},CONTROLLER://{controller}"
        keystore = self.directory / "broker-keystore.pem"
        keystore.write_bytes(self.broker.keyfile.read_bytes() + self.broker.certfile.read_bytes())
        admin_jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN}" '
                      f'password="{self.passwords[ADMIN]}";')
        return {
            "listeners": listeners,
            "advertised.listeners": listeners,
            "inter.broker.listener.name": "SASL_SSL",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": admin_jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca.cafile),
            "listener.name.ssl.ssl.client.auth": "required",
            "ssl.principal.mapping.rules": "RULE:^CN=([^,]+)$/$1/,DEFAULT",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{ADMIN};User:ANONYMOUS",
            "allow.everyone.if.no.acl.found": "false",
        }

    def format_args(self) -> list[str]:
        """``kafka-storage format`` arguments creating every user's SCRAM credential."""
        return [arg for user, password in self.passwords.items()
                for arg in ("--add-scram", f"{MECHANISM}=[name={user},password={password}]")]

    # ---- the clients' side -------------------------------------------------------------------------------
    def settings(self, user: str, password: str | None = None, bootstrap: str | None = None) -> KafkaSettings:
        """SASL_SSL as ``user`` (with another ``password`` to try a wrong one)."""
        return KafkaSettings(bootstrap_servers=bootstrap or self.bootstrap, security_protocol="SASL_SSL",
                             sasl_mechanism=MECHANISM, sasl_username=user,
                             sasl_password=password if password is not None else self.passwords[user],
                             ssl_cafile=self.ca.cafile)

    def ssl_settings(self, user: str) -> KafkaSettings:
        """SSL with ``user``'s client certificate, on the SSL listener."""
        issued = self.certificates[user]
        return KafkaSettings(bootstrap_servers=self.ssl_bootstrap, security_protocol="SSL", ssl_cafile=self.ca.cafile,
                             ssl_certfile=issued.certfile, ssl_keyfile=issued.keyfile)

    def set_items(self, user: str) -> list[str]:
        """``--set`` items for a component process running as ``user`` over SASL_SSL (the password included:
        test processes only)."""
        s = self.settings(user)
        assert s.sasl_password is not None
        return [f"kafka.bootstrap_servers={s.bootstrap_servers}", "kafka.security_protocol=SASL_SSL",
                f"kafka.sasl_mechanism={MECHANISM}", f"kafka.sasl_username={user}",
                f"kafka.sasl_password={s.sasl_password.get_secret_value()}", f"kafka.ssl_cafile={self.ca.cafile}"]

    # ---- ACLs --------------------------------------------------------------------------------------------
    def grant(self, rules: Sequence[AclRule], timeout_s: float = 30.0) -> None:
        """Create ``rules`` as allow ACLs (idempotent), as the admin."""
        with warnings.catch_warnings():  # kafka-python 3.0 reads its protocol schemas with a deprecated importlib API
            warnings.simplefilter("ignore", DeprecationWarning)
            self._grant(rules, timeout_s)

    def _grant(self, rules: Sequence[AclRule], timeout_s: float) -> None:
        from kafka.admin import (ACL, ACLOperation, ACLPermissionType, ACLResourcePatternType, KafkaAdminClient,
                                 ResourcePattern, ResourceType)

        resource = {Resource.TOPIC: ResourceType.TOPIC, Resource.GROUP: ResourceType.GROUP}
        pattern = {Pattern.LITERAL: ACLResourcePatternType.LITERAL, Pattern.PREFIXED: ACLResourcePatternType.PREFIXED}
        operation = {Operation.READ: ACLOperation.READ, Operation.WRITE: ACLOperation.WRITE,
                     Operation.CREATE: ACLOperation.CREATE, Operation.DESCRIBE: ACLOperation.DESCRIBE,
                     Operation.DESCRIBE_CONFIGS: ACLOperation.DESCRIBE_CONFIGS}
        acls = [ACL(principal=r.principal, host="*", operation=operation[r.operation],
                    permission_type=ACLPermissionType.ALLOW,
                    resource_pattern=ResourcePattern(resource[r.resource], r.name, pattern[r.pattern]))
                for r in rules]
        admin = KafkaAdminClient(**self._kafka_python_config(), request_timeout_ms=int(timeout_s * 1000))
        try:
            result = admin.create_acls(acls)
        finally:
            admin.close()
        if result["failed"]:
            raise RuntimeError(f"{len(result['failed'])} ACLs were refused: {result['failed'][:3]}")

    def _kafka_python_config(self) -> dict[str, object]:
        """kafka-python's names for the admin's ``KafkaSettings``."""
        s = self.settings(ADMIN)
        assert s.sasl_password is not None
        return {"bootstrap_servers": s.bootstrap_servers, "client_id": "tokenpools-dev-acls",
                "security_protocol": s.security_protocol, "sasl_mechanism": s.sasl_mechanism,
                "sasl_plain_username": s.sasl_username, "sasl_plain_password": s.sasl_password.get_secret_value(),
                "ssl_cafile": str(s.ssl_cafile)}
