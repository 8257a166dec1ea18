"""Where live specs come from: the compacted specs topic (Kafka on) or the --config file, watched (Kafka off).

With Kafka the proxy follows the specs topic the controller publishes (from custom resources, or from its own file
with ``--no-kubernetes``), and not its own file: two writers of one set would undo each other's changes. Without
Kafka it watches its --config file. Both end in ``LiveSpecs.apply``.

- ``SpecsFollower``: every record goes through the one follower (``runtime.specs.judge``, the catalogue the agents
  use too): validated for what it changes, refused as a whole if the set would not validate, a stale generation
  refused; what is refused or undecodable is dead-lettered through the event pipeline, and the last good specs
  stay. The topic is read in offset order from the beginning, with no group; compaction keeps the last record per
  (kind, name), so the last record of a document wins. Applied records mark the view stale; it is updated once
  per batch (``call_soon`` after the consumer's synchronous batch) with what the batch changed
  (``Catalogue.take_changes``, ``LiveSpecs.apply_change``): one record costs its pools and its keys, not the set.
  The first batch puts the whole catalogue in force (the view started from the file, in the file's order), once.
  Until the topic has been read to its end once (``caught_up``, from ``consume``) the specs are not loaded: the
  proxy is not ready (``/readyz``) and answers a key it does not know with a 503 rather than a 401 (the key may be
  in a record not read yet; proxy/README.md).
- ``ConfigWatcher``: polls the file every ``proxy.config_poll_interval_s``: size and mtime first, then the
  content's SHA-256 (an editor that rewrites the same bytes changes nothing). A changed file is loaded and
  validated like at start, and put in force whole (an edit can change anything); an invalid one logs one line with its problems and is counted, and the last good
  version stays in force. Settings (the TokenPoolsSettings document) are read at start only.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tokenpools.config import ConfigError, load_config
from tokenpools.proxy.outbox.events import EventPipeline
from tokenpools.proxy.inputs.live_specs import LiveSpecs, config_from_catalogue, served_pools
from tokenpools.runtime.clock import Clock
from tokenpools.runtime.deadletter import DeadLetters
from tokenpools.runtime.specs import Catalogue, SpecOutcome, judge

log = logging.getLogger("tokenpools.proxy")

TOPIC_SOURCE = "topic"
FILE_SOURCE = "file"


class SpecsFollower:
    """The specs topic into the proxy (module doc). ``handle`` has the limits consumer's signature (``consume``)."""

    def __init__(self, catalogue: Catalogue, live: LiveSpecs, events: EventPipeline | None, dead_letter_topic: str,
                 consumer_name: str, clock: Clock) -> None:
        self.catalogue, self.live, self.events, self.clock = catalogue, live, events, clock
        self.dead_letters = DeadLetters(dead_letter_topic, consumer_name, clock, logger=log)
        self._scheduled = False
        self._base_version = live.version  # the file's version the catalogue started from
        self._unserved: tuple[str, ...] = ()
        self._whole = True  # the view was made from the file, not this catalogue: the first batch rebuilds it

    def handle(self, value: bytes | None, topic: str = "", partition: int = 0, offset: int = 0,
               key: bytes | None = None) -> SpecOutcome:
        outcome, reason, detail = judge(self.catalogue, key, value)
        if reason is not None:
            self.live.metrics.spec_refused[TOPIC_SOURCE] += 1
            record = self.dead_letters.note(reason, detail, topic, partition, offset, key, value)
            if self.events is not None and self.dead_letters.topic:
                self.events.emit(self.dead_letters.topic, topic, record)
        elif outcome is SpecOutcome.APPLIED and not self._scheduled:
            self._scheduled = True
            try:
                asyncio.get_running_loop().call_soon(self.put_in_force)
            except RuntimeError:  # no loop (a synchronous test): at once
                self.put_in_force()
        return outcome

    @property
    def loaded(self) -> bool:
        """Whether the topic has been read to its end once and what it held is in force."""
        return self.live.handlers.specs_loaded

    def caught_up(self) -> None:
        """The consumer has read the topic to its end (``consume``): the specs are loaded once the batch it read
        last is in force (``put_in_force`` is scheduled before this, and runs first)."""
        try:
            asyncio.get_running_loop().call_soon(self._loaded)
        except RuntimeError:  # no loop (a synchronous test): at once
            self.put_in_force()
            self._loaded()

    def _loaded(self) -> None:
        if not self.loaded:
            self.live.handlers.specs_loaded = True
            log.info("specs: the specs topic read to its end, v%d in force: %d pools", self.live.version,
                     len(self.live.pools))

    def put_in_force(self) -> str | None:
        """Put in force what the records applied since the last call changed (after a batch of applied records)."""
        self._scheduled = False
        version = self._base_version + self.catalogue.version
        if version == self.live.version:
            return None
        _, _, unserved = served_pools(self.catalogue, self.live.endpoints)
        if unserved != self._unserved:
            self._unserved = unserved
            if unserved:
                log.warning("specs: pools with no endpoints known to this proxy are not served here: %s",
                            ", ".join(unserved))
        change = self.catalogue.take_changes()
        if self._whole:
            config, _ = config_from_catalogue(self.catalogue, self.live.config, self.clock.now_s())
            problem = self.live.apply(config, version, TOPIC_SOURCE)
            self._whole = problem is not None
            return problem
        return self.live.apply_change(self.catalogue, change, version, TOPIC_SOURCE)


