"""Builders shared by the admission tests: specs, limits and a controller in a few words."""

from __future__ import annotations

from tokenpools.core.admission import AdmissionController, Decision, EntitlementLimits
from tokenpools.core.classes import ServiceClass
from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.core.spec import EntitlementSpec
from tokenpools_dev.builders import entitlement_spec

O = AdmissionOutcome


def spec(name: str, service_class: ServiceClass = ServiceClass.ELASTIC, **kwargs) -> EntitlementSpec:
    if service_class.has_baseline:
        return entitlement_spec(name, service_class, 4.0, 100.0, 1e9, **kwargs)
    return entitlement_spec(name, service_class, **kwargs)


def limits(concurrency: int = 4, tokens_per_s: float = 100.0, kv_bytes: float = 1e12,
           priority: float = 50.0) -> EntitlementLimits:
    return EntitlementLimits(concurrency, tokens_per_s, kv_bytes, priority)


def controller(*entries: tuple[EntitlementSpec, EntitlementLimits], pool_concurrency: int = 16,
               kv_bytes_per_token: int = 1, default_max_tokens: int = 256, window_s: float = 10.0,
               now_s: float = 0.0) -> AdmissionController:
    ctl = AdmissionController(pool_concurrency, kv_bytes_per_token, default_max_tokens, window_s)
    for s, lim in entries:
        ctl.upsert_entitlement(s, lim, now_s)
    return ctl


def admit(ctl: AdmissionController, name: str | None, rid: str = "r", prompt: int = 50, max_tokens: int | None = 50,
          now_s: float = 0.0) -> Decision:
    return ctl.admit(name, rid, prompt, max_tokens, now_s)
