"""A CI-sized run of the HTTP framing fuzzer (``tokenpools_dev.proxy.httpfuzz``; the long run is
``benchmarks/fuzz_http.py``): generated and mutated request bytes, in random pieces, against a real proxy on a real
socket. Every input must get valid responses or a close: never a hang, never a 5xx, never an exception out of the
protocol. Deterministic: hypothesis draws the generator's random source, derandomized."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenpools_dev.proxy.httpfuzz import Outcome, ProxyThread, exchange, generate

pytestmark = pytest.mark.component


@pytest.fixture(scope="module")
def proxy() -> Iterator[ProxyThread]:
    with ProxyThread() as running:
        yield running


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False))
def test_any_request_bytes_get_an_answer_or_a_close(proxy: ProxyThread, rng: random.Random) -> None:
    assert proxy.address is not None
    data, splits, half_close = generate(rng)
    result = exchange(proxy.address, data, splits, half_close)
    assert result.outcome in (Outcome.ANSWERED, Outcome.CLOSED), (result, data[:300])
    assert not proxy.faults.errors, proxy.faults.errors
