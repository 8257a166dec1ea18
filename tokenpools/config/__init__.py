"""Configuration: the documents users write, the process settings, and their conversion into the core's specs.

Public API (everything else in this package is an implementation detail):

- ``load_config(path, specs) -> LoadedConfig``, ``load_config_text(text, source, specs)``, ``load_config_documents(objs, source)``
- ``SpecsSource`` (the file alone, or the specs topic after it) and ``require_pools``: whether a file may hold no pool
- ``LoadedConfig``: pools, entitlements (core specs), documents, API key digests, endpoints, backend refs, settings
- ``Settings`` (+ its groups), ``load_settings(file_values, overrides)``, ``apply_overrides(settings, items)``
- ``hash_api_key(key)``, ``key_matches(key, sha256_hex)``
- ``ConfigError`` / ``ConfigProblem`` (defined in ``tokenpools.errors`` so callers need not import pydantic)
"""

from tokenpools.config.documents import (
    API_VERSION,
    KINDS,
    ApiKeyRef,
    BackendRef,
    Document,
    SecretKeyRef,
    TokenEntitlementDocument,
    TokenPoolDocument,
    TokenPoolsSettingsDocument,
)
from tokenpools.config.keys import hash_api_key, key_matches
from tokenpools.config.loader import (
    LoadedConfig,
    SpecsSource,
    load_config,
    load_config_documents,
    load_config_text,
    require_pools,
)
from tokenpools.config.settings import (
    ClassWeights,
    ControllersSettings,
    KafkaSettings,
    KubernetesSettings,
    PolicySettings,
    PrometheusSettings,
    BudgetsSettings,
    ProxySettings,
    ScalingSettings,
    Settings,
    StreamsSettings,
)
from tokenpools.config.sources import apply_overrides, load_settings
from tokenpools.errors import ConfigError, ConfigProblem

__all__ = [
    "API_VERSION",
    "KINDS",
    "ApiKeyRef",
    "BackendRef",
    "ClassWeights",
    "ConfigError",
    "ConfigProblem",
    "ControllersSettings",
    "Document",
    "KafkaSettings",
    "KubernetesSettings",
    "LoadedConfig",
    "PolicySettings",
    "PrometheusSettings",
    "BudgetsSettings",
    "ProxySettings",
    "ScalingSettings",
    "SecretKeyRef",
    "Settings",
    "SpecsSource",
    "StreamsSettings",
    "TokenEntitlementDocument",
    "TokenPoolDocument",
    "TokenPoolsSettingsDocument",
    "apply_overrides",
    "hash_api_key",
    "key_matches",
    "load_config",
    "load_config_documents",
    "load_config_text",
    "load_settings",
    "require_pools",
]
