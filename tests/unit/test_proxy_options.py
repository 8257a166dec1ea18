"""The proxy's options are its ``proxy`` settings group plus what start-up resolves: no knob or default of their own,
the command line's flags winning over the settings and checked like them."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from tokenpools.config import ProxySettings, load_settings
from tokenpools.errors import ConfigError
from tokenpools.proxy.main import add_arguments, proxy_options
from tokenpools.proxy.options import ProxyOptions


def options(argv: list[str], overrides: list[str] | None = None) -> ProxyOptions:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return proxy_options(load_settings({}, overrides or []), parser.parse_args(["--config", "x.yaml", *argv]))


def test_every_knob_comes_from_the_settings_group() -> None:
    got = options([], ["proxy.limits_ttl_s=7", "proxy.spool_dir=/var/spool/tp", "kafka.topic_prefix=prod."])
    assert got.settings.limits_ttl_s == 7.0 and got.settings.spool_dir == Path("/var/spool/tp")
    assert got.topic_prefix == "prod."
    defaults = ProxySettings()
    assert {f: getattr(got.settings, f) for f in ("max_body_bytes", "event_queue_size", "producer_linger_ms")} == {
        f: getattr(defaults, f) for f in ("max_body_bytes", "event_queue_size", "producer_linger_ms")}
    assert all(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
               for f in dataclasses.fields(ProxyOptions)), "ProxyOptions re-declares a default"


def test_flags_win_over_the_settings_of_the_same_names() -> None:
    got = options(["--host", "0.0.0.0", "--port", "0", "--proxy-id", "p-7", "--no-kafka"],
                  ["proxy.host=10.0.0.1", "proxy.port=9000", "proxy.proxy_id=p-1", "proxy.kafka_enabled=true"])
    assert (got.settings.host, got.settings.port, got.proxy_id, got.settings.kafka_enabled) == ("0.0.0.0", 0, "p-7",
                                                                                               False)
    assert got.settings.proxy_id == "p-7"
    assert options([], ["proxy.proxy_id=p-1"]).proxy_id == "p-1"
    assert options([]).proxy_id  # <hostname>-<pid>


def test_a_bad_flag_is_a_config_error_naming_the_setting() -> None:
    with pytest.raises(ConfigError) as info:
        options(["--port", "70000"])
    assert "command line: proxy.port: must be <= 65535, got 70000" in str(info.value)


def test_no_kafka_says_what_it_gives_up() -> None:
    """Without Kafka the limits are static: the help says so, not only the guide (issue 31)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    help_text = next(a.help for a in parser._actions if "--no-kafka" in a.option_strings) or ""
    assert "static limits" in help_text and "no fair share, debt or priority" in help_text
