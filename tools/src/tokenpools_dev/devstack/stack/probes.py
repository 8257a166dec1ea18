"""Readiness probes and small helpers of the stack that talk to its components (Kafka, HTTP, the apiserver) and to
the server ``--backend URL`` names.

Each probe answers now, never waits: ``Proc.wait_ready`` polls it. The Kafka probes open a short-lived
group-less consumer in a private event loop (the stack's own code is synchronous). Probes take addresses and
topic declarations, not the ``Stack``: the stack uses them, they never reach back into it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tokenpools.errors import ConfigError, ConfigProblem
from tokenpools_dev.devstack.stack.backend import served_models, unserved, unserved_message
from tokenpools_dev.devstack.stack.components import StackError

if TYPE_CHECKING:
    from tokenpools.topics.declarations import TopicSpec

log = logging.getLogger("tokenpools_dev.devstack")
T = TypeVar("T")


def quietly(fn: Callable[..., T], *args: Any) -> T | None:
    """``fn(*args)``, or None (logged at debug) if it raised: for best-effort calls of the reconcile loop."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 -- best effort by definition; the caller retries
        log.debug("%s failed: %r", getattr(fn, "__name__", fn), exc)
        return None


def get_json(url: str, timeout_s: float = 1.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
        return None


def check_backend_url(url: str, models: Mapping[str, str], timeout_s: float = 10.0,
                      authorization: str | None = None) -> list[str]:
    """The models ``url`` serves, having checked that it answers ``GET /v1/models`` (else ``StackError``) and lists
    every pool's model (``models``: pool → ``spec.model``; else a one-problem ``ConfigError``). ``authorization``
    is what the proxies will send it (``proxy.upstream_api_key_env``)."""
    request = urllib.request.Request(url + "/v1/models", headers={"Authorization": authorization} if authorization
                                      else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as r:
            answer = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise StackError(f"--backend {url}: GET /v1/models answered {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise StackError(f"--backend {url}: GET /v1/models failed: {reason}") from None
    except ValueError:
        raise StackError(f"--backend {url}: GET /v1/models did not answer JSON") from None
    try:
        served = served_models(answer)
    except ValueError as exc:
        raise StackError(f"--backend {url}: {exc}") from None
    missing = unserved(models, served)
    if missing:
        raise ConfigError([ConfigProblem("tokenpools up", unserved_message(url, missing, served))])
    return served


async def last_records(bootstrap: str, topic: str, partitions: int, per_partition: int = 1) -> list[bytes]:
    """The newest ``per_partition`` values of each partition of ``topic`` (declared with ``partitions``).

    Partitions are assigned from the declaration: an unsubscribed aiokafka consumer knows no topic's partitions
    (``consumer.topics()`` does not update the metadata ``partitions_for_topic`` reads, aiokafka 0.12).
    """
    from aiokafka import TopicPartition

    from tokenpools_dev.kafka import local_kafka

    consumer = local_kafka(bootstrap).consumer("probe", group_id=None, enable_auto_commit=False)
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


def backend_metrics_seen(bootstrap: str, topic: TopicSpec) -> bool:
    """The controller has published at least one backend-metrics sample (on ``topic``, the backend-metrics one)."""
    return bool(quietly(lambda: asyncio.run(last_records(bootstrap, topic.name, topic.partitions))))


def proxy_divides_among(url: str, replicas: int) -> bool:
    """The proxy enforces the agents' limits for every pool, divided among ``replicas`` proxies (the shares of an
    update that names them all, or counts that count them all)."""
    health = get_json(url + "/healthz")
    if not health:
        return False
    pools = health.get("pools") or {}
    return bool(pools) and all(p.get("limits") == "update" and p.get("replicas") == replicas for p in pools.values())


def keep_kube_logs(kube: Any, log_dir: Path) -> None:
    """Copy etcd's and kube-apiserver's logs into the run dir before ``KubeAPIServer.stop`` deletes its dir."""
    work = quietly(lambda: kube.work_dir)
    for name in ("etcd.log", "kube-apiserver.log"):
        if work is not None and (Path(work) / name).is_file():
            shutil.copyfile(Path(work) / name, log_dir / name)
