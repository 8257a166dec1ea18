"""Budgets in the replay (docs/budgets.md#replay): the core's check on an exact event-time ledger, refusals from the
moment the ledger says until the reset, the what-if ``--budget`` option, and runs without budgets unchanged."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tokenpools.cli import main
from tokenpools.core.budgets import BudgetSpec, Period, Weights, period_bounds
from tokenpools.replay import logio
from tokenpools.replay.budget_options import parse, split_budget_items, with_budgets
from tokenpools.replay.experiments import build, examples_dir
from tokenpools.replay.replayer import ReplayResult, replay
from tokenpools.replay.report import budget_table, render
from tokenpools.replay.results import NOT_EXHAUSTED, budget_rows, summarize
from tokenpools.replay.scenario import ReplayUsageError

ENT = "spot-b"
BUDGET = "budget_exhausted"


def _ledger_check(result: ReplayResult, ent: str, spec: BudgetSpec) -> list[tuple[float, str, float, float, float]]:
    """Every decision of ``ent`` beside the ledger rebuilt from the result's own rows: (t, outcome, units spent and
    held by requests checked before t, the same with those checked at t too, the request's reservation).

    A request holds its reservation from its check (its first decision, ``queued_s`` before its row if it waited)
    until it completes (admitted) or its final decision (refused); a completion at t counts before a decision at t
    (the loop runs backend events first). Of the requests checked at the same ms, the rows do not say which came
    first: an admitted one must fit without them, a refused one must not fit with them. The simulated backend has
    no prefix cache: cached prompt tokens are 0."""
    d, c = result.decisions, result.completions
    done = {c.request_id[k] if c.attempt[k] == 0 else f"{c.request_id[k]}/{c.attempt[k]}": c.t_s[k]
            for k in range(len(c.t_s))}
    origin = result.scenario.origin_ms
    rows = sorted((d.t_s[k] - d.queued_s[k], k) for k in range(len(d.t_s)) if d.entitlement[k] == ent)
    holds: dict[int, tuple[float, float, float]] = {}  # row -> (from, until, units)
    for t_check, k in rows:
        rid = d.request_id[k] if d.attempt[k] == 0 else f"{d.request_id[k]}/{d.attempt[k]}"
        if d.outcome[k] != BUDGET:
            until = done.get(rid, float("inf")) if d.outcome[k] == "admitted" else d.t_s[k]
            holds[k] = (t_check, until, float(d.cost_tokens[k]))
    out = []
    for t_check, k in rows:
        t_ms = origin + round(t_check * 1000)
        start, end = period_bounds(spec.period, spec.time_zone, t_ms)
        spent = sum(c.prompt_tokens[j] + c.completion_tokens[j] for j in range(len(c.t_s))
                    if c.entitlement[j] == ent and c.t_s[j] <= t_check
                    and start <= origin + round(c.t_s[j] * 1000) < end)
        before = sum(u for since, until, u in holds.values() if since < t_check < until)
        at = sum(u for j, (since, until, u) in holds.items() if j != k and since <= t_check < until)
        out.append((t_check, d.outcome[k], spent + before, spent + at, float(d.cost_tokens[k])))
    return out


def test_refusals_start_exactly_when_the_ledger_says_and_stop_at_the_reset() -> None:
    """A day budget in Asia/Kolkata (+05:30) whose midnight falls 45 s into Exp 1: spot-b spends its 5,000 tokens,
    is refused ``budget_exhausted`` exactly while what it spent and holds leaves less than a request's reservation,
    and is admitted again from the local midnight on (the refused clients retry at the reset: the retry hint), until
    the new day's allowance is held by them."""
    midnight_ms = 1_772_130_600_000  # 2026-02-27T00:00:00+05:30
    scenario = build("exp1", [f"replay.budget={ENT}=5000/day/Asia/Kolkata"])
    scenario = replace(scenario, origin_ms=midnight_ms - 45_000)
    spec = next(e for e in scenario.entitlements if e.name == ENT).budgets[0]
    result = replay(scenario)
    assert result.evicted == 0  # (the rebuilt ledger below charges completions only)
    checks = _ledger_check(result, ENT, spec)
    refused = [t for t, outcome, *_ in checks if outcome == BUDGET and t < 45.0]
    # the new day's 5,000 run out too, soon: every refused client retries at the reset (its hint), at once
    again = [t for t, outcome, *_ in checks if outcome == BUDGET and t >= 45.0]
    assert refused and again
    for t, outcome, before, at, units in checks:
        if outcome == BUDGET:
            assert at + units > 5000, (t, at, units)
        else:
            assert before + units <= 5000, (t, before, units)
    # the first refusal is where the ledger first could not take a request; after the reset, admissions again
    first = min(refused)
    assert all(outcome != BUDGET for t, outcome, *_ in checks if t < first)
    # at the reset the budget takes requests again: the retries sent at local midnight (+ jitter) pass its check
    after_reset = [outcome for t, outcome, *_ in checks if t >= 45.0]
    assert after_reset[:10] == ["admitted"] * 10 and min(again) > 45.0
    # the refused retry at the reset: their hint was the time left until local midnight (capped at 3600 s)
    d = result.decisions
    hints = [(d.retry_after_ms[k], d.t_s[k]) for k in range(len(d.t_s)) if d.outcome[k] == BUDGET and d.t_s[k] < 45]
    assert hints and all(h == 45_000 - round(t * 1000) for h, t in hints)
    # the report: two periods, the first ran out at its first refusal, the second did not (yet)
    first_row, second_row = budget_rows(result)
    assert first_row["period_start"] == "2026-02-26T00:00:00+05:30"
    assert first_row["exhausted_at"] == "2026-02-26T23:59:" + f"{15 + int(first):02d}+05:30"
    assert first_row["refused_budget_exhausted"] == len(refused)
    assert first_row["allowance"] == 5000 and 4000 < first_row["spent"] <= 5000  # one proxy: no overshoot
    assert second_row["period_start"] == "2026-02-27T00:00:00+05:30"
    assert second_row["refused_budget_exhausted"] == len(again)
    # the ledger's spending is exactly the completions of each period
    c = result.completions
    spent = {True: 0, False: 0}
    for j in range(len(c.t_s)):
        if c.entitlement[j] == ENT:
            spent[c.t_s[j] < 45.0] += c.prompt_tokens[j] + c.completion_tokens[j]
    assert (first_row["spent"], second_row["spent"]) == (spent[True], spent[False])
    assert first_row["spent_tokens"]["requests"] + second_row["spent_tokens"]["requests"] == sum(
        1 for e in c.entitlement if e == ENT)


