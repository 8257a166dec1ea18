"""The example configs load into the core specs they describe; API key helpers; CRD objects load like YAML."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenpools.config import (
    LoadedConfig,
    SecretKeyRef,
    TokenEntitlementDocument,
    TokenPoolDocument,
    TokenPoolsSettingsDocument,
    hash_api_key,
    key_matches,
    load_config,
    load_config_documents,
    load_config_text,
)
from tokenpools.core.budgets import BudgetScope, BudgetSpec, Period, Weights
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import EntitlementState, ServiceClass
from tokenpools.core.spec import PoolSpec
from tokenpools_dev.builders import pool_spec

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GIB = 2**30
QWEN3_8B_C = 147_456  # 2 · 36 · 8 · 128 · 2 bytes per token
PAPER_POOL = Capacity(480.0, 8.0 * GIB, 16.0)  # 16 slots; ~240 output = 480 prompt + completion tokens/s


def _pool(name: str, max_replicas: int = 1, *, model: str = "nvidia/Qwen3-8B-NVFP4",
          default_max_tokens: int = 64) -> PoolSpec:
    return pool_spec(name, PAPER_POOL, model=model, max_replicas=max_replicas, kv_bytes_per_token=QWEN3_8B_C,
                     default_max_tokens=default_max_tokens, token_bucket_window_s=10.0)


@pytest.mark.parametrize(
    ("file", "pool"),
    [
        ("exp1.yaml", _pool("qwen3-8b")),
        ("exp2.yaml", _pool("qwen3-8b", default_max_tokens=176)),
        ("autoscale.yaml", _pool("qwen3-8b-autoscale", max_replicas=4, model="Qwen/Qwen3-8B", default_max_tokens=256)),
    ],
)
def test_example_pools_convert_to_the_expected_pool_spec(file: str, pool: PoolSpec) -> None:
    config = load_config(EXAMPLES / file)
    assert config.pools == {pool.name: pool}
    assert config.pools[pool.name].kv_bytes_per_token == QWEN3_8B_C
    assert config.source == str(EXAMPLES / file)


# name → (class, SLO ms, baseline (tokens/s, GiB, slots) or None, state)
EXPECTED_ENTITLEMENTS = {
    "exp1.yaml": {
        "guaranteed-a": (ServiceClass.GUARANTEED, 1200.0, (180.0, 3.0, 6.0), EntitlementState.BOUND),
        "spot-b": (ServiceClass.SPOT, 30_000.0, None, EntitlementState.BOUND),
        "guaranteed-c": (ServiceClass.GUARANTEED, 1200.0, (180.0, 3.0, 6.0), EntitlementState.BOUND),
    },
    "exp2.yaml": {
        "elastic-copilot": (ServiceClass.ELASTIC, 500.0, (150.0, 2.5, 5.0), EntitlementState.BOUND),
        "elastic-synth": (ServiceClass.ELASTIC, 30_000.0, (150.0, 2.5, 5.0), EntitlementState.BOUND),
        "elastic-reports": (ServiceClass.ELASTIC, 5_000.0, (150.0, 2.5, 5.0), EntitlementState.PENDING),
    },
    "autoscale.yaml": {
        "guaranteed-prod": (ServiceClass.GUARANTEED, 1000.0, (240.0, 4.0, 8.0), EntitlementState.BOUND),
        "elastic-team": (ServiceClass.ELASTIC, 5000.0, (360.0, 6.0, 12.0), EntitlementState.BOUND),
        "spot-batch": (ServiceClass.SPOT, 60_000.0, None, EntitlementState.BOUND),
        "preemptible-eval": (ServiceClass.PREEMPTIBLE, 120_000.0, None, EntitlementState.BOUND),
    },
}


@pytest.mark.parametrize("file", sorted(EXPECTED_ENTITLEMENTS))
def test_example_entitlements_convert_in_file_order(file: str) -> None:
    config = load_config(EXAMPLES / file)
    expected = EXPECTED_ENTITLEMENTS[file]
    assert list(config.entitlements) == list(expected)  # file order = binding order
    for name, (cls, slo_ms, baseline, state) in expected.items():
        spec = config.entitlements[name]
        assert (spec.service_class, spec.slo_ms, spec.state) == (cls, slo_ms, state)
        want = Capacity() if baseline is None else Capacity(baseline[0], baseline[1] * GIB, baseline[2])
        assert spec.baseline == want
        assert spec.pool == next(iter(config.pools))


DEMO_KEYS = {
    "exp1.yaml": {"guaranteed-a": "sk-exp1-guaranteed-a", "spot-b": "sk-exp1-spot-b", "guaranteed-c": "sk-exp1-guaranteed-c"},
    "exp2.yaml": {"elastic-copilot": "sk-exp2-elastic-copilot", "elastic-synth": "sk-exp2-elastic-synth",
                  "elastic-reports": "sk-exp2-elastic-reports"},
    "autoscale.yaml": {"guaranteed-prod": "sk-auto-guaranteed-prod", "elastic-team": "sk-auto-elastic-team",
                       "spot-batch": "sk-auto-spot-batch", "preemptible-eval": "sk-auto-preemptible-eval"},
}


@pytest.mark.parametrize("file", sorted(DEMO_KEYS))
def test_the_documented_demo_keys_map_to_their_entitlements(file: str) -> None:
    config = load_config(EXAMPLES / file)
    text = (EXAMPLES / file).read_text()
    for name, key in DEMO_KEYS[file].items():
        assert key in text  # documented in the header comment
        assert config.entitlement_by_key_hash[hash_api_key(key)] == name
        assert config.api_key_hashes[name] == (hash_api_key(key),)
        assert key not in "".join(str(d) for d in config.raw_documents)  # never stored in clear


def test_burst_ceiling_expiry_secret_refs_and_settings_of_the_autoscale_example() -> None:
    config = load_config(EXAMPLES / "autoscale.yaml")
    team = config.entitlements["elastic-team"]
    assert team.burst_ceiling == Capacity(960.0, 16.0 * GIB, 32.0)
    assert team.expires_at_s == 1_893_456_000.0  # 2030-01-01T00:00:00Z
    assert team.tenant == "team"
    assert config.entitlements["spot-batch"].burst_ceiling == Capacity(480.0, 8.0 * GIB, 16.0)
    assert config.api_key_secret_refs["elastic-team"] == (SecretKeyRef.model_validate({"name": "tokenpools-api-keys", "key": "elastic-team"}),)
    assert config.api_key_secret_refs["spot-batch"] == ()
    assert config.settings_values == {"scaling": {"target_utilization": 0.8, "scale_down_stabilization_s": 60, "cooldown_s": 30}}
    assert config.endpoints["qwen3-8b-autoscale"] == tuple(f"http://127.0.0.1:{p}" for p in (8000, 8001, 8002, 8003))
    ref = config.backend_refs["qwen3-8b-autoscale"]
    assert (ref.api_version, ref.kind, ref.name, ref.namespace) == ("apps/v1", "Deployment", "qwen3-8b-vllm", "tokenpools")
    assert [type(d) for d in config.documents] == [TokenPoolDocument] + [TokenEntitlementDocument] * 4 + [TokenPoolsSettingsDocument]


def test_the_autoscale_example_budgets_and_billing_labels_reach_the_core() -> None:
    config = load_config(EXAMPLES / "autoscale.yaml")
    team = config.entitlements["elastic-team"]
    assert team.budgets == (
        BudgetSpec("monthly", Period.MONTH, 500_000_000.0, time_zone="Europe/Berlin",
                   weights=Weights(prompt=1.0, cached_prompt=0.1, completion=4.0), rollover_max=100_000_000.0,
                   alert_thresholds=(0.5, 0.8, 1.0)),
        BudgetSpec("daily", Period.DAY, 40_000_000.0),
    )
    assert team.labels == (("cost-centre", "cc-4711"), ("team", "platform"))  # every label, sorted by name
    assert all(isinstance(v, float) for b in team.budgets for v in (b.amount, b.rollover_max, *b.alert_thresholds))
    assert config.entitlements["spot-batch"].budgets == () and config.entitlements["spot-batch"].labels == ()
    published = [d.model_dump(mode="json", exclude_none=True) for d in config.documents]  # as the controller publishes
    assert load_config_documents(published, source="specs").entitlements == config.entitlements


def test_loaded_config_exposes_documents_and_pool_membership() -> None:
    config = load_config(EXAMPLES / "exp1.yaml")
    assert isinstance(config, LoadedConfig)
    assert [e.name for e in config.entitlements_of("qwen3-8b")] == ["guaranteed-a", "spot-b", "guaranteed-c"]
    assert config.entitlements_of("other") == []
    assert config.endpoints == {"qwen3-8b": ("http://127.0.0.1:8000",)}
    assert config.raw_documents[0]["kind"] == "TokenPool"
    assert config.pool_documents["qwen3-8b"].spec.kv_geometry is not None
    dumped = config.entitlement_documents["spot-b"].model_dump(mode="json", exclude_none=True)
    assert dumped["spec"]["qos"] == {"serviceClass": "spot", "sloTargetMs": 30000.0}  # camelCase on the way out


POOL = """\
apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {name: p}
spec:
  model: m
  backendRef: {name: b}
  perReplica: {tokensPerSecond: 100, kvCacheGiB: 1, concurrency: 4}
  kvBytesPerToken: 73728
