"""Admission under contention (check 6: priority against the in-flight minimum) and preemptible eviction."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.admission import AdmissionController, Ticket
from tokenpools.core.classes import ServiceClass

from admission_support import O, admit, controller, limits, spec


# ---- check 6: contention -------------------------------------------------------------------------------------

def _contended_pool(floor: float, other: float) -> AdmissionController:
    """One slot, held by a request of priority ``floor``; entitlement "b" has priority ``other``."""
    ctl = controller((spec("a"), limits(priority=floor)), (spec("b"), limits(priority=other)), pool_concurrency=1)
    assert admit(ctl, "a", "a-1").admitted
    assert ctl.contended and ctl.min_in_flight_priority() == floor
    return ctl


def test_equal_priority_does_not_exceed_the_in_flight_minimum() -> None:
    decision = admit(_contended_pool(50.0, 50.0), "b")
    assert decision.outcome is O.REFUSED_LOW_PRIORITY and decision.retry_after_s >= 1


def test_priority_just_above_the_in_flight_minimum_is_admitted_into_a_full_pool() -> None:
    """No preemption: the higher priority goes through even though the pool is full (docs/semantics.md#contention)."""
    ctl = _contended_pool(50.0, math.nextafter(50.0, math.inf))
    assert admit(ctl, "b").admitted
    assert ctl.in_flight == 2


def test_lower_priority_is_refused_under_contention() -> None:
    assert admit(_contended_pool(50.0, 20.3), "b").outcome is O.REFUSED_LOW_PRIORITY


def test_same_entitlement_cannot_beat_its_own_in_flight_minimum() -> None:
    """Why spot drains to near zero in Exp 1: while it holds the minimum, its own new requests are refused."""
    ctl = controller((spec("s", ServiceClass.SPOT), limits(priority=1.0)), pool_concurrency=1)
    assert admit(ctl, "s", "s-1").admitted
    assert admit(ctl, "s", "s-2").outcome is O.REFUSED_LOW_PRIORITY


def test_uncontended_pool_admits_low_priority() -> None:
    ctl = controller((spec("a"), limits(priority=900.0)), (spec("b"), limits(priority=0.1)), pool_concurrency=2)
    assert admit(ctl, "a", "a-1").admitted
    assert not ctl.contended
    assert admit(ctl, "b", "b-1").admitted  # the pool fills up to its concurrency
    assert ctl.contended
    assert admit(ctl, "b", "b-2").outcome is O.REFUSED_LOW_PRIORITY


def test_backend_waiting_queue_makes_the_pool_contended() -> None:
    ctl = controller((spec("a"), limits(priority=50.0)), (spec("b"), limits(priority=10.0)), pool_concurrency=16)
    assert admit(ctl, "a", "a-1").admitted
    ctl.set_pool(16, backend_waiting=3)
    assert ctl.contended
    assert admit(ctl, "b", "b-1").outcome is O.REFUSED_LOW_PRIORITY
    ctl.set_pool(16, backend_waiting=0)
    assert admit(ctl, "b", "b-2").admitted


def test_waiting_queue_with_nothing_in_flight_has_no_threshold() -> None:
    ctl = controller((spec("b"), limits(priority=0.1)), pool_concurrency=16)
    ctl.set_pool(16, backend_waiting=5)
    assert ctl.contended and ctl.min_in_flight_priority() is None
    assert admit(ctl, "b").admitted


def test_in_flight_requests_keep_the_priority_they_were_admitted_with() -> None:
    """Raising a's priority after admission does not raise the threshold its in-flight request sets."""
    ctl = _contended_pool(50.0, 60.0)
    ctl.set_limits("a", limits(priority=500.0), 1.0)
    assert ctl.min_in_flight_priority() == 50.0
    assert admit(ctl, "b", "b-1", now_s=1.0).admitted  # 60 > 50 (the snapshot), though 60 < 500 (the current)


def test_new_requests_carry_the_current_priority() -> None:
    """Rising debt lets an entitlement's new request beat its own older in-flight one (docs/semantics.md#contention)."""
    ctl = controller((spec("synth"), limits(priority=20.3)), pool_concurrency=1)
    first = admit(ctl, "synth", "s-1")
    assert first.admitted and first.ticket is not None and first.ticket.priority == 20.3
    assert admit(ctl, "synth", "s-2").outcome is O.REFUSED_LOW_PRIORITY
    ctl.set_limits("synth", limits(priority=83.1), 5.0)
    second = admit(ctl, "synth", "s-3", now_s=5.0)
    assert second.admitted and second.ticket is not None and second.ticket.priority == 83.1
    assert ctl.min_in_flight_priority() == 20.3
    ctl.release(first.ticket, 100, 6.0)
    assert ctl.min_in_flight_priority() == 83.1


def test_threshold_follows_releases_with_duplicate_priorities() -> None:
    ctl = controller((spec("a"), limits(priority=10.0)), (spec("b"), limits(priority=30.0)), pool_concurrency=8)
    tickets = [admit(ctl, "a", f"a-{i}").ticket for i in range(2)] + [admit(ctl, "b", "b-0").ticket]
    assert all(t is not None for t in tickets)
    assert ctl.min_in_flight_priority() == 10.0
    ctl.release(tickets[0], 100, 0.0)  # type: ignore[arg-type]
    assert ctl.min_in_flight_priority() == 10.0  # the other a request is still in flight
    ctl.release(tickets[1], 100, 0.0)  # type: ignore[arg-type]
    assert ctl.min_in_flight_priority() == 30.0
    ctl.release(tickets[2], 100, 0.0)  # type: ignore[arg-type]
    assert ctl.min_in_flight_priority() is None


# ---- eviction ------------------------------------------------------------------------------------------------

def _full_of_preemptible(n: int = 2) -> tuple[AdmissionController, list[Ticket]]:
    ctl = controller((spec("g", ServiceClass.GUARANTEED), limits(priority=333.0)),
                     (spec("e"), limits(priority=30.0)),
                     (spec("p", ServiceClass.PREEMPTIBLE), limits(concurrency=8, priority=0.03)),
                     pool_concurrency=n)
    tickets = []
    for i in range(n):
        decision = admit(ctl, "p", f"p-{i}", now_s=float(i))
        assert decision.admitted and decision.ticket is not None and decision.ticket.evictable
        tickets.append(decision.ticket)
    return ctl, tickets


def test_protected_request_into_a_full_pool_evicts_the_newest_preemptible() -> None:
    ctl, tickets = _full_of_preemptible()
    decision = admit(ctl, "g", "g-1", now_s=5.0)
    assert decision.admitted and decision.evict == (tickets[-1],)


def test_each_protected_admission_gets_its_own_victim() -> None:
    """Until the victim is released, a second protected request must not be handed the same one."""
    ctl, tickets = _full_of_preemptible()
    first = admit(ctl, "g", "g-1", now_s=5.0)
    second = admit(ctl, "g", "g-2", now_s=5.0)
    assert first.evict == (tickets[1],) and second.evict == (tickets[0],)
    assert admit(ctl, "g", "g-3", now_s=5.0).evict == ()  # nothing left to evict


def test_a_released_preemptible_is_no_longer_a_victim() -> None:
    ctl, tickets = _full_of_preemptible()
    ctl.release(tickets[1], 10, 1.0)
    assert admit(ctl, "e", "e-1", now_s=1.0).admitted  # fills the freed slot (uncontended: 1 < 2)
    assert admit(ctl, "g", "g-1", now_s=2.0).evict == (tickets[0],)


def test_elastic_request_into_a_full_pool_evicts_nothing() -> None:
    ctl, _ = _full_of_preemptible()
    decision = admit(ctl, "e", "e-1", now_s=5.0)
    assert decision.admitted and decision.evict == ()


def test_protected_request_into_a_pool_with_room_evicts_nothing() -> None:
    ctl, _ = _full_of_preemptible(2)
    ctl.set_pool(3, backend_waiting=1)  # contended by the queue, but a slot is free
    decision = admit(ctl, "g", "g-1", now_s=5.0)
    assert decision.admitted and decision.evict == ()


def test_non_preemptible_tickets_are_not_evictable() -> None:
    ctl = controller((spec("s", ServiceClass.SPOT), limits(priority=1.0)),
                     (spec("g", ServiceClass.GUARANTEED), limits(priority=333.0)), pool_concurrency=1)
    spot = admit(ctl, "s", "s-1")
    assert spot.ticket is not None and not spot.ticket.evictable
    assert admit(ctl, "g", "g-1").evict == ()


# ---- the in-flight minimum is exact and its index stays small --------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 40), st.integers(0, 10**6)), min_size=1, max_size=300))
def test_in_flight_minimum_equals_a_scan_of_the_live_tickets(ops: list[tuple[bool, int, int]]) -> None:
    """Invariant: ``min_in_flight_priority`` is the minimum over the tickets in flight, whatever the order of
    admissions, releases and priority changes; and the heap behind it never holds more than 2·K + 17 values."""
    ctl = controller((spec("a"), limits(concurrency=10**6, tokens_per_s=1e12)), pool_concurrency=10**6)
    live: list[Ticket] = []
    for i, (is_admit, priority, pick) in enumerate(ops):
        if is_admit or not live:
            ctl.set_limits("a", limits(concurrency=10**6, tokens_per_s=1e12, priority=float(priority)), 0.0)
            decision = admit(ctl, "a", f"r{i}", prompt=1, max_tokens=0)
            assert decision.ticket is not None
            live.append(decision.ticket)
        else:
            ctl.release(live.pop(pick % len(live)), 1, 0.0)
        expected = min((t.priority for t in live), default=None)
        assert ctl.min_in_flight_priority() == expected
        assert len(ctl._heap) <= 2 * len({t.priority for t in live}) + 17


# ---- slots kept for protected limits --------------------------------------------------------------------------

def test_a_removed_entitlements_requests_do_not_let_another_class_take_a_protected_slot() -> None:
    """The Exp 1 leave: guaranteed-c leaves with requests still running, the next limits give its slots to spot, and
    the pool is over-committed until they finish. The slot guaranteed-a has unused stays its own meanwhile: spot is
    refused for it (low priority, retry after the releases that end the over-commitment), and guaranteed-a's next
    request finds it free instead of a full pool (where it would be admitted anyway, and queue in the backend)."""
    ctl = controller((spec("a", ServiceClass.GUARANTEED), limits(concurrency=2, priority=900.0)),
                     (spec("c", ServiceClass.GUARANTEED), limits(concurrency=2, priority=900.0)),
                     (spec("s", ServiceClass.SPOT), limits(concurrency=0, priority=1.0)), pool_concurrency=4)
    assert admit(ctl, "a", "a1").admitted and admit(ctl, "c", "c1").admitted and admit(ctl, "c", "c2").admitted
    ctl.remove_entitlement("c")  # c1 and c2 still run
    ctl.set_limits("s", limits(concurrency=2, priority=1.0), 0.0)  # the next tick lends c's slots to spot
    assert ctl.kept_for_protected() == 1 and ctl.in_flight == 3
    refused = admit(ctl, "s", "s1")
    assert refused.outcome is O.REFUSED_LOW_PRIORITY and "kept" in refused.reason
    assert admit(ctl, "a", "a2").admitted and ctl.in_flight == 4  # a's own slot: no over-subscription
    ctl.release(ctl._live["c1"][0], 10, 1.0)
    assert ctl.kept_for_protected() == 0 and admit(ctl, "s", "s1", now_s=1.0).admitted


def test_slots_the_limits_lend_are_not_kept() -> None:
    """With lending (policy.lend_idle_protected) the other limits take part of a protected baseline on purpose: only
    what the limits leave to the protected entitlement is kept."""
    ctl = controller((spec("g", ServiceClass.GUARANTEED), limits(concurrency=4, priority=900.0)),
                     (spec("s", ServiceClass.SPOT), limits(concurrency=3, priority=1.0)), pool_concurrency=4)
    assert admit(ctl, "g", "g1").admitted  # g leaves 3 unused, of which the limits lent 3 to s: none kept
    assert ctl.kept_for_protected() == 0
    assert all(admit(ctl, "s", f"s{i}").admitted for i in range(3))


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["admit", "release", "limits", "remove", "reclass"]), st.integers(0, 3),
                              st.integers(0, 6)), min_size=1, max_size=120),
       pool=st.integers(1, 8))
