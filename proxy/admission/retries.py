"""Which attempt of a client request an arriving request is: the retry identity on ``request_decided``.

A what-if replay must tell a client's retry from a new request (docs/tuning.md#retries). The proxy reads it from the
request, in this order (the first marker present decides; docs/tuning.md#how-the-proxy-links-attempts):

- ``Idempotency-Key: K``: the first request of (API key, K) within the window is attempt 0; each later one is the
  next attempt of the first's request (``RetryLink.IDEMPOTENCY_KEY``);
- ``X-Client-Request-Id: C``: the same, for the client's own request id (``RetryLink.CLIENT_REQUEST_ID``).
  ``X-Request-Id`` is not read: it is the id servers answer with (this proxy's, OpenAI's), and gateways and meshes
  mint one per hop, so it names a hop, not a client's request;
- ``x-stainless-retry-count: N`` (the OpenAI SDKs send it on every attempt, 0 on the first): attempt N, whose
  first attempt is the attempt 0 of the same API key and body seen within the window (none found: attempt N all
  the same, without ``first_request_id``) (``RetryLink.SDK_RETRY_COUNT``);
- nothing: an attempt with the API key and body of a request *refused* within the window is its next attempt
  (``RetryLink.HEURISTIC``); an admitted one ends the chain (the same body again is a new request).

``RetryLinker`` is the memory behind it: pure (no clock, no I/O: time is an argument), bounded in time (an entry
lives ``window_s`` after it was last touched) and in size (``max_entries``: the oldest goes first). An entry's key is
(kind, API key digest, body digest or a 16-byte digest of the marker's value) as one byte string, so a long header
costs no more than a short one. One request costs the hash of its body and one or two dict operations
(benchmarks/retry_linker.py measures it).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from tokenpools.topics.records import RetryLink

SDK_RETRY_COUNT = "x-stainless-retry-count"
IDEMPOTENCY_KEY = "idempotency-key"
CLIENT_REQUEST_ID = "x-client-request-id"
MAX_RETRY_COUNT_DIGITS = 6  # a larger x-stainless-retry-count is not a retry count: ignored


@dataclass(frozen=True, slots=True)
class RetryIdentity:
    """What ``request_decided`` says of the attempt: its number, its request's first attempt (retries only: None
    on attempt 0, or when the first was not found), and how the proxy knew."""

    attempt: int
    first_request_id: str | None
    link: RetryLink


class Linked(NamedTuple):
    """One request as the linker saw it on arrival: its identity (None: no marker and no refusal matched: the
    record carries no retry fields) and, for a request that marked nothing, the key its refusal opens a link by.
    (A named tuple, not a frozen dataclass: one is made for every request, at a third of the cost.)"""

    identity: RetryIdentity | None
    heuristic_key: bytes | None = None


NOT_LINKED = Linked(None)  # a request the linker never saw (an unknown key): nothing recorded, nothing learnt


class _Kind(Enum):
    """The namespaces of the memory: the first byte of an entry's key."""

    IDEMPOTENCY = b"i"
    CLIENT_ID = b"c"
    SDK_FIRST = b"s"  # (key, body) → the attempt 0 an SDK retry links to
    REFUSED = b"r"  # (key, body) → the chain a refused unmarked attempt left open


_ID_MARKERS = ((IDEMPOTENCY_KEY, _Kind.IDEMPOTENCY, RetryLink.IDEMPOTENCY_KEY),
               (CLIENT_REQUEST_ID, _Kind.CLIENT_ID, RetryLink.CLIENT_REQUEST_ID))


@dataclass(slots=True)
class _Entry:
    first_request_id: str
    attempt: int  # the last attempt of the chain seen
    t_s: float  # when it was last touched


def body_digest(raw: bytes) -> bytes:
    """The digest a request's body is known by (16 bytes: collisions are not a concern at this scale)."""
    return hashlib.blake2b(raw, digest_size=16).digest()


def retry_count(headers: Mapping[str, str]) -> int | None:
    """The ``x-stainless-retry-count`` header as a count, None when absent or not a small non-negative integer."""
    value = headers.get(SDK_RETRY_COUNT)
    if value is None:
        return None
    value = value.strip()
    if not value.isdigit() or len(value) > MAX_RETRY_COUNT_DIGITS or not value.isascii():
        return None
    return int(value)


def _key(kind: _Kind, tenant_key: bytes, digest: bytes) -> bytes:
    return kind.value + tenant_key + digest


