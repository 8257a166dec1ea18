"""Closed-loop load in the dev tools, the pure parts: the experiments' clients, ``tokenpools load``'s plan, the
client's own records read back as requests, and the live report naming the load mode beside its numbers.

The clients themselves (sending, waiting for the answer, retrying, giving up) run against the real proxy and
simulators in tests/integration/test_live_closed.py.
"""

from __future__ import annotations

from math import inf
from pathlib import Path

import pytest

from tokenpools.cli import build_parser, installed_commands
from tokenpools.errors import PermanentError
from tokenpools.replay.experiments import EXP2_LENGTHS, build, examples_dir
from tokenpools.replay.load import Lengths
from tokenpools_dev.live import runner
from tokenpools_dev.live.report import client_table, comparison_table
from tokenpools_dev.loadgen.cli import Plan, plan_of
from tokenpools_dev.loadgen.closed import describe, experiment_clients, split_load_mode
from tokenpools_dev.loadgen.plan import (
    Attempt,
    Completion,
    LoadMode,
    LoadResult,
    client_ttfts,
    request_spans,
    summary_rows,
)


CLOSED = ["load.mode=closed"]


def test_exp1_clients_are_the_slots_the_open_loop_rates_come_from() -> None:
    scenario = build("exp1", CLOSED)
    clients = {c.entitlement: c for c in experiment_clients(scenario)}
    assert {n: c.clients for n, c in clients.items()} == {"guaranteed-a": 6, "spot-b": 10, "guaranteed-c": 6}
    assert [(c.start_s, c.end_s) for c in clients.values()] == [(0.0, inf), (0.0, inf), (30.0, 60.0)]
    assert all(c.prompt == c.output == Lengths(64, 64) and c.max_tokens is None for c in clients.values())
    assert describe(tuple(clients.values())) == "22 clients (guaranteed-a 6, spot-b 10, guaranteed-c 6 in [30, 60) s)"
    # compressed: windows shrink with the run, the clients stay
    squeezed = experiment_clients(build("exp1", [*CLOSED, "load.compress=0.5"]))
    assert [(c.clients, c.start_s, c.end_s) for c in squeezed] == [(6, 0.0, inf), (10, 0.0, inf), (6, 15.0, 30.0)]


def test_exp2_clients_are_each_elastic_baseline_but_copilot_has_7_and_reports_join_at_210_s() -> None:
    """Copilot has 7 clients, not its 5-slot baseline (replay.experiments.COPILOT_CLIENTS: Fig. 5 shows it at up
    to 7 in flight, issue 30); synth and reports have their baselines."""
    clients = experiment_clients(build("exp2", CLOSED))
    assert [(c.entitlement, c.clients, c.start_s, c.end_s) for c in clients] == [
        ("elastic-copilot", 7, 0.0, inf), ("elastic-synth", 5, 0.0, inf), ("elastic-reports", 5, 210.0, inf)]
    assert all(c.split == EXP2_LENGTHS for c in clients)


def test_the_clients_are_those_the_simulation_replays_and_an_open_built_experiment_has_none() -> None:
    scenario = build("exp2", CLOSED)
    assert experiment_clients(scenario) == scenario.closed
    with pytest.raises(PermanentError, match="load.mode=closed"):
        experiment_clients(build("exp2"))


def test_load_mode_is_a_set_item_taken_out_before_the_experiment_is_built(tmp_path: Path) -> None:
    assert split_load_mode(["load.seed=2"]) == (LoadMode.OPEN, ("load.seed=2",))
    assert split_load_mode(["load.mode=closed", "streams.tick_s=2"]) == (LoadMode.CLOSED, ("streams.tick_s=2",))
    with pytest.raises(PermanentError, match="--set: load.mode: must be one of open, closed"):
        split_load_mode(["load.mode=half-open"])
    with pytest.raises(ValueError, match="load_mode"):
        runner.LiveOptions(name="exp1", out=tmp_path, overrides=("load.mode=closed",))
    closed = runner.LiveOptions(name="exp1", out=tmp_path, load_mode=LoadMode.CLOSED)
    arrivals, clients, what = runner.pass_load(runner.scenario_for(closed), closed)
    assert not arrivals and sum(c.clients for c in clients) == 22 and what.startswith("closed loop, 22 clients")
    opened = runner.LiveOptions(name="exp1", out=tmp_path)
    arrivals, clients, what = runner.pass_load(runner.scenario_for(opened), opened)
    assert arrivals and not clients and what == f"open loop, {len(arrivals)} requests"


def _plan(*argv: str) -> Plan:
    return plan_of(build_parser("load", installed_commands()).parse_args(["load", *argv]))


