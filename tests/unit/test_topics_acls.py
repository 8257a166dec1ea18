"""The components' Kafka ACLs (``tokenpools.topics.acls``) and the script an operator runs to grant them.

The broker enforcing them is in tests/integration/test_kafka_security.py; here: who may write what (the invariants
the security model rests on), and that deploy/secured/create-acls.sh grants exactly these rules when run.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import orjson

from tokenpools.topics.acls import Operation, Pattern, Principals, Resource, Role, rules
from tokenpools.topics.declarations import topics_for

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
TOPICS = topics_for("tp.")
RULES = rules(TOPICS, "tp.")


def _writers(topic: str) -> set[Role]:
    return {r.role for r in RULES if r.operation in (Operation.WRITE, Operation.CREATE) and r.resource is Resource.TOPIC
            and (r.name == topic if r.pattern is Pattern.LITERAL else topic.startswith(r.name))}


def test_every_topic_has_the_writers_the_contract_says_and_no_other() -> None:
    t = TOPICS
    assert _writers(t.limits.name) == {Role.AGENTS}  # a proxy cannot give anyone capacity
    assert _writers(t.counts.name) == _writers(t.scale.name) == _writers(t.effective_limits.name) == {Role.AGENTS}
    assert _writers(t.requests.name) == _writers(t.completions.name) == _writers(t.heartbeats.name) == {Role.PROXY}
    assert _writers(t.specs.name) == _writers(t.backend_metrics.name) == {Role.CONTROLLER}
    assert _writers(t.dead_letters.name) == {Role.PROXY, Role.AGENTS}
    assert not any(r.role is Role.RECORDER and r.operation is not Operation.READ and r.operation is not
                   Operation.DESCRIBE for r in RULES)  # the recorder only reads


def test_the_agents_may_read_every_topic_their_code_reads() -> None:
    """The group's source topics and the topics every worker reads whole (``streams.app.broadcast_topics``): a
    secured worker without READ on one retries it for ever (seen: the limits and budgets readers, whose rules were
    missing, so a secured worker never saw tenant parts and its first tick waited for the readers)."""
    from tokenpools.streams.admin import source_topics
    from tokenpools.streams.app import broadcast_topics

    readable = {r.name for r in RULES if r.role is Role.AGENTS and r.operation is Operation.READ
                and r.resource is Resource.TOPIC and r.pattern is Pattern.LITERAL}
    assert set(source_topics(TOPICS)) | set(broadcast_topics(TOPICS)) <= readable


def test_only_the_agents_create_topics_and_only_their_own() -> None:
    creates = [r for r in RULES if r.operation is Operation.CREATE]
    assert [(r.role, r.pattern, r.name) for r in creates] == [(Role.AGENTS, Pattern.PREFIXED, "tokenpools-agents-")]
    assert not any(t.name.startswith("tokenpools-agents-") for t in TOPICS.all())


def test_groups_are_only_those_of_the_agents_and_the_recorder() -> None:
    groups = {(r.role, r.name) for r in RULES if r.resource is Resource.GROUP}
    assert groups == {(Role.AGENTS, "tokenpools-agents"), (Role.RECORDER, "tokenpools-recorder")}


def _render() -> str:
    spec = importlib.util.spec_from_file_location("render_acls", DEPLOY / "secured/render_acls.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.render())


def test_create_acls_script_is_rendered_from_the_rules() -> None:
    assert (DEPLOY / "secured/create-acls.sh").read_text() == _render(), \
        "run: .venv/bin/python deploy/secured/render_acls.py > deploy/secured/create-acls.sh"


FAKE_KAFKA_ACLS = """#!{python}
import json, sys
args = sys.argv[1:]
value = lambda flag: args[args.index(flag) + 1]
resource = "topic" if "--topic" in args else "group"
with open({out!r}, "a") as f:
    f.write(json.dumps([value("--allow-principal"), value("--operation"), resource, value("--" + resource),
                        value("--resource-pattern-type"), value("--bootstrap-server"), value("--command-config")]) + "\\n")
"""


def test_the_script_grants_exactly_the_rules_for_the_deployment_it_is_given(tmp_path: Path) -> None:
    out = tmp_path / "granted.jsonl"
    fake = tmp_path / "kafka-acls.sh"
    fake.write_text(FAKE_KAFKA_ACLS.format(python=sys.executable, out=str(out)))
    fake.chmod(0o755)
    env = {"PATH": os.environ["PATH"], "KAFKA_ACLS_CMD": str(fake), "PREFIX": "prod.", "APP_ID": "prod-agents",
           "PROXY_USER": "gw", "BOOTSTRAP": "k:9093", "COMMAND_CONFIG": "/admin.properties"}
    done = subprocess.run(["sh", str(DEPLOY / "secured/create-acls.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    granted = [orjson.loads(line) for line in out.read_text().splitlines()]
    expected = rules(topics_for("prod."), "prod.", Principals(proxy="gw", agents_app_id="prod-agents"))
    names = {Operation.READ: "Read", Operation.WRITE: "Write", Operation.CREATE: "Create",
             Operation.DESCRIBE: "Describe", Operation.DESCRIBE_CONFIGS: "DescribeConfigs"}
    assert granted == [[r.principal, names[r.operation], r.resource.value, r.name, r.pattern.value, "k:9093",
                        "/admin.properties"] for r in expected]


def _yaml(path: Path, kind: str | None = None) -> dict:
    """The document of ``path`` (the one of ``kind`` in a multi-document file)."""
    import yaml

    return dict(next(d for d in yaml.safe_load_all(path.read_text()) if d and kind in (None, d.get("kind"))))


def test_the_secured_overlay_logs_each_component_in_as_its_own_user_with_settings_that_load(tmp_path: Path) -> None:
    from tokenpools.config import load_settings

    overlay = _yaml(DEPLOY / "secured/kustomization.yaml")
    assert overlay["resources"] == ["../base"]
    ca = tmp_path / "ca.crt"
    ca.write_text("-")
    for role, user in (("proxy", "proxy"), ("agents", "agents"), ("controller", "controller"), ("record", "recorder")):
        patch = _yaml(DEPLOY / f"secured/{role}.yaml")
        assert {"path": f"{role}.yaml"} in overlay["patches"]
        base = _yaml(DEPLOY / f"base/{role}/deployment.yaml", "Deployment")
        assert patch["metadata"]["name"] == base["metadata"]["name"] == f"tokenpools-{role}"
        [container] = patch["spec"]["template"]["spec"]["containers"]
        assert container["name"] in {c["name"] for c in base["spec"]["template"]["spec"]["containers"]}
        env = {e["name"]: e for e in container["env"]}
        secrets = {e["valueFrom"]["secretKeyRef"]["name"] for e in env.values() if "valueFrom" in e}
        assert secrets == {f"tokenpools-kafka-{user}"}  # the user topics/acls.py grants: tokenpools-{user}
        values = {name: e.get("value", "secret") for name, e in env.items()}
        values["TOKENPOOLS_KAFKA__SSL_CAFILE"] = str(ca)  # the mounted Secret's file, here
        old = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("TOKENPOOLS_")}
        try:
            os.environ.update(values)
            kafka = load_settings(None).kafka
        finally:
            for k in values:
                os.environ.pop(k, None)
            os.environ.update(old)
        assert (kafka.security_protocol, kafka.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
        assert kafka.bootstrap_servers == "kafka.tokenpools.svc:9093"
