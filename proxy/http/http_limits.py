"""What one client may take from the proxy's HTTP server (``server.py``), and why a connection ended.

- ``HttpLimits``: the server's caps and deadlines, checked once when they are built (the ``proxy`` settings group
  carries them: ``HttpLimits.from_settings``);
- ``CloseReason``: the closed set of reasons a connection ends, the label of
  ``tokenpools_proxy_connections_closed_total{reason}``;
- ``ConnectionStats``: plain counters the server bumps and the metrics collector reads at scrape time;
- ``overdue``: the pure decision of the server's sweeper, whether a waiting connection is past its deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenpools.config import ProxySettings


class CloseReason(StrEnum):
    """Why a connection ended. Every connection is counted once, when it is gone."""

    CLIENT = "client"  # the client closed it, failed, or asked for the close (HTTP/1.0, Connection: close)
    IDLE = "idle"  # keep-alive, no new request within keepalive_timeout_s
    HEADER_TIMEOUT = "header_timeout"  # the head did not arrive within header_timeout_s (slowloris)
    BODY_TIMEOUT = "body_timeout"  # the body did not arrive within body_timeout_s of being asked for
    WRITE_TIMEOUT = "write_timeout"  # the client took none of the response for write_timeout_s
    MAX_CONNECTIONS = "max_connections"  # refused with 503: max_connections were open
    MAX_REQUESTS = "max_requests"  # carried max_requests_per_connection requests
    BAD_REQUEST = "bad_request"  # malformed request line, header or body framing: 400
    HEAD_TOO_LARGE = "head_too_large"  # request line and headers above max_head_bytes: 431
    BODY_TOO_LARGE = "body_too_large"  # body above max_body_bytes: 413, the rest is not read
    UNREAD_BODY = "unread_body"  # answered before its body was sent (a refused 100-continue): cannot be skipped
    SHUTDOWN = "shutdown"  # the server stopped
    ERROR = "error"  # a failure in the server, or a stream whose handler failed after its head was sent


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The server's caps (bytes, counts) and deadlines (seconds); see the ``proxy`` settings for each default."""

    max_body_bytes: int
    max_head_bytes: int = 65_536
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    write_timeout_s: float = 30.0
    keepalive_timeout_s: float = 75.0
    max_connections: int = 10_000
    max_requests_per_connection: int = 1000

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_head_bytes", "max_connections", "max_requests_per_connection"):
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name}` must be positive, got {getattr(self, name)}")
        for name in ("header_timeout_s", "body_timeout_s", "write_timeout_s", "keepalive_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"`{name}` must be positive, got {getattr(self, name)}")

    @classmethod
    def from_settings(cls, settings: ProxySettings) -> HttpLimits:
        return cls(settings.max_body_bytes, settings.max_head_bytes, settings.header_timeout_s,
                   settings.body_timeout_s, settings.write_timeout_s, settings.keepalive_timeout_s,
                   settings.max_connections, settings.max_requests_per_connection)

    @property
    def sweep_interval_s(self) -> float:
        """How often the sweeper looks: a quarter of the shortest deadline it enforces, within [50 ms, 1 s]."""
        return min(1.0, max(0.05, min(self.header_timeout_s, self.keepalive_timeout_s) / 4))


@dataclass(slots=True)
class ConnectionStats:
    """Counters of one server: connections open now, and closed so far by reason."""

    open: int = 0
    closed: dict[CloseReason, int] = field(default_factory=lambda: dict.fromkeys(CloseReason, 0))


def overdue(limits: HttpLimits, now_s: float, *, head_since_s: float | None, idle_since_s: float | None,
            requests: int) -> CloseReason | None:
    """Whether a connection waiting on its client is past its deadline, and which.

    ``head_since_s``: when the head in progress began (None: none in progress, or reading is paused by the server);
    ``idle_since_s``: since when the connection has had nothing to do (None: a request is being answered, whose
    body and write deadlines are the worker's own); ``requests``: heads begun so far. A connection that has not begun
    its first head gets ``header_timeout_s`` from its accept, one between keep-alive requests ``keepalive_timeout_s``."""
    if head_since_s is not None and now_s - head_since_s > limits.header_timeout_s:
        return CloseReason.HEADER_TIMEOUT
    if idle_since_s is None or head_since_s is not None:
        return None
    if requests == 0:
        return CloseReason.HEADER_TIMEOUT if now_s - idle_since_s > limits.header_timeout_s else None
    return CloseReason.IDLE if now_s - idle_since_s > limits.keepalive_timeout_s else None
