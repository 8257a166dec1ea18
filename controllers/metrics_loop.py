"""metrics: Prometheus → backend-metrics topic, one sample per pool every ``interval_s``.

Queries go through prometheus-api-client (synchronous ``requests``: run in a worker thread so the event loop and
the other loops never wait on it), one instant query per pool evaluated at the loop's own clock time, which is
the sample's ``t_ms``. The client's own retries are off: the supervisor's backoff is the one retry policy.
A connection failure or a 5xx/429 is retryable; a 4xx (a query Prometheus refuses) is permanent.

What the answer means is ``reading.read_pool``'s decision: vLLM's series when fresh, else the proxies' view. This
loop publishes its sample and says what it decided: a log line when a pool's reading changes (its cause, source,
or how its ready replicas were read), a warning once per interval while vLLM's series are not fresh (or a fresh
sample misses fields), ``observed`` (the controller's metrics) after every round, and ``changed`` when some pool's
reading changed (the TokenPool's status shows it).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from urllib3.util.retry import Retry

from tokenpools.controllers.inventory import Inventory, PoolEntry
from tokenpools.controllers.promql import QueryConfig, parse_values, pool_query
from tokenpools.controllers.publisher import Publisher
from tokenpools.controllers.reading import PoolReading, read_pool
from tokenpools.errors import PermanentError, RetryableError
from tokenpools.runtime.backoff import ThrottledLog
from tokenpools.runtime.clock import Clock, SystemClock, wall_s
from tokenpools.topics.records import MetricsState

log = logging.getLogger("tokenpools.controllers.metrics")
_STATUS = re.compile(r"HTTP Status Code (\d+)")


class Querier(Protocol):
    async def query(self, promql: str, at_s: float) -> Sequence[Mapping[str, Any]]: ...


class PrometheusQuerier:
    """prometheus-api-client behind an async method, with errors classified."""

    def __init__(self, url: str, bearer_token: str | None = None, timeout_s: float = 5.0) -> None:
        headers = {"Authorization": f"Bearer {bearer_token}"} if bearer_token else None
        self._pc = PrometheusConnect(url=url, headers=headers, retry=Retry(total=0), timeout=timeout_s, method="POST")
        self.url = url

    def _query(self, promql: str, at_s: float) -> list[dict[str, Any]]:
        try:
            result = self._pc.custom_query(promql, params={"time": f"{at_s:.3f}"})
        except PrometheusApiClientException as exc:
            match = _STATUS.search(str(exc))
            status = int(match[1]) if match else 0
            if 400 <= status < 500 and status != 429:
                raise PermanentError(f"Prometheus at {self.url} refused the query ({status}): {str(exc)[:500]}") from None
            raise RetryableError(f"Prometheus at {self.url}: {str(exc)[:300]}", 1.0) from None
        except (requests.RequestException, ValueError) as exc:  # ValueError: a body that is not JSON
            raise RetryableError(f"Prometheus at {self.url} unreachable: {type(exc).__name__}: {str(exc)[:200]}", 1.0) from None
        return list(result)

    async def query(self, promql: str, at_s: float) -> Sequence[Mapping[str, Any]]:
        return await asyncio.to_thread(self._query, promql, at_s)

    def close(self) -> None:
        self._pc.close()


@dataclass(frozen=True, slots=True)
class MetricsOptions:
    """From the ``controllers`` settings group (``controllers.app.query_config``); no defaults of its own."""

    interval_s: float
    query: QueryConfig

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"`interval_s` must be > 0, got {self.interval_s}")


Observed = Callable[[Mapping[str, PoolReading]], None]
"""Every pool's reading after a round: the controller's metrics."""


class MetricsLoop:
    def __init__(self, inventory: Inventory, querier: Querier, publisher: Publisher, topic: str,
                 options: MetricsOptions, clock: Clock | None = None,
                 throttled: ThrottledLog | None = None, observed: Observed | None = None,
                 changed: Callable[[], None] | None = None) -> None:
        self.inventory, self.querier, self.publisher, self.topic = inventory, querier, publisher, topic
        self.options, self.clock = options, clock or SystemClock()
        self.throttled = throttled or ThrottledLog(log, clock=self.clock)
        self.observed, self.changed = observed, changed
        self.published = 0
        self.readings: dict[str, PoolReading] = {}  # pool → its last reading

    async def read(self, name: str, entry: PoolEntry, now_s: float) -> PoolReading:
        q = self.options.query
        result = await self.querier.query(pool_query(q, name, entry.spec.model, entry.namespace), now_s)
        values, present = parse_values(result)
        return read_pool(entry.spec, int(now_s * 1000), values, present, q.stale_after_s)

    async def run_once(self) -> list[PoolReading]:
        now_s = wall_s(self.clock)
        pools = list(self.inventory.pools.items())
        gone = set(self.readings) - {name for name, _ in pools}
        for name in gone:
            del self.readings[name]
        news, readings = bool(gone), []
        try:
            for name, entry in pools:
                reading = await self.read(name, entry, now_s)
                await self.publisher.publish(self.topic, name, reading.sample)
                self.published += 1
                news |= self._tell(name, reading)
                self.readings[name] = reading
                readings.append(reading)
        finally:  # a round cut short by an error still reports the readings it made
            if self.observed is not None:
                self.observed(self.readings)
            if news and self.changed is not None:
                self.changed()
        return readings

    def _tell(self, name: str, reading: PoolReading) -> bool:
        """Log what is news about ``name``'s reading; whether it is news."""
        before = self.readings.get(name)
        s = reading.sample
        if before is None or before.key != reading.key:  # always said; the repeats below once per interval
            level = logging.INFO if reading.state is MetricsState.FRESH else logging.WARNING
            log.log(level, "pool %s: %s (%s, source %s; running %s, waiting %s, ready replicas %s)", name,
                    reading.describe(), reading.state.value, reading.source.value, s.running, s.waiting,
                    s.replicas_ready)
            self.throttled.said(f"stale/{name}")
        elif reading.state is not MetricsState.FRESH:
            self.throttled.warning(f"stale/{name}", "pool %s: %s (%s, source %s; running %s, waiting %s)", name,
                                   reading.describe(), reading.state.value, reading.source.value, s.running,
                                   s.waiting)
        elif s.stale:
            self.throttled.warning(f"missing/{name}", "pool %s: no series for %s (reported as unknown)",
                                   name, ", ".join(s.stale))
        return before is None or before.key != reading.key

    async def run(self) -> None:
        await self.inventory.ready.wait()
        while True:
            started = self.clock.now_s()
            await self.run_once()
            await asyncio.sleep(max(0.0, self.options.interval_s - (self.clock.now_s() - started)))
