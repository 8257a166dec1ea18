"""The scenario's timeline applied to a running stack: who is a member when, and how many replicas are up.

- Membership (``Scenario.membership``: guaranteed-c in [30 s, 60 s) of Exp 1, reports from 210 s in Exp 2) is what
  an operator changes with ``kubectl apply``: here a spec record on the specs topic (the controller's own output),
  ``state: Pending`` to keep an entitlement out of the agents' tick, no state to let capacity admission bind it.
  The proxies hold every entitlement of the file from the start (they do not read the specs topic), so a client of
  a not-yet-joined entitlement would be admitted on its static limits; the schedule sends nothing for it then.
  A join's record goes out ``join_lead_s`` before the tenant's first request (``membership_lead_s``: one agents'
  window and its grace), as an operator applies an entitlement before its tenant sends: the agents tick it Bound
  and idle once, and publish its limits, before its traffic starts, as the simulation's join at a tick does.
  Published at the first request instead, the window that holds the join mostly also holds the tenant's first
  requests, some refused on the static limits the proxies hold until an update counts it, while none it admitted
  has completed yet: its first tick then carries that debt (Exp 2's reports at 117–133 instead of ≈ 60, above
  copilot), or not, by the phase of the agents' windows. A leave's record goes out when the tenant's load stops
  (its requests in flight end under the limits the proxies hold).
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


def membership_lead_s(tick_s: float, grace_s: float) -> float:
    """How long before a joining tenant's first request its membership record is published (experiment s).

    The agents read membership when they tick a window, and their ticks have no fixed phase with respect to the
    run. Published ``tick_s + grace_s`` ahead (the agents' window and how late a record may reach them), the
    record is in their view before some window that ends at or before the first request is ticked: that window is
    ticked with the tenant Bound and none of its requests, so its first tick has no debt or burst, and the proxies
    get its limits from that tick's update (a window is closed about 0.1 s after its end).
    """
    if tick_s <= 0 or grace_s < 0:
        raise ValueError(f"need tick_s > 0 and grace_s >= 0, got {tick_s}, {grace_s}")
    return tick_s + grace_s


def timeline(scenario: Scenario, slots_per_sim: int, sims_per_replica: int, join_lead_s: float) -> list[Event]:
    """Every change of the run in time order; events at t = 0 are the initial state.

    A join's membership record is at ``join_s − join_lead_s`` (``membership_lead_s``); a tenant that would join
    within ``join_lead_s`` of the start is a member from the start (no event)."""
    if join_lead_s < 0:
        raise ValueError(f"`join_lead_s` must be >= 0, got {join_lead_s}")
    events = []
    for e in scenario.entitlements:
        m = scenario.member(e.name)
        joins_at = max(0.0, m.join_s - join_lead_s)
        if joins_at > 0:
            events += [Event(0.0, "membership", e.name, "Pending"), Event(joins_at, "membership", e.name, None)]
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
