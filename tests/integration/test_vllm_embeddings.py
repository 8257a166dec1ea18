"""``/v1/embeddings`` through the proxy in front of real vLLM serving the install's second tiny model, a random BERT
(``model-<N>/embedding``, docs/vllm.md), with ``vllm serve --runner pooling``: one model runner per vLLM, so this
module starts a vLLM of its own (a minute).

An embedding costs its input tokens only: vLLM's ``usage.prompt_tokens`` (and ``total_tokens``, the same) is what the
proxy settles, with no completion tokens.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from openai import NotFoundError
from vllm_fixtures import (ENGINE_NICE, Stack, entitlement_doc, installed, pool_doc, proxied, started, vllm_metrics,
                           vllm_tokens)

from tokenpools.topics.records import CompletionStatus
from tokenpools_dev.devstack.vllm import VLLMServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POOL = "embed-pool"
MODEL = "tiny-bert"
KEYS = {"embed": "sk-vllm-embed"}


@pytest.fixture(scope="module")
def embedding_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    install = installed()
    if not (install.embedding_model / "config.json").is_file():
        pytest.skip(f"{install.model} has no embedding model (an install before it had one): run "
                    "scripts/install-vllm.sh")
    server = VLLMServer(install, model=install.embedding_model, model_name=MODEL, max_model_len=512,
                        engine_nice=ENGINE_NICE, workdir=tmp_path_factory.mktemp("vllm-embedding"),
                        extra_args=["--runner", "pooling"])
    with started(server):
        yield server


@pytest.fixture
async def stack(embedding_vllm: VLLMServer, tmp_path: Path) -> AsyncIterator[Stack]:
    config = "---".join([pool_doc(POOL, MODEL), entitlement_doc("embed", POOL, KEYS["embed"])])
    async with proxied(embedding_vllm, tmp_path, config, KEYS) as s:
        yield s


async def test_embeddings_settle_vllms_prompt_tokens(stack: Stack) -> None:
    before = vllm_metrics(stack.vllm)
    inputs = ["Token pools share one backend.", "A second input, in the same request: tokens add up."]
    async with stack.client("embed") as client:
        raw = await client.embeddings.with_raw_response.create(model=MODEL, input=inputs)
    embedded = raw.parse()
    assert [e.index for e in embedded.data] == [0, 1] and len(embedded.data[0].embedding) == 128  # hidden size
    prompt, generated = vllm_tokens(before, vllm_metrics(stack.vllm))
    assert embedded.usage.prompt_tokens == embedded.usage.total_tokens == prompt > len(inputs) and generated == 0
    record = await stack.completion(raw.headers["x-request-id"])
    assert (record.status, record.prompt_tokens, record.completion_tokens) == (CompletionStatus.OK, prompt, 0)
    assert stack.settled(POOL, "embed") == (prompt, 0)
    assert int(raw.headers["x-ratelimit-remaining-requests"]) == 1  # 2, less this one
    assert stack.relay.paths == ["/v1/embeddings"]


async def test_a_chat_request_to_the_embedding_model_gets_vllms_404_and_costs_nothing(stack: Stack) -> None:
    """A pooling vLLM serves no ``/v1/chat/completions`` (the route is not there): its 404, settled as nothing."""
    async with stack.client("embed") as client:
        with pytest.raises(NotFoundError) as no_route:
            await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
    assert no_route.value.body == {"detail": "Not Found"}
    record = await stack.completion(no_route.value.response.headers["x-request-id"])
    assert (record.status, record.http_status, record.prompt_tokens, record.completion_tokens) == (
        CompletionStatus.BACKEND_ERROR, 404, 0, 0)
    assert stack.proxy.pools[POOL].controller.in_flight_of("embed") == 0
