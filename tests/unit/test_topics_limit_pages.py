"""A pool's limit update as pages (topics/limits.py ``paginate``, ``PageAssembler``).

Invariants: every page is under 100 KB however many entitlements and proxies; a small update is one record keyed by
the pool, unchanged; the pages of a version, in any order, assemble into exactly the update; an incomplete or older
version is never handed out.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenpools.topics.codec import encode
from tokenpools.topics.limits import PageAssembler, paginate, pool_of_key
from tokenpools.topics.records import EntitlementLimit, LimitUpdate, ProxyShare

PROPERTY = settings(max_examples=25, deadline=None)


def update(entitlements: int, proxies: int, version: int = 7) -> LimitUpdate:
    names = [f"tenant-{i:05d}-with-a-longish-name" for i in range(entitlements)]
    return LimitUpdate(
        pool="pool-a", version=version, t_ms=version, contended=False, mean_slo_ms=1000.0,
        capacity_tokens_per_s=1e6, capacity_kv_bytes=1e12, capacity_concurrency=10_000,
        entitlements=tuple(EntitlementLimit(name=n, priority=93.84615384615384, debt=-0.123456789, burst=0.987654321,
                                            tokens_per_s=12345.678901, kv_bytes=1.234567e9, concurrency=64)
                           for n in names),
        proxies=tuple(ProxyShare(proxy_id=f"proxy-{p:03d}", pool_concurrency=50,
                                 entitlements={n: (3, 123.456789, 1.23456e7) for n in names})
                      for p in range(proxies)))


@PROPERTY
@given(st.integers(0, 3_000), st.sampled_from([0, 0, 1, 4, 30]), st.randoms(use_true_random=False))
def test_every_page_is_small_and_the_pages_in_any_order_are_the_update(entitlements, proxies, rng) -> None:
    whole = update(entitlements, proxies)
    pages = paginate(whole)
    assert all(len(encode(page)) < 100_000 for _, page in pages)
    assert [k for k, _ in pages] == ["pool-a"] + [f"pool-a#{i}" for i in range(1, len(pages))]
    assert all(pool_of_key(k.encode()) == b"pool-a" for k, _ in pages)
    if len(pages) == 1:
        assert pages[0][1] is whole
        return
    shuffled = [p for _, p in pages]
    rng.shuffle(shuffled)
    assembler = PageAssembler()
    out = [assembler.add(p) for p in shuffled]
    assert out[:-1] == [None] * (len(out) - 1) and out[-1] == whole


def test_a_newer_version_replaces_an_incomplete_one_and_an_older_page_is_ignored() -> None:
    old, new = paginate(update(1_000, 0, version=1)), paginate(update(1_000, 0, version=2))
    assert len(old) == len(new) > 1
    assembler = PageAssembler()
    assert assembler.add(old[0][1]) is None
    for _, page in new[:-1]:
        assert assembler.add(page) is None
    assert assembler.add(old[1][1]) is None  # older than the version being assembled
    assert assembler.add(new[-1][1]) == update(1_000, 0, version=2)
