"""The rate-limit headers' arithmetic (``proxy.ratelimit``) on a real admission controller, and OpenAI's
duration format."""

from __future__ import annotations

from tokenpools.core.admission import AdmissionController, EntitlementLimits
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec
from tokenpools.proxy.admission.ratelimit import openai_duration, ratelimit_headers


def test_durations_read_like_openais() -> None:
    assert [openai_duration(s) for s in (0, -1, 0.0201, 0.999, 1.5, 59.9, 60, 360, 3723)] == [
        "0s", "0s", "21ms", "999ms", "1.5s", "59.9s", "1m0s", "6m0s", "1h2m3s"]


def _controller() -> AdmissionController:
    controller = AdmissionController(pool_concurrency=8, kv_bytes_per_token=1, default_max_tokens=10,
                                     token_bucket_window_s=10, retry_after_s=2)
    spec = EntitlementSpec("team", "p", ServiceClass.ELASTIC, 1000, Capacity(10, 1e9, 1))
    controller.upsert_entitlement(spec, EntitlementLimits(1, 10.0, 1e9, 1.0), now_s=0.0)
    return controller


def test_headers_follow_the_slots_and_the_bucket() -> None:
    controller = _controller()
    assert ratelimit_headers(controller, "team", 0.0) == {
        "x-ratelimit-limit-requests": "1", "x-ratelimit-remaining-requests": "1", "x-ratelimit-reset-requests": "0s",
        "x-ratelimit-limit-tokens": "100", "x-ratelimit-remaining-tokens": "100", "x-ratelimit-reset-tokens": "0s"}
    decision = controller.admit("team", "r1", 20, 10, 0.0)  # reserves 30 tokens, takes the only slot
    assert decision.ticket is not None
    h = ratelimit_headers(controller, "team", 0.0)
    assert (h["x-ratelimit-remaining-requests"], h["x-ratelimit-remaining-tokens"]) == ("0", "70")
    assert h["x-ratelimit-reset-tokens"] == "3s"  # 30 tokens at 10 tokens/s
    assert h["x-ratelimit-reset-requests"] == "2s"  # no release learned yet: the ceiling, as a refusal would say
    assert controller.admit("team", "r2", 1, 1, 0.0).retry_after_ms == 2000
    controller.release(decision.ticket, 25, 1.0)  # held 1 s: the service time is learned
    assert ratelimit_headers(controller, "team", 1.0)["x-ratelimit-reset-requests"] == "0s"
    assert ratelimit_headers(controller, "missing", 1.0) == {}
