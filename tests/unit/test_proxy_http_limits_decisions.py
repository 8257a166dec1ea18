"""The HTTP server's limits as data (``proxy/http/http_limits.py``): their checks, their settings, and the sweeper's
pure decision ``overdue``."""

from __future__ import annotations

import pytest

from tokenpools.config import ProxySettings
from tokenpools.proxy.http.http_limits import CloseReason, HttpLimits, overdue

LIMITS = HttpLimits(max_body_bytes=1024, header_timeout_s=10.0, keepalive_timeout_s=75.0)


def test_the_settings_carry_the_limits_with_their_defaults() -> None:
    limits = HttpLimits.from_settings(ProxySettings())
    assert (limits.max_head_bytes, limits.header_timeout_s, limits.body_timeout_s, limits.write_timeout_s,
            limits.keepalive_timeout_s, limits.max_connections, limits.max_requests_per_connection) == (
        65_536, 10.0, 30.0, 30.0, 75.0, 10_000, 1000)
    assert limits == HttpLimits(max_body_bytes=ProxySettings().max_body_bytes)


@pytest.mark.parametrize("field, value", [("header_timeout_s", 0), ("body_timeout_s", -1), ("write_timeout_s", 0),
                                          ("keepalive_timeout_s", 0), ("max_connections", 0),
                                          ("max_requests_per_connection", 0), ("max_head_bytes", 100)])
def test_bad_settings_are_refused_at_start_up(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        ProxySettings(**{field: value})
    if field != "max_head_bytes":
        with pytest.raises(ValueError, match=field):
            HttpLimits(max_body_bytes=1, **{field: value})


def test_a_new_connection_gets_the_header_deadline_from_its_accept() -> None:
    assert overdue(LIMITS, 109.9, head_since_s=None, idle_since_s=100.0, requests=0) is None
    assert overdue(LIMITS, 110.1, head_since_s=None, idle_since_s=100.0, requests=0) is CloseReason.HEADER_TIMEOUT


def test_a_head_in_progress_gets_the_header_deadline_busy_or_not() -> None:
    for idle in (None, 100.0):
        assert overdue(LIMITS, 109.0, head_since_s=100.0, idle_since_s=idle, requests=3) is None
        assert overdue(LIMITS, 110.5, head_since_s=100.0, idle_since_s=idle, requests=3) is \
            CloseReason.HEADER_TIMEOUT


def test_an_idle_keep_alive_connection_gets_the_keepalive_deadline() -> None:
    assert overdue(LIMITS, 170.0, head_since_s=None, idle_since_s=100.0, requests=1) is None
    assert overdue(LIMITS, 175.5, head_since_s=None, idle_since_s=100.0, requests=1) is CloseReason.IDLE


def test_a_request_being_answered_has_no_sweeper_deadline() -> None:
    assert overdue(LIMITS, 1e9, head_since_s=None, idle_since_s=None, requests=1) is None


def test_the_sweep_interval_follows_the_shortest_deadline() -> None:
    assert LIMITS.sweep_interval_s == 1.0
    assert HttpLimits(max_body_bytes=1, header_timeout_s=0.5).sweep_interval_s == 0.125
    assert HttpLimits(max_body_bytes=1, header_timeout_s=0.01).sweep_interval_s == 0.05
