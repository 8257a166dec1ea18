"""Settings: defaults, TOKENPOOLS_* env parsing, precedence (file < env < --set), overrides, conversion to the core."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from tokenpools.config import ConfigError, Settings, apply_overrides, load_settings
from tokenpools.core.classes import DEFAULT_CLASS_WEIGHTS, ServiceClass
from tokenpools.core.limits import LimitConfig
from tokenpools.core.priority import PolicyConstants
from tokenpools.core.scaling import ScalingConfig
from tokenpools.topics.declarations import DEFAULT_PARTITIONS


@pytest.fixture(autouse=True)
def _no_tokenpools_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees only the TOKENPOOLS_* variables it sets."""
    import os

    for name in list(os.environ):
        if name.upper().startswith("TOKENPOOLS_"):
            monkeypatch.delenv(name)


def _messages(exc: pytest.ExceptionInfo[ConfigError]) -> list[str]:
    return [str(p) for p in exc.value.problems]


def test_defaults_match_the_paper_and_the_design() -> None:
    s = load_settings()
    assert s.kafka.bootstrap_servers == "127.0.0.1:19092" and s.kafka.topic_prefix == "tokenpools."
    assert s.kafka.topic_partitions == DEFAULT_PARTITIONS == 32  # the topic contract's default is the setting's
    assert s.policy.to_constants() == PolicyConstants()  # α 2/1/4, ε 0.05, γ 0.7/0.7, weights 1000/1000/100/1/0.1
    assert s.policy.class_weights.to_dict() == DEFAULT_CLASS_WEIGHTS
    assert s.policy.mean_slo == "frozen"
    assert s.policy.to_limit_config() == LimitConfig()
    assert s.scaling.to_config() == ScalingConfig()
    assert (s.streams.tick_s, s.streams.grace_s, s.streams.metrics_staleness_s) == (5.0, 2.0, 15.0)
    assert s.streams.standby_replicas == 1  # a warm copy of every partition's states on a second worker
    assert s.streams.session_timeout_s == 8.0  # a killed worker's pools move within about 2 ticks of 5 s
    assert (s.proxy.host, s.proxy.port, s.proxy.limits_ttl_s, s.proxy.max_body_bytes, s.proxy.retry_after_s) == (
        "127.0.0.1", 8080, 30.0, 1_048_576, 1)
    assert s.proxy.spool_dir == Path(".run/spool")
    assert s.prometheus.url == "http://127.0.0.1:9090"
    assert s.kubernetes.namespace == "default"


def test_every_field_documents_its_default() -> None:
    for group_name, group in Settings.model_fields.items():
        for name, field in group.annotation.model_fields.items():  # type: ignore[union-attr]
            if group_name == "policy" and name == "class_weights":
                continue
            assert field.description and "default" in field.description, f"{group_name}.{name}"


def test_settings_are_frozen() -> None:
    s = load_settings()
    with pytest.raises(ValidationError):
        s.streams.tick_s = 1.0  # type: ignore[misc]
    with pytest.raises(ValidationError):
        s.streams = s.streams  # type: ignore[misc]


def test_environment_is_parsed_into_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENPOOLS_STREAMS__TICK_S", "2.5")
    monkeypatch.setenv("TOKENPOOLS_POLICY__CLASS_WEIGHTS__SPOT", "0.5")
    monkeypatch.setenv("tokenpools_proxy__port", "9000")  # case-insensitive
    monkeypatch.setenv("TOKENPOOLS_POLICY__LEND_IDLE_PROTECTED", "false")
    monkeypatch.setenv("TOKENPOOLS_POLICY__MEAN_SLO", "recompute")
    monkeypatch.setenv("TOKENPOOLS_KAFKA__SECURITY_PROTOCOL", "SASL_PLAINTEXT")  # a password needs a SASL protocol
    monkeypatch.setenv("TOKENPOOLS_KAFKA__SASL_MECHANISM", "SCRAM-SHA-256")
    monkeypatch.setenv("TOKENPOOLS_KAFKA__SASL_USERNAME", "svc")
    monkeypatch.setenv("TOKENPOOLS_KAFKA__SASL_PASSWORD", "hunter2")
    monkeypatch.setenv("TOKENPOOLS_CACHE", "/tmp/cache")  # the devstack's variable is not a settings group
    s = load_settings()
    assert s.streams.tick_s == 2.5
    assert s.policy.to_constants().class_weights[ServiceClass.SPOT] == 0.5
    assert s.proxy.port == 9000
    assert s.policy.to_limit_config().lend_idle_protected is False
    assert s.policy.mean_slo == "recompute"
    assert (s.kafka.security_protocol, s.kafka.sasl_mechanism, s.kafka.sasl_username) == (
        "SASL_PLAINTEXT", "SCRAM-SHA-256", "svc")
    assert isinstance(s.kafka.sasl_password, SecretStr)
    assert s.kafka.sasl_password.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(s)


