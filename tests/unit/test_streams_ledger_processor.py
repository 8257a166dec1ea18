"""The ledger through the agents' shell (streams.processor): completions folded per entitlement beside the pool
state, published as budgets, usage and alerts; exact after re-deliveries and after a restore from any prefix of
the table's writes."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import replace

import orjson

from tokenpools.config import load_config_text
from tokenpools.core.budgets import BudgetSpec, Period, Weights
from tokenpools.core.spec import EntitlementSpec
from tokenpools.runtime.clock import FakeClock
from tokenpools.runtime.deadletter import DeadLetters
from tokenpools.runtime.specs import Catalogue
from tokenpools.streams.budgets import ledger as ledger_algebra
from tokenpools.streams.table import state
from tokenpools.streams.metrics import StreamMetrics
from tokenpools.streams.table.params import StreamParams
from tokenpools.streams.processor import DictStore, PoolProcessor, RawEvent
from tokenpools.streams.views import ProxyBook
from tokenpools.topics.codec import encode
from tokenpools.topics.declarations import topics_for
from tokenpools.topics.records import (BackendMetricsSample, BudgetAlert, BudgetStatus, DeadLetterReason,
                                       RequestCompleted, UsageRecord)
from tokenpools_dev.streams import scripted

BASE_MS = 1_700_000_000_000
DAY = ledger_algebra.utc_day(BASE_MS)
TOPICS = topics_for("t.")
LOADED = load_config_text(scripted.CONFIG_YAML)
PHASES = [(3, [scripted.Load("copilot", 6, proxies=("proxy-1", "proxy-2"))]),
          (3, [scripted.Load("copilot", 4, refuse_every=3), scripted.Load("batch", 5, proxies=("proxy-3",))])]
EVENTS = scripted.scripted_events(BASE_MS, 1000, PHASES, seed=5)
COMPLETIONS = [r for r, _ in EVENTS if isinstance(r, RequestCompleted)]
COPILOT_UNITS = sum(r.prompt_tokens + 2 * r.completion_tokens for r in COMPLETIONS if r.entitlement == "copilot")
BUDGETS = (BudgetSpec("daily", Period.DAY, COPILOT_UNITS * 0.6, weights=Weights(completion=2.0),
                      alert_thresholds=(0.5, 1.0)),
           BudgetSpec("monthly", Period.MONTH, 10**9, time_zone="Europe/Berlin"))
PARAMS = StreamParams(width_ms=1000, grace_ms=300, max_updates_per_tick=1000)
LEDGER = ledger_algebra.LedgerParams(retention_days=3, billing_labels=("team",))


class WithBudgets(Catalogue):
    """The scripted catalogue with budgets and labels on ``copilot`` (the YAML form of budgets is not this
    module's: the spec's own fields are set here)."""

    def entitlements_of(self, pool: str) -> tuple[EntitlementSpec, ...]:
        return tuple(replace(e, budgets=BUDGETS, labels=(("team", "ml"), ("zone", "eu"))) if e.name == "copilot"
                     else e for e in super().entitlements_of(pool))


def raw_events() -> list[RawEvent]:
    offsets: dict[str, int] = {}
    out = []
    for record, ts in EVENTS:
        topic = (TOPICS.backend_metrics if isinstance(record, BackendMetricsSample) else
                 TOPICS.completions if isinstance(record, RequestCompleted) else TOPICS.requests).name
        offset = offsets[topic] = offsets.get(topic, -1) + 1
        out.append(RawEvent(topic, 1, offset, ts, record.pool.encode(), encode(record)))
    return out


RAW = raw_events()


class RecordingStore(DictStore):
    """A DictStore that keeps the sequence of its writes, as the changelog would."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[tuple[bytes, bytes | None, int]] = []

    def put(self, key: bytes, value: bytes | None, partition: int) -> None:
        self.writes.append((key, value, partition))
        super().put(key, value, partition)


def processor(store: DictStore) -> tuple[PoolProcessor, scripted.Sent]:
    sent, metrics = scripted.Sent(), StreamMetrics()
    dead = DeadLetters(TOPICS.dead_letters.name, "ledger-test", FakeClock(BASE_MS), send=sent,
                       count=metrics.count_dead_letter)
    return PoolProcessor(PARAMS, TOPICS, WithBudgets.from_loaded(LOADED), ProxyBook(), store, sent, dead, metrics,
                         ledger=LEDGER), sent


