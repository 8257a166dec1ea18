"""deploy/ agrees with the code: CRD schemas with tokenpools.config.documents, the example custom resources with
examples/, the RBAC Role with the calls the controller makes, the topics script with tokenpools.topics."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from tokenpools.config import load_config, load_config_documents, load_settings
from tokenpools.config.documents import TokenEntitlementDocument, TokenPoolDocument

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BASE = DEPLOY / "base"  # the kustomize base both overlays (deploy/, deploy/secured/) build on
CRDS: dict[str, tuple[Path, type[BaseModel]]] = {"TokenPool": (BASE / "crds/tokenpools.io_tokenpools.yaml", TokenPoolDocument),
        "TokenEntitlement": (BASE / "crds/tokenpools.io_tokenentitlements.yaml", TokenEntitlementDocument)}


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _version(kind: str) -> dict[str, Any]:
    (crd,) = _docs(CRDS[kind][0])
    (version,) = crd["spec"]["versions"]
    return dict(version)


# ---- the schema: every field, type, requirement, enum and bound of the pydantic models -------------------------

def _pydantic_node(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A pydantic JSON Schema node reduced to what a CRD schema also says."""
    if "$ref" in node:
        return _pydantic_node(defs[node["$ref"].split("/")[-1]], defs)
    if "anyOf" in node:  # Optional[X]: X (absent in a CRD means None)
        (inner,) = [n for n in node["anyOf"] if n.get("type") != "null"]
        return _pydantic_node(inner, defs)
    out: dict[str, Any] = {"type": node.get("type", "string" if "enum" in node else None)}
    for key in ("enum", "minimum", "maximum", "minLength", "format"):
        if key in node:
            out[key] = node[key]
    if "exclusiveMinimum" in node:
        out["exclusiveMinimum"] = node["exclusiveMinimum"]
    if out["type"] == "object" and "properties" in node:
        out["properties"] = {k: _pydantic_node(v, defs) for k, v in node["properties"].items()}
        out["required"] = sorted(node.get("required", []))
    if out["type"] == "array":
        out["items"] = _pydantic_node(node["items"], defs)
    return out


def _crd_node(node: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"type": node.get("type")}
    for key in ("enum", "maximum", "minLength", "format"):
        if key in node:
            out[key] = node[key]
    if "minimum" in node:  # OpenAPI v3.0 spells "> 0" as minimum 0 + exclusiveMinimum true
        out["exclusiveMinimum" if node.get("exclusiveMinimum") else "minimum"] = node["minimum"]
    if out["type"] == "object" and "properties" in node:
        out["properties"] = {k: _crd_node(v) for k, v in node["properties"].items()}
        # a field the CRD defaults is not required of the user, and pydantic defaults it the same way
        out["required"] = sorted(node.get("required", []))
    if out["type"] == "array":
        out["items"] = _crd_node(node["items"])
    return out




@pytest.mark.parametrize("kind", list(CRDS))
def test_crd_spec_schema_matches_the_pydantic_document(kind: str) -> None:
    model = CRDS[kind][1]
    schema = model.model_json_schema(by_alias=True)
    want = _pydantic_node(schema["properties"]["spec"], schema["$defs"])
    have = _crd_node(_version(kind)["schema"]["openAPIV3Schema"]["properties"]["spec"])
    assert have == want


@pytest.mark.parametrize("kind", list(CRDS))
def test_crd_defaults_equal_the_pydantic_defaults(kind: str) -> None:
    """Every default the CRD applies is the default the loader would apply (so both read a document alike)."""
    spec = _version(kind)["schema"]["openAPIV3Schema"]["properties"]["spec"]
    model = CRDS[kind][1].model_fields["spec"].annotation

    def walk(node: dict[str, Any], cls: Any, path: str) -> None:
        for name, sub in node.get("properties", {}).items():
            field = next(f for f in cls.model_fields.values() if f.alias == name or f.serialization_alias == name
                         or (f.alias is None and name == _camel(f)))
            if "default" in sub:
                default = field.get_default(call_default_factory=True)
                value = default.model_dump(by_alias=True, exclude_none=True) if hasattr(default, "model_dump") else default
                assert value == sub["default"], f"{path}.{name}"
            annotation = field.annotation
            inner = getattr(annotation, "__args__", (annotation,))
            for arg in inner:
                if isinstance(arg, type) and hasattr(arg, "model_fields") and sub.get("type") == "object":
                    walk(sub, arg, f"{path}.{name}")

    walk(spec, model, "spec")