@pytest.mark.parametrize(
    ("env", "value", "expected"),
    [
        ("TOKENPOOLS_STREAMS__TICK_S", "-5", "environment: streams.tick_s: must be > 0, got -5 (from TOKENPOOLS_STREAMS__TICK_S)"),
        ("TOKENPOOLS_STREAMS__STANDBY_REPLICAS", "-1",
         "environment: streams.standby_replicas: must be >= 0, got -1 (from TOKENPOOLS_STREAMS__STANDBY_REPLICAS)"),
        ("TOKENPOOLS_PROXY__PORT", "http", "environment: proxy.port: must be a whole number, got 'http' (from TOKENPOOLS_PROXY__PORT)"),
        ("TOKENPOOLS_POLICY__GAMMA_DEBT", "1", "environment: policy.gamma_debt: must be < 1, got 1 (from TOKENPOOLS_POLICY__GAMMA_DEBT)"),
        ("TOKENPOOLS_POLICY__ALPHA_DEPT", "1",
         "environment: policy.alpha_dept: unknown field; did you mean alpha_debt? (known: alpha_slo, alpha_burst, alpha_debt, "
         "debt_factor_floor, gamma_debt, gamma_burst, debt_credit, class_weights, mean_slo, lend_idle_protected, burst_headroom, fleet_enforcement, reservation_quantile, reservation_window_completions, reservation_min_completions, queue_slo_fraction, queue_max_timeout_ms, queue_classes, queue_max_waiters_per_entitlement) "
         "(from TOKENPOOLS_POLICY__ALPHA_DEPT)"),
        ("TOKENPOOLS_KAFKA__BOOTSTRAP_SERVERS", "localhost",
         "environment: kafka.bootstrap_servers: must be comma-separated host:port, got 'localhost' (from TOKENPOOLS_KAFKA__BOOTSTRAP_SERVERS)"),
        ("TOKENPOOLS_KAFKA__TOPIC_PREFIX", "a b",
         "environment: kafka.topic_prefix: may hold only letters, digits, '.', '_' and '-' (Kafka topic characters), got 'a b' "
         "(from TOKENPOOLS_KAFKA__TOPIC_PREFIX)"),
        ("TOKENPOOLS_KAFKA__TOPIC_PARTITIONS", "0",
         "environment: kafka.topic_partitions: must be >= 1, got 0 (from TOKENPOOLS_KAFKA__TOPIC_PARTITIONS)"),
        ("TOKENPOOLS_PROMETHEUS__URL", "localhost:9090",
         "environment: prometheus.url: must be an http(s) URL such as http://127.0.0.1:8000, got 'localhost:9090' (from TOKENPOOLS_PROMETHEUS__URL)"),
        ("TOKENPOOLS_PROXY__RETRY_WINDOW_MS", "0",
         "environment: proxy.retry_window_ms: must be >= 1, got 0 (from TOKENPOOLS_PROXY__RETRY_WINDOW_MS)"),
        ("TOKENPOOLS_SCALING__TARGET_UTILIZATION", "1.5",
         "environment: scaling.target_utilization: must be <= 1, got 1.5 (from TOKENPOOLS_SCALING__TARGET_UTILIZATION)"),
        ("TOKENPOOLS_POLICY", "{not json",
         'environment: error parsing value for field "policy" from source "EnvSettingsSource" (a group variable takes JSON; '
         "or set one field with TOKENPOOLS_GROUP__FIELD)"),
    ],
)
def test_bad_environment_values_name_the_variable(monkeypatch: pytest.MonkeyPatch, env: str, value: str, expected: str) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert _messages(info) == [expected]


def test_precedence_is_defaults_then_file_then_env_then_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    file_values = {"policy": {"alpha_debt": 9.0, "alpha_slo": 1.5}, "streams": {"tick_s": 3}}
    s = load_settings(file_values)
    assert (s.policy.alpha_debt, s.policy.alpha_slo, s.streams.tick_s, s.policy.alpha_burst) == (9.0, 1.5, 3.0, 1.0)
    monkeypatch.setenv("TOKENPOOLS_POLICY__ALPHA_DEBT", "3")
    s = load_settings(file_values)
    assert (s.policy.alpha_debt, s.policy.alpha_slo) == (3.0, 1.5)  # env beats the file, field by field
    s = load_settings(file_values, ["policy.alpha_debt=2.0", "streams.tick_s=2"])
    assert (s.policy.alpha_debt, s.policy.alpha_slo, s.streams.tick_s) == (2.0, 1.5, 2.0)


