"""Leader election of the controller on a real kube-apiserver: two replicas, one acts.

Pinned:
- two ``tokenpools controller`` processes under the ServiceAccount of deploy/base/rbac/controller.yaml: one takes the
  Lease and scales, the other stands by (``/healthz`` says which, ``/metrics`` too);
- a leader killed with SIGKILL is replaced once its lease has expired, not before, and within the lease duration
  of its last renewal (plus one retry period, the standby's polling);
- a leader stopped with SIGTERM releases the Lease and the standby takes over at once, long before it would expire;
- a leader paused (SIGSTOP) past its lease wakes as a standby and writes nothing;
- never two leaders writing scale: every ``/scale`` change is recorded as an Event with the patching replica's
  identity (``reportingInstance``), and their sequence never goes back to a former leader;
- a leader cut off from the API server stops acting within its renew deadline, before a standby may take over.

The cluster is the session's kube-apiserver + etcd (``kube_apiserver`` in conftest.py,
scripts/install-kube-apiserver.sh) with deploy/ applied once (``controllers_cluster``), and the session's real
Kafka broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from controllers_fixtures import GROUP, NS, VERSION, create, deployment, eventually, fresh_topics, in_order, pool, tail
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.api_client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from tokenpools.controllers.leader import LeaderElector, LeaseStore, lead
from tokenpools.controllers.lease import LeaseTiming
from tokenpools.controllers.metrics import ControllerMetrics
from tokenpools.runtime.clock import SystemClock
from tokenpools.topics.codec import encode
from tokenpools.topics.declarations import Topics
from tokenpools.topics.records import ScaleCommand
from tokenpools_dev.devstack.process import free_port
from tokenpools_dev.kafka import local_kafka

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

LEASE = "tokenpools-controller"  # the name deploy/base/rbac/controller.yaml lets the ServiceAccount get and update
FAST = LeaseTiming(duration_s=4, renew_deadline_s=2.5, retry_period_s=0.5)
SLACK_S = 1.5  # two shared cores, several processes: scheduling delay on top of the protocol's own bounds


async def delete_lease(api: ApiClient) -> None:
    with contextlib.suppress(ApiException):
        await client.CoordinationV1Api(api).delete_namespaced_lease(LEASE, NS)


async def read_lease(api: ApiClient) -> Any:
    return (await client.CoordinationV1Api(api).read_namespaced_lease(LEASE, NS)).spec


class Replica:
    """One ``tokenpools controller`` process with its own identity and /healthz port."""

    def __init__(self, identity: str, settings: Path, kubeconfig: Path, log_dir: Path) -> None:
        self.identity, self.port = identity, free_port()
        self.log = log_dir / f"{identity}.log"
        tokenpools = Path(sys.executable).parent / "tokenpools"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [str(tokenpools), "controller", "--config", str(settings), "--kubeconfig", str(kubeconfig),
                 "--resync-s", "5", "--http-port", str(self.port), "--set", f"controllers.lease_identity={identity}"],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ})

    async def health(self, session: aiohttp.ClientSession) -> dict[str, Any] | None:
        try:
            async with session.get(f"http://127.0.0.1:{self.port}/healthz", timeout=aiohttp.ClientTimeout(total=0.5)) as r:
                return dict(await r.json()) if r.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None  # dead, paused, or not serving yet

    async def role(self, session: aiohttp.ClientSession) -> str | None:
        health = await self.health(session)
        return None if health is None else str(health["role"])

    async def metrics(self, session: aiohttp.ClientSession) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        async with session.get(f"http://127.0.0.1:{self.port}/metrics") as r:
            text = await r.text()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


@contextlib.asynccontextmanager
async def replicas(names: list[str], settings: Path, kubeconfig: Path, log_dir: Path) -> AsyncIterator[list[Replica]]:
    started = [Replica(name, settings, kubeconfig, log_dir) for name in names]
    try:
        yield started
    finally:
        for r in started:
            r.stop()


def settings_file(tmp_path: Path, bootstrap: str, topics: Topics, timing: LeaseTiming) -> Path:
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": f"{GROUP}/{VERSION}", "kind": "TokenPoolsSettings", "spec": {
        "kafka": {"bootstrap_servers": bootstrap, "topic_prefix": topics.specs.name[:-5]},
        "prometheus": {"url": "http://127.0.0.1:9"}, "kubernetes": {"namespace": NS},
        "scaling": {"scale_down_stabilization_s": 0, "cooldown_s": 0},  # every command that differs is a patch
        "controllers": {"lease_duration_s": timing.duration_s, "lease_renew_deadline_s": timing.renew_deadline_s,
                        "lease_retry_period_s": timing.retry_period_s}}}))
    return path


class Watch:
    """In the background: scale commands alternating 2 and 3 replicas, and both replicas' roles sampled, so a moment
    with two leaders would be seen."""

    def __init__(self, bootstrap: str, topics: Topics, pool_name: str, group: list[Replica]) -> None:
        self.bootstrap, self.topics, self.pool, self.group = bootstrap, topics, pool_name, group
        self.both_leading: list[float] = []
        self.samples = 0

    async def commands(self) -> None:
        producer = local_kafka(self.bootstrap).producer("test-producer", acks="all")
        await producer.start()
        try:
            for version in range(1, 100_000):
                c = ScaleCommand(pool=self.pool, version=version, t_ms=int(time.time() * 1000),
                                 desired_replicas=2 + version % 2, current_replicas=0, floor_replicas=0, reason="test")
                await producer.send_and_wait(self.topics.scale.name, encode(c), key=self.pool.encode())
                await asyncio.sleep(0.3)
        finally:
            await producer.stop()

    async def roles(self, session: aiohttp.ClientSession) -> None:
        while True:
            roles = await asyncio.gather(*(r.role(session) for r in self.group))
            self.samples += 1
            if roles.count("leader") > 1:
                self.both_leading.append(time.monotonic())
            await asyncio.sleep(0.1)


async def scalers(api: ApiClient, backend: str) -> list[str]:
    """The identity of the replica behind every /scale change of ``backend``, in the order the server stored them."""
    events = (await client.CoreV1Api(api).list_namespaced_event(
        NS, field_selector=f"involvedObject.name={backend}")).items
    return [e.reporting_instance for e in in_order(events) if e.reason in ("ScaledUp", "ScaledDown")]


def runs(sequence: list[str]) -> list[str]:
    """``a a b b b`` → ``a b``: who scaled, one entry per uninterrupted run."""
    return [x for i, x in enumerate(sequence) if i == 0 or sequence[i - 1] != x]


async def one_leader(session: aiohttp.ClientSession, group: list[Replica]) -> Replica:
    async def settled() -> bool:
        roles = await asyncio.gather(*(r.role(session) for r in group))
        return sorted(roles, key=str) == ["leader", "standby"]

    await eventually(settled, 30, "one leader and one standby:\n" + "\n".join(tail(r.log) for r in group))
    roles = await asyncio.gather(*(r.role(session) for r in group))
    return group[roles.index("leader")]


async def prepared(kube_admin: ApiClient, kafka_bootstrap: str, tmp_path: Path,
                   timing: LeaseTiming) -> tuple[Topics, str, Path]:
    await delete_lease(kube_admin)
    topics = await fresh_topics(kafka_bootstrap)
    backend = f"sim-{uuid.uuid4().hex[:6]}"
    await deployment(kube_admin, backend, replicas=1)
    await create(kube_admin, pool("elected", max_replicas=4, backend={"name": backend}))
    return topics, backend, settings_file(tmp_path, kafka_bootstrap, topics, timing)


async def test_one_replica_leads_and_a_killed_leader_is_replaced_once_its_lease_expires(
        kube_admin: ApiClient, controllers_cluster: Path, kafka_bootstrap: str, tmp_path: Path) -> None:
    topics, backend, settings = await prepared(kube_admin, kafka_bootstrap, tmp_path, FAST)
    names = [f"ctl-a-{uuid.uuid4().hex[:4]}", f"ctl-b-{uuid.uuid4().hex[:4]}"]
    async with aiohttp.ClientSession() as session, replicas(names, settings, controllers_cluster, tmp_path) as group:
        leader = await one_leader(session, group)
        standby = next(r for r in group if r is not leader)
        lease = await read_lease(kube_admin)
        assert (lease.holder_identity, lease.lease_duration_seconds, lease.lease_transitions) == (leader.identity, 4, 0)
        watch = Watch(kafka_bootstrap, topics, "elected", group)
        background = [asyncio.create_task(watch.commands()), asyncio.create_task(watch.roles(session))]
        try:
            await eventually(lambda: _at_least(kube_admin, backend, leader.identity, 3), 30,
                             f"the leader scales:\n{tail(leader.log)}")
            assert set(await scalers(kube_admin, backend)) == {leader.identity}, "the standby never scales"
            standby_health = await standby.health(session)
            assert standby_health is not None and standby_health["loops"] == {}, "a standby runs no loop"
            assert standby_health["lease"] == {"name": f"{NS}/{LEASE}", "holder": leader.identity}
            metrics = await standby.metrics(session)
            assert metrics[("tokenpools_controller_is_leader", ())] == 0.0

            leader.proc.kill()
            killed = time.monotonic()
            await eventually(lambda: _role_is(session, standby, "leader"), FAST.duration_s + 10,
                             f"the standby takes over:\n{tail(standby.log)}")
            took_s = time.monotonic() - killed
            print(f"SIGKILL → the standby leads after {took_s:.2f}s (lease {FAST.duration_s}s, retry {FAST.retry_period_s}s)")
            # the leader renewed at most one retry period before the kill, and the standby saw that at once or at its
            # next look: it waits the duration from then, and looks again exactly at expiry
            assert FAST.duration_s - FAST.retry_period_s - 0.3 <= took_s <= FAST.duration_s + FAST.retry_period_s + SLACK_S
            await eventually(lambda: _at_least(kube_admin, backend, standby.identity, 2), 30,
                             f"the new leader scales:\n{tail(standby.log)}")
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
        assert runs(await scalers(kube_admin, backend)) == [leader.identity, standby.identity]
        assert watch.samples > 50 and watch.both_leading == []
        lease = await read_lease(kube_admin)
        assert (lease.holder_identity, lease.lease_transitions) == (standby.identity, 1)
        metrics = await standby.metrics(session)
        assert metrics[("tokenpools_controller_is_leader", ())] == 1.0
        assert metrics[("tokenpools_controller_leader_transitions_total", (("outcome", "expired_takeover"),))] == 1.0
    await delete_lease(kube_admin)


async def test_a_stopped_leader_releases_the_lease_and_the_standby_takes_over_at_once(
        kube_admin: ApiClient, controllers_cluster: Path, kafka_bootstrap: str, tmp_path: Path) -> None:
    timing = LeaseTiming(duration_s=15, renew_deadline_s=10.0, retry_period_s=0.5)  # the default duration
    topics, backend, settings = await prepared(kube_admin, kafka_bootstrap, tmp_path, timing)
    names = [f"ctl-a-{uuid.uuid4().hex[:4]}", f"ctl-b-{uuid.uuid4().hex[:4]}"]
    async with aiohttp.ClientSession() as session, replicas(names, settings, controllers_cluster, tmp_path) as group:
        leader = await one_leader(session, group)
        standby = next(r for r in group if r is not leader)
        watch = Watch(kafka_bootstrap, topics, "elected", group)
        background = [asyncio.create_task(watch.commands()), asyncio.create_task(watch.roles(session))]
        try:
            await eventually(lambda: _at_least(kube_admin, backend, leader.identity, 2), 30,
                             f"the leader scales:\n{tail(leader.log)}")
            leader.proc.send_signal(signal.SIGTERM)
            stopped = time.monotonic()
            await eventually(lambda: _role_is(session, standby, "leader"), timing.duration_s,
                             f"the standby takes over:\n{tail(standby.log)}")
            took_s = time.monotonic() - stopped
            print(f"SIGTERM → the standby leads after {took_s:.2f}s (the lease would have lasted {timing.duration_s}s)")
            assert took_s <= timing.retry_period_s + SLACK_S
            assert await asyncio.to_thread(leader.proc.wait, 15) == 0, tail(leader.log)
            await eventually(lambda: _at_least(kube_admin, backend, standby.identity, 2), 30,
                             f"the new leader scales:\n{tail(standby.log)}")
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
        assert runs(await scalers(kube_admin, backend)) == [leader.identity, standby.identity]
        assert watch.both_leading == []
        lease = await read_lease(kube_admin)
        assert (lease.holder_identity, lease.lease_transitions) == (standby.identity, 1)
        log = leader.log.read_text()
        assert "released on shutdown" in log and "controller stopping" in log, log
        metrics = await standby.metrics(session)
        assert metrics[("tokenpools_controller_leader_transitions_total", (("outcome", "acquired"),))] == 1.0
    await delete_lease(kube_admin)


async def test_a_paused_leader_wakes_as_a_standby_and_writes_nothing(
        kube_admin: ApiClient, controllers_cluster: Path, kafka_bootstrap: str, tmp_path: Path) -> None:
    topics, backend, settings = await prepared(kube_admin, kafka_bootstrap, tmp_path, FAST)
    names = [f"ctl-a-{uuid.uuid4().hex[:4]}", f"ctl-b-{uuid.uuid4().hex[:4]}"]
    async with aiohttp.ClientSession() as session, replicas(names, settings, controllers_cluster, tmp_path) as group:
        leader = await one_leader(session, group)
        standby = next(r for r in group if r is not leader)
        watch = Watch(kafka_bootstrap, topics, "elected", group)
        background = [asyncio.create_task(watch.commands()), asyncio.create_task(watch.roles(session))]
        try:
            await eventually(lambda: _at_least(kube_admin, backend, leader.identity, 2), 30,
                             f"the leader scales:\n{tail(leader.log)}")
            os.kill(leader.proc.pid, signal.SIGSTOP)  # frozen mid-term: its loops and its renewals alike
            await eventually(lambda: _role_is(session, standby, "leader"), FAST.duration_s + 10,
                             f"the standby takes over:\n{tail(standby.log)}")
            await eventually(lambda: _at_least(kube_admin, backend, standby.identity, 2), 30, "the new leader scales")
            os.kill(leader.proc.pid, signal.SIGCONT)  # it wakes with scale commands waiting and its deadline past
            await eventually(lambda: _role_is(session, leader, "standby"), 10, f"it stands by:\n{tail(leader.log)}")
            await asyncio.sleep(2.0)  # commands keep coming: time for a stray write to show
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
        assert runs(await scalers(kube_admin, backend)) == [leader.identity, standby.identity]
        assert watch.both_leading == []
        assert "no longer leading" in leader.log.read_text()
        assert leader.proc.poll() is None, "a lost lease is not a reason to exit"
    await delete_lease(kube_admin)


async def _at_least(api: ApiClient, backend: str, identity: str, n: int) -> bool:
    return (await scalers(api, backend)).count(identity) >= n


async def _role_is(session: aiohttp.ClientSession, replica: Replica, role: str) -> bool:
    return await replica.role(session) == role


# ---- a leader cut off from the API server (in-process, through a relay the test can cut) ----------------------

class Relay:
    """A TCP relay to the API server; ``cut`` makes every connection through it hang (a partition, not a refusal:
    the packets just stop), ``heal`` drops the hung ones and forwards again."""

    def __init__(self, target_port: int) -> None:
        self.target_port, self.open = target_port, True
        self.links: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.links.append(writer)
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.links.append(up_w)
        await asyncio.gather(self._pipe(reader, up_w), self._pipe(up_r, writer), return_exceptions=True)
        for w in (writer, up_w):
            w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            while not self.open:  # partitioned: hold the bytes, answer nothing
                await asyncio.sleep(0.05)
            writer.write(data)
            await writer.drain()

    def cut(self) -> None:
        self.open = False

    def heal(self) -> None:
        for w in self.links:
            w.close()
        self.links.clear()
        self.open = True

    async def close(self) -> None:
        self.heal()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def relayed_kubeconfig(kubeconfig: Path, port: int, target: Path) -> Path:
    doc = yaml.safe_load(kubeconfig.read_text())
    for c in doc["clusters"]:
        c["cluster"]["server"] = f"https://127.0.0.1:{port}"
    target.write_text(yaml.safe_dump(doc))
    return target


async def test_a_leader_cut_off_from_the_api_server_stops_acting_before_its_lease_can_expire(
        kube_admin: ApiClient, controllers_cluster: Path, tmp_path: Path) -> None:
    await delete_lease(kube_admin)
    server_port = int(yaml.safe_load(controllers_cluster.read_text())["clusters"][0]["cluster"]["server"].rsplit(":", 1)[1])
    relay = Relay(server_port)
    relayed = relayed_kubeconfig(controllers_cluster, await relay.start(), tmp_path / "relayed.kubeconfig")
    clock = SystemClock()
    terms: dict[str, list[list[float]]] = {"a": [], "b": []}

    async def term(name: str) -> None:  # what a term of leadership does here: note when it starts and when it stops
        span = [clock.now_s(), float("inf")]
        terms[name].append(span)
        try:
            await asyncio.Event().wait()
        finally:
            span[1] = clock.now_s()

    metrics_a = ControllerMetrics()
    async with (await config.new_client_from_config(config_file=str(relayed), persist_config=False) as api_a,
                await config.new_client_from_config(config_file=str(controllers_cluster), persist_config=False) as api_b):
        a = LeaderElector(LeaseStore(api_a, NS, LEASE), "cut-a", FAST, clock, metrics_a)
        b = LeaderElector(LeaseStore(api_b, NS, LEASE), "cut-b", FAST, clock)
        task_a = asyncio.create_task(lead(a, lambda: term("a")))
        await eventually(lambda: _true(a.leading()), 10, "a leads")
        task_b = asyncio.create_task(lead(b, lambda: term("b")))
        try:
            await eventually(lambda: _true(b.holder == "cut-a"), 10, "b has seen a's lease")
            await asyncio.sleep(1.0)  # a few renewals
            relay.cut()
            cut = clock.now_s()
            await eventually(lambda: _true(bool(terms["b"])), FAST.duration_s + 10, "b takes over")
            (a_span,) = terms["a"]
            (b_span,) = terms["b"]
            print(f"cut at 0: a stopped acting at {a_span[1] - cut:.2f}s, b started at {b_span[0] - cut:.2f}s "
                  f"(renew deadline {FAST.renew_deadline_s}s, duration {FAST.duration_s}s)")
            assert a_span[1] - cut <= FAST.renew_deadline_s + 0.3, "a stops within its renew deadline"
            assert not a.leading()
            assert b_span[0] - a_span[1] >= FAST.margin_s - 0.3, "b starts at least the margin later"
            relay.heal()
            await eventually(lambda: _true(a.holder == "cut-b"), 10, "a sees b's lease once it can reach the server")
            assert len(terms["a"]) == 1 and not a.leading() and b.leading()
            transitions = "tokenpools_controller_leader_transitions_total"
            assert metrics_a.registry.get_sample_value(transitions, {"outcome": "lost"}) == 1.0
        finally:
            task_b.cancel()
            task_a.cancel()
            await asyncio.gather(task_a, task_b, return_exceptions=True)
            await relay.close()
    lease = await read_lease(kube_admin)
    assert lease.holder_identity is None, "b released it when cancelled"
    await delete_lease(kube_admin)


async def _true(value: bool) -> bool:
    return value