def _marker_digest(value: str) -> bytes:
    return hashlib.blake2b(value.encode("utf-8", "surrogateescape"), digest_size=16).digest()


class RetryLinker:
    """The attempts seen within ``window_s`` (module doc). ``attempt`` on arrival, ``decided`` on the request's final
    decision; both take the time (monotonic seconds) as an argument."""

    __slots__ = ("window_s", "max_entries", "_entries")

    def __init__(self, window_s: float, max_entries: int) -> None:
        if window_s <= 0:
            raise ValueError(f"`window_s` must be positive, got {window_s}")
        if max_entries < 0:
            raise ValueError(f"`max_entries` must be >= 0, got {max_entries}")
        self.window_s = window_s
        self.max_entries = max_entries
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()  # oldest touched first

    def __len__(self) -> int:
        return len(self._entries)

    def attempt(self, headers: Mapping[str, str], tenant_key: bytes, digest: bytes | None, request_id: str,
                now_s: float) -> Linked:
        """The retry identity of request ``request_id`` of API key ``tenant_key`` (its digest) whose body has
        ``digest`` (None: refused before its body was read), arriving at ``now_s``. A marker is remembered here."""
        self._expire(now_s)
        for header, kind, link in _ID_MARKERS:
            value = headers.get(header)
            if value:
                return Linked(self._seen(_key(kind, tenant_key, _marker_digest(value)),
                                         request_id, link, now_s))
        count = retry_count(headers)
        if count is not None:
            if digest is None:
                return Linked(RetryIdentity(count, None, RetryLink.SDK_RETRY_COUNT))
            key = _key(_Kind.SDK_FIRST, tenant_key, digest)
            if count == 0:
                self._put(key, _Entry(request_id, 0, now_s))
                return Linked(RetryIdentity(0, None, RetryLink.SDK_RETRY_COUNT))
            entry = self._touch(key, now_s)
            return Linked(RetryIdentity(count, entry.first_request_id if entry else None, RetryLink.SDK_RETRY_COUNT))
        if digest is None:
            return NOT_LINKED
        key = _key(_Kind.REFUSED, tenant_key, digest)
        entry = self._live(key, now_s)
        if entry is None:
            return Linked(None, key)
        return Linked(RetryIdentity(entry.attempt + 1, entry.first_request_id, RetryLink.HEURISTIC), key)

    def decided(self, linked: Linked, request_id: str, refused: bool, now_s: float) -> None:
        """Learn the final decision of a request ``attempt`` returned ``linked`` for. Only an unmarked request's
        outcome matters: refused, its chain stays open for a retry (or opens, on a first attempt); admitted, it
        ends."""
        key = linked.heuristic_key
        if key is None:
            return
        if not refused:
            self._entries.pop(key, None)
            return
        identity = linked.identity
        if identity is None:
            self._put(key, _Entry(request_id, 0, now_s))
        else:
            self._put(key, _Entry(identity.first_request_id or request_id, identity.attempt, now_s))

    # ---- the memory ---------------------------------------------------------------------------------------------
    def _seen(self, key: bytes, request_id: str, link: RetryLink, now_s: float) -> RetryIdentity:
        """One more request with an id marker: attempt 0 the first time, else the chain's next attempt."""
        entry = self._touch(key, now_s)
        if entry is None:
            self._put(key, _Entry(request_id, 0, now_s))
            return RetryIdentity(0, None, link)
        entry.attempt += 1
        return RetryIdentity(entry.attempt, entry.first_request_id, link)

    def _live(self, key: bytes, now_s: float) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is None or now_s - entry.t_s >= self.window_s:
            return None
        return entry

    def _touch(self, key: bytes, now_s: float) -> _Entry | None:
        """The live entry of ``key``, its life renewed (it moves to the newest end)."""
        entry = self._live(key, now_s)
        if entry is not None:
            entry.t_s = max(entry.t_s, now_s)
            self._entries.move_to_end(key)
        return entry

    def _put(self, key: bytes, entry: _Entry) -> None:
        entries = self._entries
        entries[key] = entry
        entries.move_to_end(key)
        while len(entries) > self.max_entries:
            entries.popitem(last=False)

    def _expire(self, now_s: float) -> None:
        """Drop the entries not touched within the window (the oldest first: they are in the order touched)."""
        entries = self._entries
        horizon = now_s - self.window_s
        while entries:
            key = next(iter(entries))
            if entries[key].t_s > horizon:
                return
            del entries[key]
