"""The documents users write (YAML) and the Kubernetes custom resources share this schema.

``apiVersion: tokenpools.io/v1alpha1``; kinds ``TokenPool``, ``TokenEntitlement`` and ``TokenPoolsSettings``.
Field names are camelCase on the outside (as in the CRDs) and snake_case attributes in Python (aliases).
Every model is frozen, strict about types (a quoted ``"5"`` is not a number; ``true`` is not a count) and
forbids unknown fields, so a typo fails at load instead of being ignored.

The models check shape, types and ranges. Rules that span fields (``kvGeometry`` *or* ``kvBytesPerToken``, what a
service class requires of ``resources``, …) are in each spec's ``check()``, which returns every issue with its
exact path; rules that span documents (pool references, unique names and keys) are in ``tokenpools.config.loader``.
Always load through the loader: it runs all three.

Choices the paper leaves open (docs/paper.md#choices-the-paper-leaves-open), made here:
- a pool states its per-replica capacity (``perReplica``) and its KV geometry (or c directly);
- ``tokensPerSecond`` counts prompt + completion tokens per second, the unit of the cost model n_in + n_out
  (admission reserves n_in + max_tokens from a bucket refilled at this rate);
- entitlements list their API keys as SHA-256 digests or as references to Kubernetes Secrets, never in clear;
- ``burstCeiling`` bounds how far a bursting class may go above its baseline (default: the pool);
- ``expiresAt`` (RFC 3339) gives the Expired state a meaning.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from tokenpools.config.keys import is_sha256_hex
from tokenpools.config.problems import describe
from tokenpools.core.budgets import BudgetScope, OnStale, Period, zone
from tokenpools.core.capacity import kv_bytes_per_token
from tokenpools.core.classes import EntitlementState, ServiceClass
from tokenpools.core.enforcement import Enforcement

API_VERSION = "tokenpools.io/v1alpha1"
GIB = 2**30
MAX_SHARDS = 1024  # a pool's shards at most (each is a key and, at best, a partition of its own)

Issue = tuple[str, str]
"""(path inside the document, message) — e.g. ("spec.scaling.maxReplicas", "must be >= minReplicas (2), got 1")."""

_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def _dns_name(value: str) -> str:
    if len(value) > 253 or not _DNS_NAME.fullmatch(value):
        raise ValueError(f"must be a lowercase DNS name (a-z, 0-9, '-', '.'; at most 253 characters), got {value!r}")
    return value


def _sha256(value: str) -> str:
    # never echo the value: a clear key pasted here by mistake must not end up in a log
    if not is_sha256_hex(value):
        raise ValueError(
            f"must be the SHA-256 of the key as 64 hexadecimal characters (`tokenpools hash-key` prints it), "
            f"got {len(value)} characters"
        )
    return value.lower()


def _secret_key(value: str) -> str:
    if not _SECRET_KEY.fullmatch(value):
        raise ValueError(f"must be a Secret data key (letters, digits, '-', '_', '.'), got {value!r}")
    return value


def check_http_url(value: str) -> str:
    """An http(s) base URL with a host and nothing after the path; returned without a trailing slash."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 — raises ValueError on a malformed port
    except ValueError as exc:
        raise ValueError(f"must be an http(s) URL such as http://127.0.0.1:8000, got {value!r} ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"must be an http(s) URL such as http://127.0.0.1:8000, got {value!r}")
    return value.rstrip("/")


DnsName = Annotated[str, AfterValidator(_dns_name)]
HttpUrl = Annotated[str, AfterValidator(check_http_url)]


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=True, allow_inf_nan=False, alias_generator=to_camel, serialize_by_alias=True,
    )


# ---------------------------------------------------------------- shared parts


class ObjectMeta(_Model):
    """Kubernetes object metadata. Server-populated fields are accepted (so live objects load) and ignored."""

    ADVERTISED_FIELDS: ClassVar[tuple[str, ...]] = ("name", "namespace", "generation", "labels", "annotations")
    name: DnsName
    namespace: DnsName | None = None
    generation: int | None = Field(None, ge=0)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    uid: Any = None
    resource_version: Any = None
    creation_timestamp: Any = None
    deletion_timestamp: Any = None
    deletion_grace_period_seconds: Any = None
    generate_name: Any = None
    finalizers: Any = None
    owner_references: Any = None
    managed_fields: Any = None
    self_link: Any = None


