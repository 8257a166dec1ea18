"""A real single-node Apache Kafka 4.x broker (KRaft, combined broker + controller) on loopback.

Why a real broker: the streams and the proxy rely on what only Kafka does -- compaction, consumer-group
offsets, idempotent ordered produce, and clients that survive a broker going away and coming back.
:class:`KafkaBroker` takes the broker away (:meth:`~KafkaBroker.kill`, :meth:`~KafkaBroker.pause`) and
brings it back on the same port and data dir (:meth:`~KafkaBroker.restart`, :meth:`~KafkaBroker.resume`).

The jars come from Maven Central: ``scripts/install-kafka.sh`` copies the runtime classpath of
``tools/kafka/pom.xml`` to ``$TOKENPOOLS_CACHE/kafka-<version>/libs`` (default cache ``~/.cache/tokenpools``).
This module never downloads anything. It is an I/O shell: nothing happens at import time, and a process
is started only by :meth:`KafkaBroker.start`.

Start-up speed on 2 cores: the JVM runs C1 only and maps its classes from an AppCDS archive that the
first broker to stop gracefully writes next to the jars (see :data:`JVM_OPTS`).

The methods block. From async code use ``await asyncio.to_thread(broker.restart)`` so the event loop,
and the clients under test, keep running meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import concurrent.futures
import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from aiokafka.admin import AIOKafkaAdminClient

from tokenpools.errors import PermanentError

KAFKA_VERSION: Final = "4.1.2"
"""Must equal ``<kafka.version>`` in ``tools/kafka/pom.xml`` (a test checks it)."""

NODE_ID: Final = 1

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
    cache = os.environ.get("TOKENPOOLS_CACHE") or str(Path.home() / ".cache" / "tokenpools")
    return Path(cache) / f"kafka-{version}"


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


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tcp_open(port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s):
            return True
    except OSError:
        return False


async def probe_metadata(bootstrap: str, timeout_s: float) -> None:
    """One Metadata round-trip through aiokafka; raises unless this node is listed as a broker."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=max(1, int(timeout_s * 1000)))
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            cluster = await admin.describe_cluster()
    finally:
        await admin.close()
    if not any(b["node_id"] == NODE_ID for b in cluster["brokers"]):
        raise KafkaBrokerError(f"metadata from {bootstrap} lists no broker {NODE_ID}: {cluster}")


# -- the broker -----------------------------------------------------------------------------------


