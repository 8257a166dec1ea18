"""Every validation error path, with the exact message: file[:line]: document N (Kind name): path: message."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenpools.config import ConfigError, load_config, load_config_documents, load_config_text
from tokenpools.errors import ConfigProblem, PermanentError, TokenPoolsError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

INVALID_YAML_PROBLEMS = [
    "examples/invalid.yaml:7: document 1 (TokenPool qwen3-8b): spec: give exactly one of kvGeometry or kvBytesPerToken, got kvGeometry and kvBytesPerToken",
    "examples/invalid.yaml:10: document 1 (TokenPool qwen3-8b): spec.scaling.maxReplicas: must be >= minReplicas (2), got 1",
    "examples/invalid.yaml:22: document 2 (TokenEntitlement spot-b): spec.qos.sloTargetMs: must be > 0, got -5",
    "examples/invalid.yaml:33: document 3 (TokenEntitlement guaranteed-a): spec.qos.serviceClass: must be one of 'dedicated', 'guaranteed', 'elastic', 'spot' or 'preemptible', got 'gold'",
    "examples/invalid.yaml:33: document 3 (TokenEntitlement guaranteed-a): spec.qos.sloTargetMs: required field is missing",
    "examples/invalid.yaml:33: document 3 (TokenEntitlement guaranteed-a): spec.qos.sloTargetMS: unknown field; did you mean sloTargetMs? (known: serviceClass, sloTargetMs, queueTimeoutMs)",
    "examples/invalid.yaml:34: document 3 (TokenEntitlement guaranteed-a): spec.resources.concurrency: must be a whole number, got 6.5",
    "examples/invalid.yaml:36: document 3 (TokenEntitlement guaranteed-a): spec.apiKeys[0].sha256: must be the SHA-256 of the key as 64 hexadecimal characters (`tokenpools hash-key` prints it), got 12 characters",
    "examples/invalid.yaml:41: document 4 (TokenEntitlement spot-b): metadata.name: duplicate TokenEntitlement name 'spot-b' (also document 2)",
    "examples/invalid.yaml:64: document 6 (TokenEntitlement elastic-x): duplicate key 'tenantId' (first at line 63)",
    "examples/invalid.yaml:65: document 6 (TokenEntitlement elastic-x): spec.poolRef.name: no TokenPool named 'llama-70b' in this file (pools: qwen3-8b, paper-pool)",
    "examples/invalid.yaml:67: document 6 (TokenEntitlement elastic-x): spec.resources.kvCacheGiB: must be > 0 for an elastic entitlement, got 0",
    "examples/invalid.yaml:68: document 6 (TokenEntitlement elastic-x): spec.burstCeiling.tokensPerSecond: must be >= the baseline resources.tokensPerSecond (150), got 100",
    "examples/invalid.yaml:70: document 6 (TokenEntitlement elastic-x): spec.apiKeys[0].sha256: the same API key is already used by TokenEntitlement 'spot-d' (document 5) of tenant 'tenant-d' (a key names one tenant)",
    "examples/invalid.yaml:73: document 7 (TokenQuota quota): kind: unknown kind 'TokenQuota' (known: TokenEntitlement, TokenPool, TokenPoolsSettings)",
    "examples/invalid.yaml:77: document 8 (TokenPool paper-pool): apiVersion: unknown apiVersion 'tokens.datarobot.com/v1alpha1' (known: tokenpools.io/v1alpha1)",
    "examples/invalid.yaml:82: document 9: must be a mapping with apiVersion, kind, metadata and spec, got a list",
    "examples/invalid.yaml:88: document 10 (TokenPoolsSettings): spec.streams.tick_s: must be > 0, got -5",
    "examples/invalid.yaml:89: document 10 (TokenPoolsSettings): spec.polcy: unknown settings group (known: kafka, policy, streams, proxy, budgets, scaling, prometheus, kubernetes, controllers)",
    "examples/invalid.yaml:100: document 11 (TokenEntitlement spot-budgets): spec.budgets[0].period: must be one of 'day', 'week', 'month' or 'never', got 'year'",
    "examples/invalid.yaml:100: document 11 (TokenEntitlement spot-budgets): spec.budgets[0].amount: must be > 0, got 0",
    "examples/invalid.yaml:103: document 11 (TokenEntitlement spot-budgets): spec.budgets[1].weights.completion: must be >= 0, got -4",
    "examples/invalid.yaml:105: document 11 (TokenEntitlement spot-budgets): spec.budgets[1].rolover: unknown field; did you mean rollover? (known: name, period, timeZone, amount, scope, weights, rollover, alertThresholds, onStale)",
    "examples/invalid.yaml:118: document 12 (TokenEntitlement spot-budgets-2): spec.budgets[0].timeZone: unknown time zone 'Europe/Paris, France' (an IANA name such as UTC or Europe/Berlin)",
    "examples/invalid.yaml:120: document 12 (TokenEntitlement spot-budgets-2): spec.budgets[0].alertThresholds[1]: must be > alertThresholds[0] (0.8), got 0.5 (thresholds are distinct and ascending)",
    "examples/invalid.yaml:124: document 12 (TokenEntitlement spot-budgets-2): spec.budgets[1].rollover: a `never` budget has no next period to roll over into: remove rollover",
    "examples/invalid.yaml:125: document 12 (TokenEntitlement spot-budgets-2): spec.budgets[2].name: duplicate of budgets[0] (monthly): budget names are unique within an entitlement",
]


def _problems(text: str, source: str = "x.yaml") -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config_text(text, source)
    return [str(p) for p in info.value.problems]


def test_invalid_example_reports_every_problem_in_file_order() -> None:
    text = (EXAMPLES / "invalid.yaml").read_text()
    assert _problems(text, "examples/invalid.yaml") == INVALID_YAML_PROBLEMS


def test_load_config_names_the_path_it_was_given() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(EXAMPLES / "invalid.yaml")
    assert str(info.value.problems[0]).startswith(f"{EXAMPLES / 'invalid.yaml'}:7: document 1 (TokenPool qwen3-8b): ")
    assert str(info.value) == "\n".join(str(p) for p in info.value.problems)


def test_config_error_is_a_permanent_project_error() -> None:
    assert issubclass(ConfigError, PermanentError) and issubclass(ConfigError, TokenPoolsError)
    with pytest.raises(ValueError):
        ConfigError([])
    assert str(ConfigProblem("f.yaml", "m")) == "f.yaml: m"
    assert str(ConfigProblem("f.yaml", "m", path="a.b", document=2, kind="K", line=4)) == "f.yaml:4: document 2 (K): a.b: m"


POOL = """\
apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {name: p}
spec:
  model: m
  backendRef: {name: b}
  perReplica: {tokensPerSecond: 480, kvCacheGiB: 8, concurrency: 16}
  kvBytesPerToken: 1000