def test_every_class_is_refused_and_the_weights_price_the_tokens() -> None:
    """A guaranteed entitlement is refused too (no class escapes its budget), and completion tokens at weight 4 run
    the budget out sooner than at weight 1."""
    exhausted = {}
    for weight in (1.0, 4.0):
        scenario = build("exp1", ["replay.budget=guaranteed-a=5000/month"])
        ents = tuple(replace(e, budgets=(replace(e.budgets[0], weights=Weights(completion=weight)),)) if e.budgets else e
                     for e in scenario.entitlements)
        result = replay(replace(scenario, entitlements=ents))
        (row,) = budget_rows(result)
        assert row["refused_budget_exhausted"] > 0 and row["exhausted_at"] != NOT_EXHAUSTED
        exhausted[weight] = row["exhausted_at"]
        assert row["spent"] == row["spent_tokens"]["prompt"] + weight * row["spent_tokens"]["completion"]
    assert exhausted[4.0] < exhausted[1.0]


def test_a_budget_that_never_binds_changes_no_decision_and_runs_without_budgets_report_nothing_new() -> None:
    scenario = build("exp1", ["load.compress=0.3"])
    plain = replay(scenario)
    loose = replay(replace(scenario, entitlements=with_budgets(scenario.entitlements, [f"{ENT}=1e12/never"])))
    assert loose.decisions == plain.decisions and loose.completions == plain.completions
    assert budget_rows(plain) == [] and plain.budgets == []
    results = {"open_loop": {"exp1": summarize("exp1", {"token-pools": plain})}}
    assert "budgets" not in results["open_loop"]["exp1"]["token_pools"]
    assert budget_table(results, "exp1") is None
    assert "budgets (token pools" not in render(results, ["exp1"], {}, {}, "cmd")
    with_rows = {"open_loop": {"exp1": summarize("exp1", {"token-pools": loose})}}
    (row,) = with_rows["open_loop"]["exp1"]["token_pools"]["budgets"]
    assert row["exhausted_at"] == NOT_EXHAUSTED and row["period_end"] is None
    assert "| spot-b | never | 1970-01-01T00:00:00+00:00 | 1e+12 | 7424 | not exhausted | 0 |" in budget_table(with_rows, "exp1")


