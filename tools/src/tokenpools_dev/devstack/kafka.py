"""A real single-node Apache Kafka 4.x broker (KRaft, combined broker + controller) on loopback.

Why a real broker: the streams and the proxy rely on what only Kafka does -- compaction, consumer-group
offsets, idempotent ordered produce, and clients that survive a broker going away and coming back.
:class:`KafkaBroker` takes the broker away (:meth:`~KafkaBroker.kill`, :meth:`~KafkaBroker.pause`) and
brings it back on the same port and data dir (:meth:`~KafkaBroker.restart`, :meth:`~KafkaBroker.resume`);
it is ready when it serves every kind of client a test has (:func:`probe_serving`), not merely when it
answers Metadata.

The install it runs from and its ``server.properties`` are ``devstack.kafka_config``. This module never
downloads anything. It is an I/O shell: nothing happens at import time, and a process is started only by
:meth:`KafkaBroker.start`.

Start-up speed on 2 cores: the JVM runs C1 only and maps its classes from an AppCDS archive that the
first broker to stop gracefully writes next to the jars (see ``kafka_config.JVM_OPTS``).

The methods block. From async code use ``await asyncio.to_thread(broker.restart)`` so the event loop,
and the clients under test, keep running meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from tokenpools_dev.devstack.kafka_config import (
    JVM_OPTS,
    KAFKA_VERSION,
    LOG_OPTS,
    NODE_ID,
    KafkaBrokerError,
    KafkaNotInstalledError,
    broker_properties,
    cds_archive_path,
    find_java,
    find_libs,
    install_dir,
    new_cluster_id,
    render_properties,
)
from tokenpools.runtime.kafka import KafkaClients
from tokenpools_dev.devstack.kafka_security import ADMIN, BrokerSecurity
from tokenpools_dev.kafka import local_kafka
from tokenpools_dev.devstack.process import free_port, kill_process, log_tail, spawn_logged, stop_process, tcp_open

__all__ = ["KAFKA_VERSION", "KafkaBroker", "KafkaBrokerError", "KafkaNotInstalledError", "probe_metadata",
           "probe_serving", "tcp_open"]

PROBE_GROUP: Final = "tokenpools-readiness-probe"
"""A group no client joins: DescribeGroups for it tells whether the group coordinator has loaded."""


# -- readiness ------------------------------------------------------------------------------------


async def probe_metadata(bootstrap: str, timeout_s: float, kafka: KafkaClients | None = None) -> None:
    """One Metadata round-trip through aiokafka; raises unless this node is listed as a broker. ``kafka``: the
    clients to probe with (default plaintext to ``bootstrap``)."""
    admin = (kafka or local_kafka(bootstrap)).admin("probe", request_timeout_ms=max(1, int(timeout_s * 1000)))
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            cluster = await admin.describe_cluster()
    finally:
        await admin.close()
    if not any(b["node_id"] == NODE_ID for b in cluster["brokers"]):
        raise KafkaBrokerError(f"metadata from {bootstrap} lists no broker {NODE_ID}: {cluster}")


async def probe_serving(bootstrap: str, timeout_s: float, kafka: KafkaClients | None = None) -> None:
    """Raises unless the node serves every client a test has: more than :func:`probe_metadata`.

    After a crash the restarted node answers Metadata while its partitions are still leaderless (the
    controller unfences it and re-elects it a moment later) and while the group coordinator is still
    loading ``__consumer_offsets`` (OffsetFetch then answers "load in progress", which aiokafka's admin
    client reports as *no offsets*). So: this node is listed as broker and as controller, leads every
    partition of every topic, and -- once ``__consumer_offsets`` exists -- answers DescribeGroups for a
    probe group without error (a fresh broker is not made to create that topic). ``kafka``: as for
    :func:`probe_metadata`.
    """
    admin = (kafka or local_kafka(bootstrap)).admin("probe", request_timeout_ms=max(1, int(timeout_s * 1000)))
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            cluster = await admin.describe_cluster()
            topics = await admin.describe_topics()
            coordinator = None
            if any(t["topic"] == "__consumer_offsets" for t in topics):
                [described] = await admin.describe_consumer_groups([PROBE_GROUP])
                coordinator = described.to_object()["groups"]
    finally:
        await admin.close()
    if not any(b["node_id"] == NODE_ID for b in cluster["brokers"]) or cluster["controller_id"] != NODE_ID:
        raise KafkaBrokerError(f"metadata from {bootstrap} lists no broker/controller {NODE_ID}: {cluster}")
    unled = [(t["topic"], p["partition"], p["error_code"]) for t in topics for p in t["partitions"]
             if t["error_code"] or p["error_code"] or p["leader"] != NODE_ID]  # fmt: skip
    if unled:
        raise KafkaBrokerError(f"partitions without leader {NODE_ID} on {bootstrap}: {unled[:5]}")
    if coordinator is not None and any(g["error_code"] for g in coordinator):
        raise KafkaBrokerError(f"group coordinator on {bootstrap} not ready: {coordinator}")


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
        security: BrokerSecurity | None = None,
    ) -> None:
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        self.security = security  # SASL_SSL + SSL listeners and ACLs (devstack.kafka_security); None: plaintext
        self.ssl_port = free_port() if security is not None else None
        if security is not None:
            security.bootstrap, security.ssl_bootstrap = self.bootstrap, f"127.0.0.1:{self.ssl_port}"
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="tokenpools-kafka-"))
        self.home = home or install_dir()
        self.log_level = log_level
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s  # the first graceful stop also writes the CDS archive (~5 s)
        self.write_cds_archive = write_cds_archive
        self.startup_seconds = 0.0
        """Wall time of the last :meth:`start`, from launching java to serving (:func:`probe_serving`)."""
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
        """Format the data dir if new, launch the JVM, block until it serves (:func:`probe_serving`)."""
        if self.is_running:
            raise KafkaBrokerError(f"broker on {self.bootstrap} is already running (pid {self.pid})")
        libs, java = find_libs(self.home), find_java()
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "server.properties"
        props = broker_properties(port=self.port, controller_port=self.controller_port, data_dir=self.data_dir)
        if self.security is not None:
            assert self.ssl_port is not None
            props |= self.security.broker_properties(port=self.port, ssl_port=self.ssl_port,
                                                     controller_port=self.controller_port)
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
        self.resume()  # a stopped process cannot act on SIGTERM
        graceful = stop_process(proc, self.stop_grace_s)
        self._forget(publish_archive=graceful)

    def kill(self) -> None:
        """SIGKILL, like a crash. Acked writes survive (they are in the page cache); the restart waits
        ``broker.session.timeout.ms`` (3 s) for the dead incarnation's registration to expire."""
        if (proc := self._proc) is None:
            return
        kill_process(proc)
        self._forget(publish_archive=False)

    def restart(self, attempts: int = 2) -> Self:
        """Stop if running, then start again on the same ports and data dir.

        Returns once the node serves again (see :func:`probe_serving`). A start that fails (the JVM exits,
        or is not serving within ``startup_timeout_s``) is retried on the same data, ``attempts`` in all.
        """
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.stop()
        for _ in range(attempts - 1):
            try:
                return self.start()
            except KafkaNotInstalledError:
                raise
            except KafkaBrokerError:
                continue  # start() killed what it launched; broker.log keeps why
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
        return log_tail(self.log_path, lines)

    def admin_clients(self) -> KafkaClients:
        """Clients with every right on this broker: plaintext, or the super user of a secured one."""
        if self.security is None:
            return local_kafka(self.bootstrap)
        return KafkaClients(self.security.settings(ADMIN))

    # -- internals ----------------------------------------------------------------------------------
    def _format(self, jvm: Sequence[str], config: Path) -> None:
        """``kafka-storage.sh format --standalone``: a one-voter dynamic quorum (KIP-853)."""
        self._run_logged(
            "formatting storage",
            [*jvm, "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "kafka.tools.StorageTool", "format",
             "--standalone", "--ignore-formatted", "--cluster-id", new_cluster_id(), "--config", str(config),
             *(self.security.format_args() if self.security is not None else ())],
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
        proc = spawn_logged(command, self.log_path, header=f"tokenpools: {what}")
        if not background and proc.wait() != 0:
            raise KafkaBrokerError(f"{what} in {self.workdir} failed ({proc.returncode}):\n{self.log_tail()}")
        return proc

    def _wait_ready(self, deadline: float) -> None:
        """TCP accept first (cheap), then :func:`probe_serving` in a private event loop."""
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
                        pool.submit(asyncio.run, probe_serving(self.bootstrap, min(5.0, remaining),
                                                               self.admin_clients())).result()
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
