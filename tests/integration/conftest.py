"""Session fixtures for the integration tier: one real Kafka broker per test session.

The broker is the project's own (:class:`tokenpools.devstack.kafka.KafkaBroker`, jars installed by
``scripts/install-kafka.sh``). A missing install FAILS the tests with the command to run: a skipped
integration test would let CI pass without ever talking to Kafka.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tokenpools.devstack.kafka import KafkaBroker, KafkaBrokerError

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
