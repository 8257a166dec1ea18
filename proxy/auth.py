"""API key → entitlement. Only SHA-256 digests are held in memory; the presented key is hashed and looked up.

The dict lookup finds the candidate by digest; ``hmac.compare_digest`` then checks the stored digest against the
presented one in constant time. The entitlement comes from the key alone: nothing in the headers or the body can
select another tenant's entitlement.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping


class KeyTable:
    __slots__ = ("_by_digest",)

    def __init__(self, digests: Mapping[str, str]) -> None:
        self._by_digest: dict[bytes, tuple[bytes, str]] = {
            bytes.fromhex(d): (bytes.fromhex(d), name) for d, name in digests.items()
        }

    def lookup(self, authorization: str | None) -> str | None:
        """The entitlement for an ``Authorization: Bearer <key>`` header, or None (missing, malformed, unknown)."""
        key = bearer_key(authorization)
        if key is None:
            return None
        presented = hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()
        entry = self._by_digest.get(presented)
        if entry is None or not hmac.compare_digest(entry[0], presented):
            return None
        return entry[1]

    def __len__(self) -> int:
        return len(self._by_digest)


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