@dataclass(frozen=True, slots=True)
class FileStamp:
    size: int
    mtime_ns: int
    sha256: str


def stamp(path: Path, previous: FileStamp | None) -> FileStamp | None:
    """The file's stamp; the content is hashed only when size or mtime moved (None: the file cannot be read)."""
    try:
        st = os.stat(path)
        if previous is not None and (st.st_size, st.st_mtime_ns) == (previous.size, previous.mtime_ns):
            return previous
        return FileStamp(st.st_size, st.st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
    except OSError:
        return None


class ConfigWatcher:
    """The --config file into the proxy when Kafka is off (module doc)."""

    def __init__(self, path: Path, live: LiveSpecs, interval_s: float,
                 load: Callable[[Path], object] = load_config) -> None:
        self.path, self.live, self.interval_s = path, live, interval_s
        self._load = load
        self._stamp = stamp(path, None)
        self._refused: str | None = None  # the content hash last refused (logged once)

    def check(self) -> str | None:
        """One poll: None when nothing changed or the edit is in force, else why it was refused."""
        current = stamp(self.path, self._stamp)
        if current is None or self._stamp is not None and current.sha256 == self._stamp.sha256:
            self._stamp = current or self._stamp
            return None
        self._stamp = current
        version = self.live.version + 1
        try:
            loaded = self._load(self.path)
            config, unserved = config_from_catalogue(Catalogue.from_loaded(loaded),  # type: ignore[arg-type]
                                                     self.live.config, self.live.clock.now_s(),
                                                     known_endpoints=False)  # the file says where every backend is
            if unserved:
                raise ValueError(f"no backend endpoint configured for pool(s) {', '.join(unserved)}")
        except ConfigError as exc:
            problems = "; ".join(str(p) for p in exc.problems)
            self.live.metrics.spec_refused[FILE_SOURCE] += 1
            log.error("--config %s edit refused, v%d kept: %s", self.path, self.live.version, problems)
            return problems
        except ValueError as exc:
            self.live.metrics.spec_refused[FILE_SOURCE] += 1
            log.error("--config %s edit refused, v%d kept: %s", self.path, self.live.version, exc)
            return str(exc)
        return self.live.apply(config, version, FILE_SOURCE)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                self.check()
            except Exception:  # noqa: BLE001 - a bug must not stop the proxy from serving its last good specs
                log.exception("--config %s: the watch failed; last good specs kept", self.path)
