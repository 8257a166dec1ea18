"""What a dev Kafka broker is made of, apart from its process: the install it runs from (jars, java, the class-data
archive) and the one source of its ``server.properties``.

The jars come from Maven Central: ``scripts/install-kafka.sh`` copies the runtime classpath of
``tools/kafka/pom.xml`` to ``$TOKENPOOLS_CACHE/kafka-<version>/libs`` (default cache ``~/.cache/tokenpools``).
Nothing here downloads anything or runs at import time; ``devstack.kafka.KafkaBroker`` starts the process.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from tokenpools.errors import PermanentError
from tokenpools_dev.devstack.process import cache_dir

KAFKA_VERSION: Final = "4.1.2"
"""Must equal ``<kafka.version>`` in ``tools/kafka/pom.xml`` (a test checks it)."""

NODE_ID: Final = 1
"""The single combined broker + controller node."""

JVM_OPTS: Final = (
    "-Xms256m",  # modest: the machine is shared (Kafka's scripts default to 1g/1g)
    "-Xmx1g",
    # kafka-run-class.sh's GC settings.
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    # C1 only: a test broker never lives long enough to profit from C2, whose compile threads compete
    # with start-up on 2 cores. Together with the AppCDS archive this is 2-3x faster to a ready broker.
    "-XX:TieredStopAtLevel=1",
    # A missing or stale archive just means no sharing; don't fill the log about it.
    "-Xlog:cds*=error",
    "-Djava.awt.headless=true",
)
LOG_OPTS: Final = (
    "-Dorg.slf4j.simpleLogger.showDateTime=true",
    "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
    # Each start would log the full ~340-line config six times; server.properties has it.
    "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.common.config.AbstractConfig=warn",
)


class KafkaBrokerError(PermanentError):
    """The broker could not be started or stopped; the message says why (with the log tail)."""


class KafkaNotInstalledError(KafkaBrokerError):
    """The jars or java are missing; the message names what to run."""


# -- installation ---------------------------------------------------------------------------------


def install_dir(version: str = KAFKA_VERSION) -> Path:
    """Where ``scripts/install-kafka.sh`` puts ``libs/`` and, last, its ``.complete`` marker."""
    return cache_dir() / f"kafka-{version}"


def find_libs(home: Path) -> Path:
    if not (home / ".complete").is_file():
        raise KafkaNotInstalledError(
            f"Apache Kafka {KAFKA_VERSION} is not installed in {home} (no .complete marker): "
            "run scripts/install-kafka.sh"
        )
    return home / "libs"


def find_java() -> Path:
    """``$JAVA_HOME/bin/java`` if set, else ``java`` on PATH (Kafka 4.x brokers need Java 17+)."""
    if (java_home := os.environ.get("JAVA_HOME")) and (java := Path(java_home) / "bin" / "java").is_file():
        return java
    if found := shutil.which("java"):
        return Path(found)
    raise KafkaNotInstalledError("java not found (Kafka 4.x needs Java 17+): apt-get install openjdk-17-jre-headless")


def cds_archive_path(home: Path, java: Path) -> Path:
    """The class-data archive for this JDK build and this install of the jars.

    The JVM ignores an archive whose JDK or jars changed; keying the name on both makes an upgrade or
    a re-install write a fresh archive instead of silently running without one.
    """
    real = java.resolve()
    stamp = f"{real}:{real.stat().st_mtime_ns}:{(home / '.complete').stat().st_mtime_ns}"
    return home / f"broker-{hashlib.sha256(stamp.encode()).hexdigest()[:12]}.jsa"


# -- configuration: the one source of server.properties ------------------------------------------


def broker_properties(*, port: int, controller_port: int, data_dir: Path) -> dict[str, str]:
    """A single combined node on 127.0.0.1.

    Kafka 4.x's sample ``config/server.properties`` with replication factors 1 and no rebalance delay,
    plus timers shortened so that retention and compaction happen within a test's lifetime.
    """
    controller = f"127.0.0.1:{controller_port}"
    listeners = f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://{controller}"
    return {
        "process.roles": "broker,controller",
        "node.id": str(NODE_ID),
        "controller.quorum.bootstrap.servers": controller,
        "listeners": listeners,
        "advertised.listeners": listeners,
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "num.recovery.threads.per.data.dir": "1",
        "auto.create.topics.enable": "true",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # After a crash (SIGKILL) the restarted node's registration is refused as a duplicate until
        # the old session expires: 9 s by default, 3 s here. Heartbeats come well within it.
        "broker.heartbeat.interval.ms": "500",
        "broker.session.timeout.ms": "3000",
        # Retention and compaction within seconds, not after the production 30 s / 5 min / 15 s.
        # A test that wants compaction sets `segment.ms` on its topic: only closed segments compact.
        "log.initial.task.delay.ms": "500",
        "log.retention.check.interval.ms": "1000",
        "log.cleaner.backoff.ms": "500",
        "log.segment.bytes": str(8 * 1024 * 1024),
        "log.segment.delete.delay.ms": "1000",
        "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),  # default 128 MiB of a 1 GiB heap
    }


def render_properties(props: Mapping[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in props.items())


def new_cluster_id() -> str:
    """A random id in Kafka's own form (url-safe base64 of 16 bytes), never starting with '-'."""
    while (cid := base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()).startswith("-"):
        pass  # would read as a command-line option
    return cid
