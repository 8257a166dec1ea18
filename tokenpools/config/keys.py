"""API keys are never stored in clear: configuration holds their SHA-256, the proxy hashes what it is shown.

An API key is a long random secret, so an unsalted SHA-256 is enough to keep it out of files and topics (nobody
can guess a preimage), and it lets the proxy find the entitlement with one dict lookup on the digest. Comparing a
presented key with one known digest goes through ``key_matches`` (constant time).
"""

from __future__ import annotations

import hashlib
import hmac
import re

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def hash_api_key(key: str) -> str:
    """The lowercase hex SHA-256 of the key's UTF-8 bytes: what ``apiKeys[].sha256`` holds."""
    if not key:
        raise ValueError("an API key must not be empty")
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def is_sha256_hex(value: str) -> bool:
    """True for exactly 64 hexadecimal characters (either case)."""
    return bool(_HEX64.fullmatch(value))


def key_matches(key: str, sha256_hex: str) -> bool:
    """Whether ``key`` hashes to ``sha256_hex``, compared in constant time (hmac.compare_digest)."""
    if not key or not is_sha256_hex(sha256_hex):
        return False
    presented = hashlib.sha256(key.encode("utf-8")).digest()
    return hmac.compare_digest(presented, bytes.fromhex(sha256_hex))
