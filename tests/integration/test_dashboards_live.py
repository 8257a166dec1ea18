"""Every PromQL expression of the dashboards (deploy/dashboards) and of the rules (deploy/prometheus/rules), run
by a real Prometheus that scrapes a running stack and evaluates the project's rules.

The stack (tools devstack, no Kubernetes): Kafka, the simulator behind exp1's pool, the agents, the controller
(its ``/metrics`` on a port of ours) and one proxy; a daily budget small enough to be spent is added to spot-b.
Load: guaranteed-a at about twice its 6 slots (concurrency refusals) and spot-b's Poisson arrivals, which spend
much of its budget; then spot-b alone, one request at a time, until the proxy refuses it budget_exhausted. Then each expression is queried (``/api/v1/query``) and must return a non-empty vector, but for
those listed in ``NO_DATA`` with the reason they cannot in this stack: those must still parse (the query
succeeds); whether they return data depends on the run.

The budget's figure is pinned to what the system promises, not to a speed. A proxy refuses a request whose
reservation does not fit what it sees left: the agents' record, its own completions from the record's
``through_ms`` on (the record may hold those too: counted twice until a record covers them) and its reservations
in flight. Under the Poisson load refusals therefore come the earlier the more requests are in flight and the
further the agents' windows lag (a slow machine stopped at a spent ratio of 0.5-0.7). So spot-b then sends one
request at a time and, once refused, waits before each next one until its proxy sees exactly the units the ledger
says are left (nothing in flight, every completion covered), until one is refused: its ``remaining``, below its
``request``, is the allowance less the ledger's spending, and the tenant dashboard's spent ratio must show exactly
that: within one request of 1, so the critical alert's expression (≥ 0.8 with budget refusals) returns data.

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
from tokenpools_dev.loadgen.plan import prompt_text

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DASHBOARDS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "dashboards"
TIME_SCALE = 0.25
DURATION_S = 40.0  # experiment seconds of load
POOL = "qwen3-8b"
MODEL = "nvidia/Qwen3-8B-NVFP4"
KEYS = {"guaranteed-a": "sk-exp1-guaranteed-a", "spot-b": "sk-exp1-spot-b"}
BUDGET_UNITS = 2000  # spot-b's daily budget: about 15 of its 64 + 64-token requests
VARIABLES = {"$pool": ".+", "$entitlement": ".+"}
PROXY_LEFT = 'tokenpools_proxy_budget_remaining_units{entitlement="spot-b"}'
SPENT_RATIO = 'pool_entitlement_budget:tokenpools_agents_budget_spent_ratio:max{entitlement="spot-b"}'
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


def send_one(proxy_url: str, key: str) -> dict[str, Any] | None:
    """One request of ``key``'s: None once served, else its refusal's ``error`` (code, and for a budget refusal the
    budget's figures); a refusal by the entitlement's rate limits is waited out as its Retry-After says."""
    body = json.dumps({"model": MODEL, "max_tokens": 64, "ignore_eos": True,
                       "messages": [{"role": "user", "content": prompt_text(64)}]}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    request = urllib.request.Request(proxy_url.rstrip("/") + "/v1/chat/completions", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            r.read()
        return None
    except urllib.error.HTTPError as e:
        error: dict[str, Any] = json.loads(e.read()).get("error") or {}
        assert e.code in (429, 503), (e.code, error)
        if error.get("code") != "budget_exhausted":
            time.sleep(min(2.0, int(e.headers.get("retry-after-ms") or 1000) / 1000))
        return error


def figures(prom_url: str) -> tuple[float | None, float | None]:
    """spot-b's spent ratio on the dashboard (the agents' ledger) and the units its proxy sees left."""
    ratio, left = query(prom_url, SPENT_RATIO)[1], query(prom_url, PROXY_LEFT)[1]
    return (float(ratio[0]["value"][1]) if ratio else None), (float(left[0]["value"][1]) if left else None)


def agreed(prom_url: str, timeout_s: float) -> float:
    """The ledger's spent ratio once the proxy sees exactly what it says left: none of spot-b's requests in flight,
    and the ledger's record covers every completion (the proxy counts its own from the record's ``through_ms``)."""
    deadline, seen = time.monotonic() + timeout_s, (None, None)
    while time.monotonic() < deadline:
        ratio, left = seen = figures(prom_url)
        if ratio is not None and left is not None and abs(left - BUDGET_UNITS * (1 - ratio)) < 1e-6:
            return ratio
        time.sleep(0.5)
    raise AssertionError(f"the ledger's spent ratio and the proxy's units left disagree after {timeout_s}s: {seen}")


def spend_until_refused(prom_url: str, proxy_url: str, key: str, timeout_s: float) -> tuple[dict[str, Any], int]:
    """``key``'s requests one at a time until the proxy refuses one with budget_exhausted while its view is the
    ledger's (checked before each request once a first one was refused: the view then counts the newest
    completions twice until the agents' windows close past them): that refusal's ``error.budget``, and how many
    were served on the way."""
    deadline, served, other, settled = time.monotonic() + timeout_s, 0, [], False
    while time.monotonic() < deadline:
        if settled:
            agreed(prom_url, 30)
        error = send_one(proxy_url, key)
        if error is None:
            served += 1
        elif error.get("code") == "budget_exhausted":
            if settled:
                return error["budget"], served
            settled = True
        else:
            other.append(error.get("code"))
    raise AssertionError(f"no budget_exhausted in {timeout_s:.0f} s: {served} served, other refusals {other}")


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
            assert {"admitted", "concurrency"} <= outcomes, outcomes
            budget, served = spend_until_refused(prom.url, stack.proxy_urls[0], KEYS["spot-b"], 180)
            # refused only because the request did not fit, on the ledger's figure: the dashboard shows exactly what
            # the refusal said was left, within one request of the allowance
            assert budget["remaining"] < budget["request"] <= 0.2 * budget["allowance"], budget
            shown, _ = figures(prom.url)
            want = 1 - budget["remaining"] / budget["allowance"]  # (remaining is never below 0: overshot, ≥ 1)
            assert shown is not None and (abs(shown - want) < 1e-9 or (want == 1 and shown >= 1)), (shown, budget)
            # the agents' alert at 0.5 was published, and Prometheus evaluated the rules on it
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
    print(f"spot-b: {sorted(outcomes)} under the load; {served} more served one at a time, then refused with "
          f"{budget['remaining']:.0f} of {budget['allowance']:.0f} units left for {budget['request']:.0f}; the "
          f"dashboard's spent ratio {shown:.4f}")
