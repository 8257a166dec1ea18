"""Which API key the load generator sends for each entitlement.

Config files store only SHA-256 digests. The examples list their demo keys in clear in a header comment
(``#   guaranteed-a: sk-exp1-guaranteed-a``); a key found there is used only if its digest is one of that
entitlement's ``apiKeys`` (so a stale comment cannot send traffic as the wrong tenant). ``--key NAME=KEY`` wins.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

from tokenpools.config import LoadedConfig, hash_api_key
from tokenpools.errors import PermanentError

_COMMENT_KEY = re.compile(r"^#\s+([a-z0-9][a-z0-9.-]*):\s+(\S+)(?:\s.*)?$")


def comment_keys(text: str) -> dict[str, str]:
    return {m[1]: m[2] for line in text.splitlines() if (m := _COMMENT_KEY.match(line.strip()))}


def keys_for(loaded: LoadedConfig, config_text: str, explicit: Mapping[str, str] | None = None,
             names: Iterable[str] | None = None) -> dict[str, str]:
    """entitlement → clear-text key for ``names`` (default: every entitlement); raises if one has none."""
    found = {n: k for n, k in comment_keys(config_text).items()
             if n in loaded.api_key_hashes and hash_api_key(k) in loaded.api_key_hashes[n]}
    found.update(explicit or {})
    wanted = list(names) if names is not None else list(loaded.entitlements)
    missing = [n for n in wanted if n not in found]
    if missing:
        raise PermanentError(f"no API key for {', '.join(missing)}: pass --key NAME=KEY (the config stores digests only)")
    return {n: found[n] for n in wanted}


def parse_key_items(items: Iterable[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, key = item.partition("=")
        if not sep or not name.strip() or not key.strip():
            raise PermanentError(f"--key expects NAME=KEY, got {item!r}")
        out[name.strip()] = key.strip()
    return out


def read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")