def _camel(field: Any) -> str:
    return str(field.alias)


_KEYWORDS = {"type", "minimum", "maximum", "exclusiveMinimum", "description", "default", "minLength", "maxLength", "pattern", "enum",
             "format", "items", "properties", "required", "x-kubernetes-validations", "x-kubernetes-list-type",
             "x-kubernetes-list-map-keys", "maxItems"}


@pytest.mark.parametrize("kind", list(CRDS))
def test_crd_schema_nodes_use_only_schema_keywords(kind: str) -> None:
    """A comma inside a flow mapping (``{description: KV cache, GiB}``) silently makes a key "GiB": caught here."""
    def walk(node: dict[str, Any], path: str) -> None:
        assert set(node) <= _KEYWORDS, (path, set(node) - _KEYWORDS)
        for name, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{name}")
        if "items" in node:
            walk(node["items"], f"{path}[]")

    walk(_version(kind)["schema"]["openAPIV3Schema"], kind)


def test_crds_have_status_subresource_printer_columns_and_short_names() -> None:
    for kind, (path, _) in CRDS.items():
        (crd,) = _docs(path)
        version = _version(kind)
        assert crd["spec"]["group"] == "tokenpools.io" and version["name"] == "v1alpha1"
        assert version["subresources"] == {"status": {}}
        assert crd["spec"]["names"]["shortNames"]
        columns = {c["name"] for c in version["additionalPrinterColumns"]}
        assert "Age" in columns
    te_columns = {c["name"] for c in _version("TokenEntitlement")["additionalPrinterColumns"]}
    assert {"Pool", "Class", "State", "Reason"} <= te_columns


# ---- examples -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("exp", ["exp1", "exp2"])
def test_example_custom_resources_load_to_the_specs_of_the_examples(exp: str) -> None:
    file_config = load_config(ROOT / "examples" / f"{exp}.yaml")
    crs = load_config_documents(_docs(DEPLOY / "examples" / f"{exp}.yaml"), source=exp)
    assert crs.pools == file_config.pools
    assert crs.entitlements == file_config.entitlements
    assert crs.entitlement_by_key_hash == file_config.entitlement_by_key_hash
    assert all(getattr(d.metadata, "namespace", None) == "tokenpools" for d in crs.documents)


def test_the_config_map_holds_settings_only_and_the_proxy_is_ready_once_it_has_read_the_specs_topic() -> None:
    """Issue 31: the ConfigMap holds only what has no custom resource. The proxy and the agents start from settings
    (with Kafka: the specs topic brings the pools), the proxy's readiness waits for that topic (/readyz), and every
    example TokenPool lists its endpoints: a proxy has no other place to learn them."""
    from tokenpools.config import SpecsSource, load_config_text

    (config_map,) = [d for d in _docs(BASE / "config.yaml") if d["kind"] == "ConfigMap"]
    for key, text in config_map["data"].items():
        assert {d["kind"] for d in yaml.safe_load_all(text)} == {"TokenPoolsSettings"}, key
    served = load_config_text(config_map["data"]["config.yaml"], "config.yaml", SpecsSource.TOPIC)
    assert served.pools == {} and served.entitlements == {}
    assert load_settings(served.settings_values, []).proxy.kafka_enabled  # so settings only is a valid config
    (proxy,) = [d for d in _docs(BASE / "proxy/deployment.yaml") if d["kind"] == "Deployment"]
    (container,) = proxy["spec"]["template"]["spec"]["containers"]
    assert "--no-kafka" not in container["args"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    for exp in ("exp1", "exp2"):
        pools = [d for d in _docs(DEPLOY / "examples" / f"{exp}.yaml") if d["kind"] == "TokenPool"]
        assert pools and all(p["spec"].get("endpoints") for p in pools), exp


# ---- RBAC: least privilege ------------------------------------------------------------------------------------

def test_controller_role_grants_exactly_the_calls_the_controller_makes() -> None:
    docs = {d["kind"]: d for d in _docs(BASE / "rbac/controller.yaml")}
    assert set(docs) == {"ServiceAccount", "Role", "RoleBinding"}, "namespaced only: no ClusterRole"
    grants = {(g, r, v, *rule.get("resourceNames", ())) for rule in docs["Role"]["rules"] for g in rule["apiGroups"]
              for r in rule["resources"] for v in rule["verbs"]}
    lease = load_settings().controllers.lease_name  # leader.LeaseStore: create, then get and update that one Lease
    assert grants == {
        ("tokenpools.io", "tokenpools", "list"), ("tokenpools.io", "tokenpools", "watch"),
        ("tokenpools.io", "tokenentitlements", "list"), ("tokenpools.io", "tokenentitlements", "watch"),
        ("tokenpools.io", "tokenpools/status", "patch"), ("tokenpools.io", "tokenentitlements/status", "patch"),
        ("apps", "deployments/scale", "get"), ("apps", "deployments/scale", "patch"),
        ("", "events", "create"),
        ("coordination.k8s.io", "leases", "create"),
        ("coordination.k8s.io", "leases", "get", lease), ("coordination.k8s.io", "leases", "update", lease),
        ("", "secrets", "get", "tokenpools-api-keys"),  # secrets.KeyResolver: named Secrets only, get only
    }
    binding = docs["RoleBinding"]
    assert binding["roleRef"]["name"] == docs["Role"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": docs["ServiceAccount"]["metadata"]["name"],
                                    "namespace": docs["ServiceAccount"]["metadata"]["namespace"]}]


