"""``tokenpools top``'s model and view without Kafka: the records of the limits, effective-limits and usage topics
in, rows and a screen out (the order, pages, versions, tombstones and bad records a compacted topic can hold)."""

from __future__ import annotations

import pytest
from rich.console import Console

from tokenpools.cli import COMMANDS, main
from tokenpools.core.capacity import Capacity
from tokenpools.core.classes import ServiceClass
from tokenpools.core.spec import EntitlementSpec
from tokenpools.core.tick import Signals, TickResult
from tokenpools.core.windows import UsageSample
from tokenpools.topics.codec import encode
from tokenpools.topics.effective import effective_limits
from tokenpools.topics.limits import build_limit_update, paginate
from tokenpools.topics.records import LimitUpdate, UsageRecord
from tokenpools.top.model import Applied, Row, TopModel, utc_day
from tokenpools.top.view import frame

T_MS = 1_780_000_000_000  # 2026-05-28 20:26:40 UTC
TODAY = "2026-05-28"
WIDTH_MS = 1000
GOLD = EntitlementSpec("gold", "pool-a", ServiceClass.GUARANTEED, 800.0, Capacity(500.0, 2e9, 8.0))
SPOT = EntitlementSpec("spot", "pool-a", ServiceClass.SPOT, 2000.0)


def tick(gold_limit: float = 500.0) -> TickResult:
    return TickResult(
        signals={"gold": Signals(burst=0.25, debt=0.5), "spot": Signals(burst=0.0, debt=-0.25)},
        priorities={"gold": 3.5, "spot": 0.2},
        limits={"gold": Capacity(gold_limit, 2e9, 8.0), "spot": Capacity(120.5, 1e9, 3.0)},
        contended=True, desired_replicas=2, lent=Capacity(),
    )


def update(version: int = T_MS, pool: str = "pool-a", gold_limit: float = 500.0) -> LimitUpdate:
    return build_limit_update(pool, version, version, tick(gold_limit), Capacity(1000.0, 4e9, 16.0), 1400.0, {})


def usage(entitlement: str, model: str, day: str, tokens: tuple[int, int], requests: int, version: int = 1,
          pool: str = "pool-a") -> tuple[bytes, bytes]:
    record = UsageRecord(tenant="acme", entitlement=entitlement, pool=pool, model=model, day=day, version=version,
                         t_ms=T_MS, usage={"prompt_tokens": tokens[0], "completion_tokens": tokens[1],
                                           "requests": requests})
    return f"acme/{entitlement}/{model}/{day}".encode(), encode(record)


def fed(*updates: LimitUpdate) -> TopModel:
    model = TopModel()
    for u in updates:
        assert model.apply_limits(u.pool.encode(), encode(u)) is Applied.SHOWN
    return model


def test_a_limit_update_gives_one_row_per_entitlement_with_its_limits_priority_and_debt() -> None:
    model = fed(update())
    assert model.rows(TODAY) == (
        Row("pool-a", "gold", None, 3.5, 0.5, 500.0, 8, None, None, 0, 0),
        Row("pool-a", "spot", None, 0.2, -0.25, 120.5, 3, None, None, 0, 0),
    )
    (pool,) = model.pools()
    assert (pool.pool, pool.version, pool.t_ms, pool.contended, pool.capacity_tokens_per_s, pool.capacity_slots,
            pool.entitlements) == ("pool-a", T_MS, T_MS, True, 1000.0, 16, 2)


def test_the_effective_limits_add_the_class_the_in_flight_and_the_refusals_of_the_last_window() -> None:
    model = fed(update())
    sample = UsageSample(start_ms=T_MS - WIDTH_MS, width_ms=WIDTH_MS, used=Capacity(410.0, 1.5e9, 6.5),
                         demand=Capacity(650.0, 2.5e9, 9.0), admitted=12, refused=3, completed=10, in_flight_at_end=7)
    for record in effective_limits(update(), [GOLD, SPOT], {"gold": sample, "spot": None}, WIDTH_MS):
        key = f"{record.pool}/{record.entitlement}".encode()
        assert model.apply_effective(key, encode(record)) is Applied.SHOWN
    gold, spot = model.rows(TODAY)
    assert (gold.service_class, gold.in_flight, gold.refused) == ("guaranteed", 7, 3)
    assert (spot.service_class, spot.in_flight, spot.refused) == ("spot", None, None)  # not measured yet
    assert model.apply_effective(b"pool-a/gold", None) is Applied.REMOVED  # it left the pool's ticks
    assert model.rows(TODAY)[0].service_class is None


def test_only_a_newer_version_replaces_the_one_shown() -> None:
    model = fed(update(T_MS + 1000, gold_limit=300.0))
    older = update(T_MS, gold_limit=900.0)
    assert model.apply_limits(b"pool-a", encode(older)) is Applied.STALE  # the compacted topic's older copy
    again = update(T_MS + 1000, gold_limit=700.0)
    assert model.apply_limits(b"pool-a", encode(again)) is Applied.STALE  # same version: not newer
    assert model.rows(TODAY)[0].limit_tokens_per_s == 300.0
    assert model.apply_limits(b"pool-a", encode(update(T_MS + 2000, gold_limit=250.0))) is Applied.SHOWN
    assert model.rows(TODAY)[0].limit_tokens_per_s == 250.0


