"""deploy/prometheus/rules: promtool accepts them and their unit tests (deploy/prometheus/tests) pass; every alert
is tested firing and not firing, follows the house form (a ``for:``, a closed severity, summary and description),
and reads only metrics the proxy, the agents and the controller export.

promtool comes with the prometheus package ``scripts/install-prometheus.sh`` installs (``make test`` runs it
first), so these run in CI; they are skipped only on a machine without it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from tokenpools.controllers.metrics import ControllerMetrics
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.admission.budgets import BudgetBook
from tokenpools.proxy.outbox.events import EventPipeline
from tokenpools.proxy.observability.metrics import ProxyMetrics
from tokenpools.proxy.views.gauges import register_gauges
from tokenpools.proxy.admission.pools import PoolRuntime
from tokenpools.proxy.outbox.spool import Spool
from tokenpools.runtime.clock import FakeClock
from tokenpools.streams.metrics import StreamMetrics

PROMETHEUS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yaml"))
TEST_FILES = sorted((PROMETHEUS_DIR / "tests").glob("*.yaml"))
SEVERITIES = {"warning", "critical"}
# series Prometheus itself makes: the scrape's health, and the alerts' own state
PROMETHEUS_SERIES = {"up", "ALERTS", "ALERTS_FOR_STATE"}
_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def promtool() -> Path:
    found = os.environ.get("TOKENPOOLS_PROMTOOL") or shutil.which("promtool")
    if not found:
        pytest.skip("promtool not on PATH: run scripts/install-prometheus.sh (Debian's prometheus package ships it)")
    return Path(found)


def run_promtool(*args: str) -> None:
    result = subprocess.run([str(promtool()), *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, f"promtool {' '.join(args)} failed:\n{result.stdout}{result.stderr}"


def rules() -> Iterator[dict]:
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            yield from group["rules"]


def alerts() -> dict[str, dict]:
    return {r["alert"]: r for r in rules() if "alert" in r}


def test_there_are_rules_and_tests() -> None:
    assert RULE_FILES and TEST_FILES
    assert PROMETHEUS_DIR / "rules" / "recording.yaml" in RULE_FILES


def test_promtool_accepts_the_rules() -> None:
    run_promtool("check", "rules", *(str(p.relative_to(PROMETHEUS_DIR)) for p in RULE_FILES))


def test_promtool_unit_tests_pass() -> None:
    run_promtool("test", "rules", *(str(p.relative_to(PROMETHEUS_DIR)) for p in TEST_FILES))


def test_every_rule_file_is_tested() -> None:
    tested = {(PROMETHEUS_DIR / "tests" / name).resolve()
              for path in TEST_FILES for name in yaml.safe_load(path.read_text())["rule_files"]}
    assert set(RULE_FILES) <= tested, sorted(str(p) for p in set(RULE_FILES) - tested)


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for path in TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else silent).add(check["alertname"])
    names = set(alerts())
    assert names - firing == set(), "never tested firing"
    assert names - silent == set(), "never tested not firing"
    assert (firing | silent) - names == set(), "tests of alerts that do not exist"


@pytest.mark.parametrize("name", sorted(alerts()))
def test_an_alert_waits_has_a_severity_and_says_what_happened(name: str) -> None:
    rule = alerts()[name]
    assert name.startswith("TokenPools")
    assert "for" in rule, "an alert waits before it fires (a blip is not an incident)"
    assert rule["labels"]["severity"] in SEVERITIES
    assert set(rule["annotations"]) >= {"summary", "description"}


def exported_names(tmp_path: Path) -> set[str]:
    """Every series name the three processes export, from their own registries (the proxy's with one pool and a
    budget book, so its per-pool and budget gauge families are there too)."""
    pool = PoolSpec("pool-a", "m", Capacity(1000, 1e10, 8))
    ents = [EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(300, 3e9, 3))]
    clock = FakeClock()
    proxy = ProxyMetrics()
    runtime = PoolRuntime(pool, ents, proxy_id="p1", ttl_s=30, retry_after_s=1, now_s=clock.now_s(),
                          wall_s=clock.wall_ms() / 1000)
    register_gauges(proxy, {"pool-a": runtime}, EventPipeline(None, Spool(tmp_path / "spool"), queue_size=1), clock,
                    BudgetBook())
    registries: list[CollectorRegistry] = [proxy.registry, StreamMetrics().registry, ControllerMetrics().registry]
    names = set()
    for registry in registries:
        for family in registry.collect():
            names.update(family.name + suffix for suffix in _SUFFIXES[family.type])
    return names


def test_rules_read_only_metrics_that_are_exported(tmp_path: Path) -> None:
    exported = exported_names(tmp_path) | PROMETHEUS_SERIES
    recorded = {r["record"] for r in rules() if "record" in r}
    functions_and_keywords = {"sum", "max", "count", "rate", "increase", "deriv", "max_over_time", "absent",
                              "histogram_quantile", "by", "on", "and", "or", "unless", "le", "printf"}
    unknown = set()
    for rule in rules():
        expr = re.sub(r'\{[^}]*\}', "", rule["expr"])  # label matchers are not series names
        expr = re.sub(r"\[[^]]*\]", "", expr)  # nor are range durations
        expr = re.sub(r"\((?:pool|entitlement|outcome|reason|job|pod|partition|kind|code|stage|le)"
                      r"(?:\s*,\s*\w+)*\)", "", expr)  # nor the labels of by (...) and on (...)
        for token in _NAME.findall(expr):
            if token in functions_and_keywords:
                continue
            if token not in (recorded if ":" in token else exported):
                unknown.add(token)
    assert not unknown, f"rules read series nobody exports: {sorted(unknown)}"