def totals(entitlement: str) -> tuple[int, int, int, int]:
    rs = [r for r in COMPLETIONS if r.entitlement == entitlement]
    return (sum(r.prompt_tokens for r in rs), sum(r.cached_prompt_tokens for r in rs),
            sum(r.completion_tokens for r in rs), len(rs))


def tokens(t) -> tuple[int, int, int, int]:
    return t.prompt_tokens, t.cached_prompt_tokens, t.completion_tokens, t.requests


def run(proc: PoolProcessor, cuts: list[int], publish_at: set[int]) -> None:
    async def go() -> None:
        start = 0
        for end in sorted({*cuts, *publish_at, len(RAW)}):
            if end > start:
                await proc.process(RAW[start:end])
                start = end
            if end in publish_at:
                await proc.publish_ledgers()
        await proc.publish_ledgers()

    asyncio.run(go())


def test_completions_are_published_as_exact_budgets_usage_and_alerts_once():
    proc, sent = processor(DictStore())

    async def go() -> None:
        for start in range(0, len(RAW), 37):
            await proc.process(RAW[max(0, start - 10):start + 37])  # each batch re-delivers the last 10 records
            await proc.publish_ledgers()

    asyncio.run(go())
    usage = sent.compacted(TOPICS.usage.name)
    assert set(usage) == {f"tenant-a/copilot/test/model/{DAY}".encode(), f"tenant-b/batch/test/model/{DAY}".encode()}
    copilot = usage[f"tenant-a/copilot/test/model/{DAY}".encode()]
    assert isinstance(copilot, UsageRecord) and tokens(copilot.usage) == totals("copilot")
    assert copilot.labels == {"team": "ml"} and copilot.pool == scripted.POOL  # only the billing labels asked for
    assert tokens(usage[f"tenant-b/batch/test/model/{DAY}".encode()].usage) == totals("batch")
    budgets = sent.compacted(TOPICS.budgets.name)
    assert set(budgets) == {f"{scripted.POOL}/copilot/daily/entitlement".encode(),
                            f"{scripted.POOL}/copilot/monthly/entitlement".encode()}
    daily = budgets[f"{scripted.POOL}/copilot/daily/entitlement".encode()]
    assert isinstance(daily, BudgetStatus) and tokens(daily.spent) == totals("copilot")
    assert daily.spent_units == COPILOT_UNITS and daily.allowance == BUDGETS[0].amount and daily.tenant == "tenant-a"
    for topic in (TOPICS.budgets.name, TOPICS.usage.name):
        versions = defaultdict(list)
        for t, key, value in sent.records:
            if t == topic:
                versions[key].append(orjson.loads(value)["version"])
        assert all(v == list(range(1, len(v) + 1)) for v in versions.values()), versions
    alerts = sent.of(TOPICS.budget_alerts.name)
    assert [(a.budget, a.threshold) for a in alerts] == [("daily", 0.5), ("daily", 1.0)]
    assert all(isinstance(a, BudgetAlert) and a.spent_units >= a.threshold * a.allowance for a in alerts)
    assert proc.metrics.ledger_events.labels("applied")._value.get() == len(COMPLETIONS)
    assert proc.metrics.ledger_events.labels("duplicate")._value.get() > 0
    assert not sent.of(TOPICS.dead_letters.name)

    async def again() -> list[ledger_algebra.Publication]:
        return await proc.publish_ledgers()

    assert asyncio.run(again()) == []  # nothing changed: nothing sent


def test_a_completion_older_than_the_retention_is_dead_lettered_once():
    proc, sent = processor(DictStore())
    old = COMPLETIONS[0].model_copy(update={"t_ms": BASE_MS - 5 * ledger_algebra.DAY_MS, "request_id": "old"})

    async def go() -> None:
        await proc.process(RAW)
        await proc.tick(BASE_MS + 60_000)
        await proc.process([RawEvent(TOPICS.completions.name, 1, 10_000, BASE_MS + 61_000, old.pool.encode(),
                                     encode(old))])
        await proc.publish_ledgers()

    asyncio.run(go())
    letters = sent.of(TOPICS.dead_letters.name)
    assert [(d.reason, d.offset) for d in letters] == [(DeadLetterReason.LATE, 10_000)]  # the pool's, not twice
    assert proc.metrics.ledger_events.labels("late")._value.get() == 1
    assert tokens(sent.compacted(TOPICS.usage.name)[f"tenant-a/copilot/test/model/{DAY}".encode()].usage) == \
        totals("copilot")
    status = sent.compacted(TOPICS.budgets.name)[f"{scripted.POOL}/copilot/daily/entitlement".encode()]
    assert status.through_ms == (BASE_MS + 60_000 - PARAMS.grace_ms) // 1000 * 1000  # the closed windows' end


