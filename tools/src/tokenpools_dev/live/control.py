"""The scenario's timeline applied to a running stack: who is a member when, and how many replicas are up.

- Membership (``Scenario.membership``: guaranteed-c in [30 s, 60 s) of Exp 1, reports from 210 s in Exp 2) is what
  an operator changes with ``kubectl apply``: here a spec record on the specs topic (the controller's own output),
  ``state: Pending`` to keep an entitlement out of the agents' tick, no state to let capacity admission bind it.
  The proxies hold every entitlement of the file from the start (they do not read the specs topic), so a client of
  a not-yet-joined entitlement would be admitted on its static limits; the schedule sends nothing for it then.
- Capacity (``Scenario.capacity_changes``: the Exp-2 outage 16 → 8 → 16 slots per replica) is a number of
  simulator replicas up (``StackOptions.split`` makes a replica several simulators): one fails (SIGKILL, its
  requests break, Prometheus ``up`` drops to 0, the controller reports one replica fewer) and is restored later.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenpools.replay.scenario import Scenario


@dataclass(frozen=True, slots=True)
class Event:
    t_s: float  # experiment time
    kind: str  # "membership" or "replicas"
    name: str  # entitlement (membership) or pool (replicas)
    value: Any  # the state ("Pending" or None) or the number of replicas up


def timeline(scenario: Scenario, slots_per_sim: int, sims_per_replica: int) -> list[Event]:
    """Every change of the run in time order; events at t = 0 are the initial state."""
    events = []
    for e in scenario.entitlements:
        m = scenario.member(e.name)
        if m.join_s > 0:
            events += [Event(0.0, "membership", e.name, "Pending"), Event(m.join_s, "membership", e.name, None)]
        if m.leave_s is not None:
            events.append(Event(m.leave_s, "membership", e.name, "Pending"))
    replicas = scenario.pool.replicas
    for change in scenario.capacity_changes:
        up = replicas * min(sims_per_replica, max(0, change.slots_per_replica // slots_per_sim))
        events.append(Event(change.t_s, "replicas", scenario.pool.name, up))
    return sorted(events, key=lambda ev: (ev.t_s, ev.kind))


def initial_membership(events: Sequence[Event]) -> list[Event]:
    return [ev for ev in events if ev.kind == "membership" and ev.t_s == 0]


async def publish_membership(bootstrap: str, topic: str, raw_documents: Sequence[Mapping[str, Any]],
                             events: Sequence[Event]) -> None:
    """One spec record per event, with the entitlement's spec as the stack's config has it (less any ``state``
    override: the record's own state is what the agents apply)."""
    from tokenpools_dev.kafka import local_kafka

    from tokenpools.topics.codec import encode
    from tokenpools.topics.records import SpecRecord

    docs = {(d.get("metadata") or {}).get("name"): d for d in raw_documents if d.get("kind") == "TokenEntitlement"}
    producer = local_kafka(bootstrap).producer("control", acks="all")
    await producer.start()
    try:
        for ev in events:
            doc = docs[ev.name]
            spec = {k: v for k, v in doc["spec"].items() if k != "state"}  # the record's state decides
            record = SpecRecord(kind="TokenEntitlement", name=ev.name, pool=doc["spec"]["poolRef"]["name"],
                                generation=1, spec=spec, state=ev.value,
                                reason="live experiment timeline", t_ms=int(time.time() * 1000))
            await producer.send_and_wait(topic, encode(record), key=f"TokenEntitlement/{ev.name}".encode())
    finally:
        await producer.stop()


async def play(events: Sequence[Event], origin_s: float, time_scale: float, stack: Any, bootstrap: str,
               specs_topic: str, raw_documents: Sequence[Mapping[str, Any]], membership: bool = True) -> list[tuple[float, Event]]:
    """Apply the events with t > 0 at ``origin + time_scale × t``; returns (wall time applied, event)."""
    applied = []
    for ev in events:
        if ev.t_s <= 0:
            continue
        delay = origin_s + ev.t_s * time_scale - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if ev.kind == "membership":
            if membership:
                await publish_membership(bootstrap, specs_topic, raw_documents, [ev])
        else:
            await asyncio.to_thread(set_up_replicas, stack.pool(ev.name), ev.value)
        applied.append((time.time(), ev))
    return applied


def set_up_replicas(pool: Any, up: int) -> None:
    """Fail the highest-numbered replicas above ``up``, restore failed ones below it."""
    for replica in pool.replicas:
        if replica.index >= up and replica.up:
            pool.fail(replica.index)
        elif replica.index < up and not replica.up:
            pool.restore(replica.index)
