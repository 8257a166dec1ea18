"""Every PromQL expression of the dashboards (deploy/dashboards) and of the rules (deploy/prometheus/rules), run
by a real Prometheus that scrapes a running stack and evaluates the project's rules.

The stack (tools devstack, no Kubernetes): Kafka, the simulator behind exp1's pool, the agents, the controller
(its ``/metrics`` on a port of ours) and one proxy; a daily budget small enough to be spent is added to spot-b.
Load: guaranteed-a at about twice its 6 slots (concurrency refusals), spot-b until its budget is spent
(budget_exhausted refusals, the agents' spent ratio just short of 1, a budget alert at 0.5). Then each expression
is queried (``/api/v1/query``) and must return a non-empty vector, but for those listed in ``NO_DATA`` with the
reason they cannot in this stack: those must still parse (the query succeeds); whether they return data
depends on the run.

The logic of every alert, firing and not, is tested by promtool (tests/unit/test_prometheus_rules.py); here an
alert's expression returns data only when the stack meets its condition, which a healthy stack does not for
most of them.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from backend_fixtures import prometheus_binary  # noqa: F401  (fixture import)

from tokenpools.replay.experiments import examples_dir
from tokenpools.replay.load import Lengths, LoadSpec, RetryPolicy, poisson_arrivals
from tokenpools_dev.devstack.process import free_port
from tokenpools_dev.devstack.prometheus import PrometheusServer, project_rule_files
from tokenpools_dev.devstack.stack.config import StackOptions
from tokenpools_dev.devstack.stack.lifecycle import Stack
from tokenpools_dev.loadgen.client import LoadGenerator, LoadOptions

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DASHBOARDS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "dashboards"
TIME_SCALE = 0.25
DURATION_S = 40.0  # experiment seconds of load
POOL = "qwen3-8b"
MODEL = "nvidia/Qwen3-8B-NVFP4"
KEYS = {"guaranteed-a": "sk-exp1-guaranteed-a", "spot-b": "sk-exp1-spot-b"}
BUDGET_UNITS = 2000  # spot-b's daily budget: about 15 of its 64 + 64-token requests
VARIABLES = {"$pool": ".+", "$entitlement": ".+"}
AGENTS_BUDGET_SERIES = '{job="tokenpools-agents",__name__=~"tokenpools_agents_(budget|ledger)_.*"}'

NO_DATA: dict[str, str] = {
    # alerts
    "TokenPoolsProxyOnStaticLimits": "the proxy receives the agents' limit updates: never static past start-up",
    "TokenPoolsProxyLimitsStale": "a limit update comes every tick: the limits in force are seconds old",
    "TokenPoolsProxyCountsFallingBack": "the fleet counts keep coming: Kafka and the agents are up",
    "TokenPoolsDeadLetters": "no producer writes records the agents cannot use",
    "TokenPoolsLateEvents": "no event arrives after its window closed",
    "TokenPoolsAgentsLagging": "the agents keep up (their horizon lag is a few seconds)",
    "TokenPoolsAgentsTicksSlow": "one pool ticks in milliseconds, not seconds",
    "TokenPoolsAgentsNotTicking": "the agents tick the pool the proxy serves",
    "TokenPoolsControllerNoLeader": "the controller without Kubernetes acts at once: it leads",
    "TokenPoolsBackendMetricsNotFresh": "the simulator answers every scrape: its series are fresh",
    "TokenPoolsControllerSplitBrain": "one controller replica",
    "TokenPoolsControllerLeaderFlapping": "leadership never changes in one replica without a Lease",
    "TokenPoolsScaleCommandsFailing": "without Kubernetes there is no workload whose /scale could fail",
    "TokenPoolsEntitlementNotBound": "every entitlement of exp1 is Bound",
    "TokenPoolsTargetDown": "every scrape target is up",
    "TokenPoolsProxyEventsDegraded": "the broker is reachable: nothing is spooled",
    "TokenPoolsProxySpoolGrowing": "the broker is reachable: nothing is spooled",
    "TokenPoolsProxyEventsDropped": "no event is dropped",
    "TokenPoolsProxySpoolCorrupt": "no spool line is corrupt",
    "TokenPoolsUnknownKeys": "every request carries a known key",
    "TokenPoolsRefusalsHigh": "10 wall seconds of load: guaranteed-a's refusals over 5 minutes stay under 1 a second",
    "TokenPoolsNotBoundEntitlementUsed": "every entitlement of exp1 is Bound",
    "TokenPoolsEntitlementDebtHigh": "guaranteed-a gets its baseline: its debt stays under 0.5",
    "TokenPoolsBackendRefusing": "the simulator never refuses what the proxy admits",
    "TokenPoolsBackendErrors": "the simulator never fails a request",
    "TokenPoolsBudgetNearlySpent": "the one budget, spot-b's, is refused: exhausted (the critical alert), not nearly",
    # recording rules
    "pool_entitlement_reason:tokenpools_proxy_would_refuse:rate1m": "shadow mode is off: nothing would-refuse",
    "reason:tokenpools_agents_dead_letters:rate5m": "nothing is dead-lettered in a healthy stack, and the counter has no "
                                                    "series before its first (a run where a record was had data)",
    "pool_code:tokenpools_proxy_backend_refusals:rate5m": "the simulator never refuses what the proxy admits",
    "pool_kind:tokenpools_proxy_backend_errors:rate5m": "the simulator never fails a request",
}


def config(path: Path) -> Path:
    """exp1 with a daily budget on spot-b that its load spends, alerting at half and all of it."""
    docs = list(yaml.safe_load_all((examples_dir() / "exp1.yaml").read_text()))
    for doc in docs:
        if doc and doc["kind"] == "TokenEntitlement" and doc["metadata"]["name"] == "spot-b":
            doc["spec"]["budgets"] = [{"name": "daily", "period": "day", "amount": BUDGET_UNITS,
                                       "alertThresholds": [0.5, 1.0]}]
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return path


def rule_expressions() -> dict[str, str]:
    """Name (alert or record) → expression, of every rule file."""
    out = {}
    for path in project_rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                out[rule.get("alert") or rule["record"]] = rule["expr"]
    return out


def dashboard_expressions() -> dict[str, str]:
    """``<dashboard>/<panel>/<refId>`` or ``<dashboard>/$<variable>`` → expression, the variables set to every
    value (a variable's ``label_values(<selector>, <label>)`` contributes its selector)."""
    out = {}
    for path in sorted(DASHBOARDS_DIR.glob("*.json")):
        doc = json.loads(path.read_text())
        for panel in doc["panels"]:
            for target in panel["targets"]:
                out[f"{path.stem}/{panel['title']}/{target['refId']}"] = target["expr"]
        for var in doc["templating"]["list"]:
            if var["type"] == "query":
                query = var["query"]["query"]
                out[f"{path.stem}/${var['name']}"] = query.removeprefix("label_values(").rsplit(",", 1)[0]
    for name, expr in out.items():
        for variable, value in VARIABLES.items():
            expr = expr.replace(variable, value)
        out[name] = expr
    return out


def query(prom_url: str, expr: str) -> tuple[str, list[dict[str, Any]]]:
    url = prom_url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = json.loads(e.read())
    return body["status"], list(body.get("data", {}).get("result", []))


def wait_for(prom_url: str, expr: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not query(prom_url, expr)[1]:
        if time.monotonic() > deadline:
            agents = query(prom_url, AGENTS_BUDGET_SERIES)[1]
            raise AssertionError(f"{expr} returned nothing for {timeout_s}s; the agents' budget series: {agents}")
        time.sleep(0.5)


async def load(stack: Stack) -> Any:
    specs = [LoadSpec("guaranteed-a", 2.8, Lengths(64, 64), Lengths(64, 64), end_s=DURATION_S),
             LoadSpec("spot-b", 2.0, Lengths(64, 64), Lengths(64, 64), end_s=DURATION_S)]
    generator = LoadGenerator(stack.proxy_urls, LoadOptions(model=MODEL, keys=KEYS, time_scale=TIME_SCALE,
                                                            retry=RetryPolicy(0), duration_s=DURATION_S, seed=3))
    try:
        return await generator.run(poisson_arrivals(specs, DURATION_S, seed=3))
    finally:
        await generator.close()


def test_every_dashboard_and_rule_expression_returns_data_from_a_running_stack(
        tmp_path: Path, prometheus_binary: Path) -> None:  # noqa: F811
    controller_port = free_port()
    options = StackOptions(config=config(tmp_path / "exp1-budget.yaml"), run_dir=tmp_path / "stack",
                           kubernetes=False, time_scale=TIME_SCALE, background_nice=5,
                           overrides=(f"controllers.http_port={controller_port}",))
    with Stack(options) as stack:
        assert stack.agents is not None
        agents_port = next(a.split("=", 1)[1] for a in stack.agents.argv if a.startswith("--http-port="))
        targets = {
            POOL: stack.pool(POOL).targets(),  # the backends: job = the pool's name, as scrape-config.yaml does
            "tokenpools-proxy": [u.removeprefix("http://").rstrip("/") for u in stack.proxy_urls],
            "tokenpools-agents": [f"127.0.0.1:{agents_port}"],
            "tokenpools-controller": [f"127.0.0.1:{controller_port}"],
        }
        with PrometheusServer(targets, scrape_interval=1.0, binary=prometheus_binary,
                              rule_files=project_rule_files()) as prom:
            prom.wait_for_targets(health="up", timeout=30)
            result = asyncio.run(load(stack))
            outcomes = {a.outcome for a in result.attempts}
            assert {"admitted", "concurrency", "budget_exhausted"} <= outcomes, outcomes
            # the agents' ledger published spot-b's account near its allowance (a proxy refuses the request that
            # would not fit, so it stops just short of 1) and its alert at 0.5, and Prometheus evaluated the rules
            wait_for(prom.url, 'pool_entitlement_budget:tokenpools_agents_budget_spent_ratio:max{entitlement="spot-b"}'
                               " >= 0.8", 30)
            wait_for(prom.url, 'pool_threshold:tokenpools_agents_budget_alerts:increase1h{threshold="0.5"}', 30)
            time.sleep(3)  # a few more evaluations: every rule has run since the load
            expressions = {**rule_expressions(), **dashboard_expressions()}
            results = {name: query(prom.url, expr) for name, expr in expressions.items()}

    assert set(NO_DATA) <= set(expressions), sorted(set(NO_DATA) - set(expressions))
    failed = {name: status for name, (status, _) in results.items() if status != "success"}
    assert not failed, f"queries Prometheus refused: {failed}"
    empty = sorted(name for name, (_, data) in results.items() if not data and name not in NO_DATA)
    assert not empty, "expressions that returned nothing: " + "; ".join(f"{n}: {expressions[n]}" for n in empty)
    # (one listed here may still return data in a run that met its condition: it parsed, which is what is checked)
