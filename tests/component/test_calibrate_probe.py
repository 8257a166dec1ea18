"""``tokenpools calibrate``'s shell against the in-process fake backend: what it sends, what it counts, and how it
fails. (The figures of real backends: tests/integration/test_calibrate_sim.py, llm-d-inference-sim, and
tests/integration/test_vllm_calibrate.py, vLLM.)"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from aiohttp import web

from tokenpools.calibrate.plan import CalibrationPlan, make_plan
from tokenpools.calibrate.probe import calibrate, send
from tokenpools.calibrate.stats import RequestOutcome
from tokenpools.calibrate.workload import body
from tokenpools.errors import ConfigError, PermanentError
from tokenpools.runtime.clock import SystemClock
from tokenpools_dev.devstack.process import free_port
from tokenpools_dev.proxy.doubles import FakeBackend, running

pytestmark = pytest.mark.component


@dataclasses.dataclass
class StrictBackend(FakeBackend):
    """Refuses a body with ``ignore_eos`` as a server that validates its bodies does (OpenAI's own API)."""

    def _refused(self, body: dict[str, Any]) -> web.Response | None:
        if "ignore_eos" in body:
            return web.json_response({"error": {"message": "Unrecognized request argument supplied: ignore_eos",
                                                "type": "invalid_request_error"}}, status=400)
        return super()._refused(body)


def plan_for(url: str, **changes: Any) -> CalibrationPlan:
    settings: dict[str, Any] = {"max_concurrency": 4, "prompt_tokens": 8, "output_tokens": 6,
                                "ttft_p99_target_ms": 5000.0, "rounds": 2, **changes}
    return make_plan(url, settings.pop("model", "fake-model"), **settings)


async def test_every_step_streams_distinct_prompts_and_counts_the_usage() -> None:
    backend = FakeBackend(chunks=6, chunk_delay_s=0.002, prompt_tokens=8)
    async with running(backend.app()) as url:
        c = await calibrate(plan_for(url), SystemClock())
    assert [(s.concurrency, s.requests, s.answered) for s in c.steps] == [(1, 2, 2), (2, 4, 4), (4, 8, 8)]
    assert c.ignore_eos and c.prompt_words == 8  # 8 words made 8 tokens (the fake counts a constant)
    assert c.kv is None and "has no vllm:cache_config_info" in c.kv_estimate().how  # the fake has no /metrics
    assert all(s.backend_queue_mean_s is None for s in c.steps)  # nor a queue-time counter
    assert c.warm_up_tokens == (2 * 8, 2 * 6)
    for s in c.steps:
        assert (s.prompt_tokens, s.completion_tokens) == (8 * s.requests, 6 * s.requests)
        assert s.ttft_p50_s is not None and s.ttft_p99_s is not None and s.e2e_p99_s is not None
        assert 0 < s.ttft_p50_s <= s.ttft_p99_s <= s.e2e_p99_s
    assert len(backend.bodies) == 2 + 14  # two warm-ups, then the steps
    prompts = [b["prompt"] for b in backend.bodies]
    assert len(set(prompts)) == len(prompts)
    assert all(b["ignore_eos"] and b["stream"] and b["stream_options"] == {"include_usage": True}
               and b["max_tokens"] == 6 for b in backend.bodies)
    block = c.block()
    assert block is not None and block["concurrency"] == 4 and "kvCacheGiB" not in block


async def test_steps_by_seconds_send_until_their_time_is_up() -> None:
    backend = FakeBackend(chunks=2, delay_s=0.01)
    async with running(backend.app()) as url:
        c = await calibrate(plan_for(url, rounds=None, step_s=0.3), SystemClock())
    for s in c.steps:
        assert s.failed == 0 and s.elapsed_s >= 0.3
        assert s.requests >= 2 * s.concurrency  # ~0.02 s a request: each client sent again within 0.3 s


async def test_a_backend_that_refuses_ignore_eos_is_asked_without_it() -> None:
    backend = StrictBackend(chunks=3)
    async with running(backend.app()) as url:
        c = await calibrate(plan_for(url, max_concurrency=1, rounds=1, output_tokens=6), SystemClock())
    assert not c.ignore_eos
    assert ["ignore_eos" in b for b in backend.bodies] == [True, False, False, False]
    notes = c.notes()
    assert any("refused vLLM's ignore_eos" in n for n in notes)
    assert any("3.0 completion tokens on average, below --output-tokens 6" in n for n in notes)


async def test_a_model_the_backend_does_not_serve_is_bad_input() -> None:
    async with running(FakeBackend().app()) as url:
        with pytest.raises(ConfigError) as caught:
            await calibrate(plan_for(url, model="other"), SystemClock())
    assert [str(p) for p in caught.value.problems] == [
        f"tokenpools calibrate: {url} does not serve the model 'other'; it serves: fake-model"]


async def test_an_unreachable_backend_is_bad_input() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ConfigError) as caught:
        await calibrate(plan_for(url), SystemClock())
    (problem,) = caught.value.problems
    assert str(problem).startswith(f"tokenpools calibrate: cannot reach {url}: ")


async def test_a_server_without_a_model_list_is_bad_input() -> None:
    async def page(_: web.Request) -> web.Response:
        return web.Response(text="<html>hello</html>")

    app = web.Application()
    app.router.add_get("/v1/models", page)
    async with running(app) as url:
        with pytest.raises(ConfigError, match="without a model list: is .* an OpenAI-compatible server"):
            await calibrate(plan_for(url), SystemClock())


async def test_a_failing_backend_fails_the_warm_up_with_its_message() -> None:
    async with running(FakeBackend(status=503).app()) as url:
        with pytest.raises(PermanentError, match=r"warm-up request failed \(http error\): HTTP 503: backend says 503"):
            await calibrate(plan_for(url), SystemClock())


async def test_a_request_past_its_timeout_and_a_stream_without_usage_are_failures() -> None:
    slow = FakeBackend(chunks=2, delay_s=0.4)
    async with running(slow.app()) as url:
        timed_out = await send_one(url, request_timeout_s=0.1)
    assert timed_out.outcome is RequestOutcome.TIMED_OUT and timed_out.detail == "no end within 0.1 s"
    async with running(FakeBackend(chunks=2).app()) as url:
        plan = plan_for(url)
        request = body(plan.model, "a prompt", 2, True)
        del request["stream_options"]  # the fake then sends no usage chunk, as a backend that ignores it would
        no_usage = await _send(plan, request)
    assert no_usage.outcome is RequestOutcome.NO_USAGE and no_usage.ttft_s is not None


async def send_one(url: str, **changes: Any) -> Any:
    plan = plan_for(url, **changes)
    return await _send(plan, body(plan.model, "a prompt", 2, True))


async def _send(plan: CalibrationPlan, request: dict[str, Any]) -> Any:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        return await send(session, plan, request, SystemClock())
