"""The replay's admission queue is woken when the live proxy's is (proxy/admission/waiting.py, docs/queueing.md), never later
and never otherwise.

The live proxy drains a pool's queue after every release, every limit change and every spec change it applies,
and on the pool's one timer, re-armed at the queue's ``next_wake_s`` after each drain and each request that starts
to wait. Over random small scenarios (hypothesis: slots and token budgets short enough that requests wait for
both, a tick a second, sometimes an entitlement leaving), a trace of the token-pools policy's calls checks named
invariants:

- woken at every trigger: while anything waits, a release, a limit change or a spec change at t is followed by a
  drain at t;
- never later than live: once the queue names a wake (the timer), the replay does not move past it without a
  drain while anything still waits;
- never otherwise: every drain is at a trigger of its instant or at the named wake (no re-check the live proxy
  would not make);
- order unchanged: inside an entitlement waiters are admitted first come, first served; each waiter is resolved
  once, and never after its deadline;
- the same scenario gives the same trace.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.admission import Decision, Ticket
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.core.waiting import Waiter, WaitOutcome
from tokenpools.replay import baseline
from tokenpools.replay.backend.model import ReplicaModel
from tokenpools.replay.budgets import BudgetPeriod
from tokenpools.replay.load import Arrival, RetryPolicy
from tokenpools.replay.policy import EntitlementTick, PoolTick, TokenPoolsPolicy
from tokenpools.replay.replayer import replay
from tokenpools.replay.scenario import EPOCH_MS, Membership, ReplayParams, Scenario

POOL = PoolSpec("p", "m", Capacity(200.0, 1e12, 4.0), kv_bytes_per_token=1, default_max_tokens=32,
                token_bucket_window_s=1.0)
ENTITLEMENTS = (
    EntitlementSpec("gold", "p", ServiceClass.GUARANTEED, 1000.0, Capacity(80.0, 1e11, 2.0), queue_timeout_ms=900),
    EntitlementSpec("silver", "p", ServiceClass.ELASTIC, 2000.0, Capacity(60.0, 1e11, 1.0), queue_timeout_ms=600),
    EntitlementSpec("spot", "p", ServiceClass.SPOT, 30000.0, queue_timeout_ms=400),
)
NAMES = tuple(e.name for e in ENTITLEMENTS)


class _Recording(baseline.NoAdmissionPolicy):
    """A ``TokenPoolsPolicy`` whose calls are written down in ``trace``, in order. (A ``NoAdmissionPolicy`` by type
    only: the registry's factories return one of the two registered classes, which the compiled replayer checks;
    every call goes to the token-pools policy inside.)"""

    name = "recording"
    controlled = True

    def __init__(self, pool: PoolSpec, params: ReplayParams, origin_ms: int = 0) -> None:  # (not the base's)
        self.inner = TokenPoolsPolicy(pool, params, origin_ms)
        self.trace: list[tuple[Any, ...]] = []

    # what the replayer reads at the end
    @property
    def queue_outcomes(self) -> dict[str, dict[str, int]]:  # type: ignore[override]
        return self.inner.queue_outcomes

    @property
    def wait_starts(self) -> list[tuple[float, str, str]]:  # type: ignore[override]
        return self.inner.wait_starts

    @property
    def entitlement_ticks(self) -> list[EntitlementTick]:  # type: ignore[override]
        return self.inner.entitlement_ticks

    @property
    def pool_ticks(self) -> list[PoolTick]:  # type: ignore[override]
        return self.inner.pool_ticks

    def budget_periods(self) -> list[BudgetPeriod]:
        return self.inner.budget_periods()

    def in_flight(self) -> dict[str, int]:
        return self.inner.in_flight()

    def output_reservation(self, entitlement: str, max_tokens: int) -> int:
        return self.inner.output_reservation(entitlement, max_tokens)

    def set_capacity(self, slots_per_replica: int, max_num_seqs: int, backend_waiting: int) -> None:
        raise AssertionError("these scenarios change no capacity")

    # the calls the invariants are about
    def join(self, spec: EntitlementSpec, now_s: float) -> None:
        self.inner.join(spec, now_s)
        self.trace.append(("trigger", now_s, []))

    def leave(self, name: str, now_s: float) -> list[Waiter]:
        withdrawn = self.inner.leave(name, now_s)
        self.trace.append(("trigger", now_s, withdrawn))
        return withdrawn

    def tick(self, now_s: float, backend_waiting: int, ready_replicas: int) -> int | None:
        target = self.inner.tick(now_s, backend_waiting, ready_replicas)
        self.trace.append(("trigger", now_s, []))
        return target

    def completed(self, ticket: Ticket, used_tokens: int, now_s: float, completion_tokens: int | None = None) -> None:
        self.inner.completed(ticket, used_tokens, now_s, completion_tokens)
        self.trace.append(("trigger", now_s, []))

    def admit(self, entitlement: str, request_id: str, prompt_tokens: int, max_tokens: int | None,
              now_s: float) -> Decision | Waiter:
        result = self.inner.admit(entitlement, request_id, prompt_tokens, max_tokens, now_s)
        if isinstance(result, Waiter):
            self.trace.append(("wait", now_s, result))
        return result

    def drain(self, now_s: float) -> list[Waiter]:
        resolved = self.inner.drain(now_s)
        self.trace.append(("drain", now_s, resolved))
        return resolved

    def next_wake_s(self) -> float | None:
        due = self.inner.next_wake_s()
        self.trace.append(("named", due))
        return due


def _replay(scenario: Scenario) -> list[tuple[Any, ...]]:
    made: list[_Recording] = []

    def factory(pool: PoolSpec, params: ReplayParams, origin_ms: int = 0) -> _Recording:
        made.append(_Recording(pool, params, origin_ms))
        return made[-1]

    with pytest.MonkeyPatch.context() as patch:  # (registered for this replay only)
        patch.setitem(baseline.POLICIES, "recording", factory)
        replay(scenario, "recording")
    return made[0].trace


def _check(trace: list[tuple[Any, ...]]) -> None:
    """Walk the trace: the invariants of the module doc, in the order the live proxy would meet them."""
    waiting: set[int] = set()  # ids of the waiters not yet resolved
    resolved: set[int] = set()
    admitted: dict[str, list[int]] = {name: [] for name in NAMES}
    now = 0.0
    due_drain: float | None = None  # a trigger while something waited: a drain is due at this instant
    armed: float | None = None  # the timer: the last wake the queue named (a due one fires at once)
    drained_at: float | None = None  # the last drain's instant: the proxy drains again there while evictions free

    def moved_to(t: float) -> None:
        assert due_drain is None or t == due_drain, f"a trigger at {due_drain} while waiting, no drain until {t}"
        assert armed is None or not waiting or t <= armed, f"the queue named {armed}, nothing drained, now {t}"

    def settle(waiters: list[Waiter], t: float) -> None:
        for w in waiters:
            assert id(w) in waiting and id(w) not in resolved, "a waiter resolved twice, or never waited"
            waiting.discard(id(w))
            resolved.add(id(w))
            assert w.resolved_s == t and w.resolved_s <= w.deadline_s + 2e-9, "resolved after its deadline"  # (the clock: whole ns)
            if w.outcome is WaitOutcome.ADMITTED:
                admitted[w.entitlement].append(w.seq)

    for event in trace:
        kind = event[0]
        if kind == "named":
            due = event[1]
            armed = None if due is None else max(due, now)
            continue
        t = event[1]
        moved_to(t)
        now = t
        if kind == "wait":
            waiting.add(id(event[2]))
        elif kind == "trigger":
            settle(event[2], t)  # (a leaving entitlement's waiters are refused with it)
            if waiting:
                due_drain = t
        else:  # a drain: at a trigger of this instant, or at the named wake, or again (an eviction freed a slot)
            assert due_drain == t or armed == t or drained_at == t, \
                f"a drain at {t}: no trigger then, and the queue named {armed}"
            settle(event[2], t)
            due_drain, drained_at = None, t
            if armed == t or not waiting:
                armed = None  # (the timer fired; or nobody waits: no timer, whatever was named)
    for name, seqs in admitted.items():
        assert seqs == sorted(seqs), f"{name}'s waiters admitted out of their order: {seqs}"


_arrivals = st.lists(
    st.tuples(st.integers(0, 4000), st.sampled_from(NAMES), st.integers(1, 40), st.integers(1, 40)),
    min_size=5, max_size=60)


@settings(max_examples=150, deadline=None)
@given(arrivals=_arrivals, retries=st.integers(0, 2), spot_leaves_ms=st.one_of(st.none(), st.integers(500, 4000)))
def test_the_queue_is_woken_when_the_live_proxy_wakes_it(arrivals: list, retries: int,
                                                         spot_leaves_ms: int | None) -> None:
    load = tuple(Arrival(t_ms / 1000, ent, f"r{i}", prompt, 32, output)
                 for i, (t_ms, ent, prompt, output) in enumerate(sorted(arrivals, key=lambda a: a[0])))
    membership = {} if spot_leaves_ms is None else {"spot": Membership(0.0, spot_leaves_ms / 1000)}
    scenario = Scenario("wakes", POOL, ENTITLEMENTS, load, 6.0, replica_model=ReplicaModel(max_num_seqs=4),
                        retry=RetryPolicy(max_retries=retries, jitter_s=0.05), membership=membership,
                        params=ReplayParams(tick_s=1.0), origin_ms=EPOCH_MS)
    trace = _replay(scenario)
    _check(trace)
    again = _replay(scenario)
    assert _summary(again) == _summary(trace)


def _summary(trace: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [(e[0], e[1]) if e[0] in ("named", "trigger") else
            (e[0], e[1], e[2].request_id if e[0] == "wait" else [w.request_id for w in e[2]]) for e in trace]


def test_a_token_budget_waiter_is_admitted_at_the_moment_the_queue_names() -> None:
    """No release, no tick: the timer is what admits a waiter whose bucket refills (live: the pool's timer)."""
    spec = EntitlementSpec("gold", "p", ServiceClass.GUARANTEED, 1000.0, Capacity(40.0, 1e11, 4.0),
                           queue_timeout_ms=2000)
    load = (Arrival(0.0, "gold", "r0", 30, 8, 8), Arrival(0.01, "gold", "r1", 30, 8, 8))  # 38 tokens each, 40 held
    scenario = Scenario("refill", POOL, (spec,), load, 5.0, replica_model=ReplicaModel(max_num_seqs=4),
                        retry=RetryPolicy(max_retries=0), params=ReplayParams(tick_s=100.0), origin_ms=EPOCH_MS)
    result = replay(scenario)
    d = result.decisions
    i = d.request_id.index("r1")
    assert d.outcome[i] == "admitted" and d.queued_s[i] > 0
    # r0 left 2 tokens; the bucket holds r1's 38 again 0.9 s later at 40/s, whenever its refusal was last refreshed
    # (r0's release refunds nothing): the timer admits it then, at no release or tick
    assert d.t_s[i] == pytest.approx(0.9, abs=0.002)
    assert d.t_s[i] not in result.completions.t_s and d.t_s[i] not in [tick.t_s for tick in result.pool_ticks]
