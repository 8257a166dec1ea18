"""The key the proxy sends its backends (``proxy.upstream_api_key_env``: a vLLM started with ``--api-key``): its own,
from the environment, never a client's; without the setting, no Authorization upstream at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from http_support import POOL, GOLD, post, replies, serving
from tokenpools.errors import ConfigError
from tokenpools.proxy.app import build_app
from tokenpools_dev.proxy.doubles import ProducerHub, offline_options, proxy_config

pytestmark = pytest.mark.component


async def answered(tmp_path: Path, **settings: object) -> list[str | None]:
    async with serving(tmp_path, **settings) as env:
        reader, writer = await env.connect()
        writer.write(post())
        (reply,) = await replies(reader, 1)
        writer.close()
        assert reply.status == 200, reply
        return env.backend.authorizations


async def test_the_backend_gets_the_proxys_key_not_the_clients(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TP_TEST_BACKEND_KEY", "sk-backend")
    assert await answered(tmp_path, upstream_api_key_env="TP_TEST_BACKEND_KEY") == ["Bearer sk-backend"]


async def test_without_the_setting_no_authorization_goes_upstream(tmp_path: Path) -> None:
    assert await answered(tmp_path) == [None]  # the client's sk-gold stays at the proxy


def test_a_named_variable_that_is_unset_stops_the_start_in_one_line(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TP_TEST_BACKEND_KEY", raising=False)
    config = proxy_config({"pool-a": ("http://127.0.0.1:9",)}, [POOL], [GOLD], {"gold": "sk-gold"})
    options = offline_options(tmp_path, upstream_api_key_env="TP_TEST_BACKEND_KEY")
    with pytest.raises(ConfigError) as info:
        build_app(config, options, producer_factory=ProducerHub().factory)
    (problem,) = info.value.problems
    assert "TP_TEST_BACKEND_KEY" in str(problem) and "unset or empty" in str(problem)
