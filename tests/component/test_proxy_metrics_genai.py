"""/metrics under ``proxy.metric_names``: the OpenTelemetry GenAI conventions' families (names, labels, buckets, as an
OTel Prometheus exporter writes them) after real requests through an in-process proxy, their values the same as the
tokenpools series', and each mode exporting exactly its own names."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec, PoolSpec
from tokenpools.proxy.app import build_app
from tokenpools.proxy.observability.genai_metrics import DURATION_BUCKETS_S, TOKEN_BUCKETS, TPOT_BUCKETS_S, TTFT_BUCKETS_S
from tokenpools_dev.proxy.doubles import FakeBackend, ProducerHub, offline_options, proxy_config, running

pytestmark = pytest.mark.component

POOL = PoolSpec("pool-a", "fake-model", Capacity(1000, 1e10, 4))
ENTS = [EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 1000, Capacity(300, 3e9, 2))]
BODY = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
TOKENPOOLS = ("tokenpools_proxy_tokens_total", "tokenpools_proxy_ttft_seconds_count",
              "tokenpools_proxy_request_duration_seconds_count")
GEN_AI = ("gen_ai_client_token_usage_bucket", "gen_ai_server_request_duration_seconds_bucket",
          "gen_ai_client_operation_duration_seconds_bucket", "gen_ai_server_time_to_first_token_seconds_bucket",
          "gen_ai_server_time_per_output_token_seconds_bucket")
COMMON = {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "openai", "gen_ai_request_model": "fake-model",
          "tokenpools_pool": "pool-a", "tokenpools_entitlement": "gold"}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def _scrape(tmp_path: Path, names: str) -> Samples:
    """Three chat requests (two streams of 4 chunks, one plain answer) and an embedding, then one scrape."""
    backend = FakeBackend(chunks=4, chunk_delay_s=0.002)
    async with running(backend.app()) as backend_url:
        config = proxy_config({"pool-a": (backend_url,)}, [POOL], ENTS, {"gold": "sk-gold"})
        app = build_app(config, offline_options(tmp_path, metric_names=names), producer_factory=ProducerHub().factory)
        async with running(app) as url, aiohttp.ClientSession(headers={"Authorization": "Bearer sk-gold"}) as s:
            for stream in (True, True, False):
                async with s.post(url + "/v1/chat/completions", json={**BODY, "stream": stream}) as r:
                    assert r.status == 200
                    await r.read()
            async with s.post(url + "/v1/embeddings", json={"model": "fake-model", "input": "hi"}) as r:
                assert r.status == 200
                await r.read()
            async with s.get(url + "/metrics") as r:
                text = await r.text()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def _sum(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every series of ``name`` whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items())


def _names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


async def test_gen_ai_names_carry_the_conventions_labels_and_the_tokenpools_values(tmp_path: Path) -> None:
    samples = await _scrape(tmp_path, "both")
    assert set(TOKENPOOLS) | set(GEN_AI) <= _names(samples)

    # gen_ai.client.token.usage: one observation per request and token type, the sums what tokenpools counted
    chat_in = {**COMMON, "gen_ai_token_type": "input"}
    chat_out = {**COMMON, "gen_ai_token_type": "output"}
    assert _value(samples, "gen_ai_client_token_usage_count", **chat_in) == 3
    assert _value(samples, "gen_ai_client_token_usage_count", **chat_out) == 3
    embed_in = {**COMMON, "gen_ai_operation_name": "embeddings", "gen_ai_token_type": "input"}
    assert _value(samples, "gen_ai_client_token_usage_count", **embed_in) == 1
    assert not any(n == "gen_ai_client_token_usage_count" and dict(ls).get("gen_ai_operation_name") == "embeddings"
                   and dict(ls)["gen_ai_token_type"] == "output" for n, ls in samples)  # embeddings have no output
    for token_type, kind in (("input", "prompt"), ("output", "completion")):
        assert _sum(samples, "gen_ai_client_token_usage_sum", gen_ai_token_type=token_type) == _value(
            samples, "tokenpools_proxy_tokens_total", pool="pool-a", entitlement="gold", kind=kind) > 0
    assert _value(samples, "gen_ai_client_token_usage_sum", **chat_out) == 3 * 4  # the backend's 4 tokens each
    assert [le for (n, ls) in samples if n == "gen_ai_client_token_usage_bucket"
            and dict(ls).items() >= chat_in.items() for le in [dict(ls)["le"]]] == \
        [repr(b) for b in TOKEN_BUCKETS] + ["+Inf"]  # the conventions' boundaries, in tokens

    # gen_ai.server.request.duration is tokenpools' request duration: the same observations, the same sum
    ok = {**COMMON, "error_type": ""}
    assert _sum(samples, "gen_ai_server_request_duration_seconds_count", **{"tokenpools_entitlement": "gold"}) == \
        _value(samples, "tokenpools_proxy_request_duration_seconds_count", pool="pool-a", entitlement="gold") == 4
    assert _sum(samples, "gen_ai_server_request_duration_seconds_sum") == pytest.approx(
        _value(samples, "tokenpools_proxy_request_duration_seconds_sum", pool="pool-a", entitlement="gold"))
    assert _value(samples, "gen_ai_server_request_duration_seconds_count", **ok) == 3
    # the client's view (admission to end) is never longer than the server's (arrival to end)
    assert 0 < _sum(samples, "gen_ai_client_operation_duration_seconds_sum") <= \
        _sum(samples, "gen_ai_server_request_duration_seconds_sum")
    assert _value(samples, "gen_ai_client_operation_duration_seconds_bucket", **ok, le="+Inf") == 3
    assert {dict(ls)["le"] for n, ls in samples if n == "gen_ai_server_request_duration_seconds_bucket"} == \
        {repr(b) for b in DURATION_BUCKETS_S} | {"+Inf"}

    # time to first token: the streams', as tokenpools measured them; time per output token: after the first
    assert _value(samples, "gen_ai_server_time_to_first_token_seconds_count", **COMMON) == \
        _value(samples, "tokenpools_proxy_ttft_seconds_count", pool="pool-a", entitlement="gold") == 2
    assert _value(samples, "gen_ai_server_time_to_first_token_seconds_sum", **COMMON) == pytest.approx(
        _value(samples, "tokenpools_proxy_ttft_seconds_sum", pool="pool-a", entitlement="gold"))
    assert {dict(ls)["le"] for n, ls in samples if n == "gen_ai_server_time_to_first_token_seconds_bucket"} == \
        {repr(b) for b in TTFT_BUCKETS_S} | {"+Inf"}
    assert _value(samples, "gen_ai_server_time_per_output_token_seconds_count", **COMMON) == 2
    assert 0 < _value(samples, "gen_ai_server_time_per_output_token_seconds_sum", **COMMON) < 1
    assert {dict(ls)["le"] for n, ls in samples if n == "gen_ai_server_time_per_output_token_seconds_bucket"} == \
        {repr(b) for b in TPOT_BUCKETS_S} | {"+Inf"}


@pytest.mark.parametrize(("names", "present", "absent"), [
    ("tokenpools", TOKENPOOLS, GEN_AI),
    ("gen_ai", GEN_AI, TOKENPOOLS),
])
async def test_each_mode_exports_its_own_names_only(tmp_path: Path, names: str, present: tuple[str, ...],
                                                    absent: tuple[str, ...]) -> None:
    samples = await _scrape(tmp_path, names)
    exported = _names(samples)
    assert set(present) <= exported
    assert not set(absent) & exported
    assert not {n for n in exported if n.startswith("gen_ai_")} - {
        n for family in GEN_AI for n in (family, family[:-len("bucket")] + "sum", family[:-len("bucket")] + "count")}
    # the series with no GenAI equivalent keep their tokenpools names in every mode
    assert {"tokenpools_proxy_decisions_total", "tokenpools_proxy_completions_total",
            "tokenpools_proxy_in_flight"} <= exported
