"""The limit-update record of a tick: building one from the core's tick result and split (agents), reading a
proxy's share of one (proxies), and its pages on the topic. Both sides use these functions, so the split a proxy
enforces is the split the agents computed; the split and its hold-back themselves are decisions, in
``core.split``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from tokenpools.core.admission import EntitlementLimits
from tokenpools.core.capacity import Capacity
from tokenpools.core.split import ProxySplit, split_limits
from tokenpools.core.tick import TickResult
from tokenpools.topics.records import LimitUpdate, ProxyShare


def build_limit_update(
    pool: str,
    version: int,
    t_ms: int,
    tick: TickResult,
    capacity: Capacity,
    mean_slo_ms: float,
    proxy_demand: Mapping[str, Mapping[str, float]],
    backend_waiting: float = 0.0,
    floor_fraction: float = 0.1,
) -> LimitUpdate:
    """``proxy_demand`` maps proxy id → entitlement → that proxy's recent demand (e.g. attempts in the window);
    every live proxy must appear, with an empty mapping if it saw nothing.
    """
    split = None
    if proxy_demand:
        demand: dict[str, dict[str, float]] = {}
        for proxy, per_entitlement in proxy_demand.items():
            for name, value in per_entitlement.items():
                demand.setdefault(name, {})[proxy] = value
        totals = {p: sum(d.values()) for p, d in proxy_demand.items()}
        split = split_limits(tick.limits, capacity, list(proxy_demand), demand, totals, floor_fraction)
    return limit_update(pool, version, t_ms, tick, capacity, mean_slo_ms, split, backend_waiting)


def limit_update(pool: str, version: int, t_ms: int, tick: TickResult, capacity: Capacity, mean_slo_ms: float,
                 split: ProxySplit | None, backend_waiting: float = 0.0) -> LimitUpdate:
    """The record of one tick: the fleet's limits and signals by entitlement name, and the proxies' shares when
    ``split`` is given (shares mode; None: counts mode, the proxies divide the limits themselves)."""
    entitlements = [  # as data: the record validates them all in one call, not one model call each
        {"name": name, "priority": tick.priorities[name], "debt": tick.signals[name].debt,
         "burst": tick.signals[name].burst, "tokens_per_s": limit.tokens_per_s, "kv_bytes": limit.kv_bytes,
         "concurrency": int(limit.concurrency)}
        for name, limit in sorted(tick.limits.items())
    ]
    return LimitUpdate.model_validate({
        "pool": pool, "version": version, "t_ms": t_ms, "contended": tick.contended,
        "backend_waiting": backend_waiting, "mean_slo_ms": mean_slo_ms,
        "capacity_tokens_per_s": capacity.tokens_per_s, "capacity_kv_bytes": capacity.kv_bytes,
        "capacity_concurrency": int(capacity.concurrency), "entitlements": entitlements,
        "proxies": proxy_shares(split) if split is not None else (),
    })


def proxy_shares(split: ProxySplit) -> tuple[ProxyShare, ...]:
    """A ``ProxySplit`` as a ``LimitUpdate``'s ``proxies``: one ``ProxyShare`` per proxy, its entitlements in the
    order of ``split.shares``, a copy of the common shares with the proxy's own put in.

    Built without validation: every value comes out of ``split_shares`` or the hold-back, whole slots >= 0 and
    tokens/s, KV bytes >= 0 by construction (validating P records of E shares each is most of a shares-mode
    tick), and every consumer validates the record when it decodes it."""
    common = {name: column.common for name, column in split.shares.items()}
    entitlements = [common.copy() for _ in split.proxies]
    for name, column in split.shares.items():
        for i, share in column.rest.items():
            entitlements[i][name] = share
    return tuple(ProxyShare.model_construct(proxy_id=proxy, pool_concurrency=split.pool.at(i)[0],
                                            entitlements=entitlements[i])
                 for i, proxy in enumerate(split.proxies))


def limits_for_proxy(update: LimitUpdate, proxy_id: str) -> tuple[dict[str, EntitlementLimits], int] | None:
    """The limits this proxy enforces and its share of the pool's concurrency.

    An update without per-proxy shares applies whole (one proxy). An update with shares that do not include this
    proxy returns None: the proxy keeps what it has until an update counts it in (it heartbeats first).
    """
    if not update.proxies:
        return (
            {
                e.name: EntitlementLimits(e.concurrency, e.tokens_per_s, e.kv_bytes, e.priority)
                for e in update.entitlements
            },
            update.capacity_concurrency,
        )
    share = next((p for p in update.proxies if p.proxy_id == proxy_id), None)
    if share is None:
        return None
    result = {}
    for e in update.entitlements:
        concurrency, tokens_per_s, kv_bytes = share.entitlements.get(e.name, (0, 0.0, 0.0))
        result[e.name] = EntitlementLimits(concurrency, tokens_per_s, kv_bytes, e.priority)
    return result, share.pool_concurrency


PAGE_BYTES = 64_000  # a limit update's page stays under this (with room for the envelope); Kafka's default is 1 MB
_BYTES_PER_ENTITLEMENT = 180  # an EntitlementLimit as JSON, long name included
_BYTES_PER_SHARE = 70  # one proxy's share of one entitlement (shares mode)


def paginate(update: LimitUpdate, page_bytes: int = PAGE_BYTES) -> list[tuple[str, LimitUpdate]]:
    """(record key, page) for every page of ``update``: one page keyed by the pool when it is small, else slices
    of the entitlements (in name order) sized so each page stays under about ``page_bytes``, keyed ``pool``,
    ``pool#1``, ``pool#2``, ... Each page carries the pool's own fields and, in shares mode, every proxy's shares
    of its entitlements only."""
    return list(pages(update, page_bytes))


def pages(update: LimitUpdate, page_bytes: int = PAGE_BYTES) -> Iterator[tuple[str, LimitUpdate]]:
    """``paginate``, one page at a time (a sender can yield between pages). Each proxy's shares are sorted into
    their pages in one pass over them, so the whole costs O(E·P), not a pass over every share per page."""
    if page_bytes <= 0:
        raise ValueError(f"`page_bytes` must be positive, got {page_bytes}")
    per = _BYTES_PER_ENTITLEMENT + _BYTES_PER_SHARE * len(update.proxies)
    size = max(1, page_bytes // per)
    slices = [update.entitlements[i:i + size] for i in range(0, len(update.entitlements), size)] or [()]
    if len(slices) == 1:
        yield update.pool, update
        return
    page_of = {e.name: i for i, chunk in enumerate(slices) for e in chunk}
    by_page: list[list[dict[str, tuple[int, float, float]]]] = [[] for _ in slices]  # page → per proxy
    for share in update.proxies:
        parts: list[dict[str, tuple[int, float, float]]] = [{} for _ in slices]
        for name, value in share.entitlements.items():
            if (i := page_of.get(name)) is not None:
                parts[i][name] = value
        for i, part in enumerate(parts):
            by_page[i].append(part)
    for i, chunk in enumerate(slices):
        proxies = tuple(s.model_copy(update={"entitlements": part}) for s, part in zip(update.proxies, by_page[i]))
        page = update.model_copy(update={"entitlements": chunk, "proxies": proxies, "page": i, "pages": len(slices)})
        yield (update.pool if i == 0 else f"{update.pool}#{i}", page)


def pool_of_key(key: bytes) -> bytes:
    """The pool a limits record's key names (``pool`` or ``pool#page``)."""
    return key.split(b"#", 1)[0]


class PageAssembler:
    """The pages of each pool's newest version, until all are held; then the whole update (pure, no clock)."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[int, dict[int, LimitUpdate]]] = {}  # pool → (version, page → record)

    def add(self, page: LimitUpdate) -> LimitUpdate | None:
        """The whole update once ``page`` completes its version; None while pages are missing (or it is older than
        the version being assembled)."""
        if page.pages == 1:
            return page
        version, pages = self._held.get(page.pool, (-1, {}))
        if page.version < version:
            return None
        if page.version > version:
            version, pages = page.version, {}
        pages[page.page] = page
        self._held[page.pool] = (version, pages)
        if len(pages) < page.pages:
            return None
        del self._held[page.pool]
        ordered = [pages[i] for i in range(page.pages)]
        shares: dict[str, ProxyShare] = {}
        for part in ordered:
            for s in part.proxies:
                held = shares.get(s.proxy_id)
                shares[s.proxy_id] = s if held is None else held.model_copy(
                    update={"entitlements": {**held.entitlements, **s.entitlements}})
        return ordered[0].model_copy(update={
            "entitlements": tuple(e for part in ordered for e in part.entitlements),
            "proxies": tuple(shares[p] for p in sorted(shares)), "page": 0, "pages": 1})