def test_a_paged_update_is_shown_once_every_page_is_held_in_any_order() -> None:
    names = [f"e{i:03d}" for i in range(40)]
    big = update().model_copy(update={"entitlements": tuple(
        update().entitlements[0].model_copy(update={"name": n, "tokens_per_s": float(i)}) for i, n in enumerate(names))})
    paged = paginate(big, page_bytes=1000)
    assert len(paged) > 2
    model = TopModel()
    last_key, last_page = paged[0]
    for key, page in reversed(paged[1:]):
        assert model.apply_limits(key.encode(), encode(page)) is Applied.PENDING
        assert model.rows(TODAY) == ()
    assert model.apply_limits(last_key.encode(), encode(last_page)) is Applied.SHOWN
    rows = model.rows(TODAY)
    assert [r.entitlement for r in rows] == names and [r.limit_tokens_per_s for r in rows] == list(range(40))
    assert model.pools()[0].entitlements == 40


def test_a_pool_tombstone_removes_the_pool_and_a_page_tombstone_does_not() -> None:
    model = fed(update(pool="pool-a"), update(pool="pool-b"))
    assert model.apply_limits(b"pool-a#1", None) is Applied.STALE
    assert [p.pool for p in model.pools()] == ["pool-a", "pool-b"]
    assert model.apply_limits(b"pool-a", None) is Applied.REMOVED
    assert [p.pool for p in model.pools()] == ["pool-b"]
    assert model.apply_limits(b"pool-a", None) is Applied.STALE  # nothing left to remove


def test_records_that_do_not_decode_are_counted_and_never_shown() -> None:
    model = fed(update())
    assert model.apply_limits(b"pool-a", b"{not json") is Applied.INVALID
    unknown = encode(update(T_MS + 5)).replace(b'"schema_version":1', b'"schema_version":2')
    assert model.apply_limits(b"pool-a", unknown) is Applied.INVALID  # never guessed at
    assert model.apply_effective(b"pool-a/gold", encode(update())) is Applied.INVALID  # the wrong record type
    assert model.apply_usage(b"k", b"[]") is Applied.INVALID
    assert model.pools()[0].version == T_MS
    assert model.applied == {Applied.SHOWN: 1, Applied.INVALID: 4}


def test_todays_usage_is_the_newest_record_of_each_key_summed_over_models() -> None:
    model = fed(update())
    for key, value in (usage("gold", "llama", TODAY, (100, 50), 2, version=1),
                       usage("gold", "llama", TODAY, (300, 200), 5, version=3),  # cumulative: replaces
                       usage("gold", "llama", TODAY, (1, 1), 1, version=2),  # older: ignored
                       usage("gold", "qwen", TODAY, (10, 20), 1),
                       usage("gold", "llama", "2026-05-27", (9999, 9999), 99),  # yesterday
                       usage("spot", "llama", TODAY, (7, 0), 1, pool="pool-b")):  # another pool's spot
        model.apply_usage(key, value)
    gold, spot = model.rows(TODAY)
    assert (gold.today_tokens, gold.today_requests) == (300 + 200 + 10 + 20, 5 + 1)
    assert (spot.today_tokens, spot.today_requests) == (0, 0)
    assert model.rows("2026-05-27")[0].today_tokens == 2 * 9999
    assert model.apply_usage(b"acme/gold/qwen/" + TODAY.encode(), None) is Applied.REMOVED
    assert model.rows(TODAY)[0].today_tokens == 500


def test_only_the_pools_asked_for_are_shown() -> None:
    model = fed(update(pool="pool-a"), update(pool="pool-b"))
    assert {r.pool for r in model.rows(TODAY, only={"pool-b"})} == {"pool-b"}
    assert [p.pool for p in model.pools(only={"pool-b"})] == ["pool-b"]
    assert model.rows(TODAY, only={"nope"}) == ()


def test_the_day_is_the_utc_date_of_the_time_given() -> None:
    assert utc_day(T_MS) == TODAY
    assert utc_day(1_780_012_799_999) == TODAY and utc_day(1_780_012_800_000) == "2026-05-29"


def _text(renderable: object) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_the_screen_shows_every_pool_and_entitlement_with_its_limits() -> None:
    model = fed(update(pool="pool-a"), update(pool="pool-b"))
    model.apply_usage(*usage("gold", "llama", TODAY, (1200, 34), 3))
    screen = _text(frame(model.pools(), model.rows(TODAY), T_MS + 2500, TODAY, model.applied, ("tokenpools.usage",)))
    assert "pool-a" in screen and "pool-b" in screen and "gold" in screen and "spot" in screen
    gold_line = next(line for line in screen.splitlines() if "pool-a" in line and "gold" in line)
    assert [cell.strip() for cell in gold_line.split("│")[1:-1]] == [
        "pool-a", "gold", "-", "3.5", "+0.50", "500.0", "8", "-", "-", "1,234", "3"]
    assert "2.5" in next(line for line in screen.splitlines() if "pool-a" in line and "yes" in line)  # age s
    assert "3 records read; 3 shown; not found (yet): tokenpools.usage" in screen


def test_before_the_first_update_the_screen_says_it_is_waiting() -> None:
    screen = _text(frame((), (), T_MS, TODAY, {}))
    assert "no limit update yet" in screen and "0 records read" in screen


def test_the_command_row_points_at_the_top_module() -> None:
    row = next(c for c in COMMANDS if c.name == "top")
    assert (row.run, row.arguments) == ("tokenpools.top.app:run", "tokenpools.top.app:add_arguments")
    assert row.available()


@pytest.mark.parametrize("option", [["--refresh-ms", "0"], ["--timeout-s", "-1"], ["--refresh-ms", "often"]])
def test_a_bad_option_is_refused_before_any_connection(option: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", *option, "--set", "kafka.bootstrap_servers=127.0.0.1:1"]) == 2
    assert option[0] in capsys.readouterr().err
