"""The project's alert and recording rules (deploy/prometheus/rules) in a real Prometheus (Debian 2.42).

Pinned: the server loads every rule file (promtool checks them as part of the config), ``/api/v1/rules`` lists
every group and rule of the files and each rule evaluates with health ``ok``; and against the agents' real
``/metrics`` (``streams.metrics.serve``), a recording rule has the value the counters imply and an alert on them
goes pending. (Unit tests of every alert's logic: deploy/prometheus/tests, run by tests/unit/test_prometheus_rules.py.)
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from backend_fixtures import prometheus_binary  # noqa: F401  (fixture import)

from tokenpools.streams.metrics import StreamMetrics, serve
from tokenpools.topics.records import DeadLetterReason
from tokenpools_dev.devstack.prometheus import PrometheusServer, project_rule_files

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

INTERVAL = 1.0  # scrape and rule evaluation interval (s)
JOB = "tokenpools-agents"


def expected_rules() -> dict[str, set[str]]:
    """Group name → the names of its rules (alert or record), from the files themselves."""
    out: dict[str, set[str]] = {}
    for path in project_rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            out[group["name"]] = {r.get("alert") or r["record"] for r in group["rules"]}
    return out


def get(prom: PrometheusServer, path: str) -> Any:
    with urllib.request.urlopen(prom.url + path, timeout=5) as r:
        return json.loads(r.read())["data"]


async def until(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await asyncio.to_thread(cond):  # blocking HTTP off the loop: the loop serves the agents' /metrics
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.2)


async def test_the_rules_load_evaluate_and_read_the_agents_metrics(prometheus_binary: Path) -> None:  # noqa: F811
    rule_files = project_rule_files()
    assert len(rule_files) >= 4, rule_files
    metrics = StreamMetrics()
    runner, port = await serve(metrics, "127.0.0.1", 0)
    prom = PrometheusServer({JOB: [f"127.0.0.1:{port}"]}, scrape_interval=INTERVAL, binary=prometheus_binary,
                            rule_files=rule_files)
    try:
        await asyncio.to_thread(prom.start)
        want = expected_rules()

        def all_loaded_and_ok() -> bool:
            groups = prom.rule_groups()
            return ({g["name"]: {r["name"] for r in g["rules"]} for g in groups} == want
                    and all(r["health"] == "ok" for g in groups for r in g["rules"]))

        await until(all_loaded_and_ok, 30, f"{sum(map(len, want.values()))} rules loaded and evaluated ok")
        files = {g["file"] for g in prom.rule_groups()}
        assert files == {str(p.resolve()) for p in rule_files}

        # 4 malformed dead letters a second, for a few scrapes: the recording rule sums them by reason, and the
        # alert on non-late dead letters goes pending (it fires after its for:, longer than this test).
        query = "reason:tokenpools_agents_dead_letters:rate5m"

        def recorded() -> list[dict[str, Any]]:
            return list(get(prom, "/api/v1/query?" + urllib.parse.urlencode({"query": query}))["result"])

        deadline = time.monotonic() + 30
        while not [s for s in recorded() if float(s["value"][1]) > 0]:
            assert time.monotonic() < deadline, f"{query} never rose: {recorded()}"
            for _ in range(4):
                metrics.count_dead_letter(DeadLetterReason.MALFORMED)
            await asyncio.sleep(0.25)
        assert [s["metric"] for s in recorded()] == [{"__name__": query, "reason": "malformed"}]

        def pending() -> bool:
            return any(a["labels"]["alertname"] == "TokenPoolsDeadLetters" and a["labels"].get("reason") == "malformed"
                       and a["state"] in ("pending", "firing") for a in get(prom, "/api/v1/alerts")["alerts"])

        await until(pending, 15, "TokenPoolsDeadLetters pending")
    finally:
        await asyncio.to_thread(prom.stop)
        await runner.cleanup()  # type: ignore[attr-defined]
