"""Readiness probes and small helpers of the stack that talk to its components (Kafka, HTTP, the apiserver).

Each probe answers now, never waits: ``Proc.wait_ready`` polls it. The Kafka probes open a short-lived
group-less consumer in a private event loop (the stack's own code is synchronous).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tokenpools_dev.devstack.stack_state import ComponentState

if TYPE_CHECKING:
    from tokenpools.config import LoadedConfig, Settings
    from tokenpools_dev.devstack.stack import Stack

log = logging.getLogger("tokenpools_dev.devstack")
T = TypeVar("T")


def quietly(fn: Callable[..., T], *args: Any) -> T | None:
    """``fn(*args)``, or None (logged at debug) if it raised: for best-effort calls of the reconcile loop."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 -- best effort by definition; the caller retries
        log.debug("%s failed: %r", getattr(fn, "__name__", fn), exc)
        return None


def settings_of(loaded: LoadedConfig) -> Settings:
    from tokenpools.config import load_settings

    return load_settings(loaded.settings_values)


def get_json(url: str, timeout_s: float = 1.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
        return None


async def last_records(bootstrap: str, topic: str, partitions: int, per_partition: int = 1) -> list[bytes]:
    """The newest ``per_partition`` values of each partition of ``topic`` (declared with ``partitions``).

    Partitions are assigned from the declaration: an unsubscribed aiokafka consumer knows no topic's partitions
    (``consumer.topics()`` does not update the metadata ``partitions_for_topic`` reads, aiokafka 0.12).
    """
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(parts)
        ends = await consumer.end_offsets(parts)
        wanted = 0
        for tp in parts:
            if ends[tp]:
                consumer.seek(tp, max(0, ends[tp] - per_partition))
                wanted += min(per_partition, ends[tp])
        out: list[bytes] = []
        while len(out) < wanted:
            batch = await consumer.getmany(timeout_ms=1000)
            if not batch:
                break
            out += [m.value for records in batch.values() for m in records if m.value is not None]
        return out
    finally:
        try:
            await consumer.stop()
        except asyncio.CancelledError:  # aiokafka cancels its own committer task while stopping
            pass


def _topics(stack: Stack) -> Any:
    from tokenpools.topics.declarations import topics_for

    return topics_for(settings_of(stack.source).kafka.topic_prefix)


def backend_metrics_seen(stack: Stack) -> bool:
    """The controller has published at least one backend-metrics sample."""
    topic = _topics(stack).backend_metrics
    return bool(quietly(lambda: asyncio.run(last_records(stack.kafka_bootstrap, topic.name, topic.partitions))))


def update_naming(stack: Stack, proxy_ids: list[str]) -> int | None:
    """The version of a newest limit update (of any pool) that splits limits over every proxy in ``proxy_ids``."""
    from tokenpools.topics.codec import decode
    from tokenpools.topics.records import LimitUpdate

    topic = _topics(stack).limits
    raws = quietly(lambda: asyncio.run(last_records(stack.kafka_bootstrap, topic.name, topic.partitions))) or []
    versions = []
    for raw in raws:
        update = quietly(decode, LimitUpdate, raw)
        if update is not None and set(proxy_ids) <= {p.proxy_id for p in update.proxies}:
            versions.append(update.version)
    return max(versions) if versions else None


def proxy_on_update(url: str, version: int) -> bool:
    """The proxy enforces limits from an update at least as new as ``version`` for every pool."""
    health = get_json(url + "/healthz")
    if not health:
        return False
    pools = health.get("pools") or {}
    return bool(pools) and all(p.get("limits") == "update" and (p.get("version") or 0) >= version
                               for p in pools.values())


def keep_kube_logs(kube: Any, log_dir: Path) -> None:
    """Copy etcd's and kube-apiserver's logs into the run dir before ``KubeAPIServer.stop`` deletes its dir."""
    work = quietly(lambda: kube.work_dir)
    for name in ("etcd.log", "kube-apiserver.log"):
        if work is not None and (Path(work) / name).is_file():
            shutil.copyfile(Path(work) / name, log_dir / name)


def component_states(stack: Stack) -> list[ComponentState]:
    out: list[ComponentState] = []
    if stack.kafka is not None:
        out.append(ComponentState("kafka", "kafka", stack.kafka.pid, stack.kafka.bootstrap, str(stack.kafka.log_path),
                                  "running" if stack.kafka.is_running else "stopped", "kafka.Kafka"))
    for name, pool in stack.pools.items():
        if pool.service is not None:
            out.append(ComponentState(pool.service.name, "service", pool.service.pid, pool.service_url,
                                      str(pool.service.log), _status(pool.service.alive), "tokenpools_dev.devstack.service"))
        for r in list(pool.replicas):
            status = "down" if not r.up else ("running" if r.sim.running else "stopped")
            out.append(ComponentState(f"sim-{name}-{r.index}", "sim", r.sim.pid, r.sim.host_port, str(r.sim.log_path),
                                      status, "llm-d-inference-sim"))
    prom = stack.prometheus
    if prom is not None:
        url = quietly(lambda: prom.url) or ""
        out.append(ComponentState("prometheus", "prometheus", prom.pid, url, str(prom.log_path),
                                  _status(prom.pid is not None), "prometheus"))
    if stack.kube is not None:
        url = getattr(stack.kube, "_server_url", None) or ""
        work = quietly(lambda: str(stack.kube.work_dir)) or ""  # type: ignore[union-attr]
        for name, binary in (("etcd", "etcd"), ("kube-apiserver", "kube-apiserver")):
            pids = pids_running(binary, work) if work else []
            log = Path(work) / f"{name}.log" if pids else stack.log_dir / f"{name}.log"  # copied there at stop
            out.append(ComponentState(name, "kube", pids[0] if pids else None, url if name != "etcd" else "",
                                      str(log), "running" if pids else "stopped", work))
    for proc in [stack.agents, stack.controller, *stack.proxies]:
        if proc is None:
            continue
        address = ""
        if proc.name.startswith("proxy-"):
            address = stack.proxy_urls[int(proc.name.split("-")[1])]
        out.append(ComponentState(proc.name, proc.name.split("-")[0], proc.pid, address, str(proc.log),
                                  _status(proc.alive, proc.returncode), "tokenpools"))
    return out


def pids_running(binary: str, marker: str) -> list[int]:
    """Pids whose command is ``binary`` and whose arguments contain ``marker`` (a work dir of this stack only)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and Path(argv[0].decode(errors="replace")).name == binary and marker.encode() in b" ".join(argv):
            found.append(int(proc.name))
    return sorted(found)


def _status(alive: bool, returncode: int | None = None) -> str:
    return "running" if alive else (f"exited {returncode}" if returncode is not None else "stopped")
