"""The engine priority mapping (core.engine_priority) and the pool's ``enginePriority`` switch in the config."""

from __future__ import annotations

import doctest

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tokenpools.core.engine_priority as engine_priority_module
from tokenpools.config import ConfigError, load_config_text
from tokenpools.core.classes import DEFAULT_CLASS_WEIGHTS, ServiceClass
from tokenpools.core.engine_priority import BAND_WIDTH, LOWEST, engine_priority, sub_rank

# classes from the most to the least promised
ORDER = [ServiceClass.DEDICATED, ServiceClass.GUARANTEED, ServiceClass.ELASTIC, ServiceClass.SPOT,
         ServiceClass.PREEMPTIBLE]
W_E = st.one_of(st.floats(min_value=0.0, max_value=1e9, allow_nan=False), st.just(float("inf")))
WEIGHTS = st.fixed_dictionaries({cls: st.floats(min_value=1e-3, max_value=1e4) for cls in ORDER})


def test_the_class_order_is_the_one_the_bands_follow() -> None:
    assert set(ORDER) == set(ServiceClass)


@given(st.integers(0, len(ORDER) - 1), st.integers(0, len(ORDER) - 1), W_E, W_E, WEIGHTS)
def test_a_higher_class_never_gets_a_larger_number_than_a_lower_one(i: int, j: int, w_i: float, w_j: float,
                                                                    weights: dict[ServiceClass, float]) -> None:
    high, low = ORDER[min(i, j)], ORDER[max(i, j)]
    if high is not low:
        assert engine_priority(high, w_i, weights) < engine_priority(low, w_j, weights)


@given(st.sampled_from(ORDER), W_E, W_E, WEIGHTS)
def test_within_a_class_a_larger_w_e_never_gets_a_larger_number(cls: ServiceClass, a: float, b: float,
                                                                weights: dict[ServiceClass, float]) -> None:
    lo, hi = sorted((a, b))
    assert engine_priority(cls, hi, weights) <= engine_priority(cls, lo, weights)


@given(st.sampled_from(ORDER), st.one_of(W_E, st.just(float("nan")), st.floats(max_value=0.0)), WEIGHTS)
def test_every_number_is_a_whole_number_in_its_class_band(cls: ServiceClass, w_e: float,
                                                          weights: dict[ServiceClass, float]) -> None:
    value = engine_priority(cls, w_e, weights)
    assert type(value) is int
    assert ORDER.index(cls) * BAND_WIDTH <= value < (ORDER.index(cls) + 1) * BAND_WIDTH <= LOWEST + 1


@pytest.mark.parametrize(("ratio", "rank"), [
    (1.0, 50), (10.0, 25), (5.0, 33), (1 / 3, 62), (0.1, 75), (0.01, 99), (0.001, 99), (1e6, 0), (0.0, 99),
    (-1.0, 99), (float("nan"), 99), (float("inf"), 0),
])
def test_the_sub_rank_is_25_steps_a_decade_centred_on_one(ratio: float, rank: int) -> None:
    assert sub_rank(ratio) == rank


def test_the_rank_within_a_band_does_not_depend_on_the_class_weights() -> None:
    doubled = {cls: 2 * w for cls, w in DEFAULT_CLASS_WEIGHTS.items()}
    for cls in ORDER:
        assert (engine_priority(cls, DEFAULT_CLASS_WEIGHTS[cls] * 0.4, DEFAULT_CLASS_WEIGHTS)
                == engine_priority(cls, doubled[cls] * 0.4, doubled))


def test_the_module_examples_hold() -> None:
    assert doctest.testmod(engine_priority_module).failed == 0


POOL = """\
apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {name: p}
spec:
  model: m
  backendRef: {name: b}
  perReplica: {tokensPerSecond: 100, kvCacheGiB: 1, concurrency: 4}
  kvBytesPerToken: 73728
"""


@pytest.mark.parametrize(("extra", "value"), [("", False), ("  enginePriority: true\n", True),
                                              ("  enginePriority: false\n", False)])
def test_engine_priority_is_off_unless_the_pool_turns_it_on(extra: str, value: bool) -> None:
    assert load_config_text(POOL + extra).pools["p"].engine_priority is value


@pytest.mark.parametrize("given_value", ["'yes'", "1", "on-ish"])
def test_engine_priority_must_be_a_boolean(given_value: str) -> None:
    with pytest.raises(ConfigError, match="enginePriority"):
        load_config_text(POOL + f"  enginePriority: {given_value}\n")
