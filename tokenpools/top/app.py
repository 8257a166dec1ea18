"""``tokenpools top``: the shell around ``model`` and ``view``, the Kafka consumer and the screen.

It reads the limits, effective-limits and usage topics from the beginning (all compacted: the newest record of every
key, then every new one), with the runtime's Kafka clients, so the ``kafka`` settings' servers, topic prefix and
security apply as for every other command (``--set kafka.bootstrap_servers=HOST:PORT``, ``TOKENPOOLS_KAFKA__*``).
It joins no consumer group and commits nothing. A topic that does not exist yet (the usage topic before the ledger
runs) is read once it does, within ``RESCAN_S``.

Live: the screen is redrawn every ``--refresh-ms`` until interrupted. ``--once``: read every topic up to its end as
of the start, print one frame and exit (0; 1 if the end was not reached within ``--timeout-s``).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from tokenpools.top.model import Applied, TopModel, utc_day
from tokenpools.top.view import frame

if TYPE_CHECKING:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition
    from rich.console import Console, RenderableType

    from tokenpools.runtime.kafka import KafkaClients

RESCAN_S = 5.0  # how often the topics' metadata is refreshed: a topic made later is read within this
WIDE_COLUMNS = 200


def positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--once", action="store_true",
                        help="read every topic to its end, print one frame and exit (for scripts)")
    parser.add_argument("--pool", action="append", default=[], metavar="NAME",
                        help="show only this pool (repeatable; default: every pool)")
    parser.add_argument("--refresh-ms", type=positive, default=1000.0, metavar="MS",
                        help="redraw the screen this often (default 1000)")
    parser.add_argument("--timeout-s", type=positive, default=30.0, metavar="S",
                        help="--once: give up reaching the topics' ends after S seconds (default 30)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from tokenpools.config import load_settings
    from tokenpools.runtime.kafka import KafkaClients

    settings = load_settings(None, args.overrides)
    kafka = KafkaClients(settings.kafka)
    # on a terminal its width; in a pipe wide enough that no column is cut (rich would assume 80)
    console = Console(width=None if sys.stdout.isatty() else WIDE_COLUMNS)
    if args.once:
        return asyncio.run(_once(kafka, console, tuple(args.pool), args.timeout_s))
    asyncio.run(_live(kafka, console, tuple(args.pool), args.refresh_ms / 1000))
    return 0


class _Feed:
    """The model, fed by one consumer of every partition of the three topics (no group, no commits).

    The consumer subscribes by pattern: it asks for every topic's metadata rather than for these by name, so it
    creates none on a broker that auto-creates topics, and a topic made later (the usage topic before the ledger
    runs) is picked up at the next metadata refresh."""

    def __init__(self, kafka: KafkaClients, pools: tuple[str, ...]) -> None:
        topics = kafka.topics()
        self.model = TopModel()
        self.pools = pools
        self.appliers: dict[str, Callable[[bytes | None, bytes | None], Applied]] = {
            topics.limits.name: self.model.apply_limits,
            topics.effective_limits.name: self.model.apply_effective,
            topics.usage.name: self.model.apply_usage,
        }
        self.consumer: AIOKafkaConsumer = kafka.consumer(
            "top", group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
            metadata_max_age_ms=int(RESCAN_S * 1000))
        self.consumer.subscribe(pattern="^(" + "|".join(re.escape(name) for name in self.appliers) + ")$")

    def missing(self) -> tuple[str, ...]:
        """The topics not assigned (yet): they did not exist at the last metadata refresh."""
        assigned = {tp.topic for tp in self.consumer.assignment()}
        return tuple(name for name in self.appliers if name not in assigned)

    async def assigned(self, timeout_s: float) -> None:
        """Wait until every one of the topics that exists now is assigned (at most ``timeout_s``)."""
        existing = set(self.appliers) & await self.consumer.topics()
        deadline = time.monotonic() + timeout_s
        while existing - {tp.topic for tp in self.consumer.assignment()} and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def read(self, timeout_ms: int) -> int:
        """Apply what arrives within ``timeout_ms``; how many records."""
        batches = await self.consumer.getmany(timeout_ms=timeout_ms)
        n = 0
        for tp, messages in batches.items():
            apply = self.appliers[tp.topic]
            for message in messages:
                apply(message.key, message.value)
            n += len(messages)
        return n

    def frame(self, now_ms: int) -> RenderableType:
        today = utc_day(now_ms)
        return frame(self.model.pools(self.pools), self.model.rows(today, self.pools), now_ms, today,
                     self.model.applied, self.missing())


async def _start(kafka: KafkaClients, pools: tuple[str, ...], timeout_s: float) -> _Feed:
    await kafka.require_reachable("top")  # wrong credentials or TLS, or no broker answering: exit 2
    feed = _Feed(kafka, pools)
    await feed.consumer.start()
    try:
        await feed.assigned(timeout_s)
    except BaseException:
        await feed.consumer.stop()
        raise
    return feed


async def _once(kafka: KafkaClients, console: Console, pools: tuple[str, ...], timeout_s: float) -> int:
    feed = await _start(kafka, pools, timeout_s)
    try:
        ends: dict[TopicPartition, int] = await feed.consumer.end_offsets(list(feed.consumer.assignment()))
        deadline = time.monotonic() + timeout_s
        behind = await _behind(feed.consumer, ends)
        while behind and time.monotonic() < deadline:
            await feed.read(timeout_ms=200)
            behind = await _behind(feed.consumer, ends)
        screen = feed.frame(int(time.time() * 1000))  # while the consumer still holds its assignment
    finally:
        await feed.consumer.stop()
    console.print(screen)
    if behind:
        print(f"tokenpools top: {len(behind)} partitions not read to their end within {timeout_s:g} s",
              file=sys.stderr)
        return 1
    return 0


async def _behind(consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]) -> list[TopicPartition]:
    """The partitions whose position has not reached the end they had at the start."""
    return [tp for tp, end in ends.items() if await consumer.position(tp) < end]


async def _live(kafka: KafkaClients, console: Console, pools: tuple[str, ...], refresh_s: float) -> None:
    from rich.live import Live

    feed = await _start(kafka, pools, RESCAN_S)
    try:
        with Live(feed.frame(int(time.time() * 1000)), console=console, auto_refresh=False,
                  vertical_overflow="visible") as live:
            while True:
                await feed.read(timeout_ms=int(refresh_s * 1000))
                live.update(feed.frame(int(time.time() * 1000)), refresh=True)
    finally:
        await feed.consumer.stop()
