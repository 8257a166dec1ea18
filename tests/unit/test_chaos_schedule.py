"""The chaos run's fault schedule (``tokenpools_dev.chaos.schedule``): seeded, every kind at least once, in the
load's window, one at a time, targets in range."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tokenpools_dev.chaos.schedule import FaultKind, schedule


@given(seed=st.integers(0, 10_000), count=st.integers(6, 30), proxies=st.integers(1, 8), workers=st.integers(1, 4))
def test_every_kind_once_in_order_within_the_window(seed: int, count: int, proxies: int, workers: int) -> None:
    faults = schedule(seed, 180.0, count, proxies, workers)
    assert len(faults) == count and {f.kind for f in faults} == set(FaultKind)
    times = [f.at_s for f in faults]
    assert times == sorted(times) and 10.0 <= times[0] and times[-1] < 160.0
    assert all(0 <= f.target < (proxies if f.kind.targets_proxy else workers) for f in faults)


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert schedule(7, 180.0, 7, 3, 2) == schedule(7, 180.0, 7, 3, 2)
    assert schedule(7, 180.0, 7, 3, 2) != schedule(8, 180.0, 7, 3, 2)


def test_too_few_faults_or_too_short_a_load_is_refused() -> None:
    with pytest.raises(ValueError, match="one fault of each kind"):
        schedule(1, 180.0, 5, 3, 2)
    with pytest.raises(ValueError, match="no time for faults"):
        schedule(1, 25.0, 6, 3, 2)