class Resources(_Model):
    """An amount in the three dimensions: token throughput, KV cache, concurrent sequences."""

    tokens_per_second: float = Field(ge=0, description="prompt + completion tokens per second")
    kv_cache_gib: float = Field(ge=0, alias="kvCacheGiB", description="KV cache, GiB (2**30 bytes)")
    concurrency: int = Field(ge=0, description="concurrent sequences")

    def is_zero(self) -> bool:
        return self.tokens_per_second == 0 and self.kv_cache_gib == 0 and self.concurrency == 0


# ---------------------------------------------------------------- TokenPool


class BackendRef(_Model):
    """The workload that serves the pool and whose ``/scale`` subresource the scaler patches."""

    api_version: str = Field("apps/v1", min_length=1)
    kind: str = Field("Deployment", min_length=1)
    name: DnsName
    namespace: DnsName | None = None


class Scaling(_Model):
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    replicas: int | None = Field(None, ge=0, description="current/initial replicas; default minReplicas")

    @property
    def initial_replicas(self) -> int:
        return self.min_replicas if self.replicas is None else self.replicas


class PerReplica(_Model):
    """The capacity of one replica (Λ_p = replicas × this)."""

    tokens_per_second: float = Field(gt=0, description="prompt + completion tokens per second")
    kv_cache_gib: float = Field(gt=0, alias="kvCacheGiB", description="KV cache, GiB")
    concurrency: int = Field(ge=1, description="concurrent sequences (vLLM max-num-seqs)")


class KvGeometry(_Model):
    """The model's attention geometry: c = 2·layers·kvHeads·headDim·bytesPerElement bytes per token."""

    layers: int = Field(ge=1)
    kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    bytes_per_element: float = Field(gt=0, description="2 for bf16/fp16, 1 for fp8")


class PoolDefaults(_Model):
    max_tokens: int = Field(256, ge=1, description="applied when a request has no max_tokens")


class TokenPoolSpec(_Model):
    model: str = Field(min_length=1)
    backend_ref: BackendRef
    scaling: Scaling = Field(default_factory=Scaling)
    per_replica: PerReplica
    kv_geometry: KvGeometry | None = None
    kv_bytes_per_token: int | None = Field(None, ge=1)
    defaults: PoolDefaults = Field(default_factory=PoolDefaults)
    token_bucket_window_seconds: float = Field(10.0, gt=0, description="bucket depth = limit × this window")
    shards: int = Field(1, ge=1, le=MAX_SHARDS, description="partitions the pool's events spread over, by "
                        "entitlement: more than 1 lets several agent workers fold a hot pool (docs/scaling.md); at "
                        "most kafka.topic_partitions")
    endpoints: list[HttpUrl] = Field(default_factory=list, description="backend base URLs outside Kubernetes")
    engine_priority: bool = Field(False, description="the backends run vLLM with --scheduling-policy priority: the "
                                  "proxy writes each request's `priority` from its class and w_e; false: a "
                                  "`priority` in a request is removed before it reaches the backend")
    enforcement: Enforcement = Field(Enforcement.ENFORCE, strict=False, description="enforce: limits refuse; "
                                     "shadow: limits are evaluated and counted as would_refuse, and the request is "
                                     "admitted (docs/shadow.md); an entitlement's own enforcement overrides it")

    def kv_bytes_per_token_value(self) -> int:
        """c in bytes per token (call after ``check()`` found no issue)."""
        if self.kv_bytes_per_token is not None:
            return self.kv_bytes_per_token
        g = self.kv_geometry
        if g is None:
            raise ValueError("neither kvGeometry nor kvBytesPerToken is set")
        return kv_bytes_per_token(g.layers, g.kv_heads, g.head_dim, g.bytes_per_element)

    def check(self) -> list[Issue]:
        issues: list[Issue] = []
        given = [n for n, v in (("kvGeometry", self.kv_geometry), ("kvBytesPerToken", self.kv_bytes_per_token)) if v is not None]
        if len(given) != 1:
            issues.append(("spec", f"give exactly one of kvGeometry or kvBytesPerToken, got {' and '.join(given) or 'neither'}"))
        s = self.scaling
        if s.max_replicas < s.min_replicas:
            issues.append(("spec.scaling.maxReplicas", f"must be >= minReplicas ({s.min_replicas}), got {s.max_replicas}"))
        elif not s.min_replicas <= s.initial_replicas <= s.max_replicas:
            issues.append(("spec.scaling.replicas",
                           f"must be within minReplicas..maxReplicas [{s.min_replicas}, {s.max_replicas}], got {s.replicas}"))
        seen: dict[str, int] = {}
        for i, url in enumerate(self.endpoints):
            if url in seen:
                issues.append((f"spec.endpoints[{i}]", f"duplicate of endpoints[{seen[url]}] ({url})"))
            seen.setdefault(url, i)
        return issues


