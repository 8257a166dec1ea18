"""OpenAI-shaped error bodies: ``{"error": {"message", "type", "code", "param"}}``.

``code`` is the admission outcome's value for admission refusals (``concurrency``, ``token_budget``, ...), so a
client, a log line and a metric label all spell a refusal the same way.
"""

from __future__ import annotations

import orjson

from tokenpools.core.outcomes import AdmissionOutcome
from tokenpools.proxy.admission.budgets import BudgetRefusal
from tokenpools.proxy.http.messages import Response, error_body, error_response

__all__ = ["ERROR_TYPES", "EVICTED_CODE", "EVICTED_STATUS", "RETRY_AFTER_MS", "budget_refusal", "error_body",
           "error_response", "refusal", "specs_not_loaded", "sse_error"]

ERROR_TYPES = {
    AdmissionOutcome.REFUSED_UNKNOWN_KEY: "authentication_error",
    AdmissionOutcome.REFUSED_NOT_BOUND: "permission_error",
    AdmissionOutcome.REFUSED_CONCURRENCY: "rate_limit_error",
    AdmissionOutcome.REFUSED_TOKEN_BUDGET: "rate_limit_error",
    AdmissionOutcome.REFUSED_KV: "rate_limit_error",
    AdmissionOutcome.REFUSED_LOW_PRIORITY: "rate_limit_error",
    AdmissionOutcome.REFUSED_BUDGET: "insufficient_quota",  # OpenAI's type for a spent quota (also a 429)
    AdmissionOutcome.BUDGET_UNAVAILABLE: "service_unavailable_error",  # a 503: retry shortly
}

EVICTED_CODE = "evicted"
RETRY_AFTER_MS = "retry-after-ms"
EVICTED_STATUS = 503


UNKNOWN_KEY = "missing or unknown API key (send `Authorization: Bearer <key>`)"


def unknown_key() -> Response:
    """The 401 of a request whose key names no entitlement (any endpoint that needs one)."""
    return error_response(401, UNKNOWN_KEY, "authentication_error", AdmissionOutcome.REFUSED_UNKNOWN_KEY)


SPECS_NOT_LOADED_CODE = "specs_not_loaded"
SPECS_NOT_LOADED = ("unknown API key, and this proxy has not read the specs topic to its end yet: retry shortly "
                    "(a proxy that has read it answers 401 for a key it does not know)")


def specs_not_loaded(request_id: str | None) -> Response:
    """The 503 of a key not known before the specs topic is read to its end (``Retry-After: 1``): not a decision
    (no admission outcome), since the key may be in a record not read yet."""
    headers = {"Retry-After": "1"} | ({"X-Request-Id": request_id} if request_id else {})
    return error_response(503, SPECS_NOT_LOADED, "service_unavailable_error", SPECS_NOT_LOADED_CODE, None, headers)


def refusal(outcome: AdmissionOutcome, reason: str, retry_after_s: int, request_id: str,
            retry_after_ms: int = 0, extra: dict[str, str] | None = None) -> Response:
    """A refusal's response. A 429 (and a 503 ``budget_unavailable``) carries ``Retry-After`` (whole seconds, at
    least 1, what HTTP defines) and, when the decision estimated one, ``retry-after-ms`` (the sub-second wait, which
    the openai client honours first); ``extra``: the entitlement's rate-limit headers (``ratelimit``)."""
    headers = {"X-Request-Id": request_id, **(extra or {})}
    if outcome.http_status in (429, 503):
        headers["Retry-After"] = str(max(1, retry_after_s))
        if retry_after_ms > 0:
            headers[RETRY_AFTER_MS] = str(retry_after_ms)
    return error_response(outcome.http_status, reason, ERROR_TYPES[outcome], outcome.value, None, headers)


def budget_refusal(refused: BudgetRefusal, request_id: str, extra: dict[str, str] | None = None) -> Response:
    """The 429 of a request its entitlement's budget cannot take (docs/budgets.md#enforcement): ``refusal``'s body
    and headers, the error also carrying ``budget`` (name, period, time zone, reset, allowance, remaining units,
    what the request reserves); ``Retry-After`` and ``retry-after-ms`` say how long until the reset, capped."""
    outcome = AdmissionOutcome.REFUSED_BUDGET
    response = refusal(outcome, refused.reason, refused.retry_after_s, request_id, refused.retry_after_ms, extra)
    response.body = orjson.dumps({"error": {"message": refused.reason, "type": ERROR_TYPES[outcome],
                                            "code": outcome.value, "param": None, "budget": refused.detail()}})
    return response


def sse_error(message: str, type_: str, code: str) -> bytes:
    """A stream's last event when the proxy ends it (eviction, backend failure)."""
    return b"data: " + error_body(message, type_, code) + b"\n\n"
