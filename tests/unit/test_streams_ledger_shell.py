"""The ledgers on their own (streams.ledger_shell.Ledgers, no processor): a batch's completions folded into their
keys, published once, sent again in full when a rebalance interrupted the publication, and an unusable stored
ledger started afresh with a warning under the module's own logger. The scripted completions and budgets are
test_streams_ledger_processor's."""

from __future__ import annotations

import asyncio
import logging

from test_streams_ledger_processor import COMPLETIONS, LEDGER, LOADED, PARAMS, RAW, TOPICS, WithBudgets

from tokenpools.streams.budgets import ledger
from tokenpools.streams.budgets.ledger_shell import Ledgers
from tokenpools.streams.metrics import StreamMetrics
from tokenpools.streams.table.pool_state import Outcome, Position
from tokenpools.streams.table.pool_table import DictStore, PoolTable
from tokenpools_dev.streams import scripted


def ledgers(store: DictStore) -> tuple[Ledgers, scripted.Sent, StreamMetrics]:
    sent, metrics = scripted.Sent(), StreamMetrics()
    pools = PoolTable(store, PARAMS.width_ms, metrics)
    return (Ledgers(LEDGER, PARAMS.width_ms, TOPICS, WithBudgets.from_loaded(LOADED), store, pools, sent, metrics,
                    lambda key: 0), sent, metrics)


def fold_all(led: Ledgers) -> None:
    raws = [r for r in RAW if r.topic == TOPICS.completions.name]
    assert len(raws) == len(COMPLETIONS)
    items = [(raw, None, record) for raw, record in zip(raws, COMPLETIONS)]
    positions = [(record, Position(f"{raw.topic}/{raw.partition}", raw.offset, raw.timestamp_ms))
                 for raw, record in zip(raws, COMPLETIONS)]
    assert led.fold(scripted.POOL, 1, items, positions, [Outcome.APPLIED] * len(items)) == []  # nothing late


def keys(sent: scripted.Sent) -> list[tuple[str, bytes]]:
    return [(topic, key) for topic, key, _ in sent.records]


def test_completions_fold_into_their_keys_and_are_published_once():
    store = DictStore()
    led, sent, metrics = ledgers(store)
    fold_all(led)
    assert {k for k, _ in store.items()} == {ledger.ledger_key(scripted.POOL, "copilot"), ledger.ledger_key(scripted.POOL, "batch")}
    assert metrics.ledger_events.labels("applied")._value.get() == len(COMPLETIONS)
    published = asyncio.run(led.publish_ledgers())
    assert published and {t for t, _ in keys(sent)} == {TOPICS.budgets.name, TOPICS.usage.name,
                                                         TOPICS.budget_alerts.name}
    assert asyncio.run(led.publish_ledgers()) == []  # confirmed: nothing is due


def test_a_publication_a_rebalance_interrupted_is_sent_again_in_full():
    led, sent, _ = ledgers(DictStore())
    fold_all(led)

    async def rebalanced() -> None:  # the changelog awaited: a rebalance happens meanwhile
        led.forget()

    asyncio.run(led.publish_ledgers(rebalanced))
    first = keys(sent)
    assert asyncio.run(led.publish_ledgers()) != []
    assert keys(sent)[len(first):] == first  # nothing was confirmed: every key and alert again, in the same order
    assert asyncio.run(led.publish_ledgers()) == []


def test_an_unusable_stored_ledger_starts_afresh_with_a_warning_of_its_own(caplog):
    store = DictStore()
    store.put(ledger.ledger_key(scripted.POOL, "copilot"), b"{", 1)
    led, _, metrics = ledgers(store)
    with caplog.at_level(logging.WARNING, logger="tokenpools.streams.budgets.ledger_shell"):
        fold_all(led)
    assert [r.name for r in caplog.records] == ["tokenpools.streams.budgets.ledger_shell"]
    assert "stored value not usable" in caplog.records[0].getMessage()
    assert metrics.state_resets._value.get() == 1
    copilot = ledger.decode(store.get(ledger.ledger_key(scripted.POOL, "copilot")))  # type: ignore[arg-type]
    assert copilot.entitlement == "copilot" and copilot.pool == scripted.POOL
