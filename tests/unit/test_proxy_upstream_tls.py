"""How the proxy's backend client reads an endpoint URL (TLS or not, default ports) and how its TLS settings are
checked; the handshakes themselves run against a TLS-serving simulator in tests/integration/test_proxy_tls_backend.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from tokenpools.config.settings import ProxySettings
from tokenpools.proxy.backends.upstream import UpstreamError, _target


def test_https_endpoints_are_tls_with_port_443_by_default_and_http_stays_plain() -> None:
    assert _target("POST", "https://vllm.example/v1/chat/completions") == (
        "vllm.example", 443, True, b"POST /v1/chat/completions HTTP/1.1\r\nHost: vllm.example:443\r\n")
    assert _target("GET", "http://10.0.0.7:8000/v1/models?x=1")[:3] == ("10.0.0.7", 8000, False)
    assert _target("GET", "http://vllm/health")[:3] == ("vllm", 80, False)
    with pytest.raises(UpstreamError, match="not an http"):
        _target("GET", "ftp://vllm/x")


def test_upstream_tls_settings_name_files_that_exist_and_a_certificate_comes_with_its_key(tmp_path: Path) -> None:
    pem = tmp_path / "cert.pem"
    pem.write_text("-")
    assert ProxySettings(upstream_ssl_cafile=pem).upstream_ssl_check_hostname is True
    with pytest.raises(ValidationError, match="no such file"):
        ProxySettings(upstream_ssl_cafile=tmp_path / "gone.pem")
    with pytest.raises(ValidationError, match="upstream_ssl_certfile and upstream_ssl_keyfile go together"):
        ProxySettings(upstream_ssl_certfile=pem)


def test_the_upstream_key_comes_from_the_environment_variable_the_settings_name() -> None:
    from tokenpools.errors import ConfigError
    from tokenpools.proxy.access.auth import upstream_authorization

    assert upstream_authorization(None, {"ANY": "x"}) is None
    assert upstream_authorization("VLLM_KEY", {"VLLM_KEY": " sk-b "}) == "Bearer sk-b"
    for environ in ({}, {"VLLM_KEY": "  "}):
        with pytest.raises(ConfigError, match="VLLM_KEY, which is unset or empty"):
            upstream_authorization("VLLM_KEY", environ)
    assert ProxySettings(upstream_api_key_env="VLLM_KEY").upstream_api_key_env == "VLLM_KEY"
    with pytest.raises(ValidationError, match="upstream_api_key_env"):
        ProxySettings(upstream_api_key_env="not a name")
