"""``tokenpools usage``: the aggregation of completion events and of the ledger's records, and reconciliation,
on a synthetic recorded log (late events across a UTC midnight that is also a month end, re-delivered duplicates,
batch elements sharing an offset)."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from tokenpools.cli import main
from tokenpools.errors import PermanentError
from tokenpools.replay import trace, usage, usage_sources
from tokenpools.topics.records import RequestCompleted, UsageRecord
from tokenpools_dev import builders


def ms(text: str) -> int:
    return int(dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC).timestamp() * 1000)


BEFORE_MIDNIGHT = ms("2026-11-30T23:59:58")  # the last day of November, UTC
AFTER_MIDNIGHT = ms("2026-12-01T00:00:01")
LATER = ms("2026-12-01T10:00:00")

SPECS = [  # entitlement e-a: tenant acme, then renamed acme-corp at 2026-12-01T05:00; e-b: beta; e-x: no spec rows
    builders.spec_record("TokenPool", "p1", {"model": "org/model-8b"}, t_ms=ms("2026-11-30T00:00:00")),
    builders.spec_record("TokenEntitlement", "e-a", {"tenantId": "acme"}, pool="p1", state="Bound",
                         t_ms=ms("2026-11-30T12:00:00")),
    builders.spec_record("TokenEntitlement", "e-b", {"tenantId": "beta"}, pool="p1", state="Bound",
                         t_ms=ms("2026-11-30T12:00:00")),
    builders.spec_record("TokenEntitlement", "e-a", {"tenantId": "acme-corp"}, pool="p1", state="Bound",
                         t_ms=ms("2026-12-01T05:00:00")),
]


def completion(rid: str, ent: str, t_ms: int, prompt: int, cached: int, output: int,
               pool: str = "p1") -> RequestCompleted:
    return builders.completed(rid, t_ms, pool=pool, entitlement=ent, proxy_id="px", admitted_t_ms=t_ms - 500,
                              prompt_tokens=prompt, completion_tokens=output, cached_prompt_tokens=cached,
                              reserved_tokens=prompt + 64, kv_bytes=1024, ttft_s=0.1, e2e_s=0.5)


# (partition, offset, record): what the completions topic held, in Kafka order per partition
EVENTS = [
    (0, 10, completion("r1", "e-a", BEFORE_MIDNIGHT - 60_000, 100, 40, 10)),  # e-a before its first spec row: acme
    (0, 11, completion("r2", "e-a", BEFORE_MIDNIGHT, 200, 0, 20)),
    (0, 12, completion("r3", "e-a", AFTER_MIDNIGHT, 300, 100, 30)),
    (0, 12, completion("r4", "e-b", AFTER_MIDNIGHT, 50, 0, 5)),  # a batch: two elements share offset 12
    (0, 13, completion("r5", "e-a", BEFORE_MIDNIGHT + 1000, 7, 7, 1)),  # late: later offset, earlier event time
    (0, 14, completion("r6", "e-a", LATER, 1000, 500, 100)),  # after the rename: tenant acme-corp
    (1, 3, completion("r7", "e-x", AFTER_MIDNIGHT, 11, 0, 2, pool="p2")),  # no spec rows: names stand in
    (1, 4, completion("r8", "e-b", BEFORE_MIDNIGHT, 13, 3, 4)),
]
DUPLICATES = [  # a proxy's spool re-sends a batch after a crash (same events, new offsets), and a second recording
    (0, 20, EVENTS[2][2]), (0, 20, EVENTS[3][2]), (1, 4, EVENTS[7][2]),
]
# the totals by hand: (tenant, entitlement, model, day) -> prompt, cached, completion, requests
EXPECTED = {
    ("acme", "e-a", "org/model-8b", "2026-11-30"): (100 + 200 + 7, 40 + 0 + 7, 10 + 20 + 1, 3),
    ("acme", "e-a", "org/model-8b", "2026-12-01"): (300, 100, 30, 1),
    ("acme-corp", "e-a", "org/model-8b", "2026-12-01"): (1000, 500, 100, 1),
    ("beta", "e-b", "org/model-8b", "2026-11-30"): (13, 3, 4, 1),
    ("beta", "e-b", "org/model-8b", "2026-12-01"): (50, 0, 5, 1),
    ("e-x", "e-x", "p2", "2026-12-01"): (11, 0, 2, 1),
}


def _write(root: Path, table: str, rows: list[tuple[int, int, object]]) -> None:
    by_partition: dict[int, list[dict[str, object]]] = {}
    for partition, offset, record in rows:
        by_partition.setdefault(partition, []).append(trace.record_row(record, partition, offset))
    for partition, part in sorted(by_partition.items()):
        trace.write_partitioned(root, table, trace.frame(table, part), partition, -1)


def ledger_records(expected: dict[tuple[str, str, str, str], tuple[int, int, int, int]]) -> list[UsageRecord]:
    """What the agents' ledger would publish: per key an early partial version, then the day's total."""
    records = []
    for (tenant, ent, model, day), (prompt, cached, output, requests) in sorted(expected.items()):
        t_ms = ms(f"{day}T12:00:00")
        pool = "p2" if ent == "e-x" else "p1"
        for version, share in ((1, 0), (2, 1)):
            records.append(UsageRecord(tenant=tenant, entitlement=ent, pool=pool, model=model, day=day,
                                       labels={"team": "ml"} if ent == "e-a" else {},
                                       usage={"prompt_tokens": prompt * share,
                                              "cached_prompt_tokens": cached * share,
                                              "completion_tokens": output * share,
                                              "requests": max(1, requests * share)},
                                       version=version, t_ms=t_ms))
    return records


@pytest.fixture
def log(tmp_path: Path) -> Path:
    root = tmp_path / "log"
    _write(root, trace.COMPLETIONS, EVENTS)
    (root_dup := tmp_path / "dup").mkdir()
    _write(root_dup, trace.COMPLETIONS, DUPLICATES)  # other files, same tables: moved into the log below
    for path in trace.table_files(root_dup, trace.COMPLETIONS):
        target = root / path.relative_to(root_dup)
        target.parent.mkdir(parents=True, exist_ok=True)
        target = target.with_name(target.stem + "-again.parquet")
        path.rename(target)
    _write(root, "spec", [(0, i, s) for i, s in enumerate(SPECS)])
    records = ledger_records(EXPECTED)
    newest_first = sorted(records, key=lambda r: -r.version)  # log order is not version order
    _write(root, "usage", [(0, i, r) for i, r in enumerate(newest_first)])
    return root


def totals(table: pl.DataFrame, period: str = "day") -> dict[tuple[str, ...], tuple[int, ...]]:
    return {(r["tenant"], r["entitlement"], r["model"], r[period]): tuple(r[c] for c in usage.COUNTS)
            for r in table.iter_rows(named=True)}


# ---------------------------------------------------------------- the aggregation


def test_the_log_holds_duplicates_and_late_events(log: Path) -> None:
    completed = trace.read_table(log, trace.COMPLETIONS)
    assert completed.height == len(EVENTS) + len(DUPLICATES)
    counts = Counter(completed["request_id"].to_list())
    assert {rid for rid, n in counts.items() if n > 1} == {"r3", "r4", "r8"}


def test_totals_equal_the_sum_of_distinct_events(log: Path) -> None:
    rows = usage_sources.log_events(log)
    assert rows.height == len(EVENTS)  # one row per distinct completion
    table = usage.aggregate(rows, usage.By.DAY)
    assert totals(table) == EXPECTED
    by_hand = [sum(e[2].prompt_tokens for e in EVENTS), sum(e[2].cached_prompt_tokens for e in EVENTS),
               sum(e[2].completion_tokens for e in EVENTS), len(EVENTS)]
    assert [table[c].sum() for c in usage.COUNTS] == by_hand
    assert table.columns == ["tenant", "entitlement", "model", "day", *usage.COUNTS, "labels"]
    assert table.schema["prompt_tokens"] == pl.Int64


def test_a_late_event_counts_in_its_own_day_not_the_day_it_arrived(log: Path) -> None:
    table = usage.aggregate(usage_sources.log_events(log), usage.By.DAY)
    november = totals(table)[("acme", "e-a", "org/model-8b", "2026-11-30")]
    assert november[0] == 100 + 200 + 7  # r5 arrived after r3 (offset 13 > 12) but happened before midnight


def test_month_grouping_across_the_month_end(log: Path) -> None:
    table = usage.aggregate(usage_sources.log_events(log), usage.By.MONTH)
    assert table.columns[:4] == ["tenant", "entitlement", "model", "month"]
    assert totals(table, "month") == {
        ("acme", "e-a", "org/model-8b", "2026-11"): (307, 47, 31, 3),
        ("acme", "e-a", "org/model-8b", "2026-12"): (300, 100, 30, 1),
        ("acme-corp", "e-a", "org/model-8b", "2026-12"): (1000, 500, 100, 1),
        ("beta", "e-b", "org/model-8b", "2026-11"): (13, 3, 4, 1),
        ("beta", "e-b", "org/model-8b", "2026-12"): (50, 0, 5, 1),
        ("e-x", "e-x", "p2", "2026-12"): (11, 0, 2, 1),
    }


def test_months_sum_their_days(log: Path) -> None:
    rows = usage_sources.log_events(log)
    days = usage.aggregate(rows, usage.By.DAY).with_columns(pl.col("day").str.slice(0, 7).alias("month"))
    months = usage.aggregate(rows, usage.By.MONTH)
    summed = days.group_by(["tenant", "entitlement", "model", "month"]).agg(pl.col(c).sum() for c in usage.COUNTS)
    assert totals(summed, "month") == totals(months, "month")


def test_filters(log: Path) -> None:
    rows = usage_sources.log_events(log)
    december = usage.aggregate(rows, usage.By.DAY, usage.Filters(since_day="2026-12-01"))
    assert set(december["day"].to_list()) == {"2026-12-01"}
    november = usage.aggregate(rows, usage.By.DAY, usage.Filters(until_day="2026-12-01"))
    assert set(november["day"].to_list()) == {"2026-11-30"}
    beta = usage.aggregate(rows, usage.By.MONTH, usage.Filters(tenants=("beta",)))
    assert set(beta["tenant"].to_list()) == {"beta"} and beta.height == 2
    ents = usage.aggregate(rows, usage.By.DAY, usage.Filters(entitlements=("e-x", "e-b")))
    assert set(ents["entitlement"].to_list()) == {"e-x", "e-b"}


def test_the_ledger_records_newest_version_per_key(log: Path) -> None:
    ledger = usage_sources.log_ledger(log)
    assert totals(usage.aggregate(ledger, usage.By.DAY)) == EXPECTED
    labelled = usage.aggregate(ledger, usage.By.MONTH).filter(pl.col("entitlement") == "e-a")
    assert set(labelled["labels"].to_list()) == {'{"team":"ml"}'}


def test_topic_records_become_rows_of_the_same_shape() -> None:
    rows = usage_sources.records_rows(ledger_records(EXPECTED))
    assert rows.schema == pl.Schema(usage.ROWS)
    assert totals(usage.aggregate(rows)) == EXPECTED
    assert usage_sources.records_rows([]).schema == pl.Schema(usage.ROWS)


def test_a_log_without_usage_records_is_refused_as_a_ledger(tmp_path: Path) -> None:
    _write(tmp_path, trace.COMPLETIONS, EVENTS)
    with pytest.raises(PermanentError, match="no usage records"):
        usage_sources.log_ledger(tmp_path)
    with pytest.raises(PermanentError, match="no such log directory"):
        usage_sources.log_events(tmp_path / "nope")


# ---------------------------------------------------------------- reconciliation


def test_reconcile_equal(log: Path) -> None:
    assert usage.reconcile(usage_sources.log_events(log), usage_sources.log_ledger(log)).is_empty()


def test_reconcile_finds_a_changed_total_and_names_its_key() -> None:
    events = usage.from_records(trace.frame("usage", [trace.record_row(r) for r in ledger_records(EXPECTED)]))
    changed = dict(EXPECTED)
    key = ("beta", "e-b", "org/model-8b", "2026-12-01")
    changed[key] = (50, 0, 6, 1)  # one completion token more
    del changed[("e-x", "e-x", "p2", "2026-12-01")]
    changed[("ghost", "e-g", "org/model-8b", "2026-12-01")] = (1, 0, 1, 1)
    differences = usage.reconcile(events, usage_sources.records_rows(ledger_records(changed)))
    assert differences.height == 3
    lines = usage.describe(differences)
    assert lines == [
        "beta/e-b/org/model-8b/2026-12-01: completion_tokens events 5 ledger 6",
        "e-x/e-x/p2/2026-12-01: only in the events (prompt_tokens 11, cached_prompt_tokens 0, completion_tokens 2, "
        "requests 1)",
        "ghost/e-g/org/model-8b/2026-12-01: only in the ledger (prompt_tokens 1, cached_prompt_tokens 0, "
        "completion_tokens 1, requests 1)",
    ]


def test_reconcile_respects_the_filters() -> None:
    changed = dict(EXPECTED)
    changed[("beta", "e-b", "org/model-8b", "2026-12-01")] = (51, 0, 5, 1)
    events = usage_sources.records_rows(ledger_records(EXPECTED))
    ledger = usage_sources.records_rows(ledger_records(changed))
    assert usage.reconcile(events, ledger).height == 1
    assert usage.reconcile(events, ledger, usage.Filters(until_day="2026-12-01")).is_empty()
    assert usage.reconcile(events, ledger, usage.Filters(tenants=("acme",))).is_empty()


# ---------------------------------------------------------------- the command


def test_cli_table_csv_and_parquet_round_trip(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv, parquet = tmp_path / "u.csv", tmp_path / "u.parquet"
    assert main(["usage", "--log", str(log), "--by", "month", "--csv", str(csv), "--parquet", str(parquet)]) == 0
    out = capsys.readouterr().out
    assert "usage by month" in out and "acme-corp" in out and "2026-11" in out
    assert "1,300" not in out and "1,000" in out  # thousands separators; no cross-tenant sums
    expected = usage.aggregate(usage_sources.log_events(log), usage.By.MONTH)
    assert pl.read_parquet(parquet).equals(expected)
    from_csv = pl.read_csv(csv, schema=expected.schema)
    assert from_csv.equals(expected)


def test_cli_filters_and_bad_dates(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    csv = tmp_path / "u.csv"
    assert main(["usage", "--log", str(log), "--tenant", "beta", "--since", "2026-12", "--csv", str(csv)]) == 0
    assert pl.read_csv(csv)["day"].to_list() == ["2026-12-01"]
    capsys.readouterr()
    assert main(["usage", "--log", str(log), "--since", "December"]) == 2
    assert "--since expects YYYY-MM-DD or YYYY-MM" in capsys.readouterr().err
    assert main(["usage", "--reconcile"]) == 2
    assert "--reconcile needs --log" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--tenant", "beta", "--entitlement", "e-a"], ["--since", "2027-01-01"],
                                  ["--until", "2026-11-01", "--by", "month"]])
def test_a_selection_of_nothing_is_said_not_only_an_empty_table(log: Path, argv: list[str],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Names that exist but not together, or days the log has none of: the table is empty, and stderr says which
    options left everything out and which days the log has."""
    assert main(["usage", str(log), *argv]) == 0
    err = capsys.readouterr().err
    assert f"warning: no usage in the completion events of {log} matches {' '.join(argv[:2])}" in err
    assert "its days run from 2026-11-30 to 2026-12-01, UTC" in err
    assert main(["usage", str(log), "--tenant", "beta"]) == 0
    assert "no usage in" not in capsys.readouterr().err  # a selection that keeps rows says nothing


