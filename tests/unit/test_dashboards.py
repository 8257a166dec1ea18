"""deploy/dashboards: Grafana dashboards Grafana can import (a Prometheus datasource variable every panel uses,
panels with a place and targets with a PromQL ``expr``), whose every expression promtool parses and reads only
series the components export or the project's recording rules record.

That they return data against a running stack: tests/integration/test_dashboards_live.py.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from test_prometheus_rules import _NAME, PROMETHEUS_SERIES, exported_names, rules, run_promtool

DASHBOARDS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "dashboards"
DASHBOARDS = sorted(DASHBOARDS_DIR.glob("*.json"))
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.+),\s*(?P<label>\w+)\)$")
# what the dashboards' variables stand for when an expression is checked: every value
VARIABLES = {"$pool": ".+", "$entitlement": ".+"}


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def targets(doc: dict) -> Iterator[tuple[str, dict]]:
    for panel in doc["panels"]:
        for target in panel["targets"]:
            yield panel["title"], target


def expressions(doc: dict) -> list[str]:
    """Every PromQL expression of a dashboard: its targets' and its variables' selectors (``label_values``)."""
    out = [t["expr"] for _, t in targets(doc)]
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            match = LABEL_VALUES.match(var["query"]["query"])
            assert match, f"variable {var['name']}: only label_values(<selector>, <label>) queries: {var['query']}"
            out.append(match["selector"])
    return out


def substituted(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"an unknown variable in {expr}"
    return expr


def test_there_are_a_pool_and_a_tenant_dashboard() -> None:
    assert {p.name for p in DASHBOARDS} == {"pool.json", "tenant.json"}
    assert len({load(p)["uid"] for p in DASHBOARDS}) == len(DASHBOARDS)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_a_dashboard_has_what_grafana_needs(path: Path) -> None:
    doc = load(path)
    assert doc["uid"] and doc["title"] and isinstance(doc["schemaVersion"], int)
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"] == DATASOURCE
            assert f"${var['name']}" in json.dumps(doc["panels"]), f"variable {var['name']} used by no panel"
    assert doc["panels"]
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for panel in doc["panels"]:
        assert panel["type"] in {"timeseries", "stat", "gauge", "table", "bargauge"}
        assert panel["title"] and panel["description"]
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["datasource"] == DATASOURCE
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert target["expr"].strip() and target["datasource"] == DATASOURCE


def test_every_expression_parses(tmp_path: Path) -> None:
    """promtool has no query parser of its own: each expression becomes a recording rule, which it parses."""
    exprs = [substituted(e) for path in DASHBOARDS for e in expressions(load(path))]
    doc = {"groups": [{"name": "dashboards", "rules": [{"record": f"dashboard_expr_{i}", "expr": e}
                                                       for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboards.yaml"
    path.write_text(yaml.safe_dump(doc))
    run_promtool("check", "rules", str(path))


def test_every_expression_reads_series_that_exist(tmp_path: Path) -> None:
    exported = exported_names(tmp_path) | PROMETHEUS_SERIES
    recorded = {r["record"] for r in rules() if "record" in r}
    functions = {"sum", "max", "min", "rate", "by", "on", "histogram_quantile"}
    labels = {"pool", "entitlement", "outcome", "budget", "job", "dimension"}
    unknown = set()
    for path in DASHBOARDS:
        for expr in expressions(load(path)):
            expr = re.sub(r"\{[^}]*\}", "", expr)
            expr = re.sub(r"\[[^]]*\]", "", expr)
            for token in _NAME.findall(expr):
                if token in functions or token in labels:
                    continue
                if token not in (recorded if ":" in token else exported):
                    unknown.add(token)
    assert not unknown, f"dashboards read series nobody exports or records: {sorted(unknown)}"