def test_only_the_controller_mounts_a_service_account_token() -> None:
    for name in ("proxy", "agents"):
        (deployment,) = [d for d in _docs(BASE / name / "deployment.yaml") if d["kind"] == "Deployment"]
        assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    (controller,) = _docs(BASE / "controller/deployment.yaml")
    assert controller["spec"]["template"]["spec"]["serviceAccountName"] == "tokenpools-controller"


def test_the_controller_runs_two_replicas_that_elect_a_leader_on_the_lease() -> None:
    """Two replicas are safe only with leader election on (the default), a distinct identity each (the pod's name),
    and a rolling update that keeps a ready standby: readiness is /healthz, which a standby passes."""
    from tokenpools.controllers.main import add_arguments, controller_options

    (controller,) = _docs(BASE / "controller/deployment.yaml")
    spec = controller["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    (container,) = spec["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["TOKENPOOLS_CONTROLLERS__LEASE_IDENTITY"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(container["args"][1:])
    (config_map,) = [d for d in _docs(BASE / "config.yaml") if d["kind"] == "ConfigMap"]
    (settings_doc,) = yaml.safe_load_all(config_map["data"]["controller.yaml"])
    options = controller_options(args, load_settings(settings_doc["spec"], [], source="controller.yaml"))
    assert options.leader_election and options.kubernetes is not None
    assert options.lease_namespace == controller["metadata"]["namespace"]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    assert options.knobs.http_port == port and options.knobs.http_host == "0.0.0.0"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}


def test_every_pod_prometheus_scrapes_serves_metrics_on_that_port_on_every_address() -> None:
    """Each scrape job of deploy/prometheus/scrape-config.yaml keeps the pods of one app and scrapes one port: that
    app's Deployment must declare the port and listen on it at 0.0.0.0 (each command's default host, 127.0.0.1,
    answers only inside the pod)."""
    from tokenpools.controllers.main import add_arguments as controller_arguments
    from tokenpools.controllers.main import controller_options
    from tokenpools.proxy.main import add_arguments as proxy_arguments
    from tokenpools.streams.main import add_arguments as agents_arguments

    (config_map,) = [d for d in _docs(BASE / "config.yaml") if d["kind"] == "ConfigMap"]
    proxy_settings = load_settings(next(yaml.safe_load_all(config_map["data"]["config.yaml"]))["spec"], [])
    controller_settings = load_settings(next(yaml.safe_load_all(config_map["data"]["controller.yaml"]))["spec"], [])

    def listens(app: str, args: argparse.Namespace) -> tuple[str, int]:
        if app == "tokenpools-agents":
            return args.http_host, args.http_port
        if app == "tokenpools-controller":
            knobs = controller_options(args, controller_settings).knobs
            return knobs.http_host, knobs.http_port
        return args.host or proxy_settings.proxy.host, args.port or proxy_settings.proxy.port

    not_scraped = {"tokenpools-record"}  # the recorder serves no /metrics (its progress is its log directory)
    parsers = {"tokenpools-agents": agents_arguments, "tokenpools-controller": controller_arguments,
               "tokenpools-proxy": proxy_arguments}
    (scrape,) = _docs(DEPLOY / "prometheus/scrape-config.yaml")
    scraped = {}
    for job in scrape["scrape_configs"]:
        relabel = job.get("relabel_configs", [])
        keep = [r["regex"] for r in relabel if r.get("action") == "keep"
                and r["source_labels"] == ["__meta_kubernetes_pod_label_app_kubernetes_io_name"]]
        address = [r["replacement"] for r in relabel if r.get("target_label") == "__address__"]
        if keep and address:  # (the backends' job scrapes the port each backend pod annotates: not ours)
            scraped[keep[0]] = int(address[0].rsplit(":", 1)[1])
    assert set(scraped) == set(parsers), scraped
    for path in sorted(BASE.glob("*/deployment.yaml")):
        (deployment,) = [d for d in _docs(path) if d["kind"] == "Deployment"]
        app = deployment["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        if app in not_scraped:
            assert app not in scraped and not container.get("ports"), path
            continue
        parser = argparse.ArgumentParser()
        parsers[app](parser)
        host, port = listens(app, parser.parse_args(container["args"][1:]))
        assert (host, port) == ("0.0.0.0", scraped[app]), (path, host, port)
        assert scraped[app] in [p["containerPort"] for p in container.get("ports", [])], path


# ---- Kafka topics ----------------------------------------------------------------------------------------------

def test_create_topics_script_is_rendered_from_the_declarations() -> None:
    spec = importlib.util.spec_from_file_location("render_topics", BASE / "kafka/render_topics.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (BASE / "kafka/create-topics.sh").read_text() == module.render(), \
        "run: .venv/bin/python deploy/base/kafka/render_topics.py > deploy/base/kafka/create-topics.sh"


# kafka-topics.sh as far as the script uses it (Kafka's CLI is not installed here: the local broker is jars only):
# --create --if-not-exists keeps an existing topic; --describe prints the CLI's own summary line.
FAKE_KAFKA_TOPICS = """#!{python}
import json, sys
from pathlib import Path
state = Path(sys.argv[0]).with_suffix(".json")
topics = json.loads(state.read_text()) if state.exists() else {{}}
args = sys.argv[1:]
topic = args[args.index("--topic") + 1]
if "--create" in args:
    topics.setdefault(topic, int(args[args.index("--partitions") + 1]))
    state.write_text(json.dumps(topics))
elif "--describe" in args:
    print(f"Topic: {{topic}}\\tTopicId: Xq1\\tPartitionCount: {{topics[topic]}}\\tReplicationFactor: 1\\tConfigs: ")
    print(f"\\tTopic: {{topic}}\\tPartition: 0\\tLeader: 1\\tReplicas: 1\\tIsr: 1")
"""


def _create_topics(tmp_path: Path, existing: dict[str, int], **env: str) -> tuple[int, dict[str, int], str]:
    import json
    import subprocess
    import sys

    fake = tmp_path / "kafka-topics"
    fake.write_text(FAKE_KAFKA_TOPICS.format(python=sys.executable))
    fake.chmod(0o755)
    fake.with_suffix(".json").write_text(json.dumps(existing))
    done = subprocess.run(["sh", str(BASE / "kafka/create-topics.sh")], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "KAFKA_TOPICS_CMD": str(fake), "PREFIX": "t.", **env})
    return done.returncode, json.loads(fake.with_suffix(".json").read_text()), done.stdout + done.stderr


def test_create_topics_script_creates_pool_keyed_topics_with_partitions_default_32(tmp_path: Path) -> None:
    code, topics, out = _create_topics(tmp_path, {})
    assert code == 0 and "tokenpools topics ready" in out, out
    assert topics == {"t.requests": 32, "t.completions": 32, "t.backend-metrics": 32, "t.specs": 1, "t.limits": 32,
                      "t.scale": 32, "t.heartbeats": 1, "t.dead-letters": 1, "t.effective-limits": 32, "t.counts": 32,
                      "t.usage-windows": 32, "t.budgets": 32, "t.usage": 32, "t.budget-alerts": 1}
    code, topics, out = _create_topics(tmp_path, {}, PARTITIONS="8")
    assert code == 0 and {topics[f"t.{n}"] for n in ("requests", "limits", "counts")} == {8}


def test_create_topics_script_names_existing_topics_with_too_few_partitions_and_fails(tmp_path: Path) -> None:
    code, topics, out = _create_topics(tmp_path, {"t.requests": 4, "t.limits": 4, "t.specs": 1})
    assert code == 1 and topics["t.requests"] == 4 and topics["t.completions"] == 32, "never grown"
    assert "topic t.requests has 4 partitions, wants 32" in out and "topic t.limits has 4 partitions, wants 32" in out
    assert "2 topic(s) have fewer than PARTITIONS=32 partitions" in out and "ready" not in out
    code, _, out = _create_topics(tmp_path, {"t.requests": 4, "t.limits": 64}, PARTITIONS="4")
    assert code == 0, out  # kept as they are: more than wanted is fine
    code, _, out = _create_topics(tmp_path, {}, PARTITIONS="four")
    assert code == 2 and "PARTITIONS must be a whole number >= 1, got 'four'" in out


@pytest.mark.parametrize("folder", ["", "base", "secured", "operators"])
def test_kustomization_lists_files_that_exist_under_its_own_root(folder: str) -> None:
    """What kustomize checks before it renders (kubectl apply -k refuses otherwise): a resource is a file under the
    kustomization's folder or a folder holding a kustomization that does not contain this one (a cycle); a
    generator's or a patch's file lies under the folder (the load restrictor). tests/integration/
    test_deploy_dry_run.py renders them with kustomize itself."""
    root = (DEPLOY / folder).resolve()
    (kustomization,) = _docs(root / "kustomization.yaml")
    for resource in kustomization["resources"]:
        path = (root / resource).resolve()
        if path.is_dir():
            assert (path / "kustomization.yaml").is_file(), resource
            assert not root.is_relative_to(path), f"{resource} contains {root}: kustomize refuses the cycle"
        else:
            assert path.is_file() and path.is_relative_to(root), resource
    files = [f for g in kustomization.get("configMapGenerator", []) for f in g["files"]]
    for f in files + [patch["path"] for patch in kustomization.get("patches", []) if "path" in patch]:
        path = (root / f).resolve()
        assert path.is_file() and path.is_relative_to(root), f"{f}: outside {root}, the load restrictor refuses it"


def test_status_documents_use_only_fields_the_crd_status_schema_declares() -> None:
    """A field the schema lacks is pruned by the API server: the rebuilt status would never equal the stored one, and
    the controller would write it again on every event."""
    from tokenpools.controllers.reconcile import evaluate
    from tokenpools.controllers.status import status_for

    def check(value: Any, schema: dict[str, Any], path: str) -> None:
        if isinstance(value, dict):
            assert schema.get("type") == "object", path
            for key, sub in value.items():
                assert key in schema.get("properties", {}), f"{path}.{key} is not in the CRD status schema"
                check(sub, schema["properties"][key], f"{path}.{key}")
        elif isinstance(value, list):
            for item in value:
                check(item, schema["items"], f"{path}[]")
        elif "enum" in schema:
            assert value in schema["enum"], (path, value)

    objects = _docs(ROOT / "examples/autoscale.yaml")[:-1] + [_docs(ROOT / "examples/exp1.yaml")[1] | {
        "metadata": {"name": "too-big"}, "spec": {**_docs(ROOT / "examples/exp1.yaml")[1]["spec"],
                                                   "poolRef": {"name": "qwen3-8b-autoscale"},
                                                   "resources": {"tokensPerSecond": 1, "kvCacheGiB": 1, "concurrency": 60},
                                                   "apiKeys": []}}]
    evaluation = evaluate(objects, 1_800_000_000.0)
    assert {v.state.value for v in evaluation.verdicts.values() if v.state} == {"Bound", "Degraded"}
    for (kind, name), verdict in evaluation.verdicts.items():
        status = status_for(verdict, evaluation.summaries.get(name), None, 1_800_000_000.0)
        check(status, _version(kind)["schema"]["openAPIV3Schema"]["properties"]["status"], f"{kind}/{name}.status")


def test_the_agents_run_two_workers_with_standbys_and_a_rolling_update_that_keeps_both() -> None:
    """Two workers of one group, each a standby for the other's partitions; no more workers than partitions (the
    rest would idle); a rolling update that starts the new pod before stopping an old one."""
    (agents,) = [d for d in _docs(BASE / "agents/deployment.yaml") if d["kind"] == "Deployment"]
    spec = agents["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    (config_map,) = [d for d in _docs(BASE / "config.yaml") if d["kind"] == "ConfigMap"]
    settings_doc = next(yaml.safe_load_all(config_map["data"]["config.yaml"]))
    settings = load_settings(settings_doc["spec"], [], source="config.yaml")
    assert 1 <= settings.streams.standby_replicas <= spec["replicas"] - 1
    assert spec["replicas"] + spec["strategy"]["rollingUpdate"]["maxSurge"] <= settings.kafka.topic_partitions
