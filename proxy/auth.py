"""Bearer keys, held only as SHA-256 digests: the presented key is hashed, then compared in constant time.

``tenancy.Tenancy`` looks a key up by its digest (key → tenant → entitlement by model); ``presents_digest`` checks a
key against one known digest (the operators' key). Nothing in the headers or the body can select another tenant.
"""

from __future__ import annotations

import hashlib
import hmac


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
