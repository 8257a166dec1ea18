"""``tokenpools top`` against a real broker: limit updates (one pool's paged), effective limits and usage records
written by the test under a fresh topic prefix; the command runs as a user runs it, in a pseudo-terminal (live) and
in a pipe (``--once``), and the screen it draws is read back: the pools, the entitlements and their limits, and a
newer update's limit once it is written. Last, the real agents tick a scripted stream and ``top`` shows the limits
they published.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import uuid

import pytest
from terminal_fixtures import Terminal, row

from tokenpools.config import KafkaSettings, StreamsSettings, load_config_text
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec
from tokenpools.core.tick import Signals, TickResult
from tokenpools.runtime.kafka import KafkaClients
from tokenpools.runtime.specs import Catalogue
from tokenpools.streams.admin import ensure_topics
from tokenpools.streams.app import AgentsOptions, build_agents
from tokenpools.streams.table.params import StreamParams
from tokenpools.topics.codec import encode
from tokenpools.topics.declarations import Topics, topics_for
from tokenpools.topics.effective import effective_limits
from tokenpools.topics.limits import build_limit_update, pages
from tokenpools.topics.records import EffectiveLimit, LimitUpdate, UsageRecord
from tokenpools_dev.kafka import local_kafka
from tokenpools_dev.streams import harness
from tokenpools_dev.streams import scripted

pytestmark = [pytest.mark.integration]

MANY = 60  # entitlements of the paged pool


def update(pool: str, version: int, limits: dict[str, float]) -> LimitUpdate:
    tick = TickResult(signals={n: Signals(burst=0.0, debt=0.25) for n in limits},
                      priorities={n: 2.0 for n in limits},
                      limits={n: Capacity(v, 1e9, 4.0) for n, v in limits.items()},
                      contended=False, desired_replicas=1, lent=Capacity())
    return build_limit_update(pool, version, version, tick, Capacity(5000.0, 8e9, 32.0), 1000.0, {})


async def publish(bootstrap: str, topics: Topics, updates: list[LimitUpdate], usage: list[UsageRecord] = (),
                  page_bytes: int = 2000) -> None:
    """Each update as the agents send it (pages of at most ``page_bytes``), its entitlements' effective limits,
    and the usage records."""
    producer = local_kafka(bootstrap).producer("test-top")
    await producer.start()
    try:
        for u in updates:
            for key, page in pages(u, page_bytes):
                await producer.send_and_wait(topics.limits.name, encode(page), key=key.encode())
            specs = [EntitlementSpec(e.name, u.pool, ServiceClass.SPOT, 100.0) for e in u.entitlements]
            for record in effective_limits(u, specs, {}, 1000):
                await producer.send_and_wait(topics.effective_limits.name, encode(record),
                                             key=f"{record.pool}/{record.entitlement}".encode())
        for record in usage:
            key = f"{record.tenant}/{record.entitlement}/{record.model}/{record.day}".encode()
            await producer.send_and_wait(topics.usage.name, encode(record), key=key)
    finally:
        await producer.stop()


@pytest.fixture
async def stack(kafka_bootstrap: str) -> tuple[str, Topics]:
    """A fresh prefix's topics, made as the agents make them, holding two pools (``big``'s update in pages)."""
    prefix = f"it-top-{uuid.uuid4().hex[:8]}."
    topics = topics_for(prefix, partitions=2)
    await ensure_topics(KafkaClients(KafkaSettings(bootstrap_servers=kafka_bootstrap)), topics)
    now_ms = int(time.time() * 1000)
    many = {f"team-{i:02d}": 10.0 + i for i in range(MANY)}
    today = time.strftime("%Y-%m-%d", time.gmtime(now_ms / 1000))
    usage = [UsageRecord(tenant="acme", entitlement="copilot", pool="chat", model="llama", day=today, version=2,
                         t_ms=now_ms, usage={"prompt_tokens": 4000, "completion_tokens": 321, "requests": 12})]
    await publish(kafka_bootstrap, topics, [update("chat", now_ms, {"copilot": 1234.5, "batch": 250.0}),
                                            update("big", now_ms, many)], usage)
    return prefix, topics


def top_command(bootstrap: str, prefix: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "tokenpools", "top", "--set", f"kafka.bootstrap_servers={bootstrap}",
            "--set", f"kafka.topic_prefix={prefix}", *args]


async def test_the_live_view_draws_every_pool_and_follows_a_newer_update(kafka_bootstrap: str,
                                                                         stack: tuple[str, Topics]) -> None:
    prefix, topics = stack
    terminal = Terminal(top_command(kafka_bootstrap, prefix, "--refresh-ms", "300"))
    try:
        await asyncio.to_thread(terminal.wait_for, row("chat", "copilot", "spot", "2", "+0.25", "1,234.5", "4"))
        # the paged pool, whole (its last entitlement is on its last page), and today's usage of copilot
        await asyncio.to_thread(terminal.wait_for, row("big", "team-59", "spot", "2", "+0.25", "69.0", "4"))
        await asyncio.to_thread(terminal.wait_for, r"copilot\s.*│\s+4,321 │\s+12 │")
        newer = update("chat", int(time.time() * 1000) + 1000, {"copilot": 777.0, "batch": 250.0})
        await publish(kafka_bootstrap, topics, [newer])
        await asyncio.to_thread(terminal.wait_for, row("chat", "copilot", "spot", "2", "+0.25", "777.0", "4"))
    finally:
        code = await asyncio.to_thread(terminal.close)
    assert code == 130  # interrupted, as every command exits on Ctrl-C


async def test_once_prints_one_frame_of_everything_the_topics_hold_and_exits(kafka_bootstrap: str,
                                                                             stack: tuple[str, Topics]) -> None:
    prefix, _ = stack
    done = await asyncio.to_thread(subprocess.run, top_command(kafka_bootstrap, prefix, "--once", "--timeout-s", "60"),
                                   capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert re.search(row("chat", "copilot", "spot", "2", "+0.25", "1,234.5", "4"), out), out
    assert re.search(row("chat", "batch", "spot", "2", "+0.25", "250.0", "4"), out), out
    names = re.findall(r"│ big\s+│ (team-\d\d)\s", out)
    assert names == [f"team-{i:02d}" for i in range(MANY)]  # every page of the paged update
    assert "\x1b[" not in out  # a pipe gets text, not a terminal's escapes
    assert "not found" not in out


async def test_once_on_a_prefix_without_topics_says_what_is_missing(kafka_bootstrap: str) -> None:
    prefix = f"it-top-{uuid.uuid4().hex[:8]}."
    done = await asyncio.to_thread(subprocess.run, top_command(kafka_bootstrap, prefix, "--once"),
                                   capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "no limit update yet" in done.stdout
    assert f"not found (yet): {prefix}limits, {prefix}effective-limits, {prefix}usage" in done.stdout


@pytest.mark.slow
async def test_once_shows_the_limits_the_agents_published(kafka_bootstrap: str, tmp_path) -> None:
    """The agents in-process over a scripted two-class stream (elastic copilot, spot batch); once they have ticked
    it and stopped, ``top --once`` shows the pool's newest update: each entitlement's class, priority, debt and
    limits as the limits and effective-limits topics hold them."""
    prefix = f"it-top-{uuid.uuid4().hex[:8]}."
    topics = topics_for(prefix, partitions=2)
    kafka = KafkaClients(KafkaSettings(bootstrap_servers=kafka_bootstrap))
    partitions = await ensure_topics(kafka, topics)
    params = StreamParams(width_ms=1000, grace_ms=300, max_updates_per_tick=100)
    loaded = load_config_text(scripted.CONFIG_YAML)
    windows = 6
    base_ms = (int(time.time()) - windows - 4) * 1000  # the stream is history: it ended ~4 s ago
    await harness.produce(kafka_bootstrap, [topics], scripted.scripted_events(base_ms, params.width_ms, scripted.two_class_phases(windows)),
                    pack_events=20)
    options = AgentsOptions(StreamsSettings(app_id=f"agents-{uuid.uuid4().hex[:8]}"), partitions=partitions,
                            fast_join=True, metrics_port=0, datadir=str(tmp_path / "faust"))
    agents = build_agents(params, topics, Catalogue.from_loaded(loaded), options, kafka)
    limits = await harness.Collector(kafka_bootstrap, topics.limits.name, partitions=topics.limits.partitions).start()
    effective = await harness.Collector(kafka_bootstrap, topics.effective_limits.name, EffectiveLimit,
                                  topics.effective_limits.partitions).start()
    await agents.app.start()
    try:
        await limits.wait_for(lambda r: len(r) >= windows, 60)
    finally:
        await agents.app.stop()
    try:
        await asyncio.sleep(2)  # the collectors read what the agents wrote before they stopped
        done = await asyncio.to_thread(subprocess.run, top_command(kafka_bootstrap, prefix, "--once"),
                                       capture_output=True, text=True, timeout=120)
    finally:
        for collector in (limits, effective):
            await collector.stop()
    assert done.returncode == 0, done.stderr
    shown = re.search(rf"│ {scripted.POOL}\s+│\s+(\d+) │", done.stdout)
    assert shown, done.stdout
    newest = max(limits.records, key=lambda u: u.version)
    assert int(shown.group(1)) == newest.version
    classes = {r.entitlement: r.service_class.value for r in effective.records
               if r is not None and r.version == newest.version}
    assert classes == {"copilot": "elastic", "batch": "spot"}
    for e in newest.entitlements:
        cells = (classes[e.name], f"{e.priority:.3g}", f"{e.debt:+.2f}", f"{e.tokens_per_s:,.1f}", str(e.concurrency))
        assert re.search(row(scripted.POOL, e.name, *cells), done.stdout), (cells, done.stdout)


async def test_a_topic_made_after_the_start_is_read_once_it_exists(kafka_bootstrap: str) -> None:
    """Only the limits topic at the start (the usage ledger not running yet): the screen names the topics it has not
    found, then shows today's usage once the usage topic is made and written, without a restart."""
    from aiokafka.admin import NewTopic

    prefix = f"it-top-{uuid.uuid4().hex[:8]}."
    topics = topics_for(prefix, partitions=2)
    admin = local_kafka(kafka_bootstrap).admin("test-top")
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topics.limits.name, 2, 1)])
    finally:
        await admin.close()
    now_ms = int(time.time() * 1000)
    producer = local_kafka(kafka_bootstrap).producer("test-top")
    await producer.start()
    try:
        u = update("chat", now_ms, {"copilot": 1234.5})
        await producer.send_and_wait(topics.limits.name, encode(u), key=b"chat")
    finally:
        await producer.stop()
    terminal = Terminal(top_command(kafka_bootstrap, prefix, "--refresh-ms", "300"))
    try:
        await asyncio.to_thread(terminal.wait_for, rf"not found \(yet\): {re.escape(prefix)}effective-limits, "
                                                   rf"{re.escape(prefix)}usage")
        await asyncio.to_thread(terminal.wait_for, row("chat", "copilot", "-", "2", "+0.25", "1,234.5", "4"))
        await ensure_topics(KafkaClients(KafkaSettings(bootstrap_servers=kafka_bootstrap)), topics)
        today = time.strftime("%Y-%m-%d", time.gmtime(now_ms / 1000))
        await publish(kafka_bootstrap, topics, [], [UsageRecord(
            tenant="acme", entitlement="copilot", pool="chat", model="llama", day=today, version=1, t_ms=now_ms,
            usage={"prompt_tokens": 4000, "completion_tokens": 321, "requests": 12})])
        await asyncio.to_thread(terminal.wait_for, r"copilot\s.*│\s+4,321 │\s+12 │", 60)
    finally:
        await asyncio.to_thread(terminal.close)
