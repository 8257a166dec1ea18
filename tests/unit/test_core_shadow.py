"""Shadow mode in the admission core (docs/shadow.md): a limit refusal of a shadow entitlement is an admission that
carries the refusal it would have been."""

from __future__ import annotations


from hypothesis import given, settings
from hypothesis import strategies as st

from admission_support import O, admit, controller, limits, spec
from tokenpools.core.admission import AdmissionController
from tokenpools.core.classes import EntitlementState, ServiceClass
from tokenpools.core.enforcement import Enforcement, effective

SHADOW, ENFORCE = Enforcement.SHADOW, Enforcement.ENFORCE


def test_the_entitlement_overrides_the_pool() -> None:
    assert effective(None, SHADOW) is SHADOW
    assert effective(ENFORCE, SHADOW) is ENFORCE
    assert effective(SHADOW, ENFORCE) is SHADOW


def test_a_concurrency_refusal_in_shadow_is_admitted_and_reserves_like_an_admission() -> None:
    ctl = controller((spec("a", enforcement=SHADOW), limits(concurrency=1)))
    first = admit(ctl, "a", "r1")
    second = admit(ctl, "a", "r2")
    assert first.admitted and first.would_refuse is None
    assert second.admitted and second.ticket is not None
    assert second.would_refuse is O.REFUSED_CONCURRENCY and second.would_retry_after_ms > 0
    assert "would refuse" in second.reason
    assert ctl.in_flight_of("a") == 2 and ctl.in_flight == 2
    assert ctl.bucket_tokens_of("a", 0.0) == 1000 - 2 * 100  # both charged their 50 + 50
    ctl.release(second.ticket, 60, 1.0)
    assert ctl.in_flight_of("a") == 1


def test_a_budget_refusal_in_shadow_takes_the_bucket_below_zero_and_the_next_decisions_see_it() -> None:
    ctl = controller((spec("a", enforcement=SHADOW), limits(tokens_per_s=10.0)))  # depth 100
    assert admit(ctl, "a", "r1", prompt=50, max_tokens=50).would_refuse is None
    d = admit(ctl, "a", "r2", prompt=50, max_tokens=50)
    assert d.admitted and d.would_refuse is O.REFUSED_TOKEN_BUDGET
    assert ctl.bucket_tokens_of("a", 0.0) == -100
    # 15 s later the bucket holds 50 (refill 10/s from -100): enforce would still refuse 100 tokens, in 5 s
    later = admit(ctl, "a", "r3", prompt=50, max_tokens=50, now_s=15.0)
    assert later.would_refuse is O.REFUSED_TOKEN_BUDGET and later.would_retry_after_ms == 5000


def test_kv_and_low_priority_refusals_are_shadowed_too() -> None:
    ctl = controller((spec("a", enforcement=SHADOW), limits(kv_bytes=150, priority=10.0)),
                     (spec("b"), limits(priority=60.0)), pool_concurrency=1)
    first = admit(ctl, "a", "a1")
    assert first.admitted and first.would_refuse is None  # 100 KV bytes of 150
    kv = admit(ctl, "a", "a2")
    assert kv.admitted and kv.would_refuse is O.REFUSED_KV and ctl.kv_reserved_of("a") == 200
    assert admit(ctl, "b", "b1").admitted  # above a's priority: passes the contended pool
    ctl.release(kv.ticket, 0, 0.0)
    ctl.release(first.ticket, 0, 0.0)
    ctl.set_limits("a", limits(priority=10.0), 0.0)  # KV no longer binds: the next check to refuse is priority
    low = admit(ctl, "a", "a3")  # the pool is full of b's priority 60
    assert low.admitted and low.would_refuse is O.REFUSED_LOW_PRIORITY and low.evict == ()


def test_identity_is_never_shadowed() -> None:
    ctl = controller((spec("a", enforcement=SHADOW, state=EntitlementState.PENDING), limits()))
    ctl.enforcement = SHADOW
    assert admit(ctl, "nobody").outcome is O.REFUSED_UNKNOWN_KEY
    assert admit(ctl, "a").outcome is O.REFUSED_NOT_BOUND


def test_the_pool_mode_applies_unless_the_entitlement_sets_its_own() -> None:
    ctl = controller((spec("a"), limits(concurrency=0)), (spec("b", enforcement=ENFORCE), limits(concurrency=0)))
    assert admit(ctl, "a", "1").outcome is O.REFUSED_CONCURRENCY
    ctl.enforcement = SHADOW
    assert admit(ctl, "a", "2").would_refuse is O.REFUSED_CONCURRENCY
    assert admit(ctl, "b", "3").outcome is O.REFUSED_CONCURRENCY


