"""``load.*`` items are checked when parsed: a value that would give an experiment of no load, of no time or of a
nonsense retry policy is a one-line ``--set`` problem, never a traceback nor a report of nothing with exit 0."""

from __future__ import annotations

import pytest

from tokenpools.errors import ConfigError
from tokenpools.replay import runner
from tokenpools.replay.experiments import LoadOptions, build, own_items


@pytest.mark.parametrize(("item", "says"), [
    ("load.factor=0", "--set: load.factor: must be a number > 0, got 0.0"),
    ("load.factor=-1", "--set: load.factor: must be a number > 0"),
    ("load.factor=nan", "--set: load.factor: must be a number > 0"),
    ("load.compress=0", "--set: load.compress: must be a number > 0, got 0.0"),
    ("load.compress=-1", "--set: load.compress: must be a number > 0"),
    ("load.compress=inf", "--set: load.compress: must be a number > 0"),
    ("load.max_retries=-1", "--set: load.max_retries: must be >= 0, got -1"),
    ("load.jitter_s=-1", "--set: load.jitter_s: must be a number of seconds >= 0"),
    ("load.c_always=5", "--set: load.c_always: must be 0 or 1, got 5"),
])
def test_a_bad_load_option_is_named(item: str, says: str) -> None:
    with pytest.raises(ConfigError, match=f"^{says}".replace(".", r"\.").replace("(", r"\(")):
        LoadOptions.parse([item])


@pytest.mark.parametrize("item", ["load.factor=0.5", "load.compress=0.1", "load.compress=2", "load.max_retries=0",
                                  "load.jitter_s=0", "load.c_always=1", "load.c_always=0"])
def test_the_values_that_mean_something_still_build(item: str) -> None:
    assert build("exp1", [item, "load.compress=0.1"] if "compress" not in item else [item]).arrivals


def test_a_load_option_only_the_other_experiment_reads_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^--set: load\.c_always: only exp1 reads it; exp2 would ignore it$"):
        build("exp2", ["load.c_always=1", "load.compress=0.1"])
    with pytest.raises(ConfigError, match=r"^--set: load\.c_always: only exp1"):
        runner.check(["exp2"], ["load.c_always=1"], sweeps={})


def test_the_demo_gives_an_experiments_own_load_option_to_it_alone() -> None:
    items = ["load.c_always=1", "load.compress=0.1", "policy.gamma_debt=0.5"]
    assert own_items("exp1", items) == items
    assert own_items("exp2", items) == ["load.compress=0.1", "policy.gamma_debt=0.5"]
    runner.check(["exp1", "exp2"], items, sweeps={})  # both experiments, as the demo runs them: accepted
