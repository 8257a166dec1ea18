"""The chaos checker (``tokenpools_dev.chaos.checker``): a history → its figures, and the findings a bad history
gives. Each test builds a clean history and breaks one thing in it."""

from __future__ import annotations

from dataclasses import replace

from tokenpools_dev.chaos import checker as ck
from tokenpools_dev.chaos.schedule import FaultKind


def _history(n: int = 6) -> ck.History:
    """n requests, each admitted by proxy i % 2 at i s, ended at i + 1 s, completed once, counted once."""
    attempts = [ck.SentAttempt(f"r{i}", i % 2, i * 1000, i * 1000 + 10, f"p{i}", "admitted", 200) for i in range(n)]
    ends = [ck.AdmittedEnd(f"p{i}", "e", i % 2, i * 1000 + 10, i * 1000 + 1000, "ok") for i in range(n)]
    events = [ck.CompletionEvent(f"p{i}", "e", f"proxy-{i % 2}", 1, i // 2 + 1, (0, i)) for i in range(n)]
    return ck.History(attempts, ends, frozenset(f"p{i}" for i in range(n)), events, {"e": n}, [],
                      {0: 0.0, 1: 0.0}, {"e": 2}, 2, ck.Budget("e", 1000, 1010), reconciled=True)


def test_a_clean_history_has_no_finding() -> None:
    f = ck.figures(_history())
    assert f.findings == ()
    assert (f.requests, f.admitted, f.completions, f.lost, f.double_counted, f.held_twice) == (6, 6, 6, 0, 0, 0)
    assert f.budget_overshoot_ratio == 0.01 and f.concurrency_overshoot == 0 and f.refused_by == {}


def test_a_completion_missing_from_the_topic_is_lost() -> None:
    h = _history()
    f = ck.figures(replace(h, completions=h.completions[:-1], ledger_requests={"e": 5}))
    assert f.lost == 1 and f.lost_detail["uncompleted"] == 1
    assert ck.Finding.LOST in f.findings


def test_a_completion_the_ledger_counts_twice_is_double_counted() -> None:
    f = ck.figures(replace(_history(), ledger_requests={"e": 7}))
    assert f.double_counted == 1 and ck.Finding.DOUBLE_COUNTED in f.findings


def test_a_completion_the_ledger_misses_is_lost() -> None:
    f = ck.figures(replace(_history(), ledger_requests={"e": 5}))
    assert f.lost_detail["ledger_missing"] == 1 and ck.Finding.LOST in f.findings


def test_a_record_the_broker_holds_twice_counts_once() -> None:
    h = _history()
    copy = replace(h.completions[0], offset=(1, 99))  # the same identity at another offset: a spool re-send
    f = ck.figures(replace(h, completions=[*h.completions, copy]))
    assert f.held_twice == 1 and f.double_counted == 0 and f.findings == ()


def test_one_request_reported_as_two_completions_is_double_counted() -> None:
    h = _history()
    other = replace(h.completions[0], sequence=99, offset=(1, 99))  # a new identity for the same request
    f = ck.figures(replace(h, completions=[*h.completions, other], ledger_requests={"e": 7}))
    assert f.double_counted == 1  # the ledger agrees with the events: the proxies counted it twice
    assert ck.Finding.DOUBLE_COUNTED in f.findings


def test_an_answer_with_no_decision_on_the_topic_is_lost() -> None:
    f = ck.figures(replace(_history(), decided=frozenset({"p0", "p1"})))
    assert f.lost_detail["undecided"] == 4


def test_an_answer_without_its_request_id_is_lost() -> None:
    h = _history()
    f = ck.figures(replace(h, attempts=[*h.attempts, ck.SentAttempt("r9", 0, 9000, 9005, "", "error", 500)]))
    assert f.lost_detail["unidentified"] == 1 and f.lost_detail["unanswered"] == 0
    refused = ck.SentAttempt("r8", 0, 8000, 8005, "p8", "budget_exhausted", 429)
    f = ck.figures(replace(h, attempts=[*h.attempts, refused], decided=h.decided | {"p8"}))
    assert f.refused_by == {"budget_exhausted": 1} and f.lost == 0


def test_a_request_in_flight_at_a_killed_proxy_is_interrupted_not_lost() -> None:
    h = _history()
    kill = ck.FaultWindow(FaultKind.PROXY_KILL, 1, 3500, 4000)  # proxy 1 had p3 in flight (3.01 s to 4 s)
    events = [c for c in h.completions if c.request_id != "p3"]
    f = ck.figures(replace(h, completions=events, ledger_requests={"e": 5}, faults=[kill], slack_ms=0))
    assert f.lost == 0 and f.interrupted == 1
    # the same gap with the fault on the other proxy is a loss
    f = ck.figures(replace(h, completions=events, ledger_requests={"e": 5},
                           faults=[replace(kill, target=0)], slack_ms=0))
    assert f.lost == 1 and f.interrupted == 0


def test_an_attempt_no_proxy_answered_is_lost_outside_a_fault_of_its_proxy() -> None:
    h = _history()
    unanswered = ck.SentAttempt("r9", 0, 9000, 9005, "", "error", 0)
    f = ck.figures(replace(h, attempts=[*h.attempts, unanswered]))
    assert f.lost_detail["unanswered"] == 1
    pause = ck.FaultWindow(FaultKind.PROXY_PAUSE, 0, 8000, 9500)
    f = ck.figures(replace(h, attempts=[*h.attempts, unanswered], faults=[pause]))
    assert f.lost == 0 and f.unanswered_in_faults == 1


def test_a_slot_held_after_the_load_and_an_unreconciled_ledger_are_findings() -> None:
    f = ck.figures(replace(_history(), in_flight_after={0: 0.0, 1: 1.0}, reconciled=False))
    assert f.slots_held_after == 1.0
    assert {ck.Finding.SLOTS_HELD, ck.Finding.NOT_RECONCILED} <= set(f.findings)


def test_overshoots_beyond_their_bounds_are_findings() -> None:
    h = _history()
    overlapping = [ck.AdmittedEnd(f"p{i}", "e", 0, 0, 1000, "ok") for i in range(5)]  # 5 at once on a limit of 2
    f = ck.figures(replace(h, ends=overlapping, budget=ck.Budget("e", 1000, 2001)))
    assert f.concurrency_overshoot == 3 and f.concurrency_bound == 2  # (proxies − 1) × limit
    assert f.budget_overshoot_ratio == 1.001 and f.budget_bound_ratio == 1.0
    assert {ck.Finding.CONCURRENCY_OVERSHOOT, ck.Finding.BUDGET_OVERSHOOT} <= set(f.findings)