def test_cli_reconcile_exit_codes(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["usage", "--log", str(log), "--reconcile"]) == 0
    assert "reconciled" in capsys.readouterr().out
    other = tmp_path / "other"  # a second log: the same ledger but one day's total changed
    changed = dict(EXPECTED)
    changed[("acme", "e-a", "org/model-8b", "2026-11-30")] = (307, 47, 31, 4)
    _write(other, "usage", [(0, i, r) for i, r in enumerate(ledger_records(changed))])
    assert main(["usage", "--log", str(log), "--reconcile", "--ledger", str(other)]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["acme/e-a/org/model-8b/2026-11-30: requests events 3 ledger 4"]
    assert "not reconciled: 1" in captured.err
    assert main(["usage", "--log", str(log), "--reconcile", "--ledger", str(other), "--until", "2026-11-30"]) == 0


def test_an_empty_log_gives_an_empty_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tmp_path.joinpath("log").mkdir()
    rows = usage_sources.log_events(tmp_path / "log")
    assert rows.is_empty() and rows.schema == pl.Schema(usage.ROWS)
    assert usage.aggregate(rows, usage.By.MONTH).columns == ["tenant", "entitlement", "model", "month",
                                                               *usage.COUNTS, "labels"]
    assert main(["usage", "--log", str(tmp_path / "log")]) == 0
    assert "usage by day" in capsys.readouterr().out


# ---------------------------------------------------------------- the ledger's retention, on the events side

def test_the_events_side_leaves_out_what_the_ledger_counts_nowhere_in_its_folding_order(tmp_path: Path) -> None:
    """The ledger's rule, per (pool, entitlement) in offset order: a completion whose UTC day is ``retention_days``
    or more before the newest one so far is counted nowhere. An old event time *before* a newer one in offset order
    counts (it was the newest then); after it, it does not; another entitlement has its own newest."""
    day = 86_400_000
    rows = [
        (0, 1, completion("old-first", "e-a", LATER - 5 * day, 1, 0, 1)),  # the newest so far: counted
        (0, 2, completion("new", "e-a", LATER, 2, 0, 1)),
        (0, 3, completion("two-days-late", "e-a", LATER - 2 * day, 4, 0, 1)),  # within 3 days: counted
        (0, 4, completion("three-days-late", "e-a", LATER - 3 * day, 8, 0, 1)),  # beyond: nowhere
        (1, 1, completion("other", "e-b", LATER - 4 * day, 16, 0, 1)),  # e-b's own newest: counted
    ]
    _write(tmp_path, trace.COMPLETIONS, rows)
    completions = trace.read_table(tmp_path, trace.COMPLETIONS)
    kept = usage.within_retention(completions, retention_days=3)
    assert kept["request_id"].to_list() == [r for r in completions["request_id"].to_list() if r != "three-days-late"]
    events, left_out = usage_sources.log_ledger_events(tmp_path, retention_days=3)
    assert left_out == 1 and events["prompt_tokens"].sum() == 1 + 2 + 4 + 16
    assert usage.within_retention(completions, retention_days=4).height == len(rows)


def test_stand_in_tenants_and_models_are_said_on_stderr(log: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Events whose spec rows name no tenantId or model get the entitlement and the pool as stand-ins: the table
    says so in one warning line (exit 0), not in silence, counting only those events."""
    assert main(["usage", "--log", str(log)]) == 0  # one of its events has an entitlement without spec rows
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "shows the entitlement for 1 and the model column shows the pool for 1 of" in err[0]
    bare = tmp_path / "bare"
    _write(bare, trace.COMPLETIONS, EVENTS)  # no spec rows at all
    assert main(["usage", "--log", str(bare)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("warning: the tenant column shows the entitlement for ")
    assert "the model column shows the pool for " in err[0]


def test_a_completion_the_broker_holds_twice_counts_once_as_in_the_ledger(tmp_path: Path) -> None:
    """The events side counts by the same rule as the agents' ledger (core.resends): a spool re-send at a later
    offset repeats the identity and counts once; the two sides agree on the tokens."""
    from tokenpools.streams.budgets import ledger as ledger_algebra
    from tokenpools.streams.table.pool_state import Position

    def identified(rid: str, sequence: int, t_ms: int, prompt: int) -> RequestCompleted:
        return completion(rid, "e-a", t_ms, prompt, 0, 1).model_copy(
            update={"proxy_start_ms": 5, "sequence": sequence})

    first = [identified(f"r{n}", n, AFTER_MIDNIGHT + n, 10 * n) for n in range(1, 6)]
    rows = [(0, 10 + k, record) for k, record in enumerate(first)]
    rows += [(0, 20, first[1]), (0, 21, first[3]), (0, 22, first[1])]  # the broker holds r2 three times, r4 twice
    _write(tmp_path, trace.COMPLETIONS, rows)
    completions = trace.read_table(tmp_path, trace.COMPLETIONS)
    once = usage.counted_once(completions)
    assert once["request_id"].to_list() == [f"r{n}" for n in range(1, 6)]
    ledger, outcomes = ledger_algebra.fold(ledger_algebra.new("p1", "e-a", "p1", 0),
                              [(r, Position("c/0", offset, None)) for _, offset, r in rows], ledger_algebra.Context(), 3)
    assert outcomes.count(ledger_algebra.Folded.RESENT) == 3
    events, left_out = usage_sources.log_ledger_events(tmp_path, retention_days=3)
    assert left_out == 0
    assert [entry.usage.prompt for entry in ledger.days.values()] == [events["prompt_tokens"].sum()] == [150]


# ---------------------------------------------------------------- time zones, prices, the positional LOG

BERLIN = "Europe/Berlin"  # UTC+1 in November and December: every event of the 30th's last minute is on the 1st


def test_days_and_months_in_a_time_zone(log: Path) -> None:
    rows = usage_sources.log_events(log, BERLIN)
    by_month = totals(usage.aggregate(rows, usage.By.MONTH), "month")
    assert by_month == {  # nothing is left in November, Berlin time
        ("acme", "e-a", "org/model-8b", "2026-12"): (100 + 200 + 7 + 300, 40 + 0 + 7 + 100, 10 + 20 + 1 + 30, 4),
        ("acme-corp", "e-a", "org/model-8b", "2026-12"): (1000, 500, 100, 1),
        ("beta", "e-b", "org/model-8b", "2026-12"): (13 + 50, 3, 4 + 5, 2),
        ("e-x", "e-x", "p2", "2026-12"): (11, 0, 2, 1),
    }
    west = totals(usage.aggregate(usage_sources.log_events(log, "America/New_York"), usage.By.DAY))
    assert {key[3] for key in west} == {"2026-11-30", "2026-12-01"}  # 19:00 on the 30th; 05:00 on the 1st


@pytest.mark.parametrize("zone", ["UTC", BERLIN, "America/New_York", "Asia/Kathmandu", "Pacific/Kiritimati"])
def test_a_time_zone_moves_usage_between_days_but_never_changes_its_sum(log: Path, zone: str) -> None:
    utc = usage.aggregate(usage_sources.log_events(log), usage.By.DAY)
    local = usage.aggregate(usage_sources.log_events(log, zone), usage.By.DAY)
    assert [local[c].sum() for c in usage.COUNTS] == [utc[c].sum() for c in usage.COUNTS]


def test_price_is_the_budget_formula_per_entitlement() -> None:
    from tokenpools.core.budgets import Usage, Weights

    table = usage.aggregate(usage.from_completions(
        trace.frame(trace.COMPLETIONS, [trace.record_row(r) for _, _, r in EVENTS]),
        trace.frame("spec", [trace.record_row(s) for s in SPECS])), usage.By.MONTH)
    weights = {"e-a": Weights(prompt=1.0, cached_prompt=0.1, completion=4.0), "e-b": Weights(2.0, 2.0, 2.0)}
    priced = usage.price(table, weights)
    assert priced.columns == [*table.columns[:-1], usage.COST, "labels"]
    for row in priced.iter_rows(named=True):
        spent = Usage(row["prompt_tokens"], row["cached_prompt_tokens"], row["completion_tokens"])
        if row["entitlement"] in weights:
            assert row[usage.COST] == pytest.approx(spent.cost(weights[row["entitlement"]]))
        else:
            assert row[usage.COST] is None  # e-x has no budget: no price, not a price of 0
    e_b = priced.filter(pl.col("entitlement") == "e-b")[usage.COST].sum()
    assert e_b == 2.0 * (13 + 50 + 4 + 5)  # all weights 2: twice its tokens


def _entitlement(name: str, *budgets: tuple[str, float, float, float]) -> object:
    from tokenpools.core.budgets import BudgetSpec, Period, Weights
    from tokenpools.core.classes import ServiceClass

    return builders.entitlement_spec(name, ServiceClass.SPOT, pool="p1", slo_ms=30_000, budgets=tuple(
        BudgetSpec(name=b, period=Period.MONTH, amount=1e6, weights=Weights(p, c, o)) for b, p, c, o in budgets))


def test_budget_weights_choose_one_budget_or_refuse_to_guess() -> None:
    from tokenpools.core.budgets import Weights

    ents = {"e-a": _entitlement("e-a", ("monthly", 1, 0.1, 4), ("daily", 1, 1, 1)),
            "e-b": _entitlement("e-b", ("monthly", 2, 2, 2)), "e-x": _entitlement("e-x")}
    with pytest.raises(ValueError, match="e-a's budgets price tokens differently"):
        usage.budget_weights(ents)
    assert usage.budget_weights(ents, "monthly") == {"e-a": Weights(1, 0.1, 4), "e-b": Weights(2, 2, 2)}
    assert usage.budget_weights(ents, "daily") == {"e-a": Weights(1, 1, 1)}
    with pytest.raises(ValueError, match="no entitlement has a budget named 'weekly' .*daily, monthly"):
        usage.budget_weights(ents, "weekly")
    alike = {"e-a": _entitlement("e-a", ("monthly", 1, 0.5, 3), ("daily", 1, 0.5, 3))}
    assert usage.budget_weights(alike) == {"e-a": Weights(1, 0.5, 3)}


PRICED_CONFIG = """\
apiVersion: tokenpools.io/v1alpha1
kind: TokenPool
metadata: {name: p1}
spec:
  model: org/model-8b
  backendRef: {apiVersion: apps/v1, kind: Deployment, name: vllm}
  perReplica: {tokensPerSecond: 480, kvCacheGiB: 8, concurrency: 16}
  kvGeometry: {layers: 36, kvHeads: 8, headDim: 128, bytesPerElement: 2}
---
apiVersion: tokenpools.io/v1alpha1
kind: TokenEntitlement
metadata: {name: e-a}
spec:
  tenantId: acme
  poolRef: {name: p1}
  qos: {serviceClass: guaranteed, sloTargetMs: 1200}
  resources: {tokensPerSecond: 100, kvCacheGiB: 1, concurrency: 2}
  budgets:
  - {name: monthly, period: month, timeZone: Europe/Berlin, amount: 1000000,
     weights: {prompt: 1.0, cachedPrompt: 0.1, completion: 4.0}}
"""


def test_cli_prices_in_the_budgets_zone_and_csv_matches_the_table(
        log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "priced.yaml"
    config.write_text(PRICED_CONFIG)
    csv = tmp_path / "u.csv"
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["usage", str(log), "--by", "month", "--tz", BERLIN, "--config", str(config),
                 "--csv", str(csv)]) == 0  # the positional LOG
    captured = capsys.readouterr()
    written = pl.read_csv(csv)
    assert written.columns == ["tenant", "entitlement", "model", "month", *usage.COUNTS, usage.COST, "labels"]
    header = next(line for line in captured.out.splitlines() if "tenant" in line)
    assert [c for c in written.columns if c != "labels"] == [cell.strip() for cell in header.split("┃")]
    acme = written.filter(pl.col("tenant") == "acme").row(0, named=True)
    assert acme["month"] == "2026-12" and acme[usage.COST] == pytest.approx((607 - 147) + 147 * 0.1 + 61 * 4)
    assert "usage by month (Europe/Berlin)" in captured.out and "718.70" in captured.out
    assert "no cost_units for e-b, e-x" in captured.err  # said, not a silent blank


def test_the_positional_log_and_log_option_are_one(log: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    assert main(["usage", str(log), "--csv", str(a)]) == 0
    assert main(["usage", "--log", str(log), "--csv", str(b)]) == 0
    assert main(["usage", str(log), "--log", str(log)]) == 0
    assert a.read_bytes() == b.read_bytes()
    capsys.readouterr()
    assert main(["usage", str(log), "--log", str(tmp_path)]) == 2
    assert "two logs named" in capsys.readouterr().err


def _with_specs(tmp_path: Path, bare: Path) -> Path:
    full = tmp_path / "full"
    _write(full, trace.COMPLETIONS, EVENTS)
    _write(full, "spec", [(0, i, s) for i, s in enumerate(SPECS)])
    return full


def test_a_config_names_the_tenants_and_models_a_log_lacks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A log without spec rows (the experiments' logs) stands the entitlement in for the tenant; ``--config``
    gives the real names (spec rows in force still win), and the stand-in warning goes."""
    bare = tmp_path / "bare"
    _write(bare, trace.COMPLETIONS, EVENTS)
    names = usage.Names(tenants={"e-a": "acme-from-config"}, models={"p1": "org/model-8b"})
    named = totals(usage.aggregate(usage_sources.log_events(bare, names=names), usage.By.MONTH), "month")
    assert {key[:3] for key in named} == {("acme-from-config", "e-a", "org/model-8b"),
                                          ("e-b", "e-b", "org/model-8b"), ("e-x", "e-x", "p2")}
    specs_win = totals(usage.aggregate(usage_sources.log_events(_with_specs(tmp_path, bare), names=names)), "day")
    assert "acme-from-config" not in {key[0] for key in specs_win}
    config = tmp_path / "priced.yaml"
    config.write_text(PRICED_CONFIG)
    assert main(["usage", str(bare), "--config", str(config)]) == 0
    captured = capsys.readouterr()
    assert "acme" in captured.out and "org/model-8b" in captured.out
    assert "the tenant column shows the entitlement for 3" in captured.err  # e-b (2 events) and e-x: not in the file
    assert "nor does --config" in captured.err


def test_budget_zone_is_the_budgets_one_zone_or_refuses_to_guess() -> None:
    from dataclasses import replace

    monthly = _entitlement("e-a", ("monthly", 1, 0.1, 4), ("daily", 1, 1, 1))
    berlin = replace(monthly, budgets=(replace(monthly.budgets[0], time_zone=BERLIN), monthly.budgets[1]))
    ents = {"e-a": berlin, "e-b": _entitlement("e-b")}
    assert usage.budget_zone(ents, "monthly") == BERLIN
    assert usage.budget_zone(ents, "daily") == "UTC"
    with pytest.raises(ValueError, match=r"more than one time zone \(daily UTC, monthly Europe/Berlin\)"):
        usage.budget_zone(ents)
    with pytest.raises(ValueError, match="no entitlement has a budget named 'weekly'"):
        usage.budget_zone(ents, "weekly")


def test_cli_tz_budget_is_the_budgets_zone(log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "priced.yaml"
    config.write_text(PRICED_CONFIG)
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    assert main(["usage", str(log), "--by", "month", "--config", str(config), "--tz", "budget", "--csv", str(a)]) == 0
    assert "usage by month (Europe/Berlin)" in capsys.readouterr().out
    assert main(["usage", str(log), "--by", "month", "--config", str(config), "--tz", BERLIN, "--csv", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()