def test_the_budget_option_adds_or_changes_a_budget() -> None:
    assert parse("copilot=5e6/month/Europe/Berlin") == ("copilot", None, 5e6, Period.MONTH, "Europe/Berlin")
    assert parse(" copilot.monthly = 100/Day ") == ("copilot", "monthly", 100.0, Period.DAY, "UTC")
    assert split_budget_items(["replay.budget=a=1/day", "policy.x=1"]) == (["a=1/day"], ["policy.x=1"])
    scenario = build("exp1")
    ents = with_budgets(scenario.entitlements, [f"{ENT}=100/day", f"{ENT}=200/day/Europe/Berlin", f"{ENT}.w=5/week"])
    spot = next(e for e in ents if e.name == ENT)
    assert [(b.name, b.amount, b.period, b.time_zone) for b in spot.budgets] == [
        ("day", 200.0, Period.DAY, "Europe/Berlin"), ("w", 5.0, Period.WEEK, "UTC")]
    # changing a named budget keeps its weights, rollover and thresholds
    kept = BudgetSpec("m", Period.MONTH, 10, weights=Weights(completion=3), rollover_max=5, alert_thresholds=(0.5,))
    base = tuple(replace(e, budgets=(kept,)) if e.name == ENT else e for e in scenario.entitlements)
    (changed,) = next(e for e in with_budgets(base, [f"{ENT}.m=99/day"]) if e.name == ENT).budgets
    assert changed == replace(kept, amount=99, period=Period.DAY)
    for bad in ("spot-b", "spot-b=5", "spot-b=x/day", "spot-b=5/year", "spot-b=5/day/Mars/Base", "nobody=5/day",
                "spot-b=-1/day", "spot-b.=5/day"):
        with pytest.raises(ReplayUsageError):
            with_budgets(scenario.entitlements, [bad])


def test_tokenpools_replay_budget_answers_when_the_budget_would_have_run_out(tmp_path: Path,
                                                                                capsys: pytest.CaptureFixture) -> None:
    """The operator's question on a recorded log: the summary line and summary.json name the budget's allowance,
    spending, the moment it ran out and its refusals; the same log without ``--budget`` gives the same outputs as
    before (no budgets key, no budget line)."""
    scenario = build("exp1", ["load.compress=0.3", "policy.queue_slo_fraction=0"])
    logio.write_log(replay(scenario), tmp_path / "log")
    config = str(examples_dir() / "exp1.yaml")
    plain_out, what_if_out = tmp_path / "plain", tmp_path / "whatif"
    assert main(["replay", str(tmp_path / "log"), "--config", config, "--out", str(plain_out)]) == 0
    plain = capsys.readouterr().out
    assert main(["replay", str(tmp_path / "log"), "--config", config, "--out", str(what_if_out),
                 "--budget", f"{ENT}=3000/day", "--set", "replay.budget=guaranteed-a=1e9/month"]) == 0
    what_if = capsys.readouterr().out
    # (the replay's three lines, one per entitlement's fitted clients and one of requests given up/pending)
    assert "budget " not in plain and len(plain.splitlines()) == 3 + 3 + 1
    plain_summary = json.loads((plain_out / "summary.json").read_text())
    assert "budgets" not in plain_summary
    summary = json.loads((what_if_out / "summary.json").read_text())
    rows = {r["entitlement"]: r for r in summary["budgets"]}
    assert rows[ENT]["allowance"] == 3000 and rows[ENT]["refused_budget_exhausted"] > 0
    assert rows[ENT]["exhausted_at"].startswith("2026-") and rows["guaranteed-a"]["exhausted_at"] == NOT_EXHAUSTED
    assert summary["by_entitlement"][ENT][BUDGET] == rows[ENT]["refused_budget_exhausted"]
    assert f"budget {ENT}/day from " in what_if and f"exhausted at {rows[ENT]['exhausted_at']}" in what_if
    assert "budget guaranteed-a/month from " in what_if and "not exhausted" in what_if


