"""Process settings, grouped by concern (docs/conventions.md#settings): defaults → file → environment → ``--set``.

One idea: the settings' schema, every group and field with its unit, default and checks; how the sources are read
and merged into one ``Settings`` is ``tokenpools.config.sources`` (``load_settings``, ``apply_overrides``).

Environment variables use the prefix ``TOKENPOOLS_`` and ``__`` between group and field:
``TOKENPOOLS_STREAMS__TICK_S=2``, ``TOKENPOOLS_POLICY__CLASS_WEIGHTS__SPOT=0.5``. A config file may carry a
``kind: TokenPoolsSettings`` document whose ``spec`` has this same structure; ``--set group.field=value``
(``apply_overrides``) wins over both. Everything is validated when it is built and frozen afterwards; nothing is
read at import time.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, SecretStr, field_validator,
                      model_validator)
from pydantic_settings import BaseSettings, SettingsConfigDict

from tokenpools.config.documents import check_http_url
from tokenpools.core.budgets import OnStale
from tokenpools.core.classes import ServiceClass
from tokenpools.core.limits import LimitConfig
from tokenpools.core.priority import PolicyConstants
from tokenpools.core.reservation import ReservationConfig
from tokenpools.core.waiting import QueueConfig
from tokenpools.core.scaling import ScalingConfig

ENV_PREFIX = "TOKENPOOLS_"
ENV_DELIMITER = "__"


class _Group(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)


def _are(names: list[str]) -> str:
    return f"{', '.join(names)} {'is' if len(names) == 1 else 'are'}"


def _existing_file(value: Path | None) -> Path | None:
    if value is not None and not value.is_file():
        raise ValueError(f"no such file: {str(value)!r}")
    return value


# A TLS client's settings, written once for every group that has one (the Kafka clients: ``ssl_*``; the proxy's
# https:// backends: ``upstream_ssl_*``): each group declares its fields with these, under its own names, and checks
# them with ``_check_client_certificate``.
TlsFile = Annotated[Path | None, AfterValidator(_existing_file)]
"""A PEM file (CAs, client certificate, private key): must exist when the settings are loaded."""


def _tls_cafile(peers: str, when: str = "") -> Any:
    return Field(None, description=f"PEM file of the CAs that sign {peers}' certificates{when}; default none: the "
                 "system's CAs")


def _tls_certfile(peers: str, keyfile: str) -> Any:
    return Field(None, description=f"PEM client certificate for {peers} that authenticate clients by TLS; needs "
                 f"{keyfile}; default none")


def _tls_keyfile(certfile: str) -> Any:
    return Field(None, description=f"PEM private key of {certfile}; default none")


def _tls_check_hostname(whose: str, host: str) -> Any:
    return Field(True, description=f"{whose} certificate must name {host}; default true")


def _check_client_certificate(certfile: tuple[str, Path | None], keyfile: tuple[str, Path | None]) -> None:
    """A client certificate (field name, value) and its private key go together."""
    if (certfile[1] is None) != (keyfile[1] is None):
        raise ValueError(f"{certfile[0]} and {keyfile[0]} go together: a client certificate needs its private key")


class KafkaSettings(_Group):
    bootstrap_servers: str = Field("127.0.0.1:19092", description="comma-separated host:port of brokers; default 127.0.0.1:19092")
    client_id: str = Field("tokenpools", min_length=1, description="Kafka client id; default tokenpools")
    topic_prefix: str = Field("tokenpools.", description="prepended to every topic name by tokenpools.topics; default 'tokenpools.'")
    topic_partitions: int = Field(
        32, ge=1, description="partitions of each pool-keyed topic (requests, completions, backend-metrics, limits, "
        "scale, effective-limits, counts) where tokenpools creates topics: at most this many agent workers share the "
        "pools. The agents refuse to start on existing topics with fewer (growing them: topics/README.md#partitions); "
        "default 32")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field("PLAINTEXT", description="default PLAINTEXT")
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = Field(
        None, description="with SASL_PLAINTEXT or SASL_SSL (and only then); default none")
    sasl_username: str | None = Field(None, min_length=1, description="with a SASL protocol; default none")
    sasl_password: SecretStr | None = Field(None, description="secret; with a SASL protocol; default none")
    ssl_cafile: TlsFile = _tls_cafile("the brokers", ", with SSL or SASL_SSL")
    ssl_certfile: TlsFile = _tls_certfile("brokers", "ssl_keyfile")
    ssl_keyfile: TlsFile = _tls_keyfile("ssl_certfile")
    ssl_key_password: SecretStr | None = Field(None, description="secret; password of ssl_keyfile; default none")
    ssl_check_hostname: bool = _tls_check_hostname("the broker's", "its host")

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, value: str) -> str:
        servers = [s.strip() for s in value.split(",")]
        for server in servers:
            host, _, port = server.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"must be comma-separated host:port, got {value!r}")
        return ",".join(servers)

    @field_validator("topic_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9._-]{0,200}", value):
            raise ValueError(f"may hold only letters, digits, '.', '_' and '-' (Kafka topic characters), got {value!r}")
        return value

    @model_validator(mode="after")
    def _security(self) -> KafkaSettings:
        """Every security option takes effect: a SASL protocol has all it needs, and nothing set is ignored."""
        protocol = self.security_protocol
        sasl = {"sasl_mechanism": self.sasl_mechanism, "sasl_username": self.sasl_username,
                "sasl_password": self.sasl_password}
        tls = {"ssl_cafile": self.ssl_cafile, "ssl_certfile": self.ssl_certfile, "ssl_keyfile": self.ssl_keyfile,
               "ssl_key_password": self.ssl_key_password}
        if protocol.startswith("SASL_"):
            missing = [name for name, value in sasl.items() if value is None]
            if missing:
                raise ValueError(f"security_protocol {protocol} needs sasl_mechanism, sasl_username and "
                                 f"sasl_password; missing: {', '.join(missing)}")
        elif unused := [name for name, value in sasl.items() if value is not None]:
            raise ValueError(f"{_are(unused)} set but security_protocol is {protocol}, which does not use SASL "
                             f"(use SASL_PLAINTEXT or SASL_SSL)")
        if not protocol.endswith("SSL"):
            if unused := [name for name, value in tls.items() if value is not None]:
                raise ValueError(f"{_are(unused)} set but security_protocol is {protocol}, which does not use TLS "
                                 f"(use SSL or SASL_SSL)")
        _check_client_certificate(("ssl_certfile", self.ssl_certfile), ("ssl_keyfile", self.ssl_keyfile))
        if self.ssl_key_password is not None and self.ssl_keyfile is None:
            raise ValueError("ssl_key_password is set but there is no ssl_keyfile")
        return self


class ClassWeights(_Group):
    """w_κ per service class (paper Table 1); dimensionless, positive."""

    dedicated: float = Field(1000.0, gt=0, description="default 1000")
    guaranteed: float = Field(1000.0, gt=0, description="default 1000")
    elastic: float = Field(100.0, gt=0, description="default 100")
    spot: float = Field(1.0, gt=0, description="default 1")
    preemptible: float = Field(0.1, gt=0, description="default 0.1")

    def to_dict(self) -> dict[ServiceClass, float]:
        return {cls: getattr(self, cls.value) for cls in ServiceClass}


class PolicySettings(_Group):
    """Constants of paper Eq. 1–3 and of the limit policy (dimensionless unless stated)."""

    alpha_slo: float = Field(2.0, ge=0, description="α_slo, SLO urgency weight; default 2.0")
    alpha_burst: float = Field(1.0, ge=0, description="α_burst, burst penalty; default 1.0")
    alpha_debt: float = Field(4.0, ge=0, description="α_debt, debt boost; default 4.0")
    debt_factor_floor: float = Field(0.05, gt=0, le=1, description="ε in max(ε, 1 + α_debt·d_e); default 0.05")
    gamma_debt: float = Field(0.7, ge=0, lt=1, description="γ_d, debt EWMA decay per tick; default 0.7")
    gamma_burst: float = Field(0.7, ge=0, lt=1, description="γ_b, burst EWMA decay per tick; default 0.7 (ours)")
    debt_credit: bool = Field(
        False, description="whether service above the baseline counts in Eq. 2 as negative debt (credit), lowering the "
        "priority twice over with Eq. 3's burst term; off, debt only measures under-service "
        "(docs/semantics.md#burst-and-debt); default false")
    class_weights: ClassWeights = Field(default_factory=ClassWeights, description="w_κ per class")
    mean_slo: Literal["frozen", "recompute"] = Field(
        "frozen", description="ℓ̄*: keep the first mean SLO of the pool's Bound entitlements (frozen, the paper's "
        "numbers) or recompute it on every membership change; default frozen")
    lend_idle_protected: bool = Field(
        False, description="lend the idle part of protected baselines to other classes (costs protected latency); default false"
    )
    burst_headroom: float = Field(0.25, ge=0, description="a bursting entitlement asks demand × (1 + this); default 0.25")
    fleet_enforcement: Literal["counts", "shares"] = Field("counts", description="how proxy replicas divide an entitlement's limits, for the agents and every proxy alike: counts (each follows the fleet's counts ten times a second; near-exact refusals, a bounded overshoot) or shares (each holds a share the agents set every tick; never above the limit, but many replicas refuse far more); default counts")

    def to_constants(self) -> PolicyConstants:
        return PolicyConstants(
            alpha_slo=self.alpha_slo, alpha_burst=self.alpha_burst, alpha_debt=self.alpha_debt,
            debt_factor_floor=self.debt_factor_floor, gamma_debt=self.gamma_debt, gamma_burst=self.gamma_burst,
            debt_credit=self.debt_credit, class_weights=self.class_weights.to_dict(),
        )

    reservation_quantile: float = Field(0.95, gt=0, le=1, description="a request reserves n_in + this quantile of its entitlement's recent completion tokens under a similar max_tokens (never above max_tokens); the part it uses beyond is charged as it streams or at completion (docs/reservations.md); 1 reserves max_tokens (off); dimensionless; default 0.95")
    reservation_window_completions: int = Field(256, ge=1, description="how many recent completions per entitlement and max_tokens class that quantile is taken over; default 256")
    reservation_min_completions: int = Field(20, ge=1, description="below this many completions for an entitlement and max_tokens class, reserve max_tokens; at most reservation_window_completions; default 20")

    queue_slo_fraction: float = Field(0.5, ge=0, le=1, description="a request refused for a slot (concurrency, KV, low priority) or its token budget waits at the proxy for the check to pass, up to this fraction of its entitlement's SLO (an entitlement's qos.queueTimeoutMs overrides it); 0 never waits (docs/queueing.md); dimensionless; default 0.5")
    queue_max_timeout_ms: int = Field(10_000, ge=0, description="the longest wait queue_slo_fraction gives, milliseconds; default 10000")
    queue_classes: list[ServiceClass] = Field(default_factory=lambda: list(ServiceClass), description="the service classes whose requests may wait (an entitlement's own qos.queueTimeoutMs wins); default all five")
    queue_max_waiters_per_entitlement: int = Field(64, ge=1, description="waiters one entitlement may have at one proxy; more are refused at once; default 64")

    def to_queue_config(self) -> QueueConfig:
        return QueueConfig(slo_fraction=self.queue_slo_fraction, max_timeout_ms=self.queue_max_timeout_ms,
                           classes=frozenset(self.queue_classes),
                           max_waiters_per_entitlement=self.queue_max_waiters_per_entitlement)

    def to_limit_config(self) -> LimitConfig:
        return LimitConfig(lend_idle_protected=self.lend_idle_protected, burst_headroom=self.burst_headroom)

    def to_reservation_config(self) -> ReservationConfig:
        return ReservationConfig(quantile=self.reservation_quantile, window_completions=self.reservation_window_completions,
                                 min_completions=self.reservation_min_completions)

    @model_validator(mode="after")
    def _converts(self) -> PolicySettings:
        self.to_constants()  # the core's own checks, in case they are stricter than the fields above
        self.to_limit_config()
        if self.reservation_min_completions > self.reservation_window_completions:
            raise ValueError(f"reservation_min_completions ({self.reservation_min_completions}) must be at most "
                             f"reservation_window_completions ({self.reservation_window_completions})")
        self.to_reservation_config()
        self.to_queue_config()
        return self


class StreamsSettings(_Group):
    app_id: str = Field("tokenpools-agents", min_length=1, description="Faust app id (consumer group); default tokenpools-agents")
    store_url: str = Field("memory://", min_length=1, description="Faust table store; default memory:// (changelog-backed)")
    tick_s: float = Field(5.0, gt=0, description="control tick and usage window, seconds; default 5")
    grace_s: float = Field(2.0, ge=0, description="how late an event may arrive for its window, seconds; default 2")
    metrics_staleness_s: float = Field(15.0, gt=0, description="backend metrics older than this are ignored, seconds; default 15")
    proxy_heartbeat_ttl_s: float = Field(30.0, gt=0, description="a proxy silent this long gets no limit share, seconds; default 30")
    counts_interval_s: float = Field(0.1, gt=0, description="how often the fleet's counts go to the proxies, seconds; default 0.1")
    demand_window_s: float = Field(1.0, ge=0, description="a proxy with a request this recent counts as active for the entitlement, seconds; default 1")
    session_timeout_s: float = Field(
        8.0, ge=1, description="how long a worker may be silent before the group gives its partitions to the others "
        "(Kafka's session timeout, at least the broker's group.min.session.timeout.ms, 6 s by default): a killed "
        "worker's pools wait this plus a rebalance, so keep it under 2 ticks; default 8")
    standby_replicas: int = Field(1, ge=0, description="workers that keep a warm copy of each partition's pool states from the changelog, besides the one that ticks them (Faust's table_standby_replicas; more than workers - 1 has no effect); default 1")


class ProxySettings(_Group):
    proxy_id: str | None = Field(None, min_length=1, description="this replica's id; default none: <hostname>-<pid> at start-up")
    host: str = Field("127.0.0.1", min_length=1, description="listen address; default 127.0.0.1")
    port: int = Field(8080, ge=0, le=65535, description="listen port (0 picks a free one); default 8080")
    limits_ttl_s: float = Field(30.0, gt=0, description="fall back to baseline limits after this long without updates, seconds; default 30")
    max_body_bytes: int = Field(1_048_576, ge=1, description="largest request body, bytes; default 1 MiB")
    max_head_bytes: int = Field(65_536, ge=1024, description="largest request line and headers, bytes; a larger head gets 431 and the connection closes; default 64 KiB")
    header_timeout_s: float = Field(10.0, gt=0, description="a request head must arrive within this long of its first byte (a new connection's: of its accept), else 408 and the connection closes (slowloris), seconds; default 10")
    body_timeout_s: float = Field(30.0, gt=0, description="a request body must arrive whole within this long of the proxy asking for it, else 408 and the connection closes; 30 s lets a full 1 MiB body come at 35 KB/s, seconds; default 30")
    write_timeout_s: float = Field(30.0, gt=0, description="a client that takes none of a response's bytes (its socket buffer stays full) for this long is disconnected, seconds; default 30")
    keepalive_timeout_s: float = Field(75.0, gt=0, description="an idle keep-alive connection closes after this long without a request, seconds; default 75")
    max_connections: int = Field(10_000, ge=1, description="client connections served at once; one more is answered 503 and closed (each costs a file descriptor and a few KiB: keep under the process's `ulimit -n`); default 10000")
    max_requests_per_connection: int = Field(1000, ge=1, description="requests one keep-alive connection carries; the last response says Connection: close, so clients reconnect and spread over replicas (one reconnect per 1000 requests); default 1000")
    retry_after_s: int = Field(1, ge=1, description="the longest Retry-After a slot refusal (concurrency, KV, "
                               "low priority) estimates, and its wait before any service time is learned, whole "
                               "seconds; default 1 (docs/semantics.md#retry-after)")
    event_queue_size: int = Field(10_000, ge=1, description="events buffered in memory before spooling to disk; default 10000")
    spool_dir: Path = Field(Path(".run/spool"), description="where events wait while Kafka is unreachable; default .run/spool")
    event_batch_size: int = Field(500, ge=1, description="records per producer/spool batch; default 500")
    heartbeat_interval_s: float = Field(2.0, gt=0, description="how often the proxy announces itself, seconds; default 2")
    watchdog_interval_s: float = Field(1.0, gt=0, description="how often the limits TTL is checked, seconds; default 1")
    upstream_connect_timeout_s: float = Field(5.0, gt=0, description="backend connect timeout, seconds; default 5")
    upstream_read_timeout_s: float = Field(600.0, gt=0, description="longest gap between two backend reads, seconds; default 600")
    upstream_api_key_env: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="the environment variable holding the key sent to every backend as `Authorization: Bearer` "
        "(a vLLM started with --api-key); read at start-up, which fails if it is unset or empty; default none: no "
        "Authorization upstream (the clients' keys are never forwarded)")
    upstream_ssl_cafile: TlsFile = _tls_cafile("the https:// backends")
    upstream_ssl_certfile: TlsFile = _tls_certfile("https:// backends", "upstream_ssl_keyfile")
    upstream_ssl_keyfile: TlsFile = _tls_keyfile("upstream_ssl_certfile")
    upstream_ssl_check_hostname: bool = _tls_check_hostname("an https:// backend's", "the endpoint's host")
    producer_linger_ms: int = Field(5, ge=0, description="Kafka producer linger, milliseconds; default 5")
    producer_request_timeout_ms: int = Field(30_000, ge=1, description="Kafka producer request timeout, milliseconds, and how long a batch may wait for a partition leader before it fails and its events are spooled: every event is on its topic exactly once through a broker outage shorter than this; past it, a batch whose delivery is unknown may be sent twice; default 30000")
    shutdown_flush_s: float = Field(5.0, ge=0, description="how long shutdown waits to flush events, seconds; default 5")
    kafka_enabled: bool = Field(True, description="produce events to Kafka (false: spool only, for tests); default true")
    watermark_interval_s: float = Field(0.1, gt=0, description="an idle (event topic, pool) gets a watermark-only record this often, seconds; default 0.1")
    config_poll_interval_s: float = Field(1.0, gt=0, description="without Kafka, how often the proxy checks its --config file for an edit (size, mtime, then content hash) and applies it live, seconds; default 1")
    counts_ttl_s: float = Field(2.0, gt=0, description="fleet counts older than this are not followed: the limits are split equally among the pool's proxies until fresh ones come, seconds; default 2")
    max_waiters: int = Field(1024, ge=0, description="requests this proxy may hold waiting for admission over all its pools (docs/queueing.md); more are refused at once; 0 turns waiting off; default 1024")
    retry_window_ms: int = Field(60_000, ge=1, description="how long the proxy remembers a request to link a client's retry to it (docs/tuning.md#how-the-proxy-links-attempts): an attempt arriving later than this after the last one of its request is taken for a new request, milliseconds; default 60000")
    retry_max_entries: int = Field(100_000, ge=0, description="requests the retry linker remembers at most (about 200 bytes each), the oldest forgotten first; 0 remembers none (an x-stainless-retry-count still numbers attempts, nothing is linked to its first); default 100000")
    growth_fraction: float = Field(2.0, ge=1, description="how much of an entitlement's free fleet headroom one proxy may take between two counts records, as a multiple of its equal share among the active proxies; default 2")
    admin_key_sha256: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$", description="lowercase hex SHA-256 of the operators' key for "
        "GET /v1/tokenpools/admin/limits (every entitlement of this proxy); default none: that view is off")
    metric_names: Literal["tokenpools", "gen_ai", "both"] = Field(
        "tokenpools", description="the names /metrics gives the per-request series (tokens, time to first token, "
        "durations): tokenpools (tokenpools_proxy_*), gen_ai (the OpenTelemetry GenAI semantic conventions': "
        "gen_ai_client_token_usage, gen_ai_server_request_duration_seconds, ... instead) or both; default tokenpools")

    @model_validator(mode="after")
    def _client_certificate(self) -> ProxySettings:
        _check_client_certificate(("upstream_ssl_certfile", self.upstream_ssl_certfile),
                                  ("upstream_ssl_keyfile", self.upstream_ssl_keyfile))
        return self


class BudgetsSettings(_Group):
    """Long-window budgets and the usage ledger (docs/budgets.md)."""

    retry_after_max_s: int = Field(3600, ge=1, description="the longest Retry-After a budget_exhausted refusal gives (the "
                                   "reset may be weeks away; clients should not sleep that long on one answer), seconds; "
                                   "default 3600")
    billing_labels: list[str] = Field(default_factory=list, description="the entitlement metadata.labels copied into "
                                      "every usage record, for chargeback; default none")
    usage_retention_days: int = Field(3, ge=2, description="UTC days of usage the agents keep per entitlement to fold "
                                      "late completions into (today and the days before it); an older completion is "
                                      "counted in no day and dead-lettered as late. Each kept day is written with the "
                                      "entitlement's ledger at every batch that changes it (~70 bytes a day and model), "
                                      "so this trades lateness for changelog bytes; days; default 3")
    publish_interval_s: float = Field(1.0, gt=0, description="how often the agents publish the changed budget accounts "
                                      "and usage days, seconds; the proxies' overshoot is bounded by what the fleet "
                                      "admits within about this long; default 1")
    on_stale: OnStale = Field(OnStale.SPEND, description="what a proxy does with a budget's requests while its view of "
                              "the budget is stale (its own spending waited stale_after_s for a record): spend (admit "
                              "on its own view) or refuse (503 budget_unavailable); a budget's onStale overrides it; "
                              "default spend")
    stale_after_s: float = Field(30.0, gt=0, description="a proxy's view of a budget is stale once its own spending has "
                                 "waited this long for the agents' record of the budget (several publish_interval_s: "
                                 "a record follows a completion within about one), seconds; default 30")

    @model_validator(mode="after")
    def _stale_after_publishing(self) -> BudgetsSettings:
        if self.stale_after_s <= self.publish_interval_s:
            raise ValueError(f"stale_after_s ({self.stale_after_s:g}) must be greater than publish_interval_s "
                             f"({self.publish_interval_s:g}): a view is answered about once per publication, so it "
                             f"would be stale between any two")
        return self


class ScalingSettings(_Group):
    target_utilization: float = Field(0.9, gt=0, le=1, description="scale so demand is this fraction of capacity; default 0.9")
    include_spot: bool = Field(True, description="count observed spot/preemptible demand; default true")
    scale_down_stabilization_s: float = Field(60.0, ge=0, description="scale-down uses the highest wish in this window, seconds; default 60")
    cooldown_s: float = Field(15.0, ge=0, description="no change sooner than this after the last one, seconds; default 15")

    def to_config(self) -> ScalingConfig:
        return ScalingConfig(
            target_utilization=self.target_utilization, include_spot=self.include_spot,
            scale_down_stabilization_s=self.scale_down_stabilization_s, cooldown_s=self.cooldown_s,
        )


class PrometheusSettings(_Group):
    url: str = Field("http://127.0.0.1:9090", description="Prometheus base URL; default http://127.0.0.1:9090")
    bearer_token: SecretStr | None = Field(None, description="secret; default none")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return check_http_url(value)


class KubernetesSettings(_Group):
    namespace: str = Field("default", min_length=1, description="namespace of pools, entitlements and backends; default default")
    kubeconfig: Path | None = Field(None, description="kubeconfig file; default none: in-cluster, then $KUBECONFIG/~/.kube/config")


DEFAULT_METRICS_SELECTOR = 'job="{pool}"'
DEFAULT_PROXY_METRICS_SELECTOR = 'pool="{pool}"'


class ControllersSettings(_Group):
    """The controller's loops (``tokenpools controller``); its command-line flags of the same names win."""

    metrics_interval_s: float = Field(5.0, gt=0, description="seconds between backend metrics samples; default 5")
    rate_window_s: float = Field(30.0, gt=0, description="PromQL rate()/quantile window, seconds, >= 4 scrape intervals; default 30")
    metrics_selector: str = Field(DEFAULT_METRICS_SELECTOR, min_length=1, description="label matchers of a pool's backends; {pool}, {model}, {namespace} are filled in; default job=\"{pool}\"")
    metrics_stale_after_s: float = Field(15.0, gt=0, description="vLLM's series of a pool are stale when the oldest of its targets was last scraped longer ago than this, seconds; more than one scrape interval (3 of the deployed 5 s); default 15")
    proxy_metrics_selector: str = Field(DEFAULT_PROXY_METRICS_SELECTOR, min_length=1, description="label matchers of the proxies' series of a pool (tokenpools_proxy_*), read when vLLM's are stale; {pool}, {model}, {namespace} are filled in; default pool=\"{pool}\"")
    resync_s: float = Field(30.0, gt=0, description="re-evaluate entitlements and status at least this often, seconds; default 30")
    scale_command_max_age_s: float = Field(30.0, gt=0, description="ignore scale commands older than this, seconds; default 30")
    leader_election: bool = Field(True, description="with Kubernetes (and without --dry-run), act only while holding the coordination.k8s.io Lease lease_namespace/lease_name, so that several replicas may run and one writes; false: act at once (run one replica only); default true")
    lease_name: str = Field("tokenpools-controller", min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", description="name of the Lease the replicas compete for; default tokenpools-controller")
    lease_namespace: str | None = Field(None, min_length=1, description="namespace of the Lease; default none: the controller's namespace (--namespace, else kubernetes.namespace)")
    lease_identity: str | None = Field(None, min_length=1, max_length=253, description="this replica's holderIdentity in the Lease (and reportingInstance of its Events), unique per replica: the pod's name in a cluster; default none: <hostname>-<pid> at start-up")
    lease_duration_s: int = Field(15, ge=1, description="leaseDurationSeconds: a standby takes the Lease over once its holder has not renewed it for this long (timed on the standby's own clock), whole seconds; default 15")
    lease_renew_deadline_s: float = Field(10.0, gt=0, description="a leader that has not renewed the Lease for this long stops acting (cancels its loops), seconds; below lease_duration_s, whose difference is the safety margin for clock drift and stopping; default 10")
    lease_retry_period_s: float = Field(2.0, gt=0, description="how often the leader renews and a standby looks at the Lease, seconds; below lease_renew_deadline_s; default 2")
    http_host: str = Field("127.0.0.1", min_length=1, description="listen address of /healthz (leader or standby) and /metrics; default 127.0.0.1")
    http_port: int = Field(-1, ge=-1, le=65535, description="listen port of /healthz and /metrics, 0 for a free one, -1 for none; default -1")

    @model_validator(mode="after")
    def _lease_timing(self) -> ControllersSettings:
        if not self.lease_retry_period_s < self.lease_renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                f"lease_retry_period_s ({self.lease_retry_period_s:g}) < lease_renew_deadline_s "
                f"({self.lease_renew_deadline_s:g}) < lease_duration_s ({self.lease_duration_s}) is required: a leader "
                "renews several times before its deadline, and stops acting before a standby may take over")
        return self


class Settings(BaseSettings):
    """All settings of all processes; each process reads the groups it needs."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_DELIMITER, frozen=True, extra="forbid",
        case_sensitive=False, validate_default=True,
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings)
    streams: StreamsSettings = Field(default_factory=StreamsSettings)
    proxy: ProxySettings = Field(default_factory=ProxySettings)
    budgets: BudgetsSettings = Field(default_factory=BudgetsSettings)
    scaling: ScalingSettings = Field(default_factory=ScalingSettings)
    prometheus: PrometheusSettings = Field(default_factory=PrometheusSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    controllers: ControllersSettings = Field(default_factory=ControllersSettings)


def groups() -> dict[str, type[_Group]]:
    """Group name → model, in declaration order."""
    return {name: field.annotation for name, field in Settings.model_fields.items()}  # type: ignore[misc]
