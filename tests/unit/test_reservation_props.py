"""Reservations sized by a prediction, settled exactly (docs/reservations.md): the output estimate never exceeds
max_tokens, stationary completions run past it at most a (1 − q) fraction (plus slack) of the time, and the token
bucket is charged exactly the tokens used whatever was reserved, streams charged as they go included."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.core.admission import AdmissionController, EntitlementLimits
from tokenpools.core.classes import EntitlementState, ServiceClass
from tokenpools.core.reservation import OFF, OutputEstimator, ReservationConfig
from tokenpools.core.spec import EntitlementSpec

configs = st.builds(
    ReservationConfig,
    quantile=st.floats(0.01, 1.0),
    window_completions=st.integers(1, 64),
    min_completions=st.just(1),
)


@settings(max_examples=200, deadline=None)
@given(configs, st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 5000)), max_size=200),
       st.integers(0, 4096))
def test_estimate_never_exceeds_max_tokens(config: ReservationConfig, completions: list[tuple[int, int]],
                                           query: int) -> None:
    est = OutputEstimator(config)
    for cap, used in completions:
        est.observe("e", cap, used)
        assert 0 <= est.estimate("e", cap) <= cap
    assert 0 <= est.estimate("e", query) <= query


@settings(max_examples=200, deadline=None)
@given(configs, st.lists(st.integers(0, 300), max_size=300), st.sampled_from([32, 64, 128, 256]))
def test_the_estimate_is_the_quantile_of_the_last_n_completions_as_a_sorted_copy_gives_it(
        config: ReservationConfig, completions: list[int], cap: int) -> None:
    """Whatever the window keeps internally (a ring and a sorted list, updated in place), the estimate after each
    completion is the nearest-rank q-quantile of the last N completions (each at most the cap), taken afresh."""
    est = OutputEstimator(config)
    for i, used in enumerate(completions):
        est.observe("e", cap, used)
        last = sorted(min(u, cap) for u in completions[max(0, i + 1 - config.window_completions):i + 1])
        rank = math.ceil(config.quantile * len(last) - 1e-9)
        expected = cap if config.quantile >= 1.0 else min(cap, last[min(len(last), max(1, rank)) - 1])
        assert est.estimate("e", cap) == expected
        assert est.samples("e", cap) == (0 if config.quantile >= 1.0 else len(last))  # (off: nothing is kept)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 30), st.integers(1, 64), st.integers(0, 200))
def test_below_min_completions_or_off_reserves_max_tokens(min_completions: int, cap: int, seen: int) -> None:
    est = OutputEstimator(ReservationConfig(0.9, window_completions=64, min_completions=min_completions))
    off = OutputEstimator(OFF)
    for i in range(seen):
        est.observe("e", cap, i % 3)
        off.observe("e", cap, i % 3)
    assert off.estimate("e", cap) == cap
    if seen < min_completions:
        assert est.estimate("e", cap) == cap


def test_estimate_is_the_nearest_rank_quantile_of_the_last_n() -> None:
    est = OutputEstimator(ReservationConfig(0.95, window_completions=20, min_completions=20))
    for v in range(100, 120):  # the oldest 20 values: 100..119
        est.observe("e", 176, v)
    assert est.estimate("e", 176) == 118  # ⌈0.95·20⌉ = 19th smallest
    for v in range(1, 21):  # a new regime replaces the window entirely
        est.observe("e", 176, v)
    assert est.estimate("e", 176) == 19
    assert est.estimate("e", 10) == 10  # another cap class has seen nothing
    assert est.estimate("other", 176) == 176


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99]), st.sampled_from([32, 128, 256]), st.integers(0, 2**32),
       st.sampled_from(["uniform", "geometric", "lognormal", "few values"]))
def test_stationary_completions_exceed_their_reservation_at_most_1_minus_q(q: float, n: int, seed: int,
                                                                              shape: str) -> None:
    rng = random.Random(seed)
    cap = 512
    draw = {
        "uniform": lambda: rng.randint(0, cap),
        "geometric": lambda: min(cap, int(rng.expovariate(1 / 50))),
        "lognormal": lambda: min(cap, int(rng.lognormvariate(3.5, 0.8))),
        "few values": lambda: rng.choice((10, 52, 52, 60, 176)),
    }[shape]
    est = OutputEstimator(ReservationConfig(q, window_completions=n, min_completions=n))
    for _ in range(n):
        est.observe("e", cap, draw())
    trials = 4000
    exceeded = 0
    for _ in range(trials):
        x = draw()
        exceeded += x > est.estimate("e", cap)
        est.observe("e", cap, x)
    bound = (1 - q) + q / (n + 1)
    # sampling slack: ~4 standard deviations of a binomial fraction, widened for the window's autocorrelation
    slack = 4 * (bound * (1 - bound) / trials) ** 0.5 * 3 + 0.005
    assert exceeded / trials <= bound + slack


SPEC = EntitlementSpec("e", "pool", ServiceClass.SPOT, 1000.0, state=EntitlementState.BOUND)

requests = st.lists(
    st.tuples(
        st.integers(0, 300),  # n_in (the estimate the proxy reserves with)
        st.one_of(st.none(), st.integers(1, 512)),  # max_tokens as the client sends it
        st.integers(-20, 20),  # real prompt − estimate (the prompt estimate is rough)
        st.floats(0.0, 1.0),  # completion as a fraction of the cap
        st.booleans(),  # streamed: charged as it goes
        st.booleans(),  # ran to its end (teaches the estimate) or aborted
    ),
    min_size=1, max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(requests, st.floats(0.05, 1.0), st.integers(1, 8), st.integers(0, 2**32))
def test_bucket_charge_equals_tokens_used_whatever_the_estimate(reqs: list, q: float, window: int, seed: int) -> None:
    """Start the bucket far below its depth and stop time: no refill, no clamp. After every request settled (in a
    random interleaving, streams charged chunk by chunk), the bucket is its start less the tokens used, exactly."""
    rng = random.Random(seed)
    ctl = AdmissionController(pool_concurrency=10_000, kv_bytes_per_token=1, default_max_tokens=176,
                              token_bucket_window_s=1.0,
                              estimator=OutputEstimator(ReservationConfig(q, window_completions=window, min_completions=1)))
    ctl.upsert_entitlement(SPEC, EntitlementLimits(10_000, 1e12, 1e15, 1.0), 0.0)
    start = 1e9
    ctl.set_bucket_tokens("e", start, 0.0)
    used_total = 0
    live = []
    for i, (n_in, max_tokens, prompt_err, frac, stream, finished) in enumerate(reqs):
        d = ctl.admit("e", f"r{i}", n_in, max_tokens, 0.0)
        assert d.ticket is not None
        cap = 176 if max_tokens is None else max_tokens
        assert n_in <= d.ticket.reserved_tokens <= n_in + cap
        live.append((d.ticket, n_in, max(0, n_in + prompt_err), round(frac * cap), stream, finished))
        while live and rng.random() < 0.5:  # settle some in a random order, interleaved with admissions
            used_total += _run(ctl, live.pop(rng.randrange(len(live))), rng)
    while live:
        used_total += _run(ctl, live.pop(rng.randrange(len(live))), rng)
    assert ctl.bucket_tokens_of("e", 0.0) == pytest.approx(start - used_total, abs=1e-6)


def _run(ctl: AdmissionController, entry: tuple, rng: random.Random) -> int:
    ticket, n_in, prompt, completion, stream, finished = entry
    produced = completion if finished else rng.randint(0, completion)
    if stream:
        chunks = 0
        while chunks < produced:
            chunks = min(produced, chunks + rng.randint(1, 40))  # one backend read
            ctl.charge(ticket, n_in + chunks, 0.0)  # the proxy's view: n_in estimate + one token per chunk
            assert ctl.bucket_tokens_of("e", 0.0) <= 1e9  # (only ever charged, never credited, mid-stream)
    used = prompt + produced
    ctl.release(ticket, used, 0.0)
    if finished:
        ctl.observe(ticket, produced)
    return used


def test_charge_takes_only_the_growth_past_reservation_and_earlier_charges() -> None:
    ctl = AdmissionController(pool_concurrency=4, kv_bytes_per_token=1, default_max_tokens=100,
                              token_bucket_window_s=1.0,
                              estimator=OutputEstimator(ReservationConfig(0.5, window_completions=4, min_completions=1)))
    ctl.upsert_entitlement(SPEC, EntitlementLimits(4, 1000.0, 1e9, 1.0), 0.0)
    first = ctl.admit("e", "a", 10, None, 0.0).ticket
    assert first is not None and first.reserved_tokens == 110  # nothing learned yet: the cap
    ctl.release(first, 10 + 20, 0.0)
    ctl.observe(first, 20)
    t = ctl.admit("e", "b", 10, None, 0.0).ticket
    assert t is not None and t.reserved_tokens == 30 and t.max_tokens == 100 and t.reserved_kv_bytes == 110
    level = ctl.bucket_tokens_of("e", 0.0)
    assert ctl.charge(t, 25, 0.0) == 0  # still within the reservation
    assert ctl.charge(t, 45, 0.0) == 15
    assert ctl.charge(t, 45, 0.0) == 0  # the same count again charges nothing
    assert ctl.charge(t, 50, 0.0) == 5
    assert ctl.bucket_tokens_of("e", 0.0) == level - 20
    assert ctl.release(t, 60, 0.0) == 30 + 20 - 60  # settles against reservation + charges: 10 more
    assert ctl.bucket_tokens_of("e", 0.0) == level - 30
    assert ctl.charge(t, 1000, 0.0) == 0  # released: nothing more
