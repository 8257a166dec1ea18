"""deploy/operators/: Strimzi's Kafka, topics and users, and the Prometheus Operator's monitors and rule, equal to
the sources the rest of deploy/ is rendered from (tests/integration/test_deploy_dry_run.py checks them against the
operators' CRDs on a real kube-apiserver)."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tokenpools.topics.acls import AclRule, Operation, Pattern, Principals, Resource, Role, rules
from tokenpools.topics.declarations import DEFAULT_PARTITIONS, topics_for

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
OPERATORS = DEPLOY / "operators"
COMPONENTS = ("proxy", "agents", "controller")


def _render_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_operators", OPERATORS / "render.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _docs(path: Path, kind: str | None = None) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d and kind in (None, d.get("kind"))]


@pytest.mark.parametrize(("what", "file"), [("topics", "kafka-topics.yaml"), ("users", "kafka-users.yaml"),
                                            ("rules", "prometheus-rule.yaml")])
def test_generated_files_are_what_render_py_writes(what: str, file: str) -> None:
    assert (OPERATORS / file).read_text() == _render_module().render(what), \
        f"run: .venv/bin/python deploy/operators/render.py {what} > deploy/operators/{file}"


def test_the_kafka_users_grant_exactly_the_acls_of_the_topic_contract() -> None:
    """Read back from the committed YAML: every (principal, operation, resource, pattern, name) of every KafkaUser
    is a rule of tokenpools.topics.acls and every rule is granted, none twice."""
    operations = {"Read": Operation.READ, "Write": Operation.WRITE, "Create": Operation.CREATE,
                  "Describe": Operation.DESCRIBE, "DescribeConfigs": Operation.DESCRIBE_CONFIGS}
    patterns = {"literal": Pattern.LITERAL, "prefix": Pattern.PREFIXED}
    granted: list[AclRule] = []
    users = _docs(OPERATORS / "kafka-users.yaml", "KafkaUser")
    for user in users:
        role = Role(user["metadata"]["labels"]["tokenpools.io/role"])
        assert user["metadata"]["name"] == Principals().user(role)
        assert user["spec"]["authentication"] == {"type": "scram-sha-512"}  # as docs/security.md's SASL_SSL
        assert user["spec"]["authorization"]["type"] == "simple"
        for acl in user["spec"]["authorization"]["acls"]:
            assert acl.get("type", "allow") == "allow" and acl.get("host", "*") == "*"
            resource = acl["resource"]
            granted += [AclRule(role, f"User:{user['metadata']['name']}", Resource(resource["type"]),
                                patterns[resource["patternType"]], resource["name"], operations[op])
                        for op in acl["operations"]]
    expected = rules(topics_for("tokenpools."), "tokenpools.", Principals())
    assert len(granted) == len(set(granted))
    assert set(granted) == set(expected)
    assert sorted(u["metadata"]["name"] for u in users) == sorted(Principals().user(r) for r in Role)


def _create_topics_script() -> dict[str, tuple[int, dict[str, str]]]:
    """What deploy/base/kafka/create-topics.sh creates with its defaults: topic → (partitions, configs)."""
    script = (DEPLOY / "base/kafka/create-topics.sh").read_text()
    defaults = dict(re.findall(r'^(PREFIX|PARTITIONS)="\$\{\w+:-([^}]*)\}"$', script, re.MULTILINE))
    out = {}
    for line in script.splitlines():
        m = re.match(r'topics .* --create --if-not-exists --topic "\$\{PREFIX\}([^"]+)" --partitions (\S+) ', line)
        if m:
            partitions = int(defaults["PARTITIONS"]) if m[2] == '"$PARTITIONS"' else int(m[2])
            configs = dict(kv.split("=", 1) for kv in re.findall(r"--config (\S+)", line))
            out[defaults["PREFIX"] + m[1]] = (partitions, configs)
    return out


def test_the_kafka_topics_are_the_topics_create_topics_sh_creates() -> None:
    script = _create_topics_script()
    topics = {t["metadata"]["name"]: t for t in _docs(OPERATORS / "kafka-topics.yaml", "KafkaTopic")}
    assert set(topics) == set(script) == {t.name for t in topics_for().all()}
    for name, (partitions, configs) in script.items():
        spec = topics[name]["spec"]
        assert spec["partitions"] == partitions, name
        assert {k: str(v) for k, v in spec["config"].items()} == configs, name
        assert spec["replicas"] == 3  # the script's REPLICAS default
        assert topics[name]["metadata"]["labels"]["strimzi.io/cluster"] == "kafka"
    assert max(p for p, _ in script.values()) == DEFAULT_PARTITIONS


def test_the_prometheus_rule_holds_every_group_of_the_rule_files() -> None:
    [rule] = _docs(OPERATORS / "prometheus-rule.yaml", "PrometheusRule")
    files = [g for f in sorted((DEPLOY / "prometheus/rules").glob("*.yaml")) for g in _docs(f)[0]["groups"]]
    assert rule["spec"]["groups"] == files
    names = [g["name"] for g in files]
    assert len(names) == len(set(names)), "group names must be unique within one rule file"


def _kafka() -> dict[str, Any]:
    [kafka] = _docs(OPERATORS / "kafka.yaml", "Kafka")
    return kafka


def test_the_kafka_cluster_is_kraft_with_a_tls_scram_listener_and_acls() -> None:
    kafka = _kafka()
    [pool] = _docs(OPERATORS / "kafka.yaml", "KafkaNodePool")
    assert pool["metadata"]["labels"]["strimzi.io/cluster"] == kafka["metadata"]["name"]
    assert set(pool["spec"]["roles"]) == {"controller", "broker"}  # KRaft: no ZooKeeper
    assert pool["spec"]["replicas"] >= 3  # the topics' replicas
    [listener] = kafka["spec"]["kafka"]["listeners"]
    assert listener["tls"] is True and listener["authentication"] == {"type": "scram-sha-512"}
    assert kafka["spec"]["kafka"]["authorization"] == {"type": "simple"}
    assert kafka["spec"]["kafka"]["config"]["auto.create.topics.enable"] is False
    assert set(kafka["spec"]["entityOperator"]) == {"topicOperator", "userOperator"}


def test_each_component_logs_in_as_its_kafka_user_at_the_bootstrap_service_with_settings_that_load(
        tmp_path: Path) -> None:
    from tokenpools.config import load_settings

    kafka = _kafka()
    cluster, namespace = kafka["metadata"]["name"], kafka["metadata"]["namespace"]
    [listener] = kafka["spec"]["kafka"]["listeners"]
    users = {u["metadata"]["name"] for u in _docs(OPERATORS / "kafka-users.yaml", "KafkaUser")}
    overlay = _docs(OPERATORS / "kustomization.yaml")[0]
    ca = tmp_path / "ca.crt"
    ca.write_text("-")
    for role in COMPONENTS:
        assert {"path": f"{role}.yaml"} in overlay["patches"]
        [patch] = _docs(OPERATORS / f"{role}.yaml")
        [container] = patch["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        user = env["TOKENPOOLS_KAFKA__SASL_USERNAME"]["value"]
        assert user == Principals().user(Role(role)) and user in users
        # the Secret Strimzi's user operator writes for the KafkaUser, and the cluster CA's
        assert env["TOKENPOOLS_KAFKA__SASL_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": user, "key": "password"}
        [volume] = patch["spec"]["template"]["spec"]["volumes"]
        assert volume["secret"]["secretName"] == f"{cluster}-cluster-ca-cert"
        values = {name: e.get("value", "secret") for name, e in env.items()}
        values["TOKENPOOLS_KAFKA__SSL_CAFILE"] = str(ca)  # the mounted Secret's file, here
        old = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("TOKENPOOLS_")}
        try:
            os.environ.update(values)
            settings = load_settings(None).kafka
        finally:
            for k in values:
                os.environ.pop(k, None)
            os.environ.update(old)
        assert (settings.security_protocol, settings.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
        assert settings.bootstrap_servers == f"{cluster}-kafka-bootstrap.{namespace}.svc:{listener['port']}"
    deleted = [yaml.safe_load(p["patch"])["kind"] for p in overlay["patches"] if "patch" in p]
    assert sorted(deleted) == ["ConfigMap", "Job"]  # the topics Job and its scripts: the operators do that work


def _scrape_ports() -> dict[str, int]:
    """job → port of deploy/prometheus/scrape-config.yaml's component jobs."""
    config = _docs(DEPLOY / "prometheus/scrape-config.yaml")[0]
    return {job["job_name"]: int(relabel["replacement"].rsplit(":", 1)[1])
            for job in config["scrape_configs"] for relabel in job["relabel_configs"]
            if relabel.get("target_label") == "__address__" and re.fullmatch(r"\$1:\d+", relabel["replacement"])}