class TokenPoolDocument(_Model):
    api_version: Literal["tokenpools.io/v1alpha1"]
    kind: Literal["TokenPool"]
    metadata: ObjectMeta
    spec: TokenPoolSpec
    status: dict[str, Any] | None = None

    def check(self) -> list[Issue]:
        return self.spec.check()


# ---------------------------------------------------------------- TokenEntitlement


class PoolRef(_Model):
    name: DnsName


class Qos(_Model):
    service_class: ServiceClass = Field(strict=False)
    slo_target_ms: float = Field(gt=0, description="latency target ℓ*_e, milliseconds")
    queue_timeout_ms: int | None = Field(None, ge=0, le=600_000, description="how long a request refused for a slot "
                                         "or its token budget may wait at the proxy for the check to pass, "
                                         "milliseconds; 0 never waits; default the policy's (a fraction of the SLO)")


class SecretKeyRef(_Model):
    """A key of a Kubernetes Secret (in the entitlement's namespace) whose value is the API key in clear."""

    name: DnsName
    key: Annotated[str, AfterValidator(_secret_key)]


class ApiKeyRef(_Model):
    """Exactly one of ``sha256`` (hex digest of the key) or ``secretRef`` (resolved by the controllers)."""

    sha256: Annotated[str, AfterValidator(_sha256)] | None = None
    secret_ref: SecretKeyRef | None = None


class BudgetWeights(_Model):
    """Units per token of each class; all 1 (the default): the budget counts tokens."""

    prompt: float = Field(1.0, ge=0, description="units per uncached prompt token")
    cached_prompt: float = Field(1.0, ge=0, description="units per prompt token served from the prefix cache")
    completion: float = Field(1.0, ge=0, description="units per completion token")


class BudgetRollover(_Model):
    max_units: float = Field(alias="max", ge=0, description="unused units carried into the next period, at most")


AlertThreshold = Annotated[float, Field(gt=0, le=10)]


class Budget(_Model):
    """A long-window budget of an entitlement (docs/budgets.md#budgets-in-the-spec): ``amount`` units per calendar
    ``period`` in ``timeZone``. Rules across fields (a known zone, thresholds ascending, no rollover on ``never``
    nor on a tenant budget, a weight that is not 0) are in ``check()``; unique names in the entitlement's; a tenant
    budget declared alike by every entitlement of the tenant in the loader's (docs/budgets.md#tenant-budgets)."""

    name: DnsName
    period: Period = Field(strict=False, description="day, week (from Monday), month or never (no reset)")
    time_zone: str = Field("UTC", min_length=1, description="IANA zone where the period's midnight is")
    amount: float = Field(gt=0, description="units per period")
    scope: BudgetScope = Field(BudgetScope.ENTITLEMENT, strict=False, description="entitlement (its own) or tenant "
                               "(shared by every entitlement of the tenant declaring it)")
    weights: BudgetWeights = Field(default_factory=BudgetWeights)
    rollover: BudgetRollover | None = Field(None, description="none: nothing carries over")
    alert_thresholds: list[AlertThreshold] = Field(default_factory=list, description="fractions of the period's "
                                                   "allowance, ascending; one alert each per period")
    on_stale: OnStale | None = Field(None, strict=False, description="spend or refuse (503 budget_unavailable) while a "
                                     "proxy's view of the budget is stale; unset: the settings' budgets.on_stale")

    def check(self, path: str) -> list[Issue]:
        issues: list[Issue] = []
        try:
            zone(self.time_zone)
        except ValueError as exc:
            issues.append((f"{path}.timeZone", str(exc)))
        w = self.weights
        if w.prompt == 0 and w.cached_prompt == 0 and w.completion == 0:
            issues.append((f"{path}.weights", "at least one weight must be > 0 (with all 0 nothing is ever spent)"))
        if self.rollover is not None and self.period is Period.NEVER:
            issues.append((f"{path}.rollover", "a `never` budget has no next period to roll over into: remove rollover"))
        elif self.rollover is not None and self.scope is BudgetScope.TENANT:
            issues.append((f"{path}.rollover", "a tenant budget has no rollover (its carry would need the tenant's "
                           "total of the previous period): remove rollover"))
        for i in range(1, len(self.alert_thresholds)):
            before, value = self.alert_thresholds[i - 1], self.alert_thresholds[i]
            if value <= before:
                issues.append((f"{path}.alertThresholds[{i}]", f"must be > alertThresholds[{i - 1}] ({describe(before)}), "
                               f"got {describe(value)} (thresholds are distinct and ascending)"))
        return issues


