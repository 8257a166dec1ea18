"""The agents' budget and usage ledger (streams.ledger): named invariants, as properties.

- EXACT: a day's usage and a kept period's spending equal the sum of the distinct completion events of that day
  or period that are not late, whatever the batch split, re-deliveries, the order of late events and crashes.
- ONCE: each alert threshold alerts once per period (a crash may re-send the very same key, never a new one).
- VERSIONS: the versions sent under one key strictly grow, across crashes.
- COMPACTED: the newest record of each key, after the last publication, is the ledger's total.
- COVERED: a ledger whose windows closed past what it folded is published again, once, so that a proxy stops
  counting its own completions the record already holds.
"""

from __future__ import annotations

from collections import defaultdict

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenpools.core.budgets import BudgetScope, BudgetSpec, Period, Usage, Weights
from tokenpools.proxy.admission.budgets import BudgetBook
from tokenpools.streams.budgets import ledger as ledger_algebra
from tokenpools.streams.table.pool_state import Position
from tokenpools.topics.records import CompletionStatus, RequestCompleted
from tokenpools_dev import builders

BASE_MS = 1_774_000_000_000  # 2026-03-20, a Friday; Europe/Berlin changes to summer time on the 29th
DAY_MS = ledger_algebra.DAY_MS
RETENTION = 4
SOURCE = "t.completions/3"
BUDGETS = (
    BudgetSpec("daily", Period.DAY, 3_000, alert_thresholds=(0.5, 1.0), rollover_max=500),
    BudgetSpec("weekly", Period.WEEK, 40_000.0, time_zone="Europe/Berlin",
               weights=Weights(prompt=1.0, cached_prompt=0.1, completion=3.0), alert_thresholds=(0.25, 0.8)),
    BudgetSpec("monthly", Period.MONTH, 10**9),
)
CONTEXT = ledger_algebra.Context(BUDGETS, "acme", (("team", "search"),), "llama")


def completion(i: int, t_ms: int, prompt: int, cached: int, out: int,
               status: CompletionStatus = CompletionStatus.OK) -> RequestCompleted:
    return builders.completed(f"r{i}", t_ms, pool="pool-a", entitlement="gold", proxy_id="px", admitted_t_ms=t_ms,
                              status=status, prompt_tokens=prompt, completion_tokens=out, cached_prompt_tokens=cached,
                              reserved_tokens=prompt + out, kv_bytes=0, e2e_s=0.1)