"""
ENTITLEMENT = """\
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {name: e}
spec:
  tenantId: t
  poolRef: {name: p}
  qos: {serviceClass: guaranteed, sloTargetMs: 100}
  resources: {tokensPerSecond: 10, kvCacheGiB: 1, concurrency: 2}
"""
KEY = "a" * 64


def test_the_building_blocks_are_valid() -> None:
    config = load_config_text(POOL + ENTITLEMENT)
    assert list(config.entitlements) == ["e"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # the file as a whole
        ("", "x.yaml: no documents: expected at least one TokenPool (apiVersion tokenpools.io/v1alpha1)"),
        ("# nothing but a comment\n---\n", "x.yaml: no documents: expected at least one TokenPool (apiVersion tokenpools.io/v1alpha1)"),
        ("a: [1, 2\n", "x.yaml:2: invalid YAML: while parsing a flow sequence; expected ',' or ']', but got '<stream end>'"),
        ("just a string\n", "x.yaml:1: document 1: must be a mapping with apiVersion, kind, metadata and spec, got 'just a string'"),
        (ENTITLEMENT, "x.yaml: no TokenPool document: entitlements need a pool to bind to"),
        # apiVersion and kind
        (POOL.replace("apiVersion: tokenpools.io/v1alpha1\n", ""),
         "x.yaml:1: document 1 (TokenPool p): apiVersion: required field is missing (known: tokenpools.io/v1alpha1)"),
        (POOL.replace("kind: TokenPool\n", "kind: TokenPools\n"),
         "x.yaml:2: document 1 (TokenPools p): kind: unknown kind 'TokenPools' (known: TokenEntitlement, TokenPool, TokenPoolsSettings)"),
        # types, ranges, unknown fields
        (POOL.replace("concurrency: 16", "concurrency: true"),
         "x.yaml:7: document 1 (TokenPool p): spec.perReplica.concurrency: must be a whole number, got true"),
        (POOL.replace("tokensPerSecond: 480", 'tokensPerSecond: "480"'),
         "x.yaml:7: document 1 (TokenPool p): spec.perReplica.tokensPerSecond: must be a number, got '480'"),
        (POOL.replace("tokensPerSecond: 480", "tokensPerSecond: 0"),
         "x.yaml:7: document 1 (TokenPool p): spec.perReplica.tokensPerSecond: must be > 0, got 0"),
        (POOL.replace("tokensPerSecond: 480", "tokensPerSecond: .inf"),
         "x.yaml:7: document 1 (TokenPool p): spec.perReplica.tokensPerSecond: must be a finite number, got inf"),
        (POOL.replace("concurrency: 16", "concurrency: 0"),
         "x.yaml:7: document 1 (TokenPool p): spec.perReplica.concurrency: must be >= 1, got 0"),
        (POOL.replace("model: m", "model: ''"), "x.yaml:5: document 1 (TokenPool p): spec.model: must not be empty"),
        (POOL.replace("model: m", "model: 8"), "x.yaml:5: document 1 (TokenPool p): spec.model: must be a string, got 8 (quote it)"),
        (POOL.replace("  model: m\n", ""), "x.yaml:4: document 1 (TokenPool p): spec.model: required field is missing"),
        (POOL.replace("kvBytesPerToken: 1000", "kvBytesPerTokn: 1000"),
         "x.yaml:8: document 1 (TokenPool p): spec.kvBytesPerTokn: unknown field; did you mean kvBytesPerToken? (known: model, "
         "backendRef, scaling, perReplica, kvGeometry, kvBytesPerToken, defaults, tokenBucketWindowSeconds, shards, endpoints, enginePriority, enforcement)"),
        (POOL.replace("name: p}", "name: p, nmae: q}"),
         "x.yaml:3: document 1 (TokenPool p): metadata.nmae: unknown field; did you mean name? (known: name, namespace, generation, labels, annotations)"),
        (POOL.replace("name: p}", "name: Pool_1}"),
         "x.yaml:3: document 1 (TokenPool Pool_1): metadata.name: must be a lowercase DNS name (a-z, 0-9, '-', '.'; at most 253 characters), got 'Pool_1'"),
        (POOL + "  endpoints: ['ftp://x']\n",
         "x.yaml:9: document 1 (TokenPool p): spec.endpoints[0]: must be an http(s) URL such as http://127.0.0.1:8000, got 'ftp://x'"),
        (POOL + "  endpoints: ['http://a:1', 'http://a:1/']\n",
         "x.yaml:9: document 1 (TokenPool p): spec.endpoints[1]: duplicate of endpoints[0] (http://a:1)"),
        # rules across fields of one document
        (POOL.replace("kvBytesPerToken: 1000", "defaults: {maxTokens: 5}"),
         "x.yaml:4: document 1 (TokenPool p): spec: give exactly one of kvGeometry or kvBytesPerToken, got neither"),
        (POOL + "  scaling: {minReplicas: 1, maxReplicas: 2, replicas: 3}\n",
         "x.yaml:9: document 1 (TokenPool p): spec.scaling.replicas: must be within minReplicas..maxReplicas [1, 2], got 3"),
        (POOL + ENTITLEMENT.replace("  resources: {tokensPerSecond: 10, kvCacheGiB: 1, concurrency: 2}\n", ""),
         "x.yaml:13: document 2 (TokenEntitlement e): spec.resources: required for a guaranteed entitlement (its baseline: tokensPerSecond, kvCacheGiB, concurrency)"),
        (POOL + ENTITLEMENT.replace("concurrency: 2", "concurrency: 0"),
         "x.yaml:17: document 2 (TokenEntitlement e): spec.resources.concurrency: must be > 0 for a guaranteed entitlement, got 0"),
        (POOL + ENTITLEMENT.replace("guaranteed", "preemptible"),
         "x.yaml:17: document 2 (TokenEntitlement e): spec.resources: a preemptible entitlement has no baseline: remove resources or set every field to 0"),
        (POOL + ENTITLEMENT + "  burstCeiling: {tokensPerSecond: 20, kvCacheGiB: 2, concurrency: 4}\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.burstCeiling: a guaranteed entitlement never bursts above its baseline: remove burstCeiling"),
        (POOL + ENTITLEMENT.replace("guaranteed", "elastic") + "  burstCeiling: {tokensPerSecond: 20, kvCacheGiB: 2, concurrency: 1}\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.burstCeiling.concurrency: must be >= the baseline resources.concurrency (2), got 1"),
        (POOL + ENTITLEMENT.replace("guaranteed", "spot").replace("  resources: {tokensPerSecond: 10, kvCacheGiB: 1, concurrency: 2}\n", "")
         + "  burstCeiling: {tokensPerSecond: 20, kvCacheGiB: 0, concurrency: 1}\n",
         "x.yaml:17: document 2 (TokenEntitlement e): spec.burstCeiling.kvCacheGiB: must be > 0, got 0"),
        (POOL + ENTITLEMENT + f"  apiKeys: [{{sha256: {KEY}, secretRef: {{name: s, key: k}}}}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.apiKeys[0]: give exactly one of sha256 or secretRef"),
        (POOL + ENTITLEMENT + "  apiKeys: [{sha256: sk-live-oops-a-clear-key}]\n",  # the value is never echoed
         "x.yaml:18: document 2 (TokenEntitlement e): spec.apiKeys[0].sha256: must be the SHA-256 of the key as 64 hexadecimal "
         "characters (`tokenpools hash-key` prints it), got 24 characters"),
        (POOL + ENTITLEMENT + "  apiKeys: [{secretRef: {name: s, key: 'a/b'}}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.apiKeys[0].secretRef.key: must be a Secret data key (letters, digits, '-', '_', '.'), got 'a/b'"),
        (POOL + ENTITLEMENT + "  expiresAt: 2030-01-01T00:00:00\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.expiresAt: must be an RFC 3339 timestamp with a UTC offset (e.g. 2026-12-31T23:59:59Z), got 2030-01-01T00:00:00"),
        (POOL + ENTITLEMENT + "  expiresAt: 'next tuesday'\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.expiresAt: must be an RFC 3339 timestamp with a UTC offset (e.g. 2026-12-31T23:59:59Z), got 'next tuesday'"),
        (POOL + ENTITLEMENT + "  state: Active\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.state: must be one of 'Pending', 'Bound', 'Degraded' or 'Expired', got 'Active'"),
        # budgets: shapes and ranges
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: Day, amount: 1}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].period: must be one of 'day', 'week', 'month' or 'never', got 'Day'"),
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: day, amount: '1e6'}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].amount: must be a number, got '1e6'"),
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: day, amount: -1}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].amount: must be > 0, got -1"),
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: day}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].amount: required field is missing"),
        (POOL + ENTITLEMENT + "  budgets: [{name: D_1, period: day, amount: 1}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].name: must be a lowercase DNS name (a-z, 0-9, '-', '.'; at most 253 characters), got 'D_1'"),
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: day, amount: 1, weights: {prompt: -0.5}}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].weights.prompt: must be >= 0, got -0.5"),
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: day, amount: 1, weights: {cached: 0.1}}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].weights.cached: unknown field; did you mean cachedPrompt? (known: prompt, cachedPrompt, completion)"),
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: day, amount: 1, rollover: {}}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].rollover.max: required field is missing"),
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: day, amount: 1, rollover: {max: -1}}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].rollover.max: must be >= 0, got -1"),
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: day, amount: 1, alertThresholds: [0, 1]}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].alertThresholds[0]: must be > 0, got 0"),
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: day, amount: 1, alertThresholds: [0.5, 10.5]}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].alertThresholds[1]: must be <= 10, got 10.5"),
        # budgets: rules across fields
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: day, amount: 1, timeZone: CEST}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].timeZone: unknown time zone 'CEST' (an IANA name such as UTC or Europe/Berlin)"),
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: day, amount: 1, alertThresholds: [0.5, 0.9, 0.9]}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].alertThresholds[2]: must be > alertThresholds[1] (0.9), got 0.9 (thresholds are distinct and ascending)"),
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: never, amount: 1, rollover: {max: 0}}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].rollover: a `never` budget has no next period to roll over into: remove rollover"),
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: day, amount: 1, weights: {prompt: 0, cachedPrompt: 0, completion: 0}}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].weights: at least one weight must be > 0 (with all 0 nothing is ever spent)"),
        (POOL + ENTITLEMENT + "  budgets:\n  - {name: d, period: day, amount: 1}\n  - {name: w, period: week, amount: 5}\n"
         "  - {name: d, period: month, amount: 20}\n",
         "x.yaml:21: document 2 (TokenEntitlement e): spec.budgets[2].name: duplicate of budgets[0] (d): budget names are unique within an entitlement"),
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: day, amount: 1, scope: team}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].scope: must be one of 'entitlement' or 'tenant', got 'team'"),
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: day, amount: 1, scope: tenant, rollover: {max: 1}}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.budgets[0].rollover: a tenant budget has no rollover (its carry would need the tenant's total of the previous period): remove rollover"),
        # rules across documents
        (POOL + ENTITLEMENT.replace("poolRef: {name: p}", "poolRef: {name: q}"),
         "x.yaml:15: document 2 (TokenEntitlement e): spec.poolRef.name: no TokenPool named 'q' in this file (pools: p)"),
        (POOL + ENTITLEMENT + "  budgets: [{name: d, period: day, amount: 1, scope: tenant}]\n"
         + ENTITLEMENT.replace("{name: e}", "{name: f}") + "  budgets:\n  - {name: w, period: week, amount: 1}\n"
         "  - {name: d, period: day, amount: 2, scope: tenant, timeZone: Europe/Berlin, alertThresholds: [1]}\n",
         "x.yaml:30: document 3 (TokenEntitlement f): spec.budgets[1]: tenant budget 'd' of tenant 't' is declared "
         "differently by TokenEntitlement 'e' (document 2, spec.budgets[0]): they differ in timeZone, amount, alertThresholds; "
         "every entitlement sharing a tenant budget declares it alike"),
        (POOL + "---\n" + POOL, "x.yaml:12: document 2 (TokenPool p): metadata.name: duplicate TokenPool name 'p' (also document 1)"),
        (POOL + ENTITLEMENT + f"  apiKeys: [{{sha256: {KEY}}}, {{sha256: {KEY.upper()}}}]\n",
         "x.yaml:18: document 2 (TokenEntitlement e): spec.apiKeys[1].sha256: the same API key is listed twice in this entitlement"),
        (POOL + ENTITLEMENT + f"  apiKeys: [{{sha256: {KEY}}}]\n" + ENTITLEMENT.replace("{name: e}", "{name: f}") + f"  apiKeys: [{{sha256: {KEY}}}]\n",
         "x.yaml:28: document 3 (TokenEntitlement f): spec.apiKeys[0].sha256: the same API key is already used by TokenEntitlement 'e' (document 2) in the same pool 'p' (a key names one entitlement per pool)"),
        (POOL + ENTITLEMENT + "  apiKeys: [{secretRef: {name: s, key: k}}]\n"
         + ENTITLEMENT.replace("{name: e}", "{name: f}") + "  apiKeys: [{secretRef: {name: s, key: k}}]\n",
         "x.yaml:28: document 3 (TokenEntitlement f): spec.apiKeys[0].secretRef: the same Secret key is already used by TokenEntitlement 'e' (document 2) in the same pool 'p' (a key names one entitlement per pool)"),
        (POOL + "---\napiVersion: tokenpools.io/v1alpha1\nkind: TokenPoolsSettings\nspec: {}\n"
         "---\napiVersion: tokenpools.io/v1alpha1\nkind: TokenPoolsSettings\nspec: {}\n",
         "x.yaml:15: document 3 (TokenPoolsSettings): kind: only one TokenPoolsSettings document is allowed (also document 2)"),
        (POOL + "---\napiVersion: tokenpools.io/v1alpha1\nkind: TokenPoolsSettings\nspec: {policy: {alpha_dept: 1}}\n",
         "x.yaml:12: document 2 (TokenPoolsSettings): spec.policy.alpha_dept: unknown field; did you mean alpha_debt? (known: alpha_slo, "
         "alpha_burst, alpha_debt, debt_factor_floor, gamma_debt, gamma_burst, debt_credit, class_weights, mean_slo, lend_idle_protected, burst_headroom, fleet_enforcement, reservation_quantile, reservation_window_completions, reservation_min_completions, queue_slo_fraction, queue_max_timeout_ms, queue_classes, queue_max_waiters_per_entitlement)"),
        (POOL.replace("metadata: {name: p}", "metadata: {name: p}\nmetadata: {name: p}"),
         "x.yaml:4: document 1 (TokenPool p): duplicate key 'metadata' (first at line 3)"),
    ],
)
def test_one_problem(text: str, expected: str) -> None:
    assert _problems(text) == [expected]


def test_a_tenant_budget_declared_alike_is_shared_and_names_are_per_tenant_and_scope() -> None:
    """Two entitlements of tenant t on two pools declare one tenant budget alike; tenant u's budget of the same name
    and an entitlement budget of the same name may differ (docs/budgets.md#tenant-budgets)."""
    tenant_budget = "  budgets: [{name: d, period: day, amount: 5, scope: tenant}]\n"
    text = (POOL + POOL.replace("{name: p}", "{name: q}").replace("apiVersion", "---\napiVersion", 1)
            + ENTITLEMENT + tenant_budget
            + ENTITLEMENT.replace("{name: e}", "{name: f}").replace("{name: p}", "{name: q}") + tenant_budget
            + ENTITLEMENT.replace("{name: e}", "{name: g}").replace("tenantId: t", "tenantId: u")
            + "  budgets: [{name: d, period: week, amount: 9, scope: tenant}]\n"
            + ENTITLEMENT.replace("{name: e}", "{name: h}") + "  budgets: [{name: d, period: month, amount: 1}]\n")
    config = load_config_text(text)
    scopes = {name: [(b.name, b.scope.value, b.amount) for b in e.budgets] for name, e in config.entitlements.items()}
    assert scopes == {"e": [("d", "tenant", 5.0)], "f": [("d", "tenant", 5.0)], "g": [("d", "tenant", 9.0)],
                      "h": [("d", "entitlement", 1.0)]}


def test_not_a_mapping_and_missing_file() -> None:
    with pytest.raises(ConfigError) as info:
        load_config("/nonexistent/tokenpools.yaml")
    assert [str(p) for p in info.value.problems] == ["/nonexistent/tokenpools.yaml: cannot read: No such file or directory"]
    with pytest.raises(ConfigError) as info:
        load_config_documents([["a"], {"apiVersion": "tokenpools.io/v1alpha1"}], source="apiserver")
    assert [str(p) for p in info.value.problems] == [
        "apiserver: document 1: must be a mapping with apiVersion, kind, metadata and spec, got a list",
        "apiserver: document 2: kind: required field is missing (known: TokenEntitlement, TokenPool, TokenPoolsSettings)",
    ]


def test_a_document_reports_all_its_problems() -> None:
    assert _problems(POOL.replace("spec:\n", "spec: []\nfoo:\n")) == [
        "x.yaml:4: document 1 (TokenPool p): spec: must be a mapping, got a list",
        "x.yaml:5: document 1 (TokenPool p): foo: unknown field (known: apiVersion, kind, metadata, spec, status)",
    ]


def test_a_broken_pool_is_not_also_reported_missing() -> None:
    text = POOL.replace("concurrency: 16", "concurrency: -1") + ENTITLEMENT
    assert _problems(text) == ["x.yaml:7: document 1 (TokenPool p): spec.perReplica.concurrency: must be >= 1, got -1"]