def test_each_service_monitor_scrapes_what_scrape_config_does_under_the_job_the_rules_expect() -> None:
    base = sorted(DEPLOY.glob("base/*/deployment.yaml"))
    services = {s["metadata"]["name"]: s for f in (*base, OPERATORS / "monitoring.yaml") for s in _docs(f, "Service")}
    deployments = {d["metadata"]["name"]: d for f in base for d in _docs(f, "Deployment")}
    monitors = _docs(OPERATORS / "monitoring.yaml", "ServiceMonitor")
    ports = _scrape_ports()
    assert sorted(m["metadata"]["name"] for m in monitors) == sorted(ports) == sorted(f"tokenpools-{c}" for c in COMPONENTS)
    for monitor in monitors:
        [service] = [s for s in services.values()
                     if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        job = service["metadata"]["name"]  # a ServiceMonitor's job: the Service's name (no jobLabel set)
        assert "jobLabel" not in monitor["spec"] and job == monitor["metadata"]["name"]
        [endpoint] = monitor["spec"]["endpoints"]
        [port] = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
        pod = deployments[job]["spec"]["template"]
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        container_ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert container_ports[port["targetPort"]] == ports[job], job
    [backends] = _docs(OPERATORS / "monitoring.yaml", "PodMonitor")
    assert backends["spec"]["jobLabel"] == "tokenpools.io/pool"  # job = pool, the controller's default selector


def test_the_prometheus_loads_every_monitor_and_the_rule_and_answers_at_the_configured_url() -> None:
    from urllib.parse import urlsplit

    [prometheus] = _docs(OPERATORS / "prometheus.yaml", "Prometheus")
    spec = prometheus["spec"]
    for kind, selector in (("ServiceMonitor", "serviceMonitorSelector"), ("PodMonitor", "podMonitorSelector")):
        monitors = _docs(OPERATORS / "monitoring.yaml", kind)
        assert monitors and all(spec[selector]["matchLabels"].items() <= m["metadata"]["labels"].items()
                                for m in monitors), kind
    [rule] = _docs(OPERATORS / "prometheus-rule.yaml", "PrometheusRule")
    assert spec["ruleSelector"]["matchLabels"].items() <= rule["metadata"]["labels"].items()
    # what the controller (the one component that queries it) is configured with: base/config.yaml's prometheus.url
    [config_map] = _docs(DEPLOY / "base/config.yaml", "ConfigMap")
    url = urlsplit(yaml.safe_load(config_map["data"]["controller.yaml"])["spec"]["prometheus"]["url"])
    [service] = _docs(OPERATORS / "prometheus.yaml", "Service")
    assert (url.hostname, url.port) == (f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc",
                                        service["spec"]["ports"][0]["port"])
    assert service["spec"]["selector"]["operator.prometheus.io/name"] == prometheus["metadata"]["name"]
    [role] = _docs(OPERATORS / "prometheus.yaml", "Role")
    [binding] = _docs(OPERATORS / "prometheus.yaml", "RoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert [s["name"] for s in binding["subjects"]] == [spec["serviceAccountName"]]
    assert all(set(r["verbs"]) == {"get", "list", "watch"} for r in role["rules"])  # it discovers, never changes