def test_a_shadow_admission_that_would_be_refused_evicts_no_one() -> None:
    ctl = controller((spec("g", ServiceClass.GUARANTEED, enforcement=SHADOW), limits(concurrency=1, priority=90.0)),
                     (spec("p", ServiceClass.PREEMPTIBLE), limits(concurrency=4, priority=1.0)), pool_concurrency=2)
    assert admit(ctl, "p", "p1").admitted and admit(ctl, "g", "g1").admitted  # the pool is full
    over = admit(ctl, "g", "g2")  # over g's limit: enforce would refuse it
    assert over.admitted and over.would_refuse is O.REFUSED_CONCURRENCY and over.evict == ()
    assert ctl.in_flight == 3  # over the pool: the backend queues it, as it would the same traffic admitted


def test_a_shadow_request_that_passes_is_an_ordinary_admission_and_evicts_as_one() -> None:
    ctl = controller((spec("g", ServiceClass.GUARANTEED, enforcement=SHADOW), limits(concurrency=2, priority=90.0)),
                     (spec("p", ServiceClass.PREEMPTIBLE), limits(concurrency=4, priority=1.0)), pool_concurrency=1)
    assert admit(ctl, "p", "p1").admitted
    d = admit(ctl, "g", "g1")
    assert d.admitted and d.would_refuse is None and [t.request_id for t in d.evict] == ["p1"]


# ---- the property ---------------------------------------------------------------------------------------------
# For any sequence of admissions, releases and clock steps over a pool in shadow with one entitlement inheriting it
# ("a") and one enforcing ("b"): every request of "a" is admitted, and at each of its decisions the would-refuse
# outcome (and retry_after_ms) is exactly what an enforce controller in the same state - a copy of the shadow
# controller taken just before the decision, switched to enforce - decides for the same request (ADMITTED when
# would_refuse is None). "b" decides the same in both. The state is the admitted state of the shadow run: what
# shadow admitted is in flight and charged in both.

_admit = st.tuples(st.just("admit"), st.sampled_from(["a", "b"]), st.integers(0, 400), st.integers(0, 400))
_step = st.one_of(
    _admit, _admit,
    st.tuples(st.just("release"), st.integers(0, 50), st.integers(0, 900)),
    st.tuples(st.just("wait"), st.integers(1, 5000)),
)


def _shadow_controller() -> AdmissionController:
    # limits that every check can refuse: a's slots, bucket (depth 1500) and KV, and the pool's contention (b's
    # priority is above a's)
    ctl = controller((spec("a", ServiceClass.ELASTIC), limits(concurrency=2, tokens_per_s=150.0, kv_bytes=1200)),
                     (spec("b", ServiceClass.ELASTIC, enforcement=ENFORCE),
                      limits(concurrency=3, tokens_per_s=150.0, priority=60.0)),
                     pool_concurrency=4)
    ctl.enforcement = SHADOW
    return ctl


def _replayed(history: list[tuple]) -> AdmissionController:
    """A controller in the state ``history`` (admissions and releases by request id, with their times) leaves the
    shadow run in, built afresh: a compiled controller cannot be deep-copied."""
    ctl, tickets = _shadow_controller(), {}
    for op in history:
        if op[0] == "admit":
            _, name, rid, prompt, out, at_s = op
            d = ctl.admit(name, rid, prompt, out, at_s)
            if d.ticket is not None:
                tickets[rid] = d.ticket
        else:
            _, rid, tokens, at_s = op
            ctl.release(tickets.pop(rid), tokens, at_s)
    return ctl


@settings(max_examples=300, deadline=None)
@given(st.lists(_step, max_size=60))
def test_shadow_admits_everything_and_would_refuse_is_the_enforce_decision(steps) -> None:
    ctl = _shadow_controller()
    now_s, n, tickets = 0.0, 0, []
    history: list[tuple] = []
    for step in steps:
        if step[0] == "wait":
            now_s += step[1] / 1000
        elif step[0] == "release":
            if tickets:
                t = tickets.pop(step[1] % len(tickets))
                ctl.release(t, step[2], now_s)
                history.append(("release", t.request_id, step[2], now_s))
        else:
            _, name, prompt, out = step
            n += 1
            twin = _replayed(history)
            twin.enforcement = ENFORCE
            enforced = twin.admit(name, f"r{n}", prompt, out, now_s)
            d = ctl.admit(name, f"r{n}", prompt, out, now_s)
            history.append(("admit", name, f"r{n}", prompt, out, now_s))
            if name == "a":
                assert d.admitted
                assert (d.would_refuse or O.ADMITTED) is enforced.outcome
                assert d.would_retry_after_ms == enforced.retry_after_ms
                if d.would_refuse is None:
                    assert [t.request_id for t in d.evict] == [t.request_id for t in enforced.evict]
            else:
                assert (d.outcome, d.retry_after_ms, d.would_refuse) == (enforced.outcome, enforced.retry_after_ms, None)
            if d.ticket is not None:
                tickets.append(d.ticket)
            for victim in d.evict:
                if victim in tickets:
                    tickets.remove(victim)
                    ctl.release(victim, 0, now_s)
                    history.append(("release", victim.request_id, 0, now_s))
