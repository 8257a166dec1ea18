"""The controller's loop knobs: the ``controllers`` settings group, and flags of the same names winning over it."""

from __future__ import annotations

import argparse
import os
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


def test_the_staleness_limit_and_the_proxies_selector_reach_the_query_and_are_checked_at_start() -> None:
    got = options([], overrides=["controllers.metrics_stale_after_s=20", 'controllers.proxy_metrics_selector=app="p"'])
    assert (got.metrics.query.stale_after_s, got.metrics.query.proxy_selector) == (20.0, 'app="p"')
    assert options([]).metrics.query.proxy_selector == 'pool="{pool}"'
    for bad, named in (("controllers.metrics_stale_after_s=0", "metrics_stale_after_s"),
                       ("controllers.proxy_metrics_selector={pool}", "proxy_selector")):
        with pytest.raises(ConfigError, match=named):
            options([], overrides=[bad])


def test_a_bad_setting_is_refused_at_load() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"controllers": {"resync_s": -3}}, [], source=str(Path("cfg.yaml")))
    assert "controllers.resync_s" in str(info.value)


def kube_options(argv: list[str], overrides: list[str] | None = None):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--config", "unused.yaml", "--kubeconfig", "kube.yaml", *argv])
    return controller_options(args, load_settings({}, overrides or [], source="test"))


def test_with_kubernetes_the_controller_elects_a_leader_on_its_namespace_lease_by_default() -> None:
    got = kube_options(["--namespace", "tp"])
    assert got.leader_election
    assert (got.lease_namespace, got.knobs.lease_name) == ("tp", "tokenpools-controller")
    assert (got.lease_timing.duration_s, got.lease_timing.renew_deadline_s, got.lease_timing.retry_period_s) == (15, 10.0, 2.0)
    assert got.instance.endswith(f"-{os.getpid()}"), "identity: <hostname>-<pid>"
    assert got.knobs.http_port == -1, "no port is bound unless asked for"


def test_a_dry_run_a_file_source_or_the_switch_act_without_a_lease() -> None:
    assert not kube_options(["--dry-run"]).leader_election, "a dry run must never take the Lease from a real leader"
    assert not options([]).leader_election
    assert not kube_options([], ["controllers.leader_election=false"]).leader_election


def test_the_lease_identity_is_also_the_events_reporting_instance_and_the_http_flags_win() -> None:
    got = kube_options(["--http-port", "9103", "--http-host", "0.0.0.0"],
                       ["controllers.lease_identity=pod-7", "controllers.lease_namespace=leases"])
    assert (got.instance, got.lease_namespace) == ("pod-7", "leases")
    assert (got.knobs.http_host, got.knobs.http_port) == ("0.0.0.0", 9103)


@pytest.mark.parametrize("overrides", [["controllers.lease_renew_deadline_s=15"], ["controllers.lease_retry_period_s=10"],
                                       ["controllers.lease_duration_s=0"], ["controllers.lease_name=Not_A_Name"]])
def test_lease_settings_that_could_make_two_leaders_are_refused_at_start_up(overrides: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        kube_options([], overrides)
    assert "controllers" in str(info.value) and "lease_" in str(info.value)


def test_a_bad_http_port_flag_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        kube_options(["--http-port", "70000"])
    assert "http_port" in str(info.value)
