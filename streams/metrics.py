"""Prometheus metrics of one agents process: a registry per app (no globals), served on its own port.

Names follow docs/conventions.md#units-in-names: ``_total`` counters, ``_seconds`` durations.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from tokenpools.topics.records import DeadLetterReason

log = logging.getLogger(__name__)


class StreamMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.events = Counter("tokenpools_agents_events_total", "records read, by record type", ["type"], registry=r)
        self.outcomes = Counter("tokenpools_agents_event_outcomes_total",
                                "usage records by what happened to them (applied, late, duplicate, ignored)",
                                ["outcome"], registry=r)
        self.dead_letters = Counter("tokenpools_agents_dead_letters_total", "records dead-lettered, by reason",
                                    ["reason"], registry=r)
        self.tick_seconds = Histogram("tokenpools_agents_tick_duration_seconds",
                                      "one timer tick over all pools (wall time, the pauses between pools included)",
                                      buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
                                      registry=r)
        self.pool_tick_seconds = Histogram("tokenpools_agents_pool_tick_duration_seconds",
                                           "one pool's tick: the longest the timer holds the event loop",
                                           buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5),
                                           registry=r)
        self.windows_closed = Counter("tokenpools_agents_windows_closed_total", "windows closed (ticks run)",
                                      ["pool"], registry=r)
        self.watermarks = Counter("tokenpools_agents_watermark_records_total",
                                  "records read that carried a proxy's watermark (with events or without)",
                                  registry=r)
        self.windows_closed_early = Counter(
            "tokenpools_agents_windows_closed_early_total",
            "windows closed before end + grace because every live proxy's watermark had passed their end",
            ["pool"], registry=r)
        self.limit_updates = Counter("tokenpools_agents_limit_updates_total", "limit updates published",
                                     ["pool"], registry=r)
        self.updates_skipped = Counter("tokenpools_agents_limit_updates_skipped_total",
                                       "catch-up updates computed but not published (older than the newest few)",
                                       ["pool"], registry=r)
        self.counts_records = Counter("tokenpools_agents_counts_records_total",
                                      "fleet counts records published (all pools)", registry=r)
        self.scale_commands = Counter("tokenpools_agents_scale_commands_total", "scale commands published",
                                      ["pool"], registry=r)
        self.table_pools = Gauge("tokenpools_agents_table_pools", "pools in this worker's state table", registry=r)
        self.table_bytes = Gauge("tokenpools_agents_table_bytes", "serialised size of the state table", registry=r)
        self.horizon_lag_seconds = Gauge("tokenpools_agents_horizon_lag_seconds",
                                         "wall clock minus the close horizon, per partition (catch-up lag)",
                                         ["partition"], registry=r)
        self.state_resets = Counter("tokenpools_agents_state_resets_total",
                                    "stored pool states that could not be used (version or width changed)",
                                    registry=r)

        self.ledger_events = Counter("tokenpools_agents_ledger_events_total",
                                     "completion events the budget and usage ledger saw, by what it did with them "
                                     "(applied, duplicate, late)", ["outcome"], registry=r)
        self.ledger_records = Counter("tokenpools_agents_ledger_records_total",
                                      "ledger records published, by topic kind (budgets, usage, budget_alerts)",
                                      ["kind"], registry=r)
        # Labels: pool and entitlement say whose budget it is (the alert names them; a dashboard filters on them),
        # budget tells an entitlement's budgets apart (a daily and a monthly one). As many series as budgets this
        # worker's ledgers hold, the same count as the budgets topic's keys; tenant is left out (it is a function
        # of the entitlement: the catalogue maps one to the other).
        self.budget_spent_ratio = Gauge(
            "tokenpools_agents_budget_spent_ratio",
            "spent units / allowance of a budget's current period, as the ledger published it (1: spent; above: "
            "overshoot, requests admitted before the proxies knew)", ["pool", "entitlement", "budget"], registry=r)
        # Labels: pool (where to look) and threshold (0.8 is a notice, 1.0 is the tenant being refused); the
        # entitlement is on the budget-alerts topic's records and in the spent ratio, kept off this counter so it
        # stays pools × thresholds.
        self.budget_alerts = Counter("tokenpools_agents_budget_alerts_total",
                                     "budget alerts published (a threshold reached, once per period), by threshold",
                                     ["pool", "threshold"], registry=r)
        self._budgets: set[tuple[str, str, str]] = set()

    def set_budget_ratios(self, ratios: Mapping[tuple[str, str, str], float]) -> None:
        """Every budget this worker's ledgers hold now, (pool, entitlement, budget) → spent ratio: set them, and
        remove the series of budgets no longer there (deleted from the spec, or their partition moved away)."""
        for gone in self._budgets - ratios.keys():
            self.budget_spent_ratio.remove(*gone)
        for labels, ratio in ratios.items():
            self.budget_spent_ratio.labels(*labels).set(ratio)
        self._budgets = set(ratios)

    def count_budget_alert(self, pool: str, threshold: float) -> None:
        self.budget_alerts.labels(pool, threshold_label(threshold)).inc()

    def count_dead_letter(self, reason: DeadLetterReason) -> None:
        self.dead_letters.labels(reason.value).inc()

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


def threshold_label(threshold: float) -> str:
    """A threshold as a label value: its shortest form (0.8, 1, 1.5), the same for the same number."""
    return f"{threshold:g}"


async def serve(metrics: StreamMetrics, host: str, port: int) -> tuple[object, int]:
    """Start ``GET /metrics`` on host:port (0: a free port); returns (aiohttp runner, bound port)."""
    from aiohttp import web

    async def handle(_: web.Request) -> web.Response:
        body, content_type = metrics.render()
        return web.Response(body=body, headers={"Content-Type": content_type})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    log.info("agents metrics on http://%s:%d/metrics", host, bound)
    return runner, int(bound)
