"""The closed set of admission outcomes. One value picks the HTTP status and labels the metric."""

from __future__ import annotations

from enum import StrEnum


class AdmissionOutcome(StrEnum):
    ADMITTED = "admitted"
    REFUSED_UNKNOWN_KEY = "unknown_key"
    REFUSED_NOT_BOUND = "not_bound"
    REFUSED_CONCURRENCY = "concurrency"
    REFUSED_TOKEN_BUDGET = "token_budget"
    REFUSED_KV = "kv_cache"
    REFUSED_LOW_PRIORITY = "low_priority"
    REFUSED_BUDGET = "budget_exhausted"  # a long-window budget is spent until its reset (docs/budgets.md)
    BUDGET_UNAVAILABLE = "budget_unavailable"  # a budget's view is stale and it says refuse (docs/budgets.md)

    @property
    def admitted(self) -> bool:
        return self is AdmissionOutcome.ADMITTED

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS[self]


_HTTP_STATUS = {
    AdmissionOutcome.ADMITTED: 200,
    AdmissionOutcome.REFUSED_UNKNOWN_KEY: 401,
    AdmissionOutcome.REFUSED_NOT_BOUND: 403,
    AdmissionOutcome.REFUSED_CONCURRENCY: 429,
    AdmissionOutcome.REFUSED_TOKEN_BUDGET: 429,
    AdmissionOutcome.REFUSED_KV: 429,
    AdmissionOutcome.REFUSED_LOW_PRIORITY: 429,
    AdmissionOutcome.REFUSED_BUDGET: 429,
    AdmissionOutcome.BUDGET_UNAVAILABLE: 503,
}
