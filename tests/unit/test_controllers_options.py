"""The controller's loop knobs: the ``controllers`` settings group, and flags of the same names winning over it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tokenpools.config import load_settings
from tokenpools.controllers.main import add_arguments, controller_options
from tokenpools.controllers.promql import DEFAULT_SELECTOR
from tokenpools.errors import ConfigError


def options(argv: list[str], settings_values: dict | None = None, overrides: list[str] | None = None):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--config", "unused.yaml", "--no-kubernetes", *argv])
    settings = load_settings(settings_values or {}, overrides or [], source="test")
    return controller_options(args, settings)


def test_defaults_come_from_the_settings_group() -> None:
    got = options([])
    assert got.metrics.interval_s == 5.0
    assert got.metrics.query.rate_window_s == 30.0
    assert got.metrics.query.selector == DEFAULT_SELECTOR == 'job="{pool}"'
    assert (got.resync_s, got.scale_command_max_age_s) == (30.0, 30.0)


def test_the_file_and_set_overrides_reach_the_loops() -> None:
    got = options([], {"controllers": {"resync_s": 7, "metrics_selector": 'app="{pool}"'}},
                  ["controllers.metrics_interval_s=0.5"])
    assert got.resync_s == 7.0
    assert got.metrics.query.selector == 'app="{pool}"'
    assert got.metrics.interval_s == 0.5


def test_a_flag_wins_over_the_setting_of_the_same_name() -> None:
    got = options(["--resync-s", "2", "--rate-window-s", "40"], {"controllers": {"resync_s": 7, "rate_window_s": 60}})
    assert got.resync_s == 2.0
    assert got.metrics.query.rate_window_s == 40.0


@pytest.mark.parametrize("argv", [["--resync-s", "0"], ["--metrics-interval-s", "-1"],
                                  ["--scale-command-max-age-s", "0"]])
def test_a_bad_flag_is_a_config_error_naming_the_knob(argv: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        options(argv)
    assert argv[0].removeprefix("--").replace("-", "_") in str(info.value)


def test_a_bad_setting_is_refused_at_load() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"controllers": {"resync_s": -3}}, [], source=str(Path("cfg.yaml")))
    assert "controllers.resync_s" in str(info.value)
