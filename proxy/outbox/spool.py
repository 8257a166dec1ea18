"""An append-only local spool for events the broker could not take yet; drained in order when it is back.

Format: one event per line, ``<crc32 as 8 hex> <json>\\n`` with json = ``{"topic", "key", "value"}`` (the value
is the record's JSON, embedded as is). A line whose checksum does not match — a torn tail after a crash, a flipped
bit — is skipped and counted (``corrupt``), never delivered. The read position lives in ``<name>.offset`` beside
the file (rewritten atomically after every drained batch); when everything is drained the file is truncated.

All calls happen on the event loop thread. ``append`` is one ``os.write`` of a whole line (O_APPEND), so readers
on the same thread never see half a line; ``sync`` runs ``fsync`` in a worker thread, once per batch.
A crash after a batch was delivered but before its offset was persisted re-delivers that batch on restart (the
only way this spool can duplicate); within a process lifetime every record is delivered once.
"""

from __future__ import annotations

import asyncio
import errno
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import orjson


@dataclass(frozen=True, slots=True)
class SpoolEntry:
    topic: str
    key: str
    value: bytes
    end_offset: int  # file offset just past this line
    t_ms: int | None = None  # the event's time (its record's ``t_ms``), for the sender's watermarks


class Spool:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._offset_path = self.path.with_name(self.path.name + ".offset")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._rfd = os.open(self.path, os.O_RDONLY)
        self._dirty = False
        self._syncing = False
        self.corrupt = 0
        self.read_offset = self._load_offset()
        self._truncate_torn_tail()
        self.pending = self._count(self.read_offset)

    # ---- writing --------------------------------------------------------------------------------------------
    def append(self, topic: str, key: str, value: bytes) -> None:
        """Raises OSError (ENOSPC and the like) when the record could not be written; nothing is left half-written."""
        payload = orjson.dumps({"topic": topic, "key": key, "value": orjson.Fragment(value)})
        line = b"%08x %s\n" % (zlib.crc32(payload), payload)
        size = os.fstat(self._fd).st_size
        try:
            written = os.write(self._fd, line)
            if written != len(line):
                raise OSError(errno.ENOSPC, "short write to the spool")
        except OSError:
            os.ftruncate(self._fd, size)
            raise
        self.pending += 1
        self._dirty = True

    async def sync(self) -> None:
        """fsync what was appended since the last sync (in a worker thread: the loop never blocks on the disk)."""
        if not self._dirty or self._syncing:
            return
        self._dirty = False
        self._syncing = True
        try:
            await asyncio.to_thread(os.fsync, self._fd)
        finally:
            self._syncing = False

    # ---- reading --------------------------------------------------------------------------------------------
    def read_batch(self, max_records: int, max_bytes: int = 4 << 20) -> list[SpoolEntry]:
        """Up to ``max_records`` entries from the read position, in order. Does not move the position."""
        entries: list[SpoolEntry] = []
        data = os.pread(self._rfd, max_bytes, self.read_offset)
        pos = 0
        while len(entries) < max_records:
            nl = data.find(b"\n", pos)
            if nl < 0:
                break
            entry = self._parse(data[pos:nl], self.read_offset + nl + 1)
            pos = nl + 1
            if entry is None:
                # a corrupt line is skipped for good: advance past it at the next commit
                entries.append(SpoolEntry("", "", b"", self.read_offset + pos))
                continue
            entries.append(entry)
        return entries

    def pending_times(self) -> list[tuple[str, str, int | None]]:
        """(topic, key, t_ms) of every readable entry from the read position on (does not move the position)."""
        offset, corrupt = self.read_offset, self.corrupt
        found: list[tuple[str, str, int | None]] = []
        try:
            while batch := self.read_batch(10_000):
                found += [(e.topic, e.key, e.t_ms) for e in batch if e.topic]
                self.read_offset = batch[-1].end_offset
        finally:
            self.read_offset, self.corrupt = offset, corrupt
        return found

    def commit(self, end_offset: int, delivered: int) -> None:
        """Move the read position past ``end_offset`` after ``delivered`` records left the spool."""
        self.read_offset = end_offset
        self.pending = max(0, self.pending - delivered)
        if self.read_offset >= os.fstat(self._fd).st_size:
            os.ftruncate(self._fd, 0)
            self.read_offset = 0
            self.pending = 0
        self._store_offset()

    def close(self) -> None:
        for fd in (self._fd, self._rfd):
            try:
                os.close(fd)
            except OSError:
                pass

    @property
    def size_bytes(self) -> int:
        return os.fstat(self._fd).st_size

    # ---- internals ------------------------------------------------------------------------------------------
    def _parse(self, line: bytes, end_offset: int) -> SpoolEntry | None:
        crc, _, payload = line.partition(b" ")
        try:
            if len(crc) != 8 or int(crc, 16) != zlib.crc32(payload):
                raise ValueError("checksum mismatch")
            obj = orjson.loads(payload)
            value = obj["value"]
            t_ms = value.get("t_ms") if isinstance(value, dict) else None
            return SpoolEntry(obj["topic"], obj["key"], orjson.dumps(value), end_offset,
                              t_ms if type(t_ms) is int else None)
        except (ValueError, KeyError, TypeError):
            self.corrupt += 1
            return None

    def _count(self, offset: int) -> int:
        count, corrupt = 0, self.corrupt  # corrupt lines are counted when the drain skips them, not here
        while True:
            batch = self.read_batch(10_000)
            if not batch:
                break
            count += sum(1 for e in batch if e.topic)
            self.read_offset = batch[-1].end_offset
        self.read_offset = offset
        self.corrupt = corrupt
        return count

    def _truncate_torn_tail(self) -> None:
        size = os.fstat(self._fd).st_size
        if size == 0:
            return
        tail = os.pread(self._rfd, min(size, 1 << 20), max(0, size - (1 << 20)))
        if not tail.endswith(b"\n"):
            cut = size - (len(tail) - (tail.rfind(b"\n") + 1))
            os.ftruncate(self._fd, cut)
            self.corrupt += 1

    def _load_offset(self) -> int:
        try:
            offset = int(self._offset_path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0
        return offset if 0 <= offset <= os.fstat(self._fd).st_size else 0

    def _store_offset(self) -> None:
        tmp = self._offset_path.with_name(self._offset_path.name + ".tmp")
        tmp.write_text(str(self.read_offset))
        os.replace(tmp, self._offset_path)