def test_apply_overrides_parses_by_field_type() -> None:
    base = load_settings()
    s = apply_overrides(base, [
        "policy.alpha_debt=2.0", "streams.tick_s=2", "policy.mean_slo=recompute", "policy.class_weights.spot=0.5",
        "policy.lend_idle_protected=no", "proxy.port=0", "proxy.proxy_id=proxy-7", "proxy.spool_dir=/var/spool/tp",
        "kafka.security_protocol=SASL_SSL", "kafka.sasl_mechanism=PLAIN", "kafka.sasl_username=u",
        "kafka.sasl_password=s3cret", "kubernetes.kubeconfig=null", " scaling.include_spot = false ",
    ])
    assert s.policy.to_constants().alpha_debt == 2.0
    assert s.streams.tick_s == 2.0
    assert s.policy.mean_slo == "recompute"
    assert s.policy.to_constants().class_weights[ServiceClass.SPOT] == 0.5
    assert s.policy.lend_idle_protected is False
    assert (s.proxy.port, s.proxy.proxy_id, s.proxy.spool_dir) == (0, "proxy-7", Path("/var/spool/tp"))
    assert s.kafka.sasl_password is not None and s.kafka.sasl_password.get_secret_value() == "s3cret"
    assert s.kubernetes.kubeconfig is None
    assert s.scaling.to_config().include_spot is False
    assert base.policy.alpha_debt == 4.0  # the original is untouched
    assert apply_overrides(base, ["streams.tick_s=1", "streams.tick_s=7"]).streams.tick_s == 7.0  # last one wins
    assert apply_overrides(base, []) == base


def test_apply_overrides_reports_every_bad_item_in_order() -> None:
    with pytest.raises(ConfigError) as info:
        apply_overrides(load_settings(), [
            "polcy.alpha_debt=2", "streams.tick_s=abc", "policy.alpha_dept=1", "policy=3", "noequals",
            "streams.tick_s.x=1", "policy.mean_slo=sometimes", "streams.tick_s=-5", "proxy.port=70000", "=1",
        ])
    assert _messages(info) == [
        "--set: polcy.alpha_debt: unknown settings group 'polcy'; did you mean policy? (known: kafka, policy, streams, proxy, "
        "budgets, scaling, prometheus, kubernetes, controllers)",
        "--set: policy.alpha_dept: unknown setting 'alpha_dept' in policy; did you mean alpha_debt? (known: alpha_slo, alpha_burst, "
        "alpha_debt, debt_factor_floor, gamma_debt, gamma_burst, debt_credit, class_weights, mean_slo, lend_idle_protected, burst_headroom, fleet_enforcement, reservation_quantile, reservation_window_completions, reservation_min_completions, queue_slo_fraction, queue_max_timeout_ms, queue_classes, queue_max_waiters_per_entitlement)",
        "--set: policy: is a group; set one of its fields, e.g. policy.alpha_slo",
        "--set: expected KEY=VALUE such as policy.alpha_debt=2.0, got 'noequals'",
        "--set: streams.tick_s.x: streams.tick_s is a setting, not a group",
        "--set: policy.mean_slo: must be one of 'frozen' or 'recompute', got 'sometimes'",
        "--set: streams.tick_s: must be > 0, got -5",  # a later item for the same key replaced 'abc'
        "--set: proxy.port: must be <= 65535, got 70000",
        "--set: expected KEY=VALUE such as policy.alpha_debt=2.0, got '=1'",
    ]


def test_the_core_rules_back_up_the_field_rules() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"policy": {"debt_factor_floor": 0}})
    assert _messages(info) == ["settings: policy.debt_factor_floor: must be > 0, got 0"]


def test_proxy_metric_names_default_to_tokenpools_and_take_only_the_three_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().proxy.metric_names == "tokenpools"  # the existing names: dashboards and rules keep working
    assert apply_overrides(load_settings(), ["proxy.metric_names=both"]).proxy.metric_names == "both"
    monkeypatch.setenv("TOKENPOOLS_PROXY__METRIC_NAMES", "gen_ai")
    assert load_settings().proxy.metric_names == "gen_ai"
    with pytest.raises(ConfigError) as info:
        apply_overrides(load_settings(), ["proxy.metric_names=otel"])
    assert _messages(info) == [
        "--set: proxy.metric_names: must be one of 'tokenpools', 'gen_ai' or 'both', got 'otel'"]