"""
ENTITLEMENT = """\
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {name: e}
spec:
  tenantId: t
  poolRef: {name: p}
  qos: {serviceClass: spot, sloTargetMs: 1000}
"""


@pytest.mark.parametrize(
    ("extra", "attribute", "value"),
    [
        ("", "replicas", 1),
        ("  scaling: {minReplicas: 2, maxReplicas: 5}\n", "replicas", 2),  # replicas defaults to minReplicas
        ("  scaling: {minReplicas: 0, maxReplicas: 3, replicas: 3}\n", "replicas", 3),
        ("  defaults: {maxTokens: 512}\n", "default_max_tokens", 512),
        ("  tokenBucketWindowSeconds: 2.5\n", "token_bucket_window_s", 2.5),
        ("", "shards", 1),
        ("  shards: 4\n", "shards", 4),
        ("", "kv_bytes_per_token", 73_728),
    ],
)
def test_pool_defaults_and_overrides(extra: str, attribute: str, value: object) -> None:
    assert getattr(load_config_text(POOL + extra).pools["p"], attribute) == value


@pytest.mark.parametrize(("bytes_per_element", "c"), [(2, 147_456), (1, 73_728), (0.5, 36_864)])
def test_kv_geometry_gives_c(bytes_per_element: float, c: int) -> None:
    text = POOL.replace("kvBytesPerToken: 73728",
                        f"kvGeometry: {{layers: 36, kvHeads: 8, headDim: 128, bytesPerElement: {bytes_per_element}}}")
    assert load_config_text(text).pools["p"].kv_bytes_per_token == c


def test_endpoints_lose_their_trailing_slash() -> None:
    config = load_config_text(POOL + "  endpoints: ['http://10.0.0.1:8000/', 'https://backend.example']\n")
    assert config.endpoints["p"] == ("http://10.0.0.1:8000", "https://backend.example")


def test_a_bare_budget_counts_tokens_in_utc_without_rollover_or_alerts() -> None:
    text = POOL + ENTITLEMENT + "  budgets: [{name: d, period: week, amount: 1000}]\n"
    (budget,) = load_config_text(text).entitlements["e"].budgets
    assert budget == BudgetSpec("d", Period.WEEK, 1000.0, time_zone="UTC", scope=BudgetScope.ENTITLEMENT,
                                weights=Weights(1.0, 1.0, 1.0), rollover_max=0.0, alert_thresholds=())
    dumped = load_config_text(text).entitlement_documents["e"].model_dump(mode="json", exclude_none=True)
    assert dumped["spec"]["budgets"] == [{"name": "d", "period": "week", "timeZone": "UTC", "amount": 1000.0,
                                          "scope": "entitlement", "weights": {"prompt": 1.0, "cachedPrompt": 1.0, "completion": 1.0},
                                          "alertThresholds": []}]  # camelCase on the way out, as written in


def test_budgets_and_labels_of_a_custom_resource_load_like_yaml() -> None:
    budget = {"name": "m", "period": "month", "timeZone": "America/New_York", "amount": 5,
              "weights": {"completion": 2.5}, "rollover": {"max": 3}, "alertThresholds": [1]}
    text = POOL + ENTITLEMENT.replace("{name: e}", "{name: e, labels: {b: '2', a: '1'}}") + (
        "  budgets:\n  - {name: m, period: month, timeZone: America/New_York, amount: 5, weights: {completion: 2.5},"
        " rollover: {max: 3}, alertThresholds: [1]}\n")
    from_yaml = load_config_text(text)
    crs = load_config_documents(from_yaml.raw_documents, source="apiserver")
    assert crs.entitlements == from_yaml.entitlements
    assert crs.raw_documents[1]["spec"]["budgets"] == [budget]
    (spec,) = crs.entitlements["e"].budgets
    assert (spec.weights, spec.rollover_max, spec.alert_thresholds) == (Weights(1.0, 1.0, 2.5), 3.0, (1.0,))
    assert crs.entitlements["e"].labels == (("a", "1"), ("b", "2"))


def test_live_custom_resources_load_with_server_fields_and_status() -> None:
    pool = {
        "apiVersion": "tokenpools.io/v1alpha1", "kind": "TokenPool",
        "metadata": {"name": "p", "namespace": "ns", "uid": "1234", "resourceVersion": "7", "generation": 3,
                     "creationTimestamp": "2026-01-01T00:00:00Z", "managedFields": [{"manager": "kubectl"}]},
        "spec": {"model": "m", "backendRef": {"name": "b"}, "kvBytesPerToken": 10,
                 "perReplica": {"tokensPerSecond": 1, "kvCacheGiB": 1, "concurrency": 1}},
        "status": {"replicas": 1},
    }
    config = load_config_documents([pool], source="apiserver")
    assert config.pools["p"].kv_bytes_per_token == 10
    assert config.pool_documents["p"].metadata.generation == 3


def test_keys_hash_and_compare_in_constant_time() -> None:
    digest = hash_api_key("sk-exp1-guaranteed-a")
    assert digest == "57907c661790537beed0dde5cea8199e0f2ca49de7377ddd598a3248b31acf8e"
    assert key_matches("sk-exp1-guaranteed-a", digest)
    assert key_matches("sk-exp1-guaranteed-a", digest.upper())
    assert not key_matches("sk-exp1-guaranteed-b", digest)
    assert not key_matches("", digest)
    assert not key_matches("sk-exp1-guaranteed-a", "not hex")
    assert not key_matches("sk-exp1-guaranteed-a", "é" * 64)
    with pytest.raises(ValueError, match="must not be empty"):
        hash_api_key("")


def test_digests_are_stored_lowercase() -> None:
    upper = hash_api_key("k").upper()
    text = POOL + f"""---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {{name: e}}
spec:
  tenantId: t
  poolRef: {{name: p}}
  qos: {{serviceClass: spot, sloTargetMs: 100}}
  resources: {{tokensPerSecond: 0, kvCacheGiB: 0, concurrency: 0}}
  apiKeys: [{{sha256: {upper}}}]
"""
    config = load_config_text(text)
    assert config.api_key_hashes["e"] == (hash_api_key("k"),)
    assert config.entitlements["e"].baseline == Capacity()  # a zero baseline is allowed for spot
