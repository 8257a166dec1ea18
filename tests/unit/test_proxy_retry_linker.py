"""The retry linker (``proxy.retries``): each marker, the heuristic, expiry, bounded memory, and the chain invariant
(a chain's attempts are numbered 0, 1, 2, … and every retry carries its first attempt's id)."""

from __future__ import annotations

from hypothesis import given, strategies as st

from tokenpools.proxy.admission.retries import (
    NOT_LINKED, RetryIdentity, RetryLinker, body_digest, retry_count)
from tokenpools.topics.records import RetryLink

ALICE, BOB = b"a" * 32, b"b" * 32  # API key digests
BODY, OTHER = body_digest(b'{"model":"m","prompt":"hi"}'), body_digest(b'{"model":"m","prompt":"ho"}')
WINDOW_S = 60.0


def linker(max_entries: int = 1000) -> RetryLinker:
    return RetryLinker(WINDOW_S, max_entries)


def sent(link: RetryLinker, rid: str, now_s: float, headers: dict[str, str] | None = None, key: bytes = ALICE,
         body: bytes | None = BODY, refused: bool = True) -> RetryIdentity | None:
    """One request through the linker: its arrival, then its final decision; its identity."""
    linked = link.attempt(headers or {}, key, body, rid, now_s)
    link.decided(linked, rid, refused, now_s)
    return linked.identity


def sdk(n: int) -> dict[str, str]:
    return {"x-stainless-retry-count": str(n)}


# ---- the SDK's retry count -----------------------------------------------------------------------------------------
def test_the_sdk_count_numbers_attempts_and_links_them_to_attempt_zero() -> None:
    link = linker()
    assert sent(link, "r1", 0.0, sdk(0)) == RetryIdentity(0, None, RetryLink.SDK_RETRY_COUNT)
    assert sent(link, "r2", 1.0, sdk(1)) == RetryIdentity(1, "r1", RetryLink.SDK_RETRY_COUNT)
    assert sent(link, "r3", 3.0, sdk(2), refused=False) == RetryIdentity(2, "r1", RetryLink.SDK_RETRY_COUNT)


def test_an_sdk_retry_whose_first_attempt_was_not_seen_keeps_its_number() -> None:
    link = linker()
    sent(link, "r1", 0.0, sdk(0), body=OTHER)  # another body
    sent(link, "r2", 0.0, sdk(0), key=BOB)  # another key
    assert sent(link, "r3", 1.0, sdk(3)) == RetryIdentity(3, None, RetryLink.SDK_RETRY_COUNT)
    # refused before its body was read (not Bound): numbered, never linked
    assert sent(link, "r4", 1.0, sdk(1), body=None) == RetryIdentity(1, None, RetryLink.SDK_RETRY_COUNT)


def test_a_malformed_retry_count_is_no_marker() -> None:
    assert [retry_count(sdk(n)) for n in (0, 7)] == [0, 7]
    for value in ("-1", "1.5", "x", "", "1234567", "²"):
        assert retry_count({"x-stainless-retry-count": value}) is None
    link = linker()
    assert sent(link, "r1", 0.0, {"x-stainless-retry-count": "nope"}) is None  # unmarked: the heuristic's


# ---- the client's ids -------------------------------------------------------------------------------------------
def test_an_idempotency_key_links_every_attempt_to_the_first_whatever_its_outcome() -> None:
    link = linker()
    key = {"idempotency-key": "k-1"}
    assert sent(link, "r1", 0.0, key, refused=False) == RetryIdentity(0, None, RetryLink.IDEMPOTENCY_KEY)
    assert sent(link, "r2", 1.0, key, body=OTHER) == RetryIdentity(1, "r1", RetryLink.IDEMPOTENCY_KEY)
    assert sent(link, "r3", 2.0, key) == RetryIdentity(2, "r1", RetryLink.IDEMPOTENCY_KEY)
    # scoped by API key: the same idempotency key of another key is another request
    assert sent(link, "r4", 2.0, key, key=BOB) == RetryIdentity(0, None, RetryLink.IDEMPOTENCY_KEY)


def test_a_client_request_id_links_like_an_idempotency_key_and_yields_to_it() -> None:
    link = linker()
    cid = {"x-client-request-id": "c-1"}
    assert sent(link, "r1", 0.0, cid) == RetryIdentity(0, None, RetryLink.CLIENT_REQUEST_ID)
    assert sent(link, "r2", 1.0, {**cid, **sdk(5)}) == RetryIdentity(1, "r1", RetryLink.CLIENT_REQUEST_ID)
    both = {"idempotency-key": "k", **cid}
    assert sent(link, "r3", 2.0, both).link is RetryLink.IDEMPOTENCY_KEY  # type: ignore[union-attr]
    # X-Request-Id is no marker, and marked requests open no heuristic link: a first attempt
    assert sent(link, "r4", 2.0, {"x-request-id": "c-1"}) is None


# ---- the heuristic -----------------------------------------------------------------------------------------------
def test_an_unmarked_first_attempt_has_no_identity() -> None:
    link = linker()
    assert sent(link, "r1", 0.0, refused=False) is None
    assert sent(link, "r2", 0.0, refused=True, body=OTHER) is None