def test_tokenpools_load_plans_open_or_closed_loops() -> None:
    config = str(examples_dir() / "exp1.yaml")
    assert _plan("--experiment", "exp1").mode is LoadMode.OPEN
    paper = _plan("--experiment", "exp1", "--closed")
    assert paper.mode is LoadMode.CLOSED and not paper.arrivals
    assert {c.entitlement: c.clients for c in paper.clients} == {"guaranteed-a": 6, "spot-b": 10, "guaranteed-c": 6}
    assert paper.describe().startswith("closed loop: 22 clients") and paper.retry.max_retries == 5
    assert _plan("--experiment", "exp1", "--set", "load.mode=closed").clients == paper.clients
    three = _plan("--experiment", "exp1", "--closed", "3", "--clients", "spot-b=12", "--think-s", "0.5")
    assert [(c.clients, c.think_s) for c in three.clients] == [(3, 0.5), (12, 0.5), (3, 0.5)]
    steady = _plan("--config", config, "--closed", "4", "--key", "spot-b=k", "--clients", "guaranteed-a=2",
                   "--duration-s", "20", "--stagger-s", "0.25")
    assert [(c.entitlement, c.clients, c.end_s, c.stagger_s) for c in steady.clients] == [
        ("guaranteed-a", 2, 20.0, 0.25), ("spot-b", 4, 20.0, 0.25)]
    assert steady.entitlements == ["guaranteed-a", "spot-b"] and steady.duration_s == 20.0
    for argv, message in ((("--config", config, "--rate", "spot-b=1", "--closed", "2"), "give one"),
                          (("--config", config, "--closed", "2"), "name the entitlements"),
                          (("--config", config, "--closed", "--key", "spot-b=k"), "number of clients"),
                          (("--experiment", "exp1", "--clients", "nobody=2"), "not an entitlement"),
                          (("--experiment", "exp1", "--clients", "spot-b"), "NAME=N")):
        with pytest.raises(PermanentError, match=message):
            _plan(*argv)


def _attempt(t: float, rid: str, n: int, outcome: str, answered: float) -> Attempt:
    return Attempt(t, "spot-b", rid, n, outcome, "", 0, 200 if outcome == "admitted" else 429, 64, 64,
                   answered_s=answered)


def test_a_request_spans_its_refusals_and_retry_waits_and_a_given_up_one_ends_at_its_last_answer() -> None:
    result = LoadResult()
    # r0: refused at 0, retried at 1.0 and admitted, served at 5; r1: refused twice, given up at 2.5 (answered)
    result.attempts += [_attempt(0.0, "r0", 0, "concurrency", 0.01), _attempt(1.0, "r0", 1, "admitted", 1.02),
                        _attempt(2.0, "r1", 0, "concurrency", 2.01), _attempt(2.4, "r1", 1, "concurrency", 2.5),
                        _attempt(2.5, "r2", 0, "admitted", 2.51)]
    result.completions += [Completion("r0", "spot-b", 1, 0.0, 1.0, 5.0, 64, 64, 0.3, 4.0),
                           Completion("r2", "spot-b", 0, 2.5, 2.5, 6.0, 64, 64, 0.2, 3.5)]
    result.abandoned["spot-b"] = 1
    spans = {s.request_id: s for s in request_spans(result)}
    assert (spans["r0"].start_s, spans["r0"].end_s, spans["r0"].attempts, spans["r0"].served) == (0.0, 5.0, 2, True)
    assert (spans["r1"].start_s, spans["r1"].end_s, spans["r1"].served) == (2.0, 2.5, False)
    assert client_ttfts(result, "spot-b") == [pytest.approx(1.3), pytest.approx(0.2)]  # r0 counts its retry wait
    (row,) = summary_rows(result)
    # r1 ended at 2.5 as r2 started: never three open at once; admitted attempts overlap in [2.5, 5)
    assert (row["max_open"], row["max_in_flight"], row["abandoned"]) == (2, 2, 1)
    assert row["p99_client_ttft_s"] == pytest.approx(1.3) and row["p99_ttft_s"] == 0.3


def test_the_live_report_names_the_load_mode_beside_every_number() -> None:
    scenario = build("exp2")
    live = {"token_pools": {"p99_client_ttft_s": {"copilot": 3.2}, "successes": {"copilot": 700},
                            "abandoned": {"copilot": 0}, "p99_ttft_s": {"copilot": 0.4}},
            "baseline": {"p99_client_ttft_s": {"copilot": 2.8}, "successes": {"copilot": 650}}}
    sim = {"token_pools": {"p99_client_ttft_s": {"copilot": 3.39}}, "baseline": {}}
    table = client_table(scenario, live, sim, LoadMode.CLOSED, LoadMode.OPEN)
    header = table.splitlines()[0]
    assert header == ("| tenant | metric | simulation (open loop): token pools | live (closed loop): token pools | "
                      "simulation (open loop): baseline | live (closed loop): baseline |")
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:2]): line for line in table.splitlines()[2:]}
    assert len(rows) == 3 * 3  # three tenants × (client TTFT, successes, given up)
    assert rows[("copilot", "P99 client TTFT incl. refusals, retries and waits (s)")].endswith(
        "| 3.39 | 3.2 | — | 2.8 |")
    assert rows[("copilot", "successful requests")].endswith("| — | 700 | — | 650 |")
    assert rows[("reports", "given up after their retries")].endswith("| — | — | — | — |")
    assert "live (closed loop): token pools" in comparison_table("exp2", live, sim, LoadMode.CLOSED, LoadMode.OPEN)