class TokenEntitlementSpec(_Model):
    tenant_id: str = Field(min_length=1)
    pool_ref: PoolRef
    qos: Qos
    resources: Resources | None = Field(None, description="baseline (λ_e, χ_e, r_e); none for spot/preemptible")
    burst_ceiling: Resources | None = Field(None, description="the most a bursting class may use; default the pool")
    expires_at: AwareDatetime | None = Field(None, strict=False, description="RFC 3339 with an offset")
    api_keys: list[ApiKeyRef] = Field(default_factory=list)
    state: EntitlementState | None = Field(None, strict=False, description="override (tests); default computed")
    enforcement: Enforcement | None = Field(None, strict=False, description="enforce or shadow (docs/shadow.md); "
                                            "default the pool's")
    budgets: list[Budget] = Field(default_factory=list, description="long-window budgets (docs/budgets.md)")

    def check(self) -> list[Issue]:
        issues: list[Issue] = []
        cls = self.qos.service_class
        a_cls = f"{'an' if cls.value[0] in 'aeiou' else 'a'} {cls}"
        base = self.resources
        dims = (("tokensPerSecond", "tokens_per_second"), ("kvCacheGiB", "kv_cache_gib"), ("concurrency", "concurrency"))
        if cls.has_baseline:
            if base is None:
                issues.append(("spec.resources", f"required for {a_cls} entitlement (its baseline: tokensPerSecond, kvCacheGiB, concurrency)"))
            else:
                for alias, attr in dims:
                    if getattr(base, attr) <= 0:
                        issues.append((f"spec.resources.{alias}", f"must be > 0 for {a_cls} entitlement, got {describe(getattr(base, attr))}"))
        elif base is not None and not base.is_zero():
            issues.append(("spec.resources", f"{a_cls} entitlement has no baseline: remove resources or set every field to 0"))
        ceiling = self.burst_ceiling
        if ceiling is not None:
            if not cls.may_burst:
                issues.append(("spec.burstCeiling", f"{a_cls} entitlement never bursts above its baseline: remove burstCeiling"))
            else:
                for alias, attr in dims:
                    value = getattr(ceiling, attr)
                    floor = getattr(base, attr) if cls.has_baseline and base is not None else 0
                    if value <= 0:
                        issues.append((f"spec.burstCeiling.{alias}", f"must be > 0, got {describe(value)}"))
                    elif value < floor:
                        issues.append((f"spec.burstCeiling.{alias}",
                                       f"must be >= the baseline resources.{alias} ({describe(floor)}), got {describe(value)}"))
        for i, ref in enumerate(self.api_keys):
            if (ref.sha256 is None) == (ref.secret_ref is None):
                issues.append((f"spec.apiKeys[{i}]", "give exactly one of sha256 or secretRef"))
        first: dict[str, int] = {}
        for i, budget in enumerate(self.budgets):
            issues += budget.check(f"spec.budgets[{i}]")
            if budget.name in first:
                issues.append((f"spec.budgets[{i}].name", f"duplicate of budgets[{first[budget.name]}] ({budget.name}): "
                               "budget names are unique within an entitlement"))
            first.setdefault(budget.name, i)
        return issues


class TokenEntitlementDocument(_Model):
    api_version: Literal["tokenpools.io/v1alpha1"]
    kind: Literal["TokenEntitlement"]
    metadata: ObjectMeta
    spec: TokenEntitlementSpec
    status: dict[str, Any] | None = None

    def check(self) -> list[Issue]:
        return self.spec.check()


# ---------------------------------------------------------------- TokenPoolsSettings


class TokenPoolsSettingsDocument(_Model):
    """Settings overrides carried in the config file: ``spec`` has the structure of ``Settings``
    (snake_case groups and fields, e.g. ``policy: {alpha_debt: 2.0}``); validated by the loader."""

    api_version: Literal["tokenpools.io/v1alpha1"]
    kind: Literal["TokenPoolsSettings"]
    metadata: ObjectMeta | None = None
    spec: dict[str, Any] = Field(default_factory=dict)

    def check(self) -> list[Issue]:
        return []


Document = TokenPoolDocument | TokenEntitlementDocument | TokenPoolsSettingsDocument

KINDS: dict[str, type[TokenPoolDocument] | type[TokenEntitlementDocument] | type[TokenPoolsSettingsDocument]] = {
    "TokenPool": TokenPoolDocument,
    "TokenEntitlement": TokenEntitlementDocument,
    "TokenPoolsSettings": TokenPoolsSettingsDocument,
}
API_VERSIONS: tuple[str, ...] = (API_VERSION,)


def expires_at_s(value: datetime | None) -> float | None:
    """Seconds since the epoch (the core's time base) for an aware datetime."""
    return None if value is None else value.timestamp()