class KafkaBroker:
    """One Kafka process on ``127.0.0.1:port`` with its data in ``workdir/data``.

    Free ports are picked at construction, so :attr:`bootstrap` is known before :meth:`start` and
    stays the same across restarts. Without ``workdir`` a temporary one is made and :meth:`close`
    deletes it; a given ``workdir`` is kept (its ``broker.log`` helps after a failure) and its data is
    reused by the next broker started on it.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        controller_port: int | None = None,
        workdir: Path | str | None = None,
        home: Path | None = None,
        log_level: str = "info",
        startup_timeout_s: float = 90.0,
        stop_grace_s: float = 30.0,
        write_cds_archive: bool = True,
    ) -> None:
        self.port = port or free_loopback_port()
        self.controller_port = controller_port or free_loopback_port()
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="tokenpools-kafka-"))
        self.home = home or install_dir()
        self.log_level = log_level
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s  # the first graceful stop also writes the CDS archive (~5 s)
        self.write_cds_archive = write_cds_archive
        self.startup_seconds = 0.0
        """Wall time of the last :meth:`start`, from launching java to a Metadata round-trip."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._paused = False
        self._archive_part: Path | None = None

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT``, for ``bootstrap_servers=``."""
        return f"127.0.0.1:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        """stdout+stderr of every JVM run on this workdir (format, start, restarts), appended."""
        return self.workdir / "broker.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def is_running(self) -> bool:
        """The process exists (it may be paused); says nothing about readiness."""
        return self.pid is not None

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> Self:
        """Format the data dir if new, launch the JVM, block until a Metadata request succeeds."""
        if self.is_running:
            raise KafkaBrokerError(f"broker on {self.bootstrap} is already running (pid {self.pid})")
        libs, java = find_libs(self.home), find_java()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "server.properties"
        props = broker_properties(port=self.port, controller_port=self.controller_port, data_dir=self.data_dir)
        config.write_text(render_properties(props))
        archive = cds_archive_path(self.home, java)
        share = [f"-XX:SharedArchiveFile={archive}"] if archive.is_file() else []
        jvm = [str(java), *JVM_OPTS, "-cp", f"{libs}/*"]
        if not (self.data_dir / "meta.properties").is_file():
            self._format([*jvm, *share], config)
        started = time.monotonic()
        self._proc = self._run_logged(
            f"starting broker on {self.bootstrap}",
            [*jvm, *(share or self._dump_opts(archive)), f"-Dorg.slf4j.simpleLogger.defaultLogLevel={self.log_level}",
             *LOG_OPTS, f"-Dkafka.logs.dir={self.workdir}", "kafka.Kafka", str(config)],
            background=True,
        )  # fmt: skip
        (self.workdir / "broker.pid").write_text(f"{self._proc.pid}\n")
        try:
            self._wait_ready(started + self.startup_timeout_s)
        except BaseException:
            self.kill()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        """SIGTERM (controlled shutdown), SIGKILL after ``stop_grace_s``. A restart after it is quick."""
        if (proc := self._proc) is None:
            return
        graceful = True
        if proc.poll() is None:
            self.resume()  # a stopped process cannot act on SIGTERM
            proc.terminate()
            try:
                proc.wait(self.stop_grace_s)
            except subprocess.TimeoutExpired:
                graceful = False
                proc.kill()
                proc.wait()
        self._forget(publish_archive=graceful)

    def kill(self) -> None:
        """SIGKILL, like a crash. Acked writes survive (they are in the page cache); the restart waits
        ``broker.session.timeout.ms`` (3 s) for the dead incarnation's registration to expire."""
        if (proc := self._proc) is None:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        self._forget(publish_archive=False)

    def restart(self) -> Self:
        """Stop if running, then start again on the same ports and data dir."""
        self.stop()
        return self.start()

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing answers, like a hung or partitioned broker."""
        if (pid := self.pid) is not None and not self._paused:
            os.kill(pid, signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`. Keep pauses under 3 s or the controller fences the broker."""
        if (pid := self.pid) is not None and self._paused:
            os.kill(pid, signal.SIGCONT)
        self._paused = False

    def detach(self) -> int:
        """Leave the broker running (in its own session) after this object is gone; returns the pid."""
        if (pid := self.pid) is None:
            raise KafkaBrokerError(f"broker on {self.bootstrap} is not running")
        self._proc = None
        return pid

    def close(self) -> None:
        """:meth:`stop`, and delete the workdir if this object made it."""
        self.stop()
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "<no log>"

    # -- internals ----------------------------------------------------------------------------------
    def _format(self, jvm: Sequence[str], config: Path) -> None:
        """``kafka-storage.sh format --standalone``: a one-voter dynamic quorum (KIP-853)."""
        self._run_logged(
            "formatting storage",
            [*jvm, "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "kafka.tools.StorageTool", "format",
             "--standalone", "--ignore-formatted", "--cluster-id", new_cluster_id(), "--config", str(config)],
        )  # fmt: skip

    def _dump_opts(self, archive: Path) -> list[str]:
        """No archive yet: this JVM writes one as it exits; a graceful :meth:`stop` publishes it."""
        if not self.write_cds_archive:
            return []
        _remove_stale_parts(self.home)
        self._archive_part = archive.with_name(f"{archive.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.part")
        return [f"-XX:ArchiveClassesAtExit={self._archive_part}"]

    def _run_logged(self, what: str, command: Sequence[str], *, background: bool = False) -> subprocess.Popen[bytes]:
        """Run ``command`` with its output appended to :attr:`log_path`; wait unless ``background``."""
        with open(self.log_path, "ab") as log:
            log.write(f"\n--- tokenpools: {what} ---\n".encode())
            log.flush()
            proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        if not background and proc.wait() != 0:
            raise KafkaBrokerError(f"{what} in {self.workdir} failed ({proc.returncode}):\n{self.log_tail()}")
        return proc

    def _wait_ready(self, deadline: float) -> None:
        """TCP accept first (cheap), then a Metadata round-trip in a private event loop."""
        last_error: BaseException | None = None
        with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-probe") as pool:
            while self._proc is not None and self._proc.poll() is None:
                if (remaining := deadline - time.monotonic()) <= 0:
                    raise KafkaBrokerError(
                        f"broker on {self.bootstrap} not ready after {self.startup_timeout_s:.0f} s "
                        f"(last probe error: {last_error!r}); log {self.log_path}:\n{self.log_tail()}"
                    )
                if tcp_open(self.port):
                    try:
                        pool.submit(asyncio.run, probe_metadata(self.bootstrap, min(5.0, remaining))).result()
                        return
                    except Exception as e:  # noqa: BLE001 -- any failure means "not ready yet"
                        last_error = e
                time.sleep(0.05)
        code = self._proc.returncode if self._proc is not None else None
        raise KafkaBrokerError(f"broker on {self.bootstrap} exited with {code}:\n{self.log_tail()}")

    def _forget(self, *, publish_archive: bool) -> None:
        """The process is gone: drop handle and pid file; publish a complete CDS dump, drop a partial one."""
        self._proc, self._paused = None, False
        (self.workdir / "broker.pid").unlink(missing_ok=True)
        part, self._archive_part = self._archive_part, None
        if part is not None and part.is_file():
            if publish_archive:
                os.replace(part, part.with_name(part.name.split(".jsa.", 1)[0] + ".jsa"))
            else:
                part.unlink()