@st.composite
def logs(draw: st.DrawFn) -> list[tuple[RequestCompleted, Position]]:
    """A partition's completions in offset order: event times over ~10 days, out of order (late ones included)."""
    n = draw(st.integers(1, 40))
    events = []
    for i in range(n):
        t = BASE_MS + draw(st.integers(0, 10 * DAY_MS // 3_600_000)) * 3_600_000 + draw(st.integers(0, 3_599_999))
        prompt = draw(st.integers(0, 900))
        cached = draw(st.integers(0, prompt))
        status = draw(st.sampled_from(list(CompletionStatus)))
        events.append((completion(i, t, prompt, cached, draw(st.integers(0, 700)), status),
                       Position(SOURCE, 1000 + 3 * i, None)))
    return events


def reference(events: list[tuple[RequestCompleted, Position]]) -> tuple[dict[str, Usage], list[bool]]:
    """Per UTC day, the distinct events not late (the definition, written out on its own), and which were late."""
    days: dict[str, Usage] = defaultdict(Usage)
    late, newest = [], None
    for record, _ in events:
        newest = record.t_ms if newest is None else max(newest, record.t_ms)
        is_late = record.t_ms // DAY_MS < newest // DAY_MS - RETENTION + 1
        late.append(is_late)
        if not is_late:
            days[ledger_algebra.utc_day(record.t_ms)] += Usage(record.prompt_tokens, record.cached_prompt_tokens,
                                                  record.completion_tokens, 1)
    return dict(days), late


def period_sum(events, late, spec: BudgetSpec, start_ms: int) -> Usage:
    total = Usage()
    for (record, _), is_late in zip(events, late):
        if not is_late and spec.period_at(record.t_ms)[0] == start_ms:
            total += Usage(record.prompt_tokens, record.cached_prompt_tokens, record.completion_tokens, 1)
    return total


def check_exact(ledger: ledger_algebra.Ledger, events) -> None:
    days, late = reference(events)
    cutoff = ledger_algebra.utc_day((ledger.newest_ms // DAY_MS - RETENTION + 1) * DAY_MS)
    kept = {day: entry.usage for (day, _), entry in ledger.days.items()}
    assert all(days[day] == usage for day, usage in kept.items())  # (a day is forgotten once out and published)
    assert {day for day in days if day >= cutoff} <= set(kept)
    for spec in BUDGETS:
        book = ledger.budgets[spec.name]
        assert book.current.spent == period_sum(events, late, spec, book.current.start_ms)
        if book.previous is not None:
            assert book.previous.spent == period_sum(events, late, spec, book.previous.start_ms)
            assert book.previous.end_ms == book.current.start_ms


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs(), st.data())
def test_exact_whatever_the_batches_and_redeliveries(events, data):
    ledger, outcomes = ledger_algebra.fold(ledger_algebra.new("pool-a", "gold", "pool-a", 3), events, CONTEXT, RETENTION)
    _, late = reference(events)
    assert outcomes == [ledger_algebra.Folded.LATE if x else ledger_algebra.Folded.APPLIED for x in late]
    check_exact(ledger, events)
    split = ledger_algebra.new("pool-a", "gold", "pool-a", 3)
    read = 0
    while read < len(events):
        start = data.draw(st.integers(0, read), label="re-deliver from")  # a re-delivery from an earlier offset
        end = data.draw(st.integers(read + 1, len(events)), label="to")
        split, out = ledger_algebra.fold(split, events[start:end], CONTEXT, RETENTION)
        assert out[:read - start] == [ledger_algebra.Folded.DUPLICATE] * (read - start)
        read = end
    assert split.days == ledger.days and split.budgets == ledger.budgets and split.outbox == ledger.outbox


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs(), st.data())
def test_crashes_keep_it_exact_alerts_once_and_versions_growing(events, data):
    """The shell's protocol, written out: a batch's ledger is written, then (once written) its offsets committed;
    a publication writes the versions, waits until written, sends, then confirms. A crash keeps any prefix of the
    changelog at least up to the last awaited write, and the events are re-delivered from the committed offset."""
    changelog: list[bytes] = []
    durable, committed, read = 0, 0, 0
    ledger = ledger_algebra.new("pool-a", "gold", "pool-a", 3)
    sent: list[tuple[str, str, int, object]] = []  # (topic, key, version, record)

    def write(value: ledger_algebra.Ledger) -> None:
        changelog.append(ledger_algebra.encode(value))

    def publish(ledger: ledger_algebra.Ledger, stop: str | None) -> ledger_algebra.Ledger:
        """``stop``: None, or where the publication fails: "send" (nothing sent), "confirm" (sent, not confirmed)."""
        nonlocal durable
        given_, publication = ledger_algebra.publish(ledger, BUDGETS, through_ms=0)
        if given_ is not ledger:
            write(given_)
        durable = len(changelog)
        if stop == "send":
            return given_
        for s in publication.statuses:
            sent.append(("budgets", ledger_algebra.status_key(s), s.version, s))
        for u in publication.usage:
            sent.append(("usage", ledger_algebra.usage_key(u), u.version, u))
        for a in publication.alerts:
            sent.append(("alerts", ledger_algebra.alert_key(a), 0, a))
        if stop == "confirm":
            return given_
        done = ledger_algebra.sent(given_, publication)
        if done is not given_:
            write(done)
        return done

    while read < len(events):
        step = data.draw(st.sampled_from(["batch", "publish", "crash"]), label="step")
        if step == "batch":
            end = data.draw(st.integers(read + 1, len(events)), label="batch end")
            folded, _ = ledger_algebra.fold(ledger, events[read:end], CONTEXT, RETENTION)
            if folded is not ledger:
                write(folded)
            ledger, read = folded, end
            if data.draw(st.booleans(), label="acked"):
                durable, committed = len(changelog), read
        elif step == "publish":
            ledger = publish(ledger, data.draw(st.sampled_from([None, "send", "confirm"]), label="fails before"))
        else:
            keep = data.draw(st.integers(durable, len(changelog)), label="changelog kept")
            del changelog[keep:]
            ledger = ledger_algebra.decode(changelog[-1]) if changelog else ledger_algebra.new("pool-a", "gold", "pool-a", 3)
            read = committed
            assert all(offset >= 1000 + 3 * (committed - 1) for offset in ledger.offsets.values()) or not committed
    ledger = publish(ledger, None)
    check_exact(ledger, events)
    assert not ledger.outbox and not any(d.published.due for d in ledger.days.values())

    newest: dict[tuple[str, str], object] = {}
    versions: dict[tuple[str, str], list[int]] = defaultdict(list)
    alerts: dict[str, list[object]] = defaultdict(list)
    for topic, key, version, record in sent:
        newest[(topic, key)] = record
        if topic == "alerts":
            alerts[key].append(record)
        else:
            versions[(topic, key)].append(version)
    for seq in versions.values():  # VERSIONS
        assert all(a < b for a, b in zip(seq, seq[1:])), seq
    for key, same in alerts.items():  # ONCE: a re-send is the very same record
        assert all(a == same[0] for a in same), key
    for spec in BUDGETS:  # every threshold the current account reached alerted, under its period's key
        book = ledger.budgets[spec.name]
        reached = [t for t in spec.alert_thresholds if t <= book.current.fraction(spec.weights)]
        assert tuple(reached) == book.alerted
        for threshold in reached:
            assert f"pool-a/gold/{spec.name}/{book.current.start_ms}/{threshold!r}" in alerts
        status = newest[("budgets", f"pool-a/gold/{spec.name}/entitlement")]  # COMPACTED
        assert status.period_start_ms == book.current.start_ms and status.allowance == book.current.allowance
        assert (status.spent.prompt_tokens, status.spent.cached_prompt_tokens, status.spent.completion_tokens,
                status.spent.requests) == (book.current.spent.prompt, book.current.spent.cached_prompt,
                                           book.current.spent.completion, book.current.spent.requests)
        if book.previous is not None and book.previous.spent.requests:  # FINAL: the ended period's last record
            last = [r for topic, key, _, r in sent
                    if topic == "budgets" and key == f"pool-a/gold/{spec.name}/entitlement"
                    and r.period_start_ms == book.previous.start_ms][-1]
            assert last.spent.requests == book.previous.spent.requests and last.spent.prompt_tokens == \
                book.previous.spent.prompt and last.allowance == book.previous.allowance
    for (day, model), entry in ledger.days.items():
        record = newest[("usage", f"acme/gold/{model}/{day}")]
        assert record.usage.prompt_tokens == entry.usage.prompt and record.usage.requests == entry.usage.requests
        assert record.labels == {"team": "search"} and record.tenant == "acme"


def test_a_late_completion_into_the_previous_period_lowers_the_rollover_and_may_alert():
    spec = BUDGETS[0]  # daily 3000, rollover up to 500, alerts at 0.5 and 1.0
    day0 = BASE_MS // DAY_MS * DAY_MS
    ledger, _ = ledger_algebra.fold(ledger_algebra.new("pool-a", "gold", "pool-a", 3), [
        (completion(0, day0 + 1000, 100, 0, 0), Position(SOURCE, 1, None)),
        (completion(1, day0 + DAY_MS + 1000, 1000, 0, 0), Position(SOURCE, 2, None)),
    ], ledger_algebra.Context((spec,), "acme", (), "llama"), RETENTION)
    book = ledger.budgets["daily"]
    assert book.previous.spent.prompt == 100 and book.current.allowance == 3500  # 2900 unused, 500 carried
    assert book.alerted == () and ledger.outbox == ()
    ledger, outcomes = ledger_algebra.fold(ledger, [(completion(2, day0 + 5000, 2600, 0, 0), Position(SOURCE, 3, None))],
                              ledger_algebra.Context((spec,), "acme", (), "llama"), RETENTION)
    book = ledger.budgets["daily"]
    assert outcomes == [ledger_algebra.Folded.APPLIED] and book.previous.spent.prompt == 2700
    assert book.current.allowance == 3300 and book.previous_alerted == (0.5,)  # 300 left over, carried
    assert [(a.period_start_ms, a.threshold) for a in ledger.outbox] == [(day0, 0.5)]


def test_a_period_ending_between_two_publications_publishes_its_final_account_then_the_next():
    """The budget's key moves on to the new period: without the ended period's own record, a subscriber's last
    record of it would lack what was folded after the previous publication."""
    spec = BUDGETS[0]
    day0 = BASE_MS // DAY_MS * DAY_MS
    context = ledger_algebra.Context((spec,), "acme", (), "llama")
    ledger, _ = ledger_algebra.fold(ledger_algebra.new("pool-a", "gold", "pool-a", 3),
                       [(completion(0, day0 + 1000, 100, 0, 0), Position(SOURCE, 1, None))], context, RETENTION)
    ledger, first = ledger_algebra.publish(ledger, (spec,), through_ms=0)
    ledger = ledger_algebra.sent(ledger, first)
    ledger, _ = ledger_algebra.fold(ledger, [(completion(1, day0 + 2000, 200, 0, 0), Position(SOURCE, 2, None)),
                                (completion(2, day0 + DAY_MS + 1000, 50, 0, 0), Position(SOURCE, 3, None))],
                       context, RETENTION)
    ledger, turn = ledger_algebra.publish(ledger, (spec,), through_ms=0)
    assert [(s.period_start_ms, s.spent.prompt_tokens, s.version) for s in turn.statuses] == [
        (day0, 300, 2), (day0 + DAY_MS, 50, 3)]
    assert ledger_algebra.decode(ledger_algebra.encode(ledger)) == ledger and ledger.budgets["daily"].previous_due  # until confirmed sent
    ledger = ledger_algebra.sent(ledger, turn)
    assert not ledger.budgets["daily"].due
    ledger, _ = ledger_algebra.fold(ledger, [(completion(3, day0 + 3000, 10, 0, 0), Position(SOURCE, 4, None))],
                          context, RETENTION)  # a late one changes the ended period: its final account again
    ledger, again = ledger_algebra.publish(ledger, (spec,), through_ms=0)
    assert [(s.period_start_ms, s.spent.prompt_tokens) for s in again.statuses] == [(day0, 310), (day0 + DAY_MS, 50)]
    assert ledger_algebra.publish(ledger_algebra.sent(ledger, again), (spec,), through_ms=0)[1].statuses == ()


def test_the_reservations_in_flight_go_on_the_current_account_and_a_change_of_them_alone_is_due():
    """docs/budgets.md#the-others-reservations-in-flight: the ended period's final account carries none (its requests
    in flight are the current period's concern); levels that changed make every budget due under a new version."""
    spec = BUDGETS[0]
    day0 = BASE_MS // DAY_MS * DAY_MS
    context = ledger_algebra.Context((spec,), "acme", (), "llama")
    ledger, _ = ledger_algebra.fold(ledger_algebra.new("pool-a", "gold", "pool-a", 3),
                       [(completion(0, day0 + 1000, 100, 0, 0), Position(SOURCE, 1, None))], context, RETENTION)
    ledger = ledger_algebra.sent(*ledger_algebra.publish(ledger, (spec,), through_ms=0))
    ledger, _ = ledger_algebra.fold(ledger, [(completion(1, day0 + 2000, 200, 0, 0), Position(SOURCE, 2, None)),
                                (completion(2, day0 + DAY_MS + 1000, 50, 0, 0), Position(SOURCE, 3, None))],
                       context, RETENTION)
    ledger, turn = ledger_algebra.publish(ledger, (spec,), 0, {"p1": 40, "p2": 7}, True)
    assert [(s.period_start_ms, s.reserved_tokens) for s in turn.statuses] == [
        (day0, {}), (day0 + DAY_MS, {"p1": 40, "p2": 7})]
    ledger = ledger_algebra.sent(ledger, turn)
    assert ledger_algebra.publish(ledger, (spec,), 0, {"p1": 40, "p2": 7}, False)[1].statuses == ()
    ledger, moved = ledger_algebra.publish(ledger, (spec,), 0, {"p2": 9}, True)
    assert [(s.version, s.spent.prompt_tokens, s.reserved_tokens) for s in moved.statuses] == [(4, 50, {"p2": 9})]


def test_a_period_whose_last_account_went_out_turns_without_a_record_of_it():
    spec = BUDGETS[0]
    day0 = BASE_MS // DAY_MS * DAY_MS
    context = ledger_algebra.Context((spec,), "acme", (), "llama")
    ledger, _ = ledger_algebra.fold(ledger_algebra.new("pool-a", "gold", "pool-a", 3),
                       [(completion(0, day0 + 1000, 100, 0, 0), Position(SOURCE, 1, None))], context, RETENTION)
    ledger, first = ledger_algebra.publish(ledger, (spec,), through_ms=0)
    ledger, _ = ledger_algebra.fold(ledger_algebra.sent(ledger, first),
                       [(completion(1, day0 + DAY_MS + 1000, 50, 0, 0), Position(SOURCE, 2, None))], context, RETENTION)
    assert [s.period_start_ms for s in ledger_algebra.publish(ledger, (spec,), through_ms=0)[1].statuses] == [day0 + DAY_MS]


def test_an_unknown_entitlement_keeps_its_budgets_and_counts_its_usage():
    day0 = BASE_MS // DAY_MS * DAY_MS
    ledger, _ = ledger_algebra.fold(ledger_algebra.new("pool-a", "gold", "pool-a", 3), [
        (completion(0, day0 + 1000, 100, 0, 5), Position(SOURCE, 1, None))], CONTEXT, RETENTION)
    later, _ = ledger_algebra.fold(ledger, [(completion(1, day0 + 2000, 10, 0, 5), Position(SOURCE, 2, None))],
                      ledger_algebra.Context(model="llama", known=False), RETENTION)
    assert later.budgets == ledger.budgets and later.tenant == "acme"
    assert later.days[(ledger_algebra.utc_day(day0), "llama")].usage == Usage(110, 0, 10, 2)
    assert ledger_algebra.decode(ledger_algebra.encode(later)) == later


def test_a_tenant_budgets_part_is_the_entitlements_own_spending_published_as_tenant_scope_and_never_alerts():
    """Its fraction is not the tenant's, so a part reaching a threshold alerts nothing (docs/budgets.md#tenant-budgets)."""
    shared = BudgetSpec("shared", Period.DAY, 1_000, scope=BudgetScope.TENANT, alert_thresholds=(0.5, 1.0))
    day0 = BASE_MS // DAY_MS * DAY_MS
    ledger, _ = ledger_algebra.fold(ledger_algebra.new("pool-a", "gold", "pool-a", 3), [
        (completion(0, day0 + 1000, 900, 0, 200), Position(SOURCE, 1, None))], ledger_algebra.Context((shared,), "acme", (), "llama"),
        RETENTION)
    book = ledger.budgets["shared"]
    assert book.current.spent == Usage(900, 0, 200, 1) and book.current.allowance == 1000
    assert book.alerted == () and ledger.outbox == ()
    _, publication = ledger_algebra.publish(ledger, (shared,), day0 + 2000)
    (status,) = publication.statuses
    assert status.scope is BudgetScope.TENANT and status.tenant == "acme" and status.spent.prompt_tokens == 900
    assert ledger_algebra.status_key(status) == "pool-a/gold/shared/tenant/acme"  # a proxy reads the scope without decoding
    assert publication.alerts == ()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs(), st.data())
def test_exact_when_the_broker_holds_completions_twice(events, data):
    """RESENT: a completion with an identity that the broker holds again at a later offset (a spool re-send) counts
    once: the ledger equals the one of the log without the copies, and survives its changelog encoding."""
    identified = [(e.model_copy(update={"proxy_start_ms": 77, "sequence": i + 1}), at)
                  for i, (e, at) in enumerate(events)]
    log = list(identified)
    copies = data.draw(st.lists(st.integers(0, len(events) - 1), max_size=len(events)), label="re-sent")
    for i in copies:  # each copy lands anywhere after the original
        original = next(k for k, (e, _) in enumerate(log) if e.sequence == i + 1)
        log.insert(data.draw(st.integers(original + 1, len(log)), label="at"), identified[i])
    log = [(e, Position(SOURCE, 1000 + k, None)) for k, (e, _) in enumerate(log)]
    once, _ = ledger_algebra.fold(ledger_algebra.new("pool-a", "gold", "pool-a", 3), identified, CONTEXT, RETENTION)
    twice = ledger_algebra.new("pool-a", "gold", "pool-a", 3)
    outcomes: list[ledger_algebra.Folded] = []
    at = 0
    while at < len(log):  # in batches, each ledger through its changelog value
        end = data.draw(st.integers(at + 1, len(log)), label="batch end")
        twice, out = ledger_algebra.fold(ledger_algebra.decode(ledger_algebra.encode(twice)), log[at:end], CONTEXT, RETENTION)
        outcomes += out
        at = end
    assert outcomes.count(ledger_algebra.Folded.RESENT) == len(copies)
    assert twice.days == once.days and twice.budgets == once.budgets and twice.outbox == once.outbox
    assert ledger_algebra.decode(ledger_algebra.encode(twice)).seen == twice.seen


def test_a_value_written_before_identities_decodes_with_none_seen():
    first = [(completion(1, BASE_MS, 10, 0, 5), Position(SOURCE, 1, None))]
    ledger, _ = ledger_algebra.fold(ledger_algebra.new("pool-a", "gold", "pool-a", 3), first, CONTEXT, RETENTION)
    value = orjson.loads(ledger_algebra.encode(ledger))
    del value["seen"]
    assert ledger_algebra.decode(orjson.dumps(value)) == ledger


def test_a_quiet_ledger_is_published_again_once_its_windows_close_past_what_it_folded():
    """A record counts every completion folded, those at or after its ``through_ms`` too, and a proxy adds its own
    completions from that ``through_ms`` on: the ones in between count twice at the proxy until a record with a
    later ``through_ms``. With nothing more folded (the entitlement refused on that very view) the ledger is due
    again once the windows closed past them, once; the proxy then counts each completion once."""
    spec = BudgetSpec("daily", Period.DAY, 3_000)
    context = ledger_algebra.Context((spec,), "acme", (), "llama")
    t = BASE_MS + 10_000
    events = [(completion(i, t + 100 * i, 100, 0, 50), Position(SOURCE, i, None)) for i in range(3)]
    proxy = BudgetBook()
    for record, _ in events:
        proxy.settle("gold", (spec,), record.request_id, record.t_ms,
                     Usage(record.prompt_tokens, 0, record.completion_tokens, 1))
    ledger, _ = ledger_algebra.fold(ledger_algebra.new("pool-a", "gold", "pool-a", 3), events, context, RETENTION)
    ledger, first = ledger_algebra.publish(ledger, (spec,), through_ms=t + 50)  # the windows closed through the first only
    ledger = ledger_algebra.sent(ledger, first)
    proxy.apply(first.statuses[-1])
    now = t + 1_000
    assert proxy.state("gold", spec, now).remaining_units == 3_000 - 450 - 300  # the last two twice
    assert ledger_algebra.publish(ledger, (spec,), through_ms=t + 50)[1].statuses == ()  # the windows did not move: not due

    ledger, again = ledger_algebra.publish(ledger, (spec,), through_ms=t + 1_000)  # closed past every completion folded
    assert [(s.version, s.spent_units, s.through_ms) for s in again.statuses] == [(2, 450.0, t + 1_000)]
    ledger = ledger_algebra.sent(ledger, again)
    proxy.apply(again.statuses[-1])
    assert proxy.state("gold", spec, now).remaining_units == 3_000 - 450
    assert ledger_algebra.publish(ledger, (spec,), through_ms=t + 5_000)[1].statuses == ()  # covered: quiet from here
    assert ledger_algebra.decode(ledger_algebra.encode(ledger)) == ledger
