"""Bearer keys, held only as SHA-256 digests: the presented key is hashed, then compared in constant time.

``tenancy.Tenancy`` looks a key up by its digest (key → tenant → entitlement by model); ``presents_digest`` checks a
key against one known digest (the operators' key). Nothing in the headers or the body can select another tenant.

Upstream, the other way: a client's key is never forwarded; the backends get the proxy's own key, when
``proxy.upstream_api_key_env`` names the environment variable that holds it (``upstream_authorization``).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from tokenpools.errors import ConfigError, ConfigProblem


def presents_digest(authorization: str | None, digest: bytes) -> bool:
    """True when the bearer key hashes to ``digest`` (a credential held only as its SHA-256), in constant time."""
    key = bearer_key(authorization)
    presented = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest() if key is not None else b""
    return hmac.compare_digest(presented, digest) and key is not None


def bearer_key(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    key = key.strip()
    return key or None


def upstream_authorization(env_name: str | None, environ: Mapping[str, str]) -> str | None:
    """The ``Authorization`` value the proxy sends its backends: ``Bearer <key>`` with the key from the environment
    variable ``env_name``, or None when no variable is named. A named variable that is unset or blank is a
    ``ConfigError`` of one line (its value is never printed)."""
    if env_name is None:
        return None
    key = environ.get(env_name, "").strip()
    if not key:
        raise ConfigError([ConfigProblem("proxy settings", f"proxy.upstream_api_key_env names {env_name}, which is "
                                                           "unset or empty in the proxy's environment")])
    return f"Bearer {key}"