def ledgers(store: DictStore) -> dict[bytes, tuple]:
    out = {}
    for key, value in store.items():
        if ledger_algebra.is_ledger_key(key):
            ledger = ledger_algebra.decode(value)
            out[key] = ({k: d.usage for k, d in ledger.days.items()},
                        {n: (b.current, b.previous, b.alerted) for n, b in ledger.budgets.items()}, ledger.offsets)
    return out


def test_restoring_any_prefix_of_the_writes_and_reading_again_gives_the_uninterrupted_ledgers():
    """The pool's state and each ledger are separate writes: a crash between any two of them, then every event
    read again (the committed offsets may lag anywhere behind) in other batches, leaves each ledger exact."""
    uninterrupted = RecordingStore()
    proc, sent = processor(uninterrupted)
    run(proc, list(range(0, len(RAW), 23)), {50, 120})
    expected = ledgers(uninterrupted)
    assert len(expected) == 2
    statuses = {k: v.version for k, v in sent.compacted(TOPICS.budgets.name).items()}
    writes = uninterrupted.writes
    for cut in range(0, len(writes) + 1, 3):
        restored = DictStore()
        for key, value, partition in writes[:cut]:
            restored.put(key, value, partition)
        again, resent = processor(restored)
        run(again, list(range(0, len(RAW), 41)), {80})
        assert ledgers(restored) == expected, f"cut after write {cut} of {len(writes)}"
        published_before = {}
        for key, value, _ in writes[:cut]:
            if value is not None and ledger_algebra.is_ledger_key(key):
                for name, book in ledger_algebra.decode(value).budgets.items():
                    published_before[f"{scripted.POOL}/copilot/{name}".encode()] = book.published.version
        for key, record in resent.compacted(TOPICS.budgets.name).items():  # versions go on growing
            assert record.version > published_before.get(key, 0)
            assert tokens(record.spent) == totals("copilot")
        assert set(resent.compacted(TOPICS.budgets.name)) <= set(statuses)
        _, why = state.read(scripted.POOL, restored.items(), 1000)
        assert why == ""


def test_the_budget_records_carry_the_reservations_in_flight_and_go_again_when_only_they_change():
    """docs/budgets.md#the-others-reservations-in-flight: each budget record of an entitlement carries its requests'
    reservations in flight per proxy, as the pool's fleet counts hold them; a change of those alone (admissions, no
    completion) publishes the budgets again under new versions, and nothing changed sends nothing."""
    proc, sent = processor(DictStore())
    half = len(RAW) // 2
    t_mid = max(r.t_ms for r, _ in EVENTS[:half])

    async def publish(t_ms: int) -> list[ledger_algebra.Publication]:
        book = proc.counts.of(scripted.POOL, proc.pool_table.held(scripted.POOL).state)
        book.advance(t_ms, {})
        return await proc.publish_ledgers()

    asyncio.run(proc.process(RAW[:half]))
    first = asyncio.run(publish(t_mid - 1500))
    levels = proc.counts.reserved(scripted.POOL, "copilot")
    assert levels and set(levels) <= {"proxy-1", "proxy-2"}
    statuses = [s for p in first for s in p.statuses]
    assert statuses and all(s.reserved_tokens == levels for s in statuses if s.entitlement == "copilot")
    assert asyncio.run(proc.publish_ledgers()) == []  # nothing changed: nothing sent
    second = asyncio.run(publish(t_mid - 500))
    moved = proc.counts.reserved(scripted.POOL, "copilot")
    assert moved != levels
    again = {s.budget: s for p in second for s in p.statuses if s.entitlement == "copilot"}
    before = {s.budget: s for s in statuses if s.entitlement == "copilot"}
    assert set(again) == {"daily", "monthly"}
    for name, status in again.items():
        assert status.reserved_tokens == moved and status.version > before[name].version
    budgets = sent.compacted(TOPICS.budgets.name)
    assert budgets[f"{scripted.POOL}/copilot/daily/entitlement".encode()].reserved_tokens == moved