def test_a_refusal_opens_a_link_for_the_same_key_and_body() -> None:
    link = linker()
    assert sent(link, "r1", 0.0) is None
    assert sent(link, "r2", 1.0, body=OTHER) is None  # another body: another request
    assert sent(link, "r3", 1.0, key=BOB) is None  # another key: another client
    assert sent(link, "r4", 2.0) == RetryIdentity(1, "r1", RetryLink.HEURISTIC)
    assert sent(link, "r5", 3.0, refused=False) == RetryIdentity(2, "r1", RetryLink.HEURISTIC)
    assert sent(link, "r6", 4.0) is None  # admitted, the chain ended: the same body again is a new request


def test_an_admitted_request_opens_no_link() -> None:
    link = linker()
    sent(link, "r1", 0.0, refused=False)
    assert sent(link, "r2", 1.0) is None


def test_a_request_refused_before_its_body_was_read_opens_no_heuristic_link() -> None:
    link = linker()
    assert link.attempt({}, ALICE, None, "r1", 0.0) is NOT_LINKED
    sent(link, "r1", 0.0, body=None)
    assert sent(link, "r2", 1.0) is None


# ---- bounded memory ----------------------------------------------------------------------------------------------
def test_entries_expire_after_the_window_since_last_touched() -> None:
    link = linker()
    sent(link, "r1", 0.0)
    assert sent(link, "r2", WINDOW_S - 1) == RetryIdentity(1, "r1", RetryLink.HEURISTIC)  # renews the chain
    assert sent(link, "r3", 2 * WINDOW_S - 2) == RetryIdentity(2, "r1", RetryLink.HEURISTIC)
    assert sent(link, "r4", 3 * WINDOW_S) is None  # too late: a new request (r4 opens its own chain)
    assert len(link) == 1
    sent(link, "i1", 0.0, {"idempotency-key": "k"})
    assert sent(link, "i2", 4 * WINDOW_S, {"idempotency-key": "k"}) == RetryIdentity(0, None, RetryLink.IDEMPOTENCY_KEY)
    link.attempt({}, BOB, OTHER, "x", 10 * WINDOW_S)
    assert len(link) == 0  # everything expired, whatever the lookup


def test_memory_is_bounded_and_the_oldest_goes_first() -> None:
    link = linker(max_entries=3)
    for i in range(5):
        sent(link, f"k{i}", float(i), {"idempotency-key": f"k{i}"})
    assert len(link) == 3
    assert sent(link, "again0", 5.0, {"idempotency-key": "k0"}).attempt == 0  # type: ignore[union-attr]
    assert sent(link, "again4", 5.0, {"idempotency-key": "k4"}) == RetryIdentity(1, "k4", RetryLink.IDEMPOTENCY_KEY)
    off = linker(max_entries=0)
    sent(off, "r1", 0.0, sdk(0))
    assert sent(off, "r2", 1.0, sdk(1)) == RetryIdentity(1, None, RetryLink.SDK_RETRY_COUNT) and len(off) == 0


def test_a_long_marker_costs_one_short_key() -> None:
    link = linker()
    sent(link, "r1", 0.0, {"idempotency-key": "k" * 60_000})
    (key,) = link._entries  # the memory's keys hold a 16-byte digest of the value
    assert len(key) == 1 + len(ALICE) + 16


# ---- the chain invariant -----------------------------------------------------------------------------------------
MARKERS = st.sampled_from(["sdk", "idempotency", "client_id", "none"])


@given(marker=MARKERS, retries=st.integers(0, 8), gaps=st.lists(st.floats(0.0, WINDOW_S * 0.99), min_size=8,
                                                                  max_size=8),
       noise=st.lists(st.tuples(st.sampled_from([ALICE, BOB]), st.sampled_from([BODY, OTHER]), st.booleans()),
                      max_size=8))
def test_a_chains_attempts_are_numbered_in_order_and_carry_its_first_id(
        marker: str, retries: int, gaps: list[float], noise: list[tuple[bytes, bytes, bool]]) -> None:
    """Named invariant: a request refused ``retries`` times then admitted, each attempt within the window of the
    previous, is seen as attempts 0, 1, …, retries, every retry carrying attempt 0's request id and the marker's
    link, whatever other clients send meanwhile (other keys' requests, or this key's other bodies)."""
    link = linker()
    expected = {"sdk": RetryLink.SDK_RETRY_COUNT, "idempotency": RetryLink.IDEMPOTENCY_KEY,
                "client_id": RetryLink.CLIENT_REQUEST_ID, "none": RetryLink.HEURISTIC}[marker]
    now, seen = 0.0, []
    for n in range(retries + 1):
        headers = {"sdk": sdk(n), "idempotency": {"idempotency-key": "chain"},
                   "client_id": {"x-client-request-id": "chain"}, "none": {}}[marker]
        for i, (key, body, refused) in enumerate(noise):
            if (key, body) != (ALICE, BODY):
                sent(link, f"noise-{n}-{i}", now, key=key, body=body, refused=refused)
        seen.append(sent(link, f"r{n}", now, headers, refused=n < retries))
        now += gaps[n % len(gaps)]
    if marker == "none":
        assert seen[0] is None  # an unmarked first attempt: no fields
    else:
        assert seen[0] == RetryIdentity(0, None, expected)
    assert seen[1:] == [RetryIdentity(n, "r0", expected) for n in range(1, retries + 1)]