def _remove_stale_parts(home: Path, max_age_s: float = 3600.0) -> None:
    """Dumps whose broker outlived its Python process (SIGTERM'd by someone else) are never published."""
    for part in home.glob("broker-*.jsa.*.part"):
        with contextlib.suppress(OSError):
            if time.time() - part.stat().st_mtime > max_age_s:
                part.unlink()


# -- a long-running broker for manual development (scripts/kafka.sh) ------------------------------


def _live_pid(workdir: Path) -> int | None:
    """The pid in ``workdir/broker.pid`` if that process is still a ``kafka.Kafka`` of this workdir."""
    try:
        pid = int((workdir / "broker.pid").read_text())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if b"kafka.Kafka" in argv and str(workdir / "server.properties").encode() in argv else None


def main(argv: Sequence[str] | None = None) -> int:
    """``start`` leaves the broker running in the background; ``stop`` and ``status`` find it by pid file."""
    parser = argparse.ArgumentParser(prog="scripts/kafka.sh", description="A dev Kafka broker on loopback.")
    parser.add_argument("command", choices=("start", "stop", "status"))
    parser.add_argument("--port", type=int, default=19092, help="the controller listens on port + 1")
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args(argv)
    workdir: Path = args.workdir.resolve()
    pid, bootstrap = _live_pid(workdir), f"127.0.0.1:{args.port}"
    if args.command == "status":
        print(f"kafka: running, pid {pid}, {bootstrap}" if pid else f"kafka: not running ({workdir})")
        return 0 if pid else 3
    if args.command == "stop":
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
            (workdir / "broker.pid").unlink(missing_ok=True)
        print(f"kafka: stopped pid {pid}" if pid else "kafka: not running")
        return 0
    if pid is not None:
        print(f"kafka: already running, pid {pid}, {bootstrap}")
        return 0
    broker = KafkaBroker(port=args.port, controller_port=args.port + 1, workdir=workdir, write_cds_archive=False)
    try:
        broker.start()
    except KafkaBrokerError as e:
        print(f"kafka: {e}", file=sys.stderr)
        return 1
    print(f"kafka: ready on {broker.bootstrap} in {broker.startup_seconds:.1f} s, pid {broker.detach()}")
    print(f"kafka: data {broker.data_dir}, log {broker.log_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