def test_no_other_class_is_admitted_into_slots_kept_for_protected_limits(ops: list[tuple[str, int, int]],
                                                                          pool: int) -> None:
    """Invariant: an admitted request of a class that is not protected never leaves fewer free slots than the
    protected limits have unused and not lent (pool − other limits − protected in flight), whatever the limit
    changes, class changes and removals (with requests still in flight) before it. The reference is recomputed from
    scratch."""
    names = ["g0", "g1", "e", "s"]
    classes = [ServiceClass.GUARANTEED, ServiceClass.DEDICATED, ServiceClass.ELASTIC, ServiceClass.SPOT]
    ctl = controller(*((spec(n, c), limits(concurrency=1, priority=float(10 - i)))
                       for i, (n, c) in enumerate(zip(names, classes))), pool_concurrency=pool)
    specs = {n: spec(n, c) for n, c in zip(names, classes)}
    live: list[Ticket] = []
    for step, (op, who, value) in enumerate(ops):
        name = names[who]
        if op == "admit" and name in ctl.entitlement_names():
            decision = admit(ctl, name, f"r{step}", now_s=step)
            if decision.admitted:
                assert decision.ticket is not None
                live.append(decision.ticket)
                if not specs[name].service_class.protected and ctl.in_flight <= pool:
                    assert ctl.in_flight + _kept(ctl, pool, specs) <= pool
        elif op == "release" and live:
            ctl.release(live.pop(value % len(live)), 1, step)
        elif op == "limits":
            if name not in ctl.entitlement_names():
                ctl.upsert_entitlement(specs[name], limits(concurrency=value, priority=float(10 - who)), step)
            else:
                ctl.set_limits(name, limits(concurrency=value, priority=float(10 - who)), step)
        elif op == "remove":
            ctl.remove_entitlement(name)
        elif op == "reclass" and name in ctl.entitlement_names():  # protected <-> not, its requests in flight
            other = ServiceClass.ELASTIC if specs[name].service_class.protected else ServiceClass.GUARANTEED
            specs[name] = spec(name, other)
            ctl.upsert_entitlement(specs[name], ctl.limits_of(name), step)
        assert ctl.kept_for_protected() == _kept(ctl, pool, specs)


def _kept(ctl: AdmissionController, pool: int, specs: dict) -> int:
    """The reference: the protected limits' unused slots, at most what the other limits leave them."""
    names = ctl.entitlement_names()
    protected = [n for n in names if specs[n].service_class.protected]
    others = sum(ctl.limits_of(n).concurrency for n in names if n not in protected)
    held = sum(ctl.in_flight_of(n) for n in protected)
    unused = sum(max(0, ctl.limits_of(n).concurrency - ctl.in_flight_of(n)) for n in protected)
    return max(0, min(unused, pool - others - held))
