"""The proxy reaches an ``https://`` backend: llm-d-inference-sim serving TLS with a certificate from a CA the test
makes (``tokenpools_dev.tls``), the proxy trusting that CA through ``proxy.upstream_ssl_cafile``.

A backend whose certificate does not verify (an unknown CA, another host's name) is not talked to: the client gets
a 502 that says TLS failed, and the sim never sees the request. Kafka is off (the events spool): this is about the
backend connection only.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from backend_fixtures import inference_sim_binary  # noqa: F401  (fixture import)
from openai import APIStatusError, AsyncOpenAI
from proxy_fixtures import KEYS, config_text, start_proxy, start_sim  # noqa: F401

from tokenpools.config import apply_overrides, load_config_text, load_settings
from tokenpools.errors import ConfigError
from tokenpools.proxy.app import build_app
from tokenpools.proxy.main import proxy_config
from tokenpools.proxy.options import ProxyOptions
from tokenpools.topics.declarations import topics_for
from tokenpools_dev.devstack.inference_sim import InferenceSim
from tokenpools_dev.tls import CertificateAuthority

pytestmark = [pytest.mark.integration]

MESSAGES = [{"role": "user", "content": "Hello over TLS"}]
NO_KAFKA = "127.0.0.1:9"  # never dialled: kafka_enabled=False


async def _chat(url: str) -> str:
    client = AsyncOpenAI(base_url=url + "/v1", api_key=KEYS["gold"], max_retries=0, timeout=20)
    try:
        response = await client.chat.completions.create(model="fake-model", messages=MESSAGES, max_tokens=8)
        return response.choices[0].message.content or ""
    finally:
        await client.close()


async def _refused(url: str) -> APIStatusError:
    with pytest.raises(APIStatusError) as caught:
        await _chat(url)
    return caught.value


async def test_an_https_backend_is_reached_with_the_ca_it_is_told_to_trust(
        start_sim: Callable[..., InferenceSim], tmp_path: Path) -> None:
    ca = CertificateAuthority.create(tmp_path / "ca")
    served = ca.issue("sim", ["localhost", "127.0.0.1"])
    sim = start_sim(tls=(served.certfile, served.keyfile))
    assert sim.base_url.startswith("https://")
    topics = topics_for("tls.", partitions=1)
    trusted = (f"proxy.upstream_ssl_cafile={ca.cafile}",)
    async with start_proxy([sim.base_url], NO_KAFKA, topics, tmp_path / "a", trusted, kafka_enabled=False) as proxy:
        assert await _chat(proxy.url)
    # the system's CAs do not know ours: refused before a byte of the request is sent
    async with start_proxy([sim.base_url], NO_KAFKA, topics, tmp_path / "b", kafka_enabled=False) as proxy:
        error = await _refused(proxy.url)
        assert error.status_code == 502 and "TLS to 127.0.0.1" in error.message and "CERTIFICATE_VERIFY_FAILED" \
            in error.message, error.message


async def test_a_certificate_for_another_host_is_refused_unless_the_host_check_is_off(
        start_sim: Callable[..., InferenceSim], tmp_path: Path) -> None:
    ca = CertificateAuthority.create(tmp_path / "ca")
    elsewhere = ca.issue("elsewhere", ["backend.example"])
    sim = start_sim(tls=(elsewhere.certfile, elsewhere.keyfile))
    topics = topics_for("tls.", partitions=1)
    trusted = f"proxy.upstream_ssl_cafile={ca.cafile}"
    async with start_proxy([sim.base_url], NO_KAFKA, topics, tmp_path / "a", (trusted,),
                           kafka_enabled=False) as proxy:
        error = await _refused(proxy.url)
        assert error.status_code == 502 and "CERTIFICATE_VERIFY_FAILED" in error.message, error.message
    async with start_proxy([sim.base_url], NO_KAFKA, topics, tmp_path / "b",
                           (trusted, "proxy.upstream_ssl_check_hostname=false"), kafka_enabled=False) as proxy:
        assert await _chat(proxy.url)


def test_tls_files_that_cannot_be_loaded_stop_the_proxy_at_start_up(tmp_path: Path) -> None:
    garbage = tmp_path / "ca.pem"
    garbage.write_text("not a certificate\n")
    loaded = load_config_text(config_text(["https://127.0.0.1:1"]), "tls.yaml")
    settings = apply_overrides(load_settings(loaded.settings_values), [f"proxy.upstream_ssl_cafile={garbage}",
                                                                      "proxy.kafka_enabled=false"])
    options = ProxyOptions.from_settings(settings, "tls-proxy", spool_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"proxy settings.*upstream_ssl_cafile=.*ca\.pem"):
        build_app(proxy_config(loaded, settings, 0.0), options)
