"""Kafka clients for the dev tooling, from the product's one client factory (``tokenpools.runtime.kafka``).

The local stack's broker is reached by a bootstrap address alone; building every client through ``KafkaClients``
keeps the factory the only place in the repository that constructs one, so a security setting added there reaches
the tooling too.
"""

from __future__ import annotations

from tokenpools.config import KafkaSettings
from tokenpools.runtime.kafka import KafkaClients


def local_kafka(bootstrap: str, client_id: str = "tokenpools-dev") -> KafkaClients:
    """The client factory for a plaintext local broker at ``bootstrap`` (``host:port[,host:port]``)."""
    return KafkaClients(KafkaSettings(bootstrap_servers=bootstrap, client_id=client_id))
