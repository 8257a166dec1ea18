"""Usage per tenant, entitlement, model and day or month, and its reconciliation (docs/budgets.md#usage).

One aggregation for both sources of ``tokenpools usage``: the ledger's ``UsageRecord`` s (the ``usage`` topic, or
its table in a recorded log) and the completion events themselves (a log's ``request_completed`` table). Each
source first becomes *usage rows* of one shape (``ROWS``: the key, the billing labels as JSON text, and exact
integer token counts and requests), then goes through :func:`aggregate`; :func:`reconcile` compares two sources'
rows per (tenant, entitlement, model, UTC day). Pure: polars frames in, polars frames out, no I/O and no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import polars as pl

from tokenpools.core import resends
from tokenpools.core.budgets import Weights
from tokenpools.core.spec import EntitlementSpec

KEY = ("tenant", "entitlement", "model", "day")
COUNTS = ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "requests")
ROWS: dict[str, pl.DataType] = {
    "tenant": pl.String(), "entitlement": pl.String(), "model": pl.String(),
    "day": pl.String(),  # date, YYYY-MM-DD: UTC, or the time zone the rows were made in (from_completions)
    "labels": pl.String(),  # billing labels, JSON object text with sorted keys ("{}" when none are known)
    **{name: pl.Int64() for name in COUNTS},
}
NO_LABELS = "{}"
COST = "cost_units"  # the priced column: the tokens at their budget's weights (price)
UTC = "UTC"


class By(StrEnum):
    """The period usage is grouped by."""

    DAY = "day"
    MONTH = "month"


@dataclass(frozen=True, slots=True)
class Names:
    """Tenants and models a configuration gives, for events the log's spec rows name none for: entitlement →
    ``tenantId``, pool → ``model``."""

    tenants: Mapping[str, str] = field(default_factory=dict)
    models: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Filters:
    """Which rows count: any of these tenants and entitlements (empty: all), days in [since_day, until_day)."""

    tenants: tuple[str, ...] = ()
    entitlements: tuple[str, ...] = ()
    since_day: str | None = None  # YYYY-MM-DD, inclusive
    until_day: str | None = None  # YYYY-MM-DD, exclusive


def empty_rows() -> pl.DataFrame:
    return pl.DataFrame(schema=ROWS)


def from_completions(completions: pl.DataFrame, specs: pl.DataFrame, time_zone: str = UTC,
                     names: Names = Names()) -> pl.DataFrame:
    """One usage row per distinct completion event (a ``request_completed`` table; ``specs``: a ``spec`` table). A
    completion is counted once (``counted_once``). The tenant is the entitlement's
    ``tenantId`` and the model the pool's ``model`` in the spec rows in force at the event's time (before an object's
    first row, its first row's); without spec rows, those ``names`` gives, and without either the tenant is the
    entitlement's name and the model the pool's name. The day is the date of the event time in ``time_zone`` (an IANA
    name; UTC by default), so a month is that zone's calendar month, as a budget's is. Every status counts: the tokens
    are what the backend reported it used."""
    distinct = counted_once(completions)
    events = distinct.select(
        "entitlement", "pool", pl.col("t_ms").cast(pl.Int64),
        pl.col("prompt_tokens").cast(pl.Int64), pl.col("cached_prompt_tokens").cast(pl.Int64),
        pl.col("completion_tokens").cast(pl.Int64), pl.lit(1, dtype=pl.Int64).alias("requests"),
    ).sort("t_ms", maintain_order=True)
    events = _named(events, specs, names)
    return events.select(
        pl.col("tenant").fill_null(pl.col("entitlement")), "entitlement", pl.col("model").fill_null(pl.col("pool")),
        local_day(pl.col("t_ms"), time_zone).alias("day"), pl.lit(NO_LABELS).alias("labels"), *COUNTS,
    ).cast(ROWS)  # type: ignore[arg-type]


def stand_ins(completions: pl.DataFrame, specs: pl.DataFrame, names: Names = Names()) -> tuple[int, int]:
    """How many distinct completion events ``from_completions`` gives a stand-in: (the entitlement's name as the
    tenant: no ``tenantId`` in force nor in ``names``; the pool's name as the model: no ``model`` either)."""
    distinct = counted_once(completions)
    events = distinct.select("entitlement", "pool", pl.col("t_ms").cast(pl.Int64)).sort("t_ms", maintain_order=True)
    named = _named(events, specs, names)
    return named["tenant"].null_count(), named["model"].null_count()


def _named(events: pl.DataFrame, specs: pl.DataFrame, names: Names) -> pl.DataFrame:
    """``events`` with ``tenant`` and ``model``: the spec rows' in force, else ``names``', else null."""
    events = _spec_value(events, specs, "TokenEntitlement", "tenantId", on="entitlement", alias="tenant")
    events = _spec_value(events, specs, "TokenPool", "model", on="pool", alias="model")
    return events.with_columns(pl.col("tenant").fill_null(_lookup("entitlement", names.tenants)),
                               pl.col("model").fill_null(_lookup("pool", names.models)))


def _lookup(column: str, mapping: Mapping[str, str]) -> pl.Expr:
    if not mapping:
        return pl.lit(None, dtype=pl.String)
    return pl.col(column).replace_strict(list(mapping), list(mapping.values()), default=None, return_dtype=pl.String)


def counted_once(completions: pl.DataFrame, max_ahead: int = resends.MAX_AHEAD) -> pl.DataFrame:
    """The rows of ``completions`` that count, in their order: each completion once, as the agents' ledger does.

    A row with an identity (``proxy_start_ms`` and ``sequence``, docs/budgets.md#re-sent-decisions-and-completions)
    counts when ``core.resends.sight`` sees it first, reading each (pool, entitlement)'s rows in the order the
    ledger folds them (its partition's offsets; rows not from Kafka by event time): a completion the broker holds
    twice, or a row recorded twice, counts once. A row without one (a record older than the fields) counts once per
    ``request_id`` (the proxy makes ids unique), its first row in the frame's order."""
    if completions.is_empty():
        return completions
    if "sequence" not in completions.columns or "proxy_start_ms" not in completions.columns:
        return completions.unique(subset=["request_id"], keep="first", maintain_order=True)
    rows = completions.with_row_index("__row")
    identified = rows.filter(pl.col("sequence").is_not_null() & pl.col("proxy_start_ms").is_not_null())
    keep: list[int] = []
    streams: dict[tuple[str, str, str], resends.Seen] = {}
    ordered = identified.sort(["pool", "entitlement", "kafka_partition", "kafka_offset", "t_ms"], maintain_order=True)
    for row, pool, entitlement, proxy_id, start_ms, sequence, t_ms in ordered.select(
            "__row", "pool", "entitlement", "proxy_id", "proxy_start_ms", "sequence", "t_ms").iter_rows():
        key = (pool, entitlement, resends.stream_key(proxy_id, start_ms, sequence) or "")
        streams[key], sighting = resends.sight(streams.get(key), sequence, t_ms, max_ahead)
        if sighting is resends.Sighting.FIRST:
            keep.append(row)
    anonymous = rows.filter(pl.col("sequence").is_null() | pl.col("proxy_start_ms").is_null()).unique(
        subset=["request_id"], keep="first", maintain_order=True)
    kept = pl.concat([identified.filter(pl.col("__row").is_in(keep)), anonymous], how="vertical")
    return kept.sort("__row").drop("__row")


def within_retention(completions: pl.DataFrame, retention_days: int) -> pl.DataFrame:
    """The completions the agents' ledger counts: per (pool, entitlement) in the order the ledger folds them (its
    partition's offsets; rows not from Kafka, offset -1, by event time), each one whose UTC day is at most
    ``retention_days - 1`` days before the newest completion so far (itself included). An older one is counted
    nowhere by the ledger (``streams.ledger``: dead-lettered as late), so reconciling must leave it out too."""
    if completions.is_empty():
        return completions
    day_ms = 86_400_000
    ordered = completions.with_row_index("__row").sort(
        ["pool", "entitlement", "kafka_partition", "kafka_offset", "t_ms"], maintain_order=True)
    newest = pl.col("t_ms").cast(pl.Int64).cum_max().over(["pool", "entitlement"])
    cutoff = (newest // day_ms - retention_days + 1) * day_ms
    return (ordered.filter(pl.col("t_ms").cast(pl.Int64) >= cutoff)
            .sort("__row").drop("__row"))


def _spec_value(events: pl.DataFrame, specs: pl.DataFrame, kind: str, field: str, on: str, alias: str) -> pl.DataFrame:
    """``events`` with column ``alias``: the ``field`` of the ``kind`` spec named by column ``on``, as in force at
    each event's ``t_ms`` (the latest row at or before it; before the first row, the first), null when none."""
    values = (specs.filter(pl.col("kind") == kind)
              .select(pl.col("name").alias(on), pl.col("t_ms").cast(pl.Int64).alias("spec_t_ms"),
                      pl.col("spec").str.json_path_match(f"$.{field}").alias(alias))
              .filter(pl.col(alias).is_not_null()).sort("spec_t_ms", maintain_order=True))
    if values.is_empty():
        return events.with_columns(pl.lit(None, dtype=pl.String).alias(alias))
    joined = [events.join_asof(values, left_on="t_ms", right_on="spec_t_ms", by=on, strategy=strategy,
                               check_sortedness=False)[alias]  # both sorted by time (so within every group too)
              for strategy in ("backward", "forward")]
    return events.with_columns(pl.coalesce(*joined).alias(alias))


def local_day(t_ms: pl.Expr, time_zone: str = UTC) -> pl.Expr:
    """The date (YYYY-MM-DD) of epoch milliseconds in ``time_zone``."""
    instant = pl.from_epoch(t_ms, time_unit="ms")
    if time_zone != UTC:
        instant = instant.dt.replace_time_zone(UTC).dt.convert_time_zone(time_zone)
    return instant.dt.strftime("%Y-%m-%d")


def budget_weights(entitlements: Mapping[str, EntitlementSpec], budget: str | None = None) -> dict[str, Weights]:
    """The weights that price each entitlement's usage: those of its budget named ``budget``, or, with none named,
    of its budgets when they all price alike. An entitlement without such a budget is left out (its usage has no
    price). ``ValueError`` when ``budget`` is no entitlement's budget, or when one entitlement's budgets price
    differently and none is named."""
    chosen: dict[str, Weights] = {}
    for name, spec in entitlements.items():
        budgets = [b for b in spec.budgets if budget is None or b.name == budget]
        if len({b.weights for b in budgets}) > 1:
            raise ValueError(f"entitlement {name}'s budgets price tokens differently "
                             f"({', '.join(b.name for b in budgets)}): name the one to price by")
        if budgets:
            chosen[name] = budgets[0].weights
    if budget is not None and not chosen:
        known = sorted({b.name for spec in entitlements.values() for b in spec.budgets})
        raise ValueError(f"no entitlement has a budget named {budget!r} (the budgets: {', '.join(known) or 'none'})")
    return chosen


def budget_zone(entitlements: Mapping[str, EntitlementSpec], budget: str | None = None) -> str:
    """The one time zone of the budgets named ``budget`` (every budget, with none named) of ``entitlements``:
    where a bill's days and months start. ``ValueError`` when there is no such budget or they disagree."""
    zones = {(b.time_zone, b.name) for spec in entitlements.values() for b in spec.budgets
             if budget is None or b.name == budget}
    if not zones:
        raise ValueError("no entitlement has a budget" + (f" named {budget!r}" if budget else ""))
    if len({z for z, _ in zones}) > 1:
        listed = ", ".join(f"{name} {z}" for z, name in sorted(zones, key=lambda zn: (zn[1], zn[0])))
        raise ValueError(f"the budgets are in more than one time zone ({listed}): name one")
    return next(iter(zones))[0]


def price(table: pl.DataFrame, weights: Mapping[str, Weights]) -> pl.DataFrame:
    """``table`` (rows with the ``COUNTS``) with ``COST`` after the counts: per row, its entitlement's ``weights``
    applied as a budget prices spending (docs/budgets.md: uncached prompt, cached prompt and completion tokens each
    at its weight); null for an entitlement ``weights`` does not name."""
    ents = list(weights)

    def weight(name: str) -> pl.Expr:
        if not ents:
            return pl.lit(None, dtype=pl.Float64)
        return pl.col("entitlement").replace_strict(ents, [getattr(weights[e], name) for e in ents], default=None,
                                                    return_dtype=pl.Float64)

    uncached = pl.col("prompt_tokens") - pl.col("cached_prompt_tokens")
    cost = (uncached * weight("prompt") + pl.col("cached_prompt_tokens") * weight("cached_prompt")
            + pl.col("completion_tokens") * weight("completion"))
    columns = table.columns
    at = columns.index(COUNTS[-1]) + 1
    return table.with_columns(cost.cast(pl.Float64).alias(COST)).select(*columns[:at], COST, *columns[at:])


def from_records(usage: pl.DataFrame) -> pl.DataFrame:
    """The usage rows a ``usage`` table holds (rows of ``UsageRecord``, as ``replay.trace`` writes them): per
    (tenant, entitlement, model, day) the record with the highest ``version`` (the day's cumulative total; the
    later of equal versions in frame order), as a compacted topic keeps the newest."""
    if usage.is_empty():
        return empty_rows()
    newest = (usage.with_row_index("__order").sort(["version", "__order"])
              .group_by(list(KEY), maintain_order=True).last())
    tokens = [pl.col("usage").str.json_path_match(f"$.{name}").cast(pl.Int64).fill_null(0).alias(name)
              for name in COUNTS]
    rows = newest.select(*KEY, pl.col("labels").fill_null(NO_LABELS), *tokens).sort(list(KEY))
    return rows.cast(ROWS)  # type: ignore[arg-type]


def select(rows: pl.DataFrame, filters: Filters) -> pl.DataFrame:
    """The rows ``filters`` keep."""
    keep = pl.lit(True)
    if filters.tenants:
        keep &= pl.col("tenant").is_in(list(filters.tenants))
    if filters.entitlements:
        keep &= pl.col("entitlement").is_in(list(filters.entitlements))
    if filters.since_day is not None:
        keep &= pl.col("day") >= filters.since_day
    if filters.until_day is not None:
        keep &= pl.col("day") < filters.until_day
    return rows.filter(keep)


def aggregate(rows: pl.DataFrame, by: By = By.DAY, filters: Filters = Filters()) -> pl.DataFrame:
    """Totals per tenant, entitlement, model and day (``day``, YYYY-MM-DD) or month (``month``, YYYY-MM), sorted
    by them; ``labels`` are those of the group's latest day that has any. Exact: sums of integers."""
    period = pl.col("day") if by is By.DAY else pl.col("day").str.slice(0, 7)
    keyed = select(rows, filters).with_columns(period.alias(by.value))
    groups = ["tenant", "entitlement", "model", by.value]
    labelled = pl.when(pl.col("labels") != NO_LABELS).then(pl.col("labels"))
    return (keyed.sort(groups + (["day"] if by is By.MONTH else []), maintain_order=True)
            .group_by(groups, maintain_order=True)
            .agg(*(pl.col(name).sum() for name in COUNTS), labelled.drop_nulls().last().alias("labels"))
            .with_columns(pl.col("labels").fill_null(NO_LABELS))
            .select(*groups, *COUNTS, "labels"))


def reconcile(events: pl.DataFrame, ledger: pl.DataFrame, filters: Filters = Filters()) -> pl.DataFrame:
    """Every (tenant, entitlement, model, day) whose totals differ between two sources' rows (labels are not
    compared), with both sides' counts (``events_<count>``, ``ledger_<count>``; null on the side that lacks the
    key), sorted by the key. Empty when they reconcile exactly."""
    sides = []
    for name, rows in (("events", events), ("ledger", ledger)):
        totals = aggregate(rows, By.DAY, filters).drop("labels")
        sides.append(totals.rename({c: f"{name}_{c}" for c in COUNTS}))
    joined = sides[0].join(sides[1], on=list(KEY), how="full", coalesce=True)
    differs = pl.lit(False)
    for name in COUNTS:
        differs |= pl.col(f"events_{name}").ne_missing(pl.col(f"ledger_{name}"))
    return joined.filter(differs).sort(list(KEY)).select(
        *KEY, *(f"{side}_{name}" for side in ("events", "ledger") for name in COUNTS))


def describe(differences: pl.DataFrame) -> list[str]:
    """One line per difference: the key, then each count that differs, or which side lacks the key."""
    lines = []
    for row in differences.iter_rows(named=True):
        key = "/".join(str(row[k]) for k in KEY)
        if row["ledger_requests"] is None:
            lines.append(f"{key}: only in the events ({_counts(row, 'events')})")
        elif row["events_requests"] is None:
            lines.append(f"{key}: only in the ledger ({_counts(row, 'ledger')})")
        else:
            diffs = [f"{name} events {row[f'events_{name}']} ledger {row[f'ledger_{name}']}"
                     for name in COUNTS if row[f"events_{name}"] != row[f"ledger_{name}"]]
            lines.append(f"{key}: " + "; ".join(diffs))
    return lines


def _counts(row: dict[str, object], side: str) -> str:
    return ", ".join(f"{name} {row[f'{side}_{name}']}" for name in COUNTS)
