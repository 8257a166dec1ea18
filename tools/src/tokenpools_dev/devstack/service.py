"""A pool's Service for the local stack: one stable address in front of the replicas that are up.

In Kubernetes a pool's endpoint is a Service whose ready Pods change as the Deployment scales or a node fails;
the proxies never learn Pod addresses. Locally the stack runs this process per pool instead:

- it listens on one port and splices each accepted TCP connection to the member (a simulator ``host:port``) with
  the fewest open connections (ties: round robin);
- it adds ``Connection: close`` to each request's head, so the backend closes after one response and the client
  opens a new connection for the next request: balancing is per request, not per keep-alive connection (else a
  replica added by the scaler would get no traffic from connections pooled before it existed);
- the members are a JSON list in ``--members FILE`` (written atomically by the stack), re-read when the file
  changes; a connection already spliced stays on its member, as a Pod's open connections do.

Run as ``python -m tokenpools_dev.devstack.service --listen 127.0.0.1:PORT --members FILE``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("tokenpools_dev.devstack.service")

HEAD_LIMIT = 64 * 1024
CHUNK = 64 * 1024


def add_connection_close(head: bytes) -> bytes:
    """The request head (through the blank line) with any Connection header replaced by ``Connection: close``."""
    lines = head[:-4].split(b"\r\n")
    kept = [lines[0]] + [ln for ln in lines[1:] if not ln.lower().startswith(b"connection:")]
    return b"\r\n".join([*kept, b"Connection: close"]) + b"\r\n\r\n"


def pick(members: Sequence[str], open_counts: dict[str, int], turn: int) -> str | None:
    """The member with the fewest open connections; among equals the one after ``turn`` (round robin)."""
    if not members:
        return None
    least = min(open_counts.get(m, 0) for m in members)
    candidates = [m for m in members if open_counts.get(m, 0) == least]
    return candidates[turn % len(candidates)]


def read_members(path: Path) -> list[str] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return [str(m) for m in data] if isinstance(data, list) else None


def write_members(path: Path, members: Sequence[str]) -> None:
    """Atomic replace, so the service never reads half a file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(list(members)))
    os.replace(tmp, path)


class Service:
    def __init__(self, members_file: Path, poll_s: float = 0.05) -> None:
        self.members_file = members_file
        self.poll_s = poll_s
        self.members: list[str] = read_members(members_file) or []
        self.open: dict[str, int] = {}
        self.served = 0
        self.refused = 0
        self._turn = itertools.count()
        self._mtime = self._stamp()

    def _stamp(self) -> int | None:
        try:
            return self.members_file.stat().st_mtime_ns
        except OSError:
            return None

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            stamp = self._stamp()
            if stamp != self._mtime:
                self._mtime = stamp
                members = read_members(self.members_file)
                if members is not None and members != self.members:
                    log.info("members: %s", ", ".join(members) or "none")
                    self.members = members

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        member = pick(self.members, self.open, next(self._turn))
        if member is None:
            self.refused += 1
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            with contextlib.suppress(OSError):
                await writer.drain()
            writer.close()
            return
        self.open[member] = self.open.get(member, 0) + 1
        try:
            await self._splice(reader, writer, member)
        finally:
            self.open[member] -= 1

    async def _splice(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, member: str) -> None:
        host, _, port = member.rpartition(":")
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            self.refused += 1
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            with contextlib.suppress(OSError):
                await writer.drain()
            writer.close()
            return
        self.served += 1
        up_writer.write(add_connection_close(head))
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(CHUNK):
            dst.write(data)
            await dst.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if dst.can_write_eof():
                dst.write_eof()
        dst.close()


async def serve(host: str, port: int, members_file: Path) -> None:
    service = Service(members_file)
    server = await asyncio.start_server(service.handle, host, port, limit=HEAD_LIMIT, backlog=1024)
    log.info("service on %s:%d, members %s", host, port, ", ".join(service.members) or "none")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    watcher = asyncio.create_task(service.watch())
    async with server:
        await stop.wait()
    watcher.cancel()
    log.info("service stopped: %d connections served, %d refused", service.served, service.refused)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tokenpools_dev.devstack.service", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--members", required=True, type=Path, metavar="FILE", help="JSON list of host:port")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    host, _, port = args.listen.rpartition(":")
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(host, int(port), args.members))
    else:
        uvloop.run(serve(host, int(port), args.members))
    return 0


if __name__ == "__main__":
    sys.exit(main())