def test_a_sweep_of_a_log_tabulates_when_each_budget_ran_out(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    scenario = build("exp1", ["load.compress=0.3", "policy.queue_slo_fraction=0"])
    logio.write_log(replay(scenario), tmp_path / "log")
    config = str(examples_dir() / "exp1.yaml")
    assert main(["replay", str(tmp_path / "log"), "--config", config, "--out", str(tmp_path / "plain"),
                 "--sweep", "policy.queue_slo_fraction=0,0.5"]) == 0
    assert main(["replay", str(tmp_path / "log"), "--config", config, "--out", str(tmp_path / "budget"),
                 "--sweep", "policy.queue_slo_fraction=0,0.5", "--budget", f"{ENT}=3000/day"]) == 0
    capsys.readouterr()
    plain = (tmp_path / "plain" / "sweep.csv").read_text().splitlines()
    budget = (tmp_path / "budget" / "sweep.csv").read_text().splitlines()
    assert "budget" not in plain[0]
    column = f"{ENT}.day@2026-02-27T00:00:00+00:00.exhausted_at"
    assert column in budget[0].split(",") and budget[0].startswith(plain[0])
    assert all("2026-02-27T" in row.split(",")[budget[0].split(",").index(column)] for row in budget[1:])


@pytest.mark.parametrize(("items", "hint_ms"), [([], 3_600_000), (["budgets.retry_after_max_s=60"], 60_000)])
def test_a_refusals_retry_hint_is_the_reset_capped_at_the_setting(items: list[str], hint_ms: int) -> None:
    """A ``never`` budget resets never: its refusals say to come back after ``budgets.retry_after_max_s``."""
    result = replay(build("exp1", [*items, f"replay.budget={ENT}=3000/never"]))
    d = result.decisions
    hints = {d.retry_after_ms[k] for k in range(len(d.t_s)) if d.outcome[k] == BUDGET}
    assert hints == {hint_ms}
    assert {d.retry_after_s[k] for k in range(len(d.t_s)) if d.outcome[k] == BUDGET} == {hint_ms // 1000}
    reasons = {d.reason[k] for k in range(len(d.t_s)) if d.outcome[k] == BUDGET}
    assert reasons == {f"budget never of {ENT} is spent: it never resets"}


def test_the_ledger_reserves_settles_and_keeps_a_late_completion_in_its_own_period() -> None:
    """``BudgetLedger`` alone: a reservation counts until it settles; a completion is charged to the period holding
    its time (a late one too, though the replay's time only grows); a release gives a reservation back."""
    from tokenpools.core.spec import EntitlementSpec
    from tokenpools.replay.budgets import BudgetLedger

    spec = next(e for e in build("exp1").entitlements if e.name == ENT)
    spec = replace(spec, budgets=(BudgetSpec("day", Period.DAY, 100),))
    assert isinstance(spec, EntitlementSpec)
    ledger = BudgetLedger(origin_ms=1_772_150_400_000 - 10_000, retry_after_max_s=3600)  # 10 s before midnight UTC
    ledger.join(spec, 0.0)
    assert ledger.check(ENT, "r1", 40, 20, 1.0) is None  # 60 reserved
    refused = ledger.check(ENT, "r2", 30, 20, 2.0)  # 60 + 50 > 100
    assert refused is not None and refused.retry_after_ms == 8_000 and "2026-02-27T00:00:00+00:00" in refused.reason
    assert ledger.check(ENT, "r3", 20, 20, 3.0) is None  # 60 + 40 = 100 fits
    ledger.release("r3")
    ledger.settle("r1", 40, 30, 4.0)  # used 70, beyond its 60
    assert ledger.check(ENT, "r4", 20, 20, 11.0) is None  # the new day
    ledger.settle("r4", 20, 1, 12.0)
    first, second = ledger.periods()
    assert (first.spent_units, first.refused, first.exhausted_ms) == (70, 1, ledger.origin_ms + 2_000)
    assert (second.spent_units, second.refused, second.exhausted_ms) == (21, 0, None)
    assert ledger.check(ENT, "r5", 1, 1, 12.0) is None
    ledger.settle("r5", 5, 0, 5.0)  # (a completion from before midnight: into the closed day)
    first, second = ledger.periods()
    assert (first.spent_units, first.spent.requests, second.spent_units) == (75, 2, 21)


def test_a_tenant_budget_is_one_account_shared_by_the_tenants_entitlements() -> None:
    """Two entitlements of one tenant declaring a tenant budget spend and reserve from one account, reported under
    ``tenant/<tenant>``; an entitlement of another tenant with a budget of the same name has its own."""
    from tokenpools.core.budgets import BudgetScope
    from tokenpools.replay.budgets import BudgetLedger

    shared = BudgetSpec("day", Period.DAY, 100, scope=BudgetScope.TENANT)
    a, b, c = build("exp1").entitlements[:3]
    a, b = replace(a, tenant="acme", budgets=(shared,)), replace(b, tenant="acme", budgets=(shared,))
    c = replace(c, tenant="globex", budgets=(shared,))
    ledger = BudgetLedger(origin_ms=1_772_150_400_000 - 10_000, retry_after_max_s=3600)
    for spec in (a, b, c):
        ledger.join(spec, 0.0)
    assert ledger.check(a.name, "r1", 40, 20, 1.0) is None  # 60 of acme's 100 reserved
    refused = ledger.check(b.name, "r2", 30, 20, 1.5)  # 60 + 50 > 100: b is refused on a's reservation
    assert refused is not None and f"tenant/acme ({b.name})" in refused.reason
    assert ledger.check(c.name, "r3", 60, 40, 1.5) is None  # globex's budget is its own
    assert ledger.check(b.name, "r4", 20, 20, 2.0) is None  # 60 + 40 = 100 fits
    ledger.settle("r1", 40, 20, 3.0)
    ledger.settle("r4", 20, 20, 3.0)
    assert ledger.check(a.name, "r5", 1, 0, 4.0) is not None  # 100 spent by a and b together
    rows = [(p.entitlement, p.spent_units, p.refused) for p in ledger.periods()]
    assert rows == [("tenant/acme", 100, 2), ("tenant/globex", 0, 0)]
